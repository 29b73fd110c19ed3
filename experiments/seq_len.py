"""Sequence length: what a training step costs at length n, and how models trained on short
sentences translate longer ones.

    nice -n 19 python -m experiments.seq_len                 # both parts, CPU defaults
    python -m experiments.seq_len --part=cost --lengths=64,128,...,16384 --batch_size=8  # GPU

(a) cost: `step_cost.cost_sweep` for n = 64 ... 4096 (source = target = n tokens) over the
Transformer of `--config` with each attention implementation that applies here and its
equal-size LSTMs (with and without attention): XLA memory, sequential loop iterations, step
time, and growth exponents over all n and over n >= `--fit_from`. (b) quality:
`seq_len_report.run_quality`, BLEU by source length of the models of configs/sweeps/seq_len.py.

Writes experiments/results/seq_len.md, seq_len.png and seq_len.json (every record); a part
that does not run keeps its records from the last run.
"""

from __future__ import annotations

import os

from absl import app, flags
from ml_collections import config_flags

from transformer.errors import UserError, fail, flags_parser

_PART = flags.DEFINE_list("part", ["cost", "quality"], "cost, quality, or both.")
_CONFIG = config_flags.DEFINE_config_file("config", None,
                                          "Model of the cost part (configs/numbers.py).")
_LENGTHS = flags.DEFINE_list("lengths", [str(2**k) for k in range(6, 13)],
                             "Sequence lengths n (source = target = n).")
_BATCH = flags.DEFINE_integer("batch_size", 2, "Rows per training step (cost).")
_KINDS = flags.DEFINE_list("kinds", [], "Models: xla, chunked, cudnn (Transformer attention), "
                           "lstm, lstm_noattn; default: all that apply here (cudnn only on GPU).")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per length (best is kept).")
_MAX_STEP_S = flags.DEFINE_float("max_step_s", 20.0, "Do not time steps predicted slower.")
_MAX_RUN_GB = flags.DEFINE_float("max_run_gb", 6.0, "Do not run steps needing more memory.")
_FIT_FROM = flags.DEFINE_integer("fit_from", 512, "Second fit: lengths >= this only.")
_QUALITY_SWEEP = flags.DEFINE_string("quality_sweep", "configs/sweeps/seq_len.py",
                                     "Sweep file of the quality part.")
_BINS = flags.DEFINE_list("bins", ["16", "24", "32", "48", "64"],
                          "Upper edges of the source-length bins (tokens).")
_OUT = flags.DEFINE_string("out", os.path.join("experiments", "results"), "Results directory.")
_ROOT = flags.DEFINE_string("root", os.path.join("runs", "sweeps"), "Quality runs' root.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  parts = set(_PART.value)
  if not parts or parts - {"cost", "quality"}:
    fail(f"--part={','.join(_PART.value)}: use cost, quality or both")
  from experiments import report, seq_len_report, step_cost

  command = report.command_line()
  # A part that does not run keeps its results (and command) from the last run.
  old = report.read_json(os.path.join(_OUT.value, "seq_len.json"))
  commands = dict(old.get("commands") or {})
  cost, quality = old.get("cost"), old.get("quality")
  try:
    if "cost" in parts:
      cost = step_cost.cost_sweep(_CONFIG.value, _KINDS.value or step_cost.default_kinds(),
                                  [int(n) for n in _LENGTHS.value], _BATCH.value, _STEPS.value,
                                  _MAX_STEP_S.value, _MAX_RUN_GB.value * 1e9)
      commands["cost"] = command
    if "quality" in parts:
      quality = seq_len_report.run_quality(
        _QUALITY_SWEEP.value, _ROOT.value,
        seq_len_report.length_bins([int(b) for b in _BINS.value]))
      commands["quality"] = command
  except (UserError, ValueError) as e:
    fail(str(e))
  paths = seq_len_report.write_report(_OUT.value, commands, cost, quality, _FIT_FROM.value)
  print(f"wrote {', '.join(paths)}", flush=True)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser(config="configs/numbers.py"))
