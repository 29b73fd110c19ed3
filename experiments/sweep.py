"""The sweep command: every point of a sweep file trained in its own workdir, then a report.

    python -m experiments.sweep --sweep=configs/sweeps/heads.py [--parallel=2] [--only=a,b]

Sweep files, workdirs, resuming and the report: experiments/sweeps.py.
"""

import os

from experiments import sweeps
from transformer.errors import flags_parser

if __name__ == "__main__":
  from absl import app

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  FLAGS = sweeps.define_flags()
  app.run(lambda argv: sweeps.main(argv, FLAGS), flags_parser=flags_parser())
