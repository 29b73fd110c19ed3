"""The prepared GPU check end to end in its smoke mode (tiny shapes, on the CPU)."""

import json
import os
import subprocess
import sys

import pytest

from tests.xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_smoke(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE}
  proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--smoke",
                         f"--out={tmp_path / 'gpu'}", "--timeout_s=300"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  (result,) = json.loads((tmp_path / "gpu.json").read_text())["sections"].values()
  assert [(r["attention"], r["rows"]) for r in result["train"]] == [
    (a, rows) for a in ("xla", "cudnn") for rows in ("bucketed", "packed")]
  for r in result["train"]:
    assert "error" not in r, r["error"]
    assert r["tokens_per_s"] > 0 and r["compile_s"] > 0 and r["dtype"] == "float32"
  assert [r["packed_segments"] for r in result["train"]] == [0, 2, 0, 2]
  assert "error" not in result["decode"], result["decode"]["error"]
  md = (tmp_path / "gpu.md").read_text()
  assert "## Training step" in md and "## Beam search" in md and "gpu_check --smoke" in md
