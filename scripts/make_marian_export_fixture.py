"""Writes tests/fixtures/marian_export/: a model trained here, exported to Hugging Face's Marian
format by the project (`--mode=export --format=marian`), the reference of the export tests.

Runs in the project's environment (it trains a small model on the offline numbers task and
exports it); then the transformers side records what Hugging Face computes with the export,
in its own virtual environment (requirements-marian.txt):

    python scripts/make_marian_export_fixture.py
    /tmp/marian-venv/bin/python scripts/make_marian_fixture.py --export

The model is `configs/numbers.py:tiny` (1 + 1 layers, d_model 32, the paper's interleaved
sinusoids, ReLU, no biases) with PyTorch's LayerNorm epsilon (1e-5, which Marian cannot
change) and 400 training steps, so that its greedy outputs are sentences rather than one
repeated token. Seeded: a re-run writes the same model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "marian_export")
TRAIN = ["--config=configs/numbers.py:tiny", "--config.model.layer_norm_epsilon=1e-5",
         "--config.num_train_steps=400", "--config.checkpoint_every_steps=400",
         "--config.evals.valid_loss.every_steps=400", "--config.average_last_checkpoints=0"]


def main() -> None:
  work = tempfile.mkdtemp(prefix="marian-export-fixture-")
  try:
    workdir = os.path.join(work, "run")
    for args in ([*TRAIN, f"--workdir={workdir}"],
                 ["--mode=export", "--format=marian", f"--workdir={workdir}",
                  f"--output={work}/export"]):
      proc = subprocess.run([sys.executable, "-m", "transformer.main", *args], cwd=REPO,
                            capture_output=True, text=True)
      if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    shutil.rmtree(OUT, ignore_errors=True)
    shutil.copytree(os.path.join(work, "export"), OUT)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  for name in sorted(os.listdir(OUT)):
    print(f"{name}: {os.path.getsize(os.path.join(OUT, name)):,} bytes")


if __name__ == "__main__":
  main()
