"""Heads sweep: the paper's Table 3, row (A), on the numbers corpus (or WMT on accelerators).

    nice -n 19 python -m experiments.heads                  # 18 CPU runs, configs/sweeps/heads.py
    python -m experiments.heads --sweep=configs/sweeps/heads.py:wmt   # WMT14 base, GPUs/TPUs

The points come from `configs/sweeps/heads.py` (h in {1, 2, 4, 8, 16, 32} at fixed d_model,
d_k = d_v = d_model / h, three seeds) and run with the sweep runner (experiments/sweeps.py: the
flags of experiments/sweep.py, resuming, `--parallel`); the report is
experiments/heads_report.py's: `experiments/results/heads.md` and `heads.png`.
"""

import os

from absl import app

from experiments import heads_report, sweeps
from transformer.errors import flags_parser

FLAGS = sweeps.define_flags(default_sweep="configs/sweeps/heads.py")

if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(lambda argv: sweeps.main(argv, FLAGS, report=heads_report.report),
          flags_parser=flags_parser())
