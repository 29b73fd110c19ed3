"""The training system end to end: CLI, exact resume after kill -9, mock WMT, config errors."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from configs import numbers as numbers_config
from tests.conftest import RESUMED_RUN
from tests.xla_flags import FAST_COMPILE
from transformer.schedules import paper_schedule
from transformer.training import checkpoint as checkpoint_lib
from transformer.training.train_state import cross_entropy, make_train_step

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(*args, env_extra=None, timeout=600):
  env = dict(os.environ)
  # One CPU device per subprocess unless a test asks for more, and cheap compiles.
  env["XLA_FLAGS"] = FAST_COMPILE
  env.update(env_extra or {})
  return subprocess.run(
    [sys.executable, "-m", "transformer.main", *args], cwd=REPO, env=env,
    capture_output=True, text=True, timeout=timeout,
  )


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def final_params(workdir):
  """Parameters of the newest checkpoint, as NumPy arrays (restored without a target)."""
  import orbax.checkpoint as ocp

  ckpt = os.path.join(workdir, "checkpoints")
  with ocp.CheckpointManager(ckpt, item_names=("state", "meta")) as mgr:
    step = mgr.latest_step()
    restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return step, jax.tree.map(np.asarray, restored["state"]["params"])


def assert_same_run(straight, other, steps):
  """`other` (interrupted and resumed, local or gs://) ended as the uninterrupted `straight`:
  bitwise equal final parameters, and the same loss at every step in its metrics."""
  from transformer.metrics import read_metrics as read_any_metrics

  step_a, params_a = final_params(straight)
  step_b, params_b = final_params(other)
  assert step_a == step_b == steps
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
  loss = lambda recs: {r["step"]: r["train/loss"] for r in recs if "train/loss" in r}
  assert loss(read_any_metrics(straight)) == loss(read_any_metrics(other))


TINY = ["--config=configs/numbers.py:tiny"]


@pytest.fixture(scope="module")
def tiny_run(tiny_trained, tmp_path_factory):
  """A copy of the session's tiny run (conftest.tiny_trained) and its output."""
  shared, stdout, stderr = tiny_trained
  workdir = str(tmp_path_factory.mktemp("tiny") / "w")
  shutil.copytree(shared, workdir)
  return workdir, types.SimpleNamespace(stdout=stdout, stderr=stderr)


def test_cli_trains_end_to_end(tiny_run):
  workdir, proc = tiny_run
  records = read_metrics(workdir)
  keys = set().union(*records)
  for key in ("train/loss", "train/learning_rate", "train/real_token_fraction", "eval/loss",
              "eval/accuracy", "eval/perplexity", "eval/bleu", "test/bleu"):
    assert key in keys, key
  assert all("step" in r for r in records)
  assert "Test BLEU" in proc.stdout
  assert os.path.exists(os.path.join(workdir, "vocab", "spm.model"))
  assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tb")))
  assert os.path.isdir(os.path.join(workdir, "translations"))


def test_rerun_of_a_finished_run_resumes_and_changes_nothing(tiny_run):
  workdir, _ = tiny_run
  step, before = final_params(workdir)
  proc = run_main(*TINY, f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  step2, after = final_params(workdir)
  assert step2 == step
  jax.tree.map(np.testing.assert_array_equal, before, after)


def test_resume_after_kill_is_bitwise_exact(uninterrupted_run, tmp_path):
  """kill -9 mid-run, restart: the final parameters equal an uninterrupted run's, bitwise.

  With packed batches, whose plan of every step is rebuilt from (seed, step) in the new
  process, each step run as 3 micro-batches (8 rows: two of them padded with empty rows)
  (conftest.RESUMED_RUN; bucketed batches: test_best_checkpoint's kill test).
  """
  straight, _, stderr = uninterrupted_run
  assert "batch shapes [(8, 64, 42)]" in stderr

  interrupted = str(tmp_path / "interrupted")
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)
  child = subprocess.Popen(
    [sys.executable, "-m", "transformer.main", *RESUMED_RUN, f"--workdir={interrupted}"],
    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )
  # Kill as soon as a checkpoint has been finalized and training has gone on past it.
  metrics = os.path.join(interrupted, "metrics.jsonl")
  deadline = time.time() + 300
  while time.time() < deadline and child.poll() is None:
    ckpt = os.path.join(interrupted, "checkpoints")
    done = [d for d in os.listdir(ckpt) if d.isdigit()] if os.path.isdir(ckpt) else []
    if done and os.path.exists(metrics) and len(read_metrics(interrupted)) >= 7:
      break
    time.sleep(0.05)
  assert child.poll() is None, "the run ended before it could be interrupted"
  child.send_signal(signal.SIGKILL)
  child.wait()
  records = read_metrics(interrupted)
  assert max(r["step"] for r in records) < 30

  proc = run_main(*RESUMED_RUN, f"--workdir={interrupted}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert_same_run(straight, interrupted, 30)  # the metrics read as one run too


def test_mock_wmt_runs_offline(tmp_path):
  """configs/wmt.py:tiny through the real WMT loading code, served by tfds mock data."""
  code = (
    "import sys, tensorflow_datasets as tfds\n"
    "from transformer import main\n"
    "with tfds.testing.mock_data(num_examples=64):\n"
    "  sys.argv = ['main', '--config=configs/wmt.py:tiny', '--workdir=" + str(tmp_path) + "',"
    " '--config.num_train_steps=2']\n"
    "  main.run()\n"
  )
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=600, env=dict(os.environ, XLA_FLAGS=FAST_COMPILE))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "tokenized, compound-split" in proc.stdout
  keys = set().union(*read_metrics(str(tmp_path)))
  assert "test/bleu" in keys and "eval/accuracy" in keys


def test_wmt_without_data_fails_at_once_with_one_line(tmp_path):
  proc = run_main("--config=configs/wmt.py:tiny", f"--workdir={tmp_path}/w",
                  f"--config.data_dir={tmp_path}/no_data")
  assert proc.returncode == 2
  lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
  assert len(lines) == 1 and "wmt14" in lines[0] and "tfds build" in lines[0]
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(f"{tmp_path}/w")  # failed before any work


# The command line's contract, on a field of each kind; every field's checks are in-process
# (test_validate, which mutates them all).
@pytest.mark.parametrize("override,field", [
  ("--config.model.num_heads=3", "num_heads"),
  ("--config.mesh.data=3", "mesh"),
  ("--config.optimizer.schedule=linear", "optimizer.schedule"),
])
def test_invalid_config_exits_2_with_one_line_naming_the_field(tmp_path, override, field):
  workdir = tmp_path / "w"
  proc = run_main(*TINY, f"--workdir={workdir}", override)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert len(errors) == 1 and field in errors[0], proc.stderr[-2000:]
  assert not workdir.exists()


def test_unknown_field_and_missing_config_file_end_cleanly(tmp_path):
  proc = run_main(*TINY, f"--workdir={tmp_path}/w", "--config.model.no_such_field=1")
  assert proc.returncode == 2 and "no_such_field" in proc.stderr and "Traceback" not in proc.stderr
  proc = run_main("--config=configs/nope.py", f"--workdir={tmp_path}/w")
  assert proc.returncode == 2 and "nope.py" in proc.stderr and "Traceback" not in proc.stderr


def test_config_overrides_reach_the_config():
  from ml_collections import config_flags  # noqa: F401 - the flag machinery used by main

  config = numbers_config.get_config("tiny")
  config.model.num_heads = 2
  assert config.model.num_heads == 2
  proc = run_main(*TINY, "--config.model.num_heads=3", "--workdir=/nonexistent/x/y")
  assert "num_heads=3" in proc.stderr


def test_learning_rate_schedule_matches_equation_3():
  schedule = paper_schedule(512, 4000)
  for step in (1, 100, 4000, 4001, 100000):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    np.testing.assert_allclose(float(schedule(step - 1)), expected, rtol=1e-5)


def test_label_smoothed_cross_entropy_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
  targets = rng.integers(0, 7, size=(2, 3))
  smoothed, nll = cross_entropy(logits, targets, 0.1)
  logp = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
  q = np.full((2, 3, 7), 0.1 / 6)
  np.put_along_axis(q, targets[..., None], 0.9, axis=-1)
  expected = -(q * logp).sum(-1) + (q * np.log(q)).sum(-1)
  np.testing.assert_allclose(smoothed, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(nll, -np.take_along_axis(logp, targets[..., None], -1)[..., 0],
                             rtol=1e-5)


def test_average_of_checkpoints_is_the_mean(tiny_run):
  import orbax.checkpoint as ocp

  workdir, _ = tiny_run
  ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), None, False)
  steps = ckpt.all_steps()[-2:]
  assert len(steps) == 2
  with ocp.CheckpointManager(ckpt.directory, item_names=("state", "meta")) as mgr:
    trees = [mgr.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
             for s in steps]
  trainer = tiny_trainer()
  avg = checkpoint_lib.average_params(ckpt, steps, trainer.abstract_state)
  expected = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / 2,
                          trees[0]["params"], trees[1]["params"])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), y, rtol=1e-6), avg,
               expected)


