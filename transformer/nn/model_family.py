"""Model families behind one interface: `config.model.kind` picks the Transformer or the LSTM
baseline; both have `__call__(inputs, targets, train)`, `encode`, `decode_logits` and an
incremental-decoding cache, so training, decoding and evaluation treat them alike. Their
parameters are counted here, and the LSTM baseline is sized here to match a Transformer."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.nn.model import ModelConfig, Transformer

KINDS = ("transformer", "lstm")


def build_model(config: ModelConfig, incremental: bool = False) -> nn.Module:
  """The module for `config.kind`; `incremental=True` gives the KV-cache decoding variant."""
  if config.kind == "transformer":
    return Transformer(config, incremental=incremental)
  if config.kind == "lstm":
    from transformer.nn.rnn import LSTMSeq2Seq

    return LSTMSeq2Seq(config, incremental=incremental)
  raise ValueError(f"model.kind must be one of {', '.join(KINDS)}, got {config.kind!r}")


def count_params(tree: Any) -> int:
  """Number of scalars in a pytree of arrays or shapes (boxed `nn.Partitioned` leaves too)."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(tree)))


def param_count(config: ModelConfig) -> int:
  """Parameters of the model of `config`, from `jax.eval_shape` of its init (no FLOPs, no
  memory; tracing an LSTM costs about 0.2 s per layer and direction)."""
  tokens = jnp.ones((1, 2), jnp.int32)
  return count_params(jax.eval_shape(
    lambda: build_model(config).init(jax.random.key(0), tokens, tokens)["params"]))


def lstm_config_for_params(target_params: int, base: ModelConfig) -> ModelConfig:
  """The LSTM config (kind='lstm') whose parameter count is closest to `target_params`.

  Only d_model is chosen; every other field comes from `base`. The attention fields of
  ModelConfig do not affect the LSTM, but the config must still validate, so d_kv is
  pinned to base.head_dim when num_heads does not divide the chosen d_model.
  """
  from transformer.nn.rnn import closed_form_param_count

  if target_params < 1:
    raise ValueError(f"target_params must be positive, got {target_params}")
  # The count grows with d, so bisect on the closed form (tracing every candidate would take
  # seconds each), then confirm the choice with one exact count.
  count = functools.partial(closed_form_param_count, base)
  lo, hi = 2, 4
  while count(hi) < target_params:
    lo, hi = hi, 2 * hi
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if count(mid) < target_params else (lo, mid)
  d = min((lo, hi), key=lambda x: abs(count(x) - target_params))
  d_kv = base.d_kv or (0 if d % base.num_heads == 0 else base.head_dim)
  config = dataclasses.replace(base, d_model=d, d_kv=d_kv, kind="lstm")
  exact = param_count(config)
  if exact != count(d):
    raise RuntimeError(f"rnn.closed_form_param_count is out of date with LSTMSeq2Seq: {exact} "
                       f"parameters counted, {count(d)} predicted for d_model={d}")
  return config
