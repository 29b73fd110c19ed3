"""Attention against recurrence: the three usual claims, each measured side by side.

    nice -n 19 python -m experiments.claims                   # CPU defaults, about 15 minutes
    python -m experiments.claims --config=configs/wmt.py:base --lengths=128,256,...,16384 \
        --batch_size=8 --long_range.d_model=256 --long_range.max_distance=2000 \
        --long_range.steps=2000                               # accelerators

The Transformer and the LSTM baseline (`model.kind='lstm'`, transformer/rnn.py) always have
the same number of parameters (`model_family.lstm_config_for_params`) and get the same
training budget (the same batches, steps and optimiser recipe).

1. Parallelism. Training-step time against n, and the number of sequential steps: the while
   loops of the compiled train step and their trip counts (`measure.loop_iterations`), so a
   scan over time shows up as n iterations run one after another. Measured with
   `step_cost.cost_sweep` (random batches of `--batch_size` x n source and target tokens) for
   the Transformer of `--config` with `xla` and `chunked` attention and its equal-size LSTMs,
   or read from experiments.seq_len's records with `--cost_from`.
2. Long-range dependencies. The recall task of experiments/tasks.py, trained and tested by
   experiments/long_range.py with the settings of `--long_range` (configs/long_range.py;
   override any field with `--long_range.FIELD=VALUE`).
3. Memory. XLA's memory analysis of the same compiled steps against n, and the decoding cache
   a model keeps per sentence while generating (from `jax.eval_shape` of its cache), against
   the complexity table usually quoted (the paper's Table 1) and the folk claim.

Writes experiments/results/claims.md, claims.json and claims_parallelism.png,
claims_long_range.png, claims_memory.png (experiments/claims_report.py); a part that does not
run keeps its records from the last run.
"""

import os

from absl import app, flags
from ml_collections import config_flags

from transformer.errors import fail, flags_parser

_PART = flags.DEFINE_list("part", ["cost", "long_range"],
                          "cost (parallelism and memory), long_range, or both.")
_CONFIG = config_flags.DEFINE_config_file("config", None,
                                          "Model of the cost part (configs/numbers.py).")
_LONG_RANGE = config_flags.DEFINE_config_file(
  "long_range", None, "Settings of the long-range task (configs/long_range.py).")
_LENGTHS = flags.DEFINE_list("lengths", [str(2**k) for k in range(5, 12)], "Lengths n.")
_BATCH = flags.DEFINE_integer("batch_size", 2, "Rows per step in the cost part.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per length (best is kept).")
_MAX_STEP_S = flags.DEFINE_float("max_step_s", 20.0, "Do not time steps predicted slower.")
_FIT_FROM = flags.DEFINE_integer("fit_from", 256, "Exponents are fitted over n >= this too.")
_COST_FROM = flags.DEFINE_string(
  "cost_from", "", "Read the cost records (parallelism, memory) from this seq_len.json (from "
  "`python -m experiments.seq_len --part=cost`) instead of measuring.")
_OUT = flags.DEFINE_string("out", os.path.join("experiments", "results"), "Results directory.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  parts = set(_PART.value)
  if not parts or parts - {"cost", "long_range"}:
    fail(f"--part={','.join(_PART.value)}: use cost, long_range or both")
  from experiments import claims_report, long_range, report, step_cost

  command = report.command_line()
  previous = report.read_json(os.path.join(_OUT.value, "claims.json"))
  commands = dict(previous.get("command") or {})
  cost, caches, lr = (previous.get(k) for k in ("cost", "decode_cache", "long_range"))
  if "cost" in parts:
    if _COST_FROM.value:
      source = report.read_json(_COST_FROM.value)
      if not source:
        fail(f"--cost_from={_COST_FROM.value}: no such file")
      cost = source["cost"]
      commands["parallelism and memory"] = (
        f"{command}\n# cost records read from {_COST_FROM.value}, measured by:\n"
        f"{(source.get('commands') or {}).get('cost', '?')}")
    else:
      cost = step_cost.cost_sweep(_CONFIG.value, ["xla", "chunked", *step_cost.LSTM_KINDS],
                                  [int(n) for n in _LENGTHS.value], _BATCH.value, _STEPS.value,
                                  _MAX_STEP_S.value)
      commands["parallelism and memory"] = command
    caches = claims_report.decode_caches(_CONFIG.value, sorted({r["n"] for r in cost}))
  if "long_range" in parts:
    lr = long_range.run(_LONG_RANGE.value)
    commands["long-range dependencies"] = command
  paths = claims_report.write_report(_OUT.value, commands, cost, caches, lr, _FIT_FROM.value)
  print(f"wrote {', '.join(paths)}", flush=True)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser(config="configs/numbers.py",
                                           long_range="configs/long_range.py"))