def test_average_mode_of_the_cli(tiny_run):
  workdir, _ = tiny_run
  proc = run_main(*TINY, f"--workdir={workdir}", "--mode=average", "--average=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "average of steps" in proc.stdout and "Average Test BLEU" in proc.stdout
  assert any("average_test/bleu" in r for r in read_metrics(workdir))


def tiny_trainer():
  from transformer import sharding as sharding_lib
  from transformer.training.trainer import Trainer
  from transformer.training.validate import validate

  config = numbers_config.get_config("tiny")
  config.mesh.data = 1
  return Trainer(config, sharding_lib.make_mesh(config.mesh, jax.devices()[:1]),
                 validate(config, 1))


def test_a_nonfinite_step_leaves_parameters_and_moments_bitwise_unchanged():
  trainer = tiny_trainer()
  step = jax.jit(make_train_step(trainer.model, trainer.tx, trainer.config.label_smoothing),
                 donate_argnums=0)

  def train_step(state, batch, rng):
    with trainer.context():
      return step(state, batch, rng)

  rng = np.random.default_rng(0)
  batch = {k: jax.numpy.asarray(rng.integers(3, 200, (8, 16)), jax.numpy.int32)
           for k in ("inputs", "targets")}
  state = trainer.init_state(0)
  state, _ = train_step(state, batch, jax.random.key(1))  # Adam moments not all zero
  embedding = state.params["embed"]["embedding"]
  poisoned = state.replace(params={**state.params, "embed": {
    "embedding": embedding.at[0, 0].set(np.inf)}})
  before = jax.tree.map(np.asarray, poisoned)  # the step donates (deletes) its input state
  after, metrics = train_step(poisoned, batch, jax.random.key(1))
  assert float(metrics["nonfinite"]) == 1.0
  assert int(after.step) == 2 and int(after.nonfinite_total) == 1
  for name, old, new in (("params", before.params, after.params),
                         ("opt_state", before.opt_state, after.opt_state)):
    jax.tree.map(lambda x, y, name=name: np.testing.assert_array_equal(
      x, np.asarray(y), err_msg=name), old, new)
