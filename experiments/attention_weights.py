"""Attention weights of a trained model, recomputed from what each attention module received
(used by experiments/attention_maps.py).

One teacher-forced forward pass runs under `nn.intercept_methods`, which records the inputs of
every `MultiHeadAttention` call: queries' and keys' inputs, masks, causality, and the module's
path. The model does not return attention weights, so they are recomputed from those inputs
and the module's own parameters (`query` [d, h, k] and `key` [d, h, k]):

    weights = softmax(mask(Q K^T / sqrt(d_k))),   Q = x_q W^Q, K = x_kv W^K

with the masks the module applied (source padding for encoder self-attention and
cross-attention, causal for decoder self-attention), in float32. `recompute_output` checks
them: weights @ (x_kv W^V) @ W^O must give the module's output, which was recorded too
(tests/test_experiments.py does that and compares the weights with float64 NumPy).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from measuring import report

KINDS = ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")


def capture_attention(model: Any, params: Any, inputs: Any, targets: Any) -> list[dict[str, Any]]:
  """Runs `model.apply` (teacher-forced, deterministic, jitted) and records every attention call.

  Returns, in call order, dicts with 'path' (module path tuple), 'params' (the module's
  parameters), 'inputs_q' [b, q, d], 'inputs_kv' [b, kv, d] (the queries' input for
  self-attention), 'self_attention', 'mask' (or None), 'kv_mask' [b, kv] (or None),
  'is_causal', 'output' [b, q, d]. Needs unscanned layers (`model.scan_layers=False`).
  """
  import flax.linen as nn
  import jax

  from transformer.nn.model import MultiHeadAttention

  if getattr(getattr(model, "config", None), "scan_layers", False):
    raise ValueError("attention maps need unscanned layers: set model.scan_layers=False")
  static: list[dict[str, Any]] = []  # Python values, filled while tracing

  def run(params, inputs, targets):
    arrays: list[dict[str, Any]] = []  # traced values, returned as the jitted outputs

    def interceptor(next_fun, args, kwargs, context):
      module = context.module
      if not isinstance(module, MultiHeadAttention) or context.method_name != "__call__":
        return next_fun(*args, **kwargs)
      out = next_fun(*args, **kwargs)
      inputs_q = args[0]
      inputs_kv = args[1] if len(args) > 1 else kwargs.get("inputs_kv")
      mask = args[2] if len(args) > 2 else kwargs.get("mask")
      static.append({"path": tuple(module.path), "self_attention": inputs_kv is None,
                     "is_causal": bool(kwargs.get("is_causal", False))})
      arrays.append({
        "params": {k: module.get_variable("params", k) for k in ("query", "key", "value", "out")},
        "inputs_q": inputs_q,
        "inputs_kv": inputs_q if inputs_kv is None else inputs_kv,
        "mask": mask,
        "kv_mask": kwargs.get("kv_mask"),
        "output": out,
      })
      return out

    with nn.intercept_methods(interceptor):
      model.apply({"params": params}, inputs, targets, train=False)
    return arrays

  arrays = jax.device_get(jax.jit(run)(params, inputs, targets))
  return [{**s, **a} for s, a in zip(static, arrays, strict=True)]


def attention_weights(record: dict[str, Any], xp: Any = np, dtype: Any = np.float32) -> Any:
  """softmax(mask(Q K^T / sqrt(d_k))) of one recorded call: [b, h, q, kv].

  `xp` is the array module (NumPy by default; jax.numpy works too) and `dtype` the precision.
  Masked positions get weight 0 and a row with nothing to attend to is all zeros, as in
  transformer.nn.attention.
  """
  p = record["params"]
  xq = xp.asarray(record["inputs_q"], dtype)
  xkv = xp.asarray(record["inputs_kv"], dtype)
  q = xp.einsum("bqd,dhk->bqhk", xq, xp.asarray(p["query"], dtype))
  k = xp.einsum("bsd,dhk->bshk", xkv, xp.asarray(p["key"], dtype))
  logits = xp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
  q_len, kv_len = q.shape[1], k.shape[1]
  allowed = xp.ones((1, 1, q_len, kv_len), bool)
  if record["kv_mask"] is not None:
    allowed = allowed & xp.asarray(record["kv_mask"], bool)[:, None, None, :]
  if record["is_causal"]:
    offset = kv_len - q_len
    allowed = allowed & (np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None] + offset)
  if record["mask"] is not None:
    allowed = allowed & xp.asarray(record["mask"], bool)
  logits = xp.where(allowed, logits, -xp.inf)
  top = xp.max(logits, axis=-1, keepdims=True)
  top = xp.where(xp.isfinite(top), top, 0)
  e = xp.where(allowed, xp.exp(logits - top), 0)
  denom = e.sum(axis=-1, keepdims=True)
  return xp.where(denom > 0, e / xp.where(denom > 0, denom, 1), 0)


def recompute_output(record: dict[str, Any], weights: Any, xp: Any = np,
                     dtype: Any = np.float32) -> Any:
  """The module's output from the weights: sum_s w[b,h,q,s] (x_kv W^V)[b,s,h,:] @ W^O."""
  p = record["params"]
  v = xp.einsum("bsd,dhk->bshk", xp.asarray(record["inputs_kv"], dtype),
                xp.asarray(p["value"], dtype))
  heads = xp.einsum("bhqs,bshk->bqhk", xp.asarray(weights, dtype), v)
  return xp.einsum("bqhk,hkd->bqd", heads, xp.asarray(p["out"], dtype))


