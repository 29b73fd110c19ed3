"""Attention maps of a trained model: every head of every layer, for one sentence.

    python -m experiments.attention_maps --config=configs/numbers.py --workdir=runs/numbers \
        --sentence="three hundred and forty-seven" [--out=experiments/results/attention_maps.png]

Writes the PNG and, beside it, a .md with the command, the model and the machine.

The model translates the sentence (decoding as in the config); then one teacher-forced
forward pass over (sentence, translation) runs under `nn.intercept_methods`, which records
the inputs of every `MultiHeadAttention` call: queries' and keys' inputs, masks, causality,
and the module's path. The model does not return attention weights, so they are recomputed
from those inputs and the module's own parameters (`query` [d, h, k] and `key` [d, h, k]):

    weights = softmax(mask(Q K^T / sqrt(d_k))),   Q = x_q W^Q, K = x_kv W^K

with the masks the module applied (source padding for encoder self-attention and
cross-attention, causal for decoder self-attention), in float32. `recompute_output` checks
them: weights @ (x_kv W^V) @ W^O must give the module's output, which was recorded too
(tests/test_experiments.py does that and compares the weights with float64 NumPy).

The figure has one row per layer and attention kind (encoder self-attention, decoder
self-attention, encoder-decoder attention) and one column per head. Rows of a map are the
decoder's (or encoder's) query positions, columns the key positions; decoder rows are labelled
with the output token that position predicts.
"""

from __future__ import annotations

import os
import re
import types
from typing import Any

import numpy as np
from absl import app

from experiments import report
from experiments.sweep import define_flag
from transformer.errors import fail

_F = types.SimpleNamespace()  # the command-line flags, once define_flags() ran


def define_flags() -> None:
  """Defines this command's flags (only when it runs, so modules import together)."""
  _F.config = define_flag("config_file", "config", None, "Config of the trained model.")
  _F.workdir = define_flag("string", "workdir", None, "Workdir: checkpoint and vocabulary.")
  _F.sentence = define_flag("string", "sentence", "three hundred and forty-seven",
                            "Source sentence.")
  _F.out = define_flag("string", "out",
                       os.path.join("experiments", "results", "attention_maps.png"), "PNG path.")


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

  from transformer.model import MultiHeadAttention

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
  transformer.attention.
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


def attention_maps(config: Any, workdir: str, sentence: str, out: str) -> dict[str, Any]:
  """Translates `sentence` with the workdir's newest checkpoint and plots its attention."""
  import jax.numpy as jnp

  from transformer import infer
  from transformer.model_family import build_model

  model = infer.restore(config, workdir)
  tokenizer, translator, params, label = (model.tokenizer, model.translator, model.params,
                                          model.label)
  src = tokenizer.encode(sentence)
  hyp = translator.translate_ids(params, [src])[0]
  tgt = list(hyp) + [1]
  model = build_model(translator.model_config)
  records = capture_attention(model, params, jnp.asarray([src], jnp.int32),
                              jnp.asarray([tgt], jnp.int32))
  attn = maps(records)
  translation = tokenizer.decode(hyp)
  src_labels = token_labels(tokenizer, src)
  tgt_in = [0] + tgt[:-1]
  title = (f"{workdir} ({label}): \"{sentence}\" -> \"{translation}\"\n"
           "rows: query positions (decoder rows labelled with the token they predict); "
           "columns: key positions")
  plot(attn, src_labels, token_labels(tokenizer, tgt_in), token_labels(tokenizer, tgt),
       title, out)
  result = {"translation": translation, "checkpoint": label, "maps": len(attn), "path": out,
            "heads": int(attn[0]["weights"].shape[0]), "sentence": sentence, "workdir": workdir,
            "source_pieces": src_labels, "output_pieces": token_labels(tokenizer, tgt)}
  result["markdown"] = write_markdown(result, config)
  return result


def write_markdown(result: dict[str, Any], config: Any) -> str:
  """`<out>.md` beside the PNG: the command, the model, the machine."""
  path = os.path.splitext(result["path"])[0] + ".md"
  m = config.model
  workdir = result["workdir"]
  note = ""
  if os.path.normpath(workdir) != os.path.normpath(os.path.join("runs", "numbers")):
    note = (f"\nThe model is not `runs/numbers` (the README's main command) but `{workdir}`; "
            "see the results README for how it was trained.\n")
  text = [
    "# Attention maps\n",
    f"Every head of every layer of `{workdir}` ({result['checkpoint']}; d_model {m.d_model}, "
    f"{m.num_layers} + {m.num_layers} layers, {m.num_heads} heads) for one sentence, made by "
    "`experiments/attention_maps.py` (method in its docstring): the weights are recomputed "
    "from each attention module's recorded inputs and parameters.\n" + note,
    f"- Source: \"{result['sentence']}\" -> pieces {' '.join(result['source_pieces'])}",
    f"- Model's translation: \"{result['translation']}\" -> pieces "
    f"{' '.join(result['output_pieces'])}\n",
    "## Command\n", f"```\n{report.command_line()}\n```\n",
    "## Machine\n", report.hardware_markdown(report.hardware()),
    f"![attention maps]({os.path.basename(result['path'])})\n",
  ]
  with open(path, "w") as f:
    f.write("\n".join(text))
  return path


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  if _F.config.value is None or _F.workdir.value is None:
    fail("--config and --workdir are required, e.g. --config=configs/numbers.py "
          "--workdir=runs/numbers")
  from transformer.data.errors import DataError
  from transformer.errors import UserError

  try:
    result = attention_maps(_F.config.value, _F.workdir.value, _F.sentence.value, _F.out.value)
  except (UserError, DataError, ValueError) as e:
    fail(str(e))
  print(f"translation: {result['translation']}\n{result['maps']} attention layers x "
        f"{result['heads']} heads ({result['checkpoint']}) -> {result['path']}, "
        f"{result['markdown']}", flush=True)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  define_flags()
  app.run(main)
