"""Number of attention heads at fixed d_model: the paper's Table 3, row (A).

    python -m experiments.heads                                   # CPU: numbers corpus
    python -m experiments.heads --sweep=configs/sweeps/heads.py:wmt   # accelerators: WMT14

d_k = d_v = d_model / h throughout (`model.d_kv = 0`), so the attention's parameter count and
FLOPs do not change with h. Variants:

  cpu (default)  the numbers corpus and the numbers model (d_model 128, 2 + 2 layers, d_ff 256),
                 h in {1, 2, 4, 8, 16, 32} (h = 32: d_k = 4), seeds {0, 1, 2}: 18 short runs
                 of 300 steps of ~2048 tokens per side, greedy decoding for BLEU. Shorter
                 runs end on the plateau these models cross first (loss ~1.5, token accuracy
                 ~0.57, BLEU ~1: a target language model that does not yet use the source):
                 200 steps of 2048 tokens, and 400 steps of 1024 tokens, ended there for h = 1
                 and h = 2, while 2048-token batches leave it after 200-250 steps for h = 8
                 and h = 32.
  wmt            Table 3's protocol: the base model on WMT14 en-de, 100k steps, newstest2013 for
                 validation (dev BLEU with beam 4, alpha 0.6, no checkpoint averaging),
                 h in {1, 4, 8, 16, 32} as in row (A), one seed. For accelerators; not run here.
"""

from __future__ import annotations

from typing import Any

from ml_collections import config_dict

from configs import numbers, wmt

HEADS = {"cpu": (1, 2, 4, 8, 16, 32), "wmt": (1, 4, 8, 16, 32)}
SEEDS = {"cpu": (0, 1, 2), "wmt": (0,)}


def _variant(arg: str | None) -> str:
  variant = arg or "cpu"
  if variant not in HEADS:
    raise ValueError(f"unknown variant {variant!r} of configs/sweeps/heads.py: use cpu or wmt")
  return variant


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  variant = _variant(arg)
  if variant == "wmt":
    config = wmt.get_config("base")
    config.average_last_checkpoints = 0  # Table 3: "no checkpoint averaging"
    config.evals.valid_translation.every_steps = 0  # dev BLEU once, at the end
    return config
  config = numbers.get_config()
  config.name = "heads"
  # Bucketed batches, as when experiments/results/heads.md was made (packing, the numbers
  # default since, would change the batches and so the results).
  config.data.packing = False
  config.model.d_model = 128  # divisible by every h up to 32 (h = 32: d_k = 4)
  config.num_train_steps = 300
  config.optimizer.warmup_steps = 200
  config.log_every_steps = 25
  config.evals.valid_loss.every_steps = 300  # the final evaluation only
  config.checkpoint_every_steps = 100
  config.keep_checkpoints = 1
  config.average_last_checkpoints = 0  # the final parameters, as Table 3 (no averaging)
  config.evals.valid_translation.sentences = 200
  config.decode.beam_size = 1  # greedy: beam 4 would double each point's time on 2 cores
  config.num_samples_to_print = 0
  return config


def sweep(arg: str | None = None) -> dict[str, dict[str, Any]]:
  """Points `h{h}-seed{s}`: model.num_heads = h, seed = s."""
  variant = _variant(arg)
  return {
    f"h{h}-seed{s}": {"model.num_heads": h, "seed": s}
    for h in HEADS[variant]
    for s in SEEDS[variant]
  }
