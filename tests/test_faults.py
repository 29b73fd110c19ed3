"""Faults and bad input, each reproduced in a subprocess: real signals, real file damage."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.test_train import FAST_COMPILE, REPO, TINY, final_params, read_metrics, run_main

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tiny_trained):
  """A finished tiny run (checkpoints at steps 3 and 6) to copy from (conftest.tiny_trained)."""
  return tiny_trained[0]


def copy_of(trained, tmp_path):
  target = str(tmp_path / "w")
  shutil.copytree(trained, target)
  return target


def tree_digest(path):
  h = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(path)):
    dirs.sort()
    for name in sorted(files):
      full = os.path.join(root, name)
      h.update(full[len(path):].encode())
      with open(full, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def one_error_line(stderr):
  lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
  assert len(lines) == 1, stderr[-2000:]
  assert "Traceback" not in stderr
  return lines[0]


def test_damaged_newest_checkpoint_falls_back_to_the_previous(trained, tmp_path):
  workdir = copy_of(trained, tmp_path)
  newest = os.path.join(workdir, "checkpoints", "6")
  # Truncate every data file of the newest checkpoint's state.
  for root, _, files in os.walk(os.path.join(newest, "state")):
    for name in files:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 16:
        with open(path, "r+b") as f:
          f.truncate(8)
  proc = run_main(*TINY, f"--workdir={workdir}", "--config.num_train_steps=9")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "damaged" in proc.stderr and "checkpoints/6" in proc.stderr
  assert "Resumed from the checkpoint of step 3" in proc.stderr
  step, _ = final_params(workdir)
  assert step == 9
  # The damaged files were moved aside, not deleted.
  assert os.listdir(os.path.join(workdir, "checkpoints_damaged"))


def test_incompatible_checkpoint_is_refused_and_left_untouched(trained, tmp_path):
  workdir = copy_of(trained, tmp_path)
  before = tree_digest(workdir)
  proc = run_main(*TINY, f"--workdir={workdir}", "--config.model.d_model=64")
  assert proc.returncode == 2
  line = one_error_line(proc.stderr)
  assert "d_model" in line and "checkpoints" in line
  assert tree_digest(workdir) == before


def test_other_vocabulary_size_is_refused(trained, tmp_path):
  workdir = copy_of(trained, tmp_path)
  before = tree_digest(workdir)
  proc = run_main(*TINY, f"--workdir={workdir}", "--config.data.vocab_size=300",
                  "--config.model.vocab_size=300")
  assert proc.returncode == 2
  assert "vocab" in one_error_line(proc.stderr)
  assert tree_digest(workdir) == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_the_rerun_continues(tmp_path, sig):
  workdir = str(tmp_path / "w")
  args = [*TINY, f"--workdir={workdir}", "--config.num_train_steps=400",
          "--config.checkpoint_every_steps=1000", "--config.log_every_steps=1",
          "--config.evals.valid_loss.every_steps=1000"]
  child = subprocess.Popen([sys.executable, "-m", "transformer.main", *args], cwd=REPO,
                           env=dict(os.environ, XLA_FLAGS=FAST_COMPILE), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 300
  while time.time() < deadline and child.poll() is None:
    if os.path.exists(metrics) and len(read_metrics(workdir)) >= 3:
      break
    time.sleep(0.05)
  assert child.poll() is None
  child.send_signal(sig)
  out, err = child.communicate(timeout=120)
  assert child.returncode == 0, err[-3000:]
  assert "Interrupted" in out and "Traceback" not in err
  step, _ = final_params(workdir)
  assert 3 <= step < 400
  if sig == signal.SIGINT:
    return  # the rerun is the same for both signals; check it once
  proc = run_main(*args[:-4], "--config.num_train_steps=" + str(step + 2))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"Resumed from the checkpoint of step {step}" in proc.stderr
  assert final_params(workdir)[0] == step + 2


@pytest.mark.parametrize("mode", ["skip", "stop"])
def test_nonfinite_loss_stops_with_a_message_and_checkpoints_stay_finite(tmp_path, mode):
  workdir = str(tmp_path / "w")
  # An absurd learning rate makes the parameters overflow the forward pass within steps.
  proc = run_main(*TINY, f"--workdir={workdir}", "--config.optimizer.learning_rate_scale=1e30",
                  f"--config.nonfinite={mode}", "--config.max_consecutive_nonfinite=2",
                  "--config.num_train_steps=12", "--config.log_every_steps=1",
                  "--config.checkpoint_every_steps=1")
  assert proc.returncode == 1, proc.stderr[-3000:]
  line = one_error_line(proc.stderr)
  assert "non-finite" in line
  if os.path.isdir(os.path.join(workdir, "checkpoints")) and os.listdir(
      os.path.join(workdir, "checkpoints")):
    import jax
    import numpy as np

    _, params = final_params(workdir)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))
  records = read_metrics(workdir)
  assert any(r.get("train/nonfinite_steps", 0) > 0 for r in records)


def translate(workdir, data: bytes, *extra):
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)
  return subprocess.run(
    [sys.executable, "-m", "transformer.main", *TINY, f"--workdir={workdir}",
     "--mode=translate", *extra], cwd=REPO, env=env, input=data, capture_output=True,
    timeout=300,
  )


def test_translate_mode_round_trips_and_handles_awkward_input(trained):
  lines = [b"three hundred and forty-seven", b"", b"twelve \xff\xfe and then one",
           b"   ", b" and".join([b" one"] * 200)]
  proc = translate(trained, b"\n".join(lines) + b"\n")
  assert proc.returncode == 0, proc.stderr.decode()[-3000:]
  out = proc.stdout.decode("utf-8").split("\n")
  assert out[-1] == "" and len(out) == len(lines) + 1  # one output line per input line
  assert out[1] == "" and out[3] == ""  # empty lines stay empty
  stderr = proc.stderr.decode()
  assert "line 3 is not valid UTF-8" in stderr
  assert "line 5 has" in stderr and "truncated" in stderr
  assert "Traceback" not in stderr


def test_translate_empty_input_gives_empty_output(trained):
  proc = translate(trained, b"")
  assert proc.returncode == 0 and proc.stdout == b""


def test_translate_from_a_file_and_missing_file(trained, tmp_path):
  src = tmp_path / "in.txt"
  src.write_text("seven\neight\n")
  proc = translate(trained, b"", f"--input={src}")
  assert proc.returncode == 0 and len(proc.stdout.decode().splitlines()) == 2
  proc = translate(trained, b"", f"--input={tmp_path}/none.txt")
  assert proc.returncode == 2 and "none.txt" in one_error_line(proc.stderr.decode())


def test_damaged_vocabulary_is_reported(trained, tmp_path):
  workdir = copy_of(trained, tmp_path)
  path = os.path.join(workdir, "vocab", "spm.model")
  with open(path, "r+b") as f:
    f.truncate(100)
  proc = translate(workdir, b"seven\n")
  assert proc.returncode == 2
  assert "spm.model" in one_error_line(proc.stderr.decode())


def test_unwritable_workdir_is_refused(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  proc = run_main(*TINY, f"--workdir={blocker}/w")
  assert proc.returncode == 2 and "workdir" in one_error_line(proc.stderr)


def test_workdir_that_cannot_be_created_is_one_line(tmp_path):
  proc = run_main(*TINY, "--workdir=/proc/x")
  assert proc.returncode == 2
  line = one_error_line(proc.stderr)
  assert "--workdir=/proc/x" in line


def start_main(*args):
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)
  return subprocess.Popen([sys.executable, "-m", "transformer.main", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_second_run_on_a_live_workdir_is_refused_naming_the_owner(tmp_path):
  workdir = tmp_path / "w"
  first = start_main(*TINY, f"--workdir={workdir}", "--config.num_train_steps=100000",
                     "--config.checkpoint_every_steps=100000")
  try:
    deadline = time.time() + 300
    while not (workdir / ".lock").exists():
      assert first.poll() is None and time.time() < deadline, first.communicate()[1][-3000:]
      time.sleep(0.2)
    second = run_main(*TINY, f"--workdir={workdir}")
    assert second.returncode == 2, second.stderr[-3000:]
    line = one_error_line(second.stderr)
    assert f"pid {first.pid}" in line and "workdir in use" in line
    assert first.poll() is None  # the first run goes on
  finally:
    first.kill()  # like kill -9: its lock stays behind
    first.communicate()
  assert (workdir / ".lock").exists()
  # A dead owner's lock is taken over (two steps are enough to see the run go on).
  again = run_main(*TINY, f"--workdir={workdir}", "--config.num_train_steps=2")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "taking over the lock" in again.stderr


def test_concurrent_starts_on_an_empty_data_dir_build_everything_once(tmp_path):
  """Two runs started at the same moment: one corpus build, one shared token cache."""
  data_dir, cache = tmp_path / "tfds", tmp_path / "cache"
  procs = [start_main(*TINY, f"--workdir={tmp_path / f'w{i}'}", f"--config.data_dir={data_dir}",
                      f"--config.data.cache_dir={cache}", "--config.num_train_steps=2")
           for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outputs, strict=True):
    assert p.returncode == 0, err[-3000:]
  assert os.listdir(data_dir / "numbers" / "tiny") == ["1.1.0"]
  builds = [d for d in os.listdir(cache) if not d.endswith(".lock")]
  assert len(builds) == 1 and builds[0].startswith("train-"), os.listdir(cache)
