"""Test setup: 8 simulated CPU devices and cheap compiles, set before jax is imported anywhere."""

import atexit
import os
import shutil
import tempfile

from tests.xla_flags import FAST_COMPILE

os.environ["XLA_FLAGS"] = " ".join(
  [os.environ.get("XLA_FLAGS", ""), FAST_COMPILE, "--xla_force_host_platform_device_count=8"]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow is used for tf.data only; keep its logging quiet in test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every test (and every process it starts) builds its corpora and local caches in a directory
# of this session, never in the user's ~/tensorflow_datasets or ~/.cache: the suite passes the
# same on a fresh machine and on one where earlier runs left data behind.
_SESSION_DIR = tempfile.mkdtemp(prefix="transformer-tests-")
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ["TFDS_DATA_DIR"] = os.path.join(_SESSION_DIR, "tensorflow_datasets")
os.environ["TRANSFORMER_CACHE"] = os.path.join(_SESSION_DIR, "cache")
# One persistent compilation cache for the session, every program in it however fast it
# compiled: the tests and the programs they start compile many of the same tiny programs, and
# the main program's default cache is this same directory (compilation.default_cache_dir).
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_SESSION_DIR, "cache",
                                                       "jax_compilation_cache")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)


# Offline GCS (tests/gcs_emulator.py): an in-memory emulator for one test module, with
# os.environ pointing etils.epath, gcsfs, Orbax/tensorstore and google-cloud-storage at it.
import pytest  # noqa: E402

from tests.gcs_emulator import apply_env, gcs_emulator, restore_env  # noqa: E402


@pytest.fixture(scope="module")
def gcs():
  """A `GcsEmulator` (bucket, url, env, path()); its env is also set in os.environ, and the
  in-process caches that read it are reset, until the module's tests are done."""
  with gcs_emulator() as emulator:
    saved = apply_env(emulator.env)
    try:
      yield emulator
    finally:
      restore_env(saved)


def pytest_collection_modifyitems(config, items):
  """Files holding end-to-end runs (a test marked slow) first, the most of them first: the two
  workers (`--dist loadfile`) take whole files in this order, so the longest start early and
  the workers finish together instead of one running the last long file alone."""
  slow: dict[str, int] = {}
  for item in items:
    slow[item.fspath.strpath] = slow.get(item.fspath.strpath, 0) + bool(
      item.get_closest_marker("slow"))
  order = {path: i for i, path in enumerate(dict.fromkeys(i.fspath.strpath for i in items))}
  items.sort(key=lambda item: (-slow[item.fspath.strpath], order[item.fspath.strpath]))


def shared_run(name: str, *args: str) -> tuple[str, str, str]:
  """A run of the main program with `args`, made once for the whole session: the first worker
  to ask runs it under a lock, the others reuse it. Returns (workdir, stdout, stderr)."""
  import json

  from tests.test_train import run_main
  from transformer import storage

  workdir = os.path.join(_SESSION_DIR, name)
  record = workdir + ".json"
  with storage.local_file_lock(workdir + ".lock"):
    if not os.path.exists(record):
      proc = run_main(*args, f"--workdir={workdir}", timeout=900)
      assert proc.returncode == 0, f"the shared run {name} failed:\n{proc.stderr[-3000:]}"
      with open(record, "w") as f:
        json.dump({"stdout": proc.stdout, "stderr": proc.stderr}, f)
  with open(record) as f:
    output = json.load(f)
  return workdir, output["stdout"], output["stderr"]


@pytest.fixture(scope="session")
def tiny_trained():
  """A finished run of `configs/numbers.py:tiny` by the main program, trained once for the
  whole session (`shared_run`).

  Returns (workdir, stdout, stderr). Tests copy the workdir before they change anything in it
  (`shutil.copytree`); translating from it writes nothing there.
  """
  return shared_run("tiny_trained", "--config=configs/numbers.py:tiny")


# The run the kill -9 tests interrupt and resume, locally (tests/test_train.py) and in a GCS
# bucket (tests/test_cloud_workdir.py): packed rows, each step as 3 micro-batches, a checkpoint
# every 5 steps and a record every step, so that there is time to kill it between checkpoints.
RESUMED_RUN = ["--config=configs/numbers.py:tiny", "--config.num_train_steps=30",
               "--config.checkpoint_every_steps=5", "--config.evals.valid_loss.every_steps=100",
               "--config.log_every_steps=1", "--config.data.packing=True",
               "--config.evals.valid_translation.sentences=4", "--config.grad_accum_steps=3"]


@pytest.fixture(scope="session")
def uninterrupted_run():
  """RESUMED_RUN run through once, uninterrupted (`shared_run`): what a resumed run must equal.
  Returns (workdir, stdout, stderr)."""
  return shared_run("uninterrupted_run", *RESUMED_RUN)
