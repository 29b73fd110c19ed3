"""Gradient accumulation (`config.grad_accum_steps` = k): the train step's memory and time.

    python -m experiments.accum_memory

Memory: the train step of `--config` (default: configs/wmt.py:base, vocabulary 37,000) for one
batch of `--rows` x `--length` tokens per side (96 x 256 = 24,576, about the paper's 25,000),
compiled ahead of time on one device for each k of `--memory_k`, never run
(`step_cost.measure_step` with no steps): XLA's memory analysis of the compiled step
(`measure.memory_stats`), temp bytes (activations kept for the backward pass, gradients and
their accumulators, workspace) and the peak (arguments + outputs - aliased + temp).

Time: the step of `--time_config` (default: configs/numbers.py, a small model) on its packed
batch shape (rows = data.tokens_per_batch // the longer packed length; with data.packing off,
the largest bucket on both sides) on this host's first device for each k of `--time_k`. After
one untimed round (compiling), every round runs `--steps_per_round` steps of each k in turn
(`measure.time_interleaved`), so that the load of a shared machine falls on all alike; the
ratios to k = 1 are of the median round. Each k trains from the same state on the same
random batches, and the report gives how far its losses are from k = 1's.

Fields of either model can be overridden when its file is given, e.g.
`--config=configs/wmt.py:base --config.model.dropout_rate=0`. Writes `--out`.md and .json.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from experiments import report
from experiments.accum_memory_report import check_ks, memory_by_k, time_by_k, write_report
from transformer.errors import UserError, fail, flags_parser

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Model of the memory part; default configs/wmt.py:base.", lock_config=False)
_TIME_CONFIG = config_flags.DEFINE_config_file(
  "time_config", None, "Model and batch shape of the time part; default configs/numbers.py.",
  lock_config=False)
_ROWS = flags.DEFINE_integer("rows", 96, "Memory part: rows of the batch.")
_LENGTH = flags.DEFINE_integer("length", 256, "Memory part: source and target tokens per row.")
_MEMORY_K = flags.DEFINE_list("memory_k", ["1", "2", "4", "8"], "Memory part: values of k.")
_TIME_K = flags.DEFINE_list("time_k", ["1", "2", "4"], "Time part: values of k (empty: none).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Time part: timed rounds.")
_STEPS = flags.DEFINE_integer("steps_per_round", 4, "Time part: steps of each k per round.")
_OUT = flags.DEFINE_string("out", "experiments/results/accum_memory",
                           "Report path without extension.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  try:
    memory_k = [int(k) for k in _MEMORY_K.value]
    time_k = [int(k) for k in _TIME_K.value]
  except ValueError:
    fail("--memory_k and --time_k are lists of integers, e.g. --memory_k=1,2,4,8")
  from configs import numbers, wmt

  config = _CONFIG.value or wmt.get_config("base")
  time_config = _TIME_CONFIG.value or numbers.get_config()
  try:
    check_ks("--memory_k", memory_k)
    check_ks("--time_k", time_k)
    timing = time_by_k(time_config, time_k, _ROUNDS.value, _STEPS.value) if time_k else []
    memory = memory_by_k(config, _ROWS.value, _LENGTH.value, memory_k)
  except UserError as e:
    fail(str(e))
  write_report(_OUT.value, config, time_config, memory, timing, report.command_line())
  print(f"wrote {_OUT.value}.md", flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flags_parser())
