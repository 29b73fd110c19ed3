"""The sweep command: every point of a sweep file trained in its own workdir, then a report.

    python -m experiments.sweep --sweep=configs/sweeps/heads.py [--parallel=2] [--only=a,b]

Sweep files, workdirs, resuming and the report: experiments/sweeps.py.
"""

import os

from absl import app

from experiments import sweeps
from transformer.errors import flags_parser

FLAGS = sweeps.define_flags()

if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(lambda argv: sweeps.main(argv, FLAGS), flags_parser=flags_parser())
