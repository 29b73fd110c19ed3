"""benchmarks.packing end to end on the tiny numbers corpus: both layouts counted,
timed in turns and reported (no speed asserted); a config bad for either layout refused."""

import json
import os
import subprocess
import sys

import pytest

from tests.test_train import FAST_COMPILE, REPO

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow


def run_benchmark(tmp_path, *args):
  cmd = [sys.executable, "-m", "benchmarks.packing", "--config=configs/numbers.py:tiny",
         f"--workdir={tmp_path / 'w'}", f"--out={tmp_path / 'packing'}", *args]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, XLA_FLAGS=FAST_COMPILE))


def test_both_layouts_are_counted_timed_and_reported(tmp_path):
  proc = run_benchmark(tmp_path, "--batches=10", "--timed_steps=4")
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  report = json.loads((tmp_path / "packing.json").read_text())
  result = report["sections"]["numbers-tiny"]["result"]
  bucketed, packed = result["bucketed"], result["packed"]
  assert result["train_examples"] == 2000
  assert bucketed["kept_examples"] == packed["kept_examples"] > 0  # the same filter
  for r in (bucketed, packed):
    assert 0 < r["real_fraction"] <= 1 and r["real_tokens"] <= r["positions"]
    assert r["timed_steps"] == 4 and r["real_tokens_per_second"] > 0
  # Packing fills rows that bucketing leaves part empty, in one shape.
  assert packed["real_fraction"] > bucketed["real_fraction"]
  assert packed["compiled_shapes"] == 1 and len(packed["shapes"]) == 1
  md = (tmp_path / "packing.md").read_text()
  assert "**real tokens per second**" in md and "packed / bucketed" in md
  assert bucketed["timed_turns"] == 4 and "taking turns in 4 slices" in md


def test_a_config_bad_for_either_layout_is_one_line_before_any_work(tmp_path):
  # The config trains bucketed; only the packed layout reads packed_source_len.
  proc = run_benchmark(tmp_path, "--config.data.packing=False",
                       "--config.data.packed_source_len=100000")
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: data.packed_source_len=100000"), last
  assert not (tmp_path / "w").exists() and not (tmp_path / "packing.md").exists()
