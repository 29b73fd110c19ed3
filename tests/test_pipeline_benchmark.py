"""benchmarks.pipeline end to end on the tiny numbers corpus (no timing asserted)."""

import json
import os
import subprocess
import sys

import pytest

from tests.test_train import FAST_COMPILE, REPO

STAGES = ["open", "vocabulary", "token cache", "batch plan", "first step", "batches"]


@pytest.mark.slow
def test_first_start_and_restart_are_reported_stage_by_stage(tmp_path):
  out = tmp_path / "pipeline"
  cmd = [sys.executable, "-m", "benchmarks.pipeline",
         "--config=configs/numbers.py:tiny", "--config.data.packing=true",  # every corpus's default
         f"--workdir={tmp_path / 'w'}", f"--out={out}", "--batches=20"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, XLA_FLAGS=FAST_COMPILE))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  record = json.loads(out.with_suffix(".json").read_text())["sections"]["numbers-tiny"]
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
  # ...and the packed epoch plan the first start wrote beside it (plan_cache).
  plans = tmp_path / "w" / "cache" / builds[0] / "plans"
  (key,) = os.listdir(plans)
  assert {"meta.json", "epoch-0"} <= set(os.listdir(plans / key))
  assert runs["restart"]["plan_bytes"] > 0
  md = out.with_suffix(".md").read_text()
  assert "| restart | token cache |" in md and "to the first step" in md
  assert set(record["need"]) == {"TPU v2-8 (Colab)", "H100 SXM"}


def test_scaling_report_fits_the_sizes_and_checks_the_promises(tmp_path):
  # The committed English-French records at two corpus sizes (sections of the pipeline
  # report), as the report's inputs.
  records = os.path.join(REPO, "benchmarks", "results", "pipeline.json")
  out = tmp_path / "scaling"
  cmd = [sys.executable, "-m", "benchmarks.pipeline_scaling", f"--records={records}",
         "--runs=fr-4m5,fr-18m", f"--out={out}", "--extrapolate=36000000"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.with_suffix(".json").read_text())
  assert [r["pairs"] for r in record["sizes"]] == sorted(r["pairs"] for r in record["sizes"])
  assert len(record["sizes"]) == 2 and record["promises"]
  assert all(isinstance(p["holds"], bool) for p in record["promises"])
  md = out.with_suffix(".md").read_text()
  assert "## Promises" in md and "at 36.0M pairs" in md
  bad = subprocess.run([*cmd[:4], "--runs=fr-none,fr-4m5"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
  assert bad.returncode == 2 and len(errors) == 1 and "fr-none" in errors[0]