def kind_of(record: dict[str, Any]) -> str:
  """Which of KINDS a recorded call is, from its path and arguments."""
  path = record["path"]
  if not record["self_attention"]:
    return KINDS[2]
  if any("decoder" in str(part) for part in path) or record["is_causal"]:
    return KINDS[1]
  return KINDS[0]


def layer_of(record: dict[str, Any]) -> int:
  """The layer index in the module path (`layer_3`), 0 if there is none."""
  for part in record["path"]:
    m = re.fullmatch(r"layers?_(\d+)", str(part))
    if m:
      return int(m.group(1))
  return 0


def maps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per recorded call: kind, layer, path and the weights of the first batch row [h, q, kv]."""
  out = []
  for r in records:
    out.append({"kind": kind_of(r), "layer": layer_of(r), "path": "/".join(r["path"]),
                "weights": np.asarray(attention_weights(r))[0]})
  order = {k: i for i, k in enumerate(KINDS)}
  return sorted(out, key=lambda m: (order[m["kind"]], m["layer"]))


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
  labels = []
  for i in ids:
    if i == 0:
      labels.append("<s>")
    elif i == 1:
      labels.append("</s>")
    else:
      labels.append(tokenizer.decode([i]) or "▁")  # a piece that decodes to nothing: a space
  return labels


def plot(attn: list[dict[str, Any]], src_labels: list[str], tgt_in_labels: list[str],
         tgt_out_labels: list[str], title: str, path: str) -> None:
  """One row per (kind, layer), one column per head."""
  heads = max(m["weights"].shape[0] for m in attn)
  rows = len(attn)
  size = 1.2 + 0.16 * max(len(src_labels), len(tgt_in_labels))
  fig, axes = report.figure(rows, heads, figsize=(size * heads + 1.5, size * rows + 0.8),
                            squeeze=False)
  for i, m in enumerate(attn):
    if m["kind"] == KINDS[0]:
      ylab, xlab = src_labels, src_labels
    elif m["kind"] == KINDS[1]:
      ylab, xlab = tgt_out_labels, tgt_in_labels
    else:
      ylab, xlab = tgt_out_labels, src_labels
    for h in range(heads):
      ax = axes[i, h]
      if h >= m["weights"].shape[0]:
        ax.axis("off")
        continue
      ax.imshow(m["weights"][h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
      ax.set_xticks(range(len(xlab)), xlab, rotation=90, fontsize=6)
      ax.set_yticks(range(len(ylab)), ylab if h == 0 else [""] * len(ylab), fontsize=6)
      if i == 0:
        ax.set_title(f"head {h}", fontsize=9)
      if h == 0:
        ax.set_ylabel(f"{m['kind']}\nlayer {m['layer']}", fontsize=8)
  fig.suptitle(title, fontsize=10)
  report.save_figure(fig, path, dpi=110)
