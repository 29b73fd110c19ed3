"""Model families behind one interface: `config.model.kind` picks the Transformer or the LSTM
baseline; both have `__call__(inputs, targets, train)`, `encode`, `decode_logits` and an
incremental-decoding cache, so training, decoding and evaluation treat them alike."""

from __future__ import annotations

import flax.linen as nn

from transformer.model import ModelConfig, Transformer

KINDS = ("transformer", "lstm")


def build_model(config: ModelConfig, incremental: bool = False) -> nn.Module:
  """The module for `config.kind`; `incremental=True` gives the KV-cache decoding variant."""
  if config.kind == "transformer":
    return Transformer(config, incremental=incremental)
  if config.kind == "lstm":
    from transformer.rnn import LSTMSeq2Seq

    return LSTMSeq2Seq(config, incremental=incremental)
  raise ValueError(f"model.kind must be one of {', '.join(KINDS)}, got {config.kind!r}")
