"""Training length against test length: the numbers model trained on short pairs only.

    python -m experiments.seq_len --part=quality     # trains these points, then scores them

Points `max24`, `max48`, `max64`: training pairs with at most 24 / 48 / 64 tokens per side
(`data.max_source_len`, `data.max_target_len`, and `data.bucket_lengths` cut at that length;
longer pairs are dropped), everything else equal: the numbers model (d_model 128, 2 + 2
layers, 4 heads, sinusoidal positions over `model.max_len` 128), 1000 steps of about 2048
tokens per side with the numbers config's warm-up (400), seed 0 (so all three share one
SentencePiece vocabulary), greedy decoding. (300 steps left single runs on either side of the
plateau these models cross first, and the BLEU differences were training noise.)
experiments/seq_len.py then translates the whole validation split with each and reports BLEU
by source length. Variant `wmt`: the WMT14 base model with limits 32 / 64 / 128 / 256 (the
paper's recipe otherwise), for accelerators; not run here.
"""

from __future__ import annotations

from typing import Any

from ml_collections import config_dict

from configs import numbers, wmt

LIMITS = {"cpu": (24, 48, 64), "wmt": (32, 64, 128, 256)}


def _variant(arg: str | None) -> str:
  variant = arg or "cpu"
  if variant not in LIMITS:
    raise ValueError(f"unknown variant {variant!r} of configs/sweeps/seq_len.py: use cpu or wmt")
  return variant


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  if _variant(arg) == "wmt":
    return wmt.get_config("base")
  config = numbers.get_config()
  config.name = "seq_len"
  # Bucketed batches, as when experiments/results/seq_len.md was made (packing, the numbers
  # default since, would change the batches and so the results).
  config.data.packing = False
  config.num_train_steps = 1000
  config.optimizer.warmup_steps = 400
  config.log_every_steps = 50
  config.evals.valid_loss.every_steps = 1000
  config.checkpoint_every_steps = 250
  config.keep_checkpoints = 1
  config.average_last_checkpoints = 0  # evaluate the final parameters
  config.evals.valid_translation.sentences = 200
  config.decode.beam_size = 1
  config.num_samples_to_print = 0
  return config


def sweep(arg: str | None = None) -> dict[str, dict[str, Any]]:
  """Points `max{L}`: source and target limited to L tokens, buckets cut at L."""
  variant = _variant(arg)
  buckets = list(get_config(arg).data.bucket_lengths)
  points = {}
  for limit in LIMITS[variant]:
    cut = [b for b in buckets if b < limit] + [limit]
    points[f"max{limit}"] = {
      "data.max_source_len": limit,
      "data.max_target_len": limit,
      "data.bucket_lengths": cut,
    }
  return points
