"""experiments.pipeline_benchmark end to end on the tiny numbers corpus (no timing asserted)."""

import json
import os
import subprocess
import sys

from tests.test_train import FAST_COMPILE, REPO

STAGES = ["open", "vocabulary", "token cache", "batch plan", "first step", "batches"]


def test_first_start_and_restart_are_reported_stage_by_stage(tmp_path):
  out = tmp_path / "pipeline"
  cmd = [sys.executable, "-m", "experiments.pipeline_benchmark",
         "--config=configs/numbers.py:tiny", f"--workdir={tmp_path / 'w'}", f"--out={out}",
         "--batches=20"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, XLA_FLAGS=FAST_COMPILE))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  record = json.loads(out.with_suffix(".json").read_text())
  runs = record["runs"]
  assert list(runs) == ["first start", "restart"]
  for run in runs.values():
    assert [s["stage"] for s in run["stages"]] == STAGES
    assert all(s["seconds"] >= 0 and s["peak_rss_bytes"] > 0 for s in run["stages"])
    assert 0 < run["real_token_fraction"] <= 1 and run["batches_per_second"] > 0
    assert run["train_examples"] == 2000 and run["step_xla_bytes"] > 0
  # The restart found the vocabulary and the cache: one build in the workdir.
  builds = [d for d in os.listdir(tmp_path / "w" / "cache") if not d.endswith(".lock")]
  assert len(builds) == 1
  md = out.with_suffix(".md").read_text()
  assert "| restart | token cache |" in md and "to the first step" in md
  assert set(record["need"]) == {"TPU v2-8 (Colab)", "H100 SXM"}
