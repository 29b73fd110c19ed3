"""The offline GCS emulator harness: etils.epath, Orbax and tensorboardX on gs:// paths."""

import os
import struct
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.gcs_emulator import apply_env, gcs_emulator, restore_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_CWD = os.getcwd()


@pytest.fixture(autouse=True)
def no_local_gs_dir(tmp_path, monkeypatch):
  """Runs each test in an empty cwd and fails it if a local `gs:` directory appears there."""
  monkeypatch.chdir(tmp_path)
  yield
  made = [root for root, dirs, _ in os.walk(tmp_path) if "gs:" in dirs]
  assert not made, f"local gs: directory created under {made}"


def object_names(gcs, prefix):
  """Object names under `prefix`, straight from the emulator (google-cloud-storage, anonymous)."""
  from google.cloud import storage

  return sorted(b.name for b in storage.Client().list_blobs(gcs.bucket, prefix=prefix))


def test_epath_operations(gcs):
  root = epath.Path(gcs.path("epath"))
  d = root / "a" / "b"
  d.mkdir(parents=True, exist_ok=True)
  d.mkdir(parents=True, exist_ok=True)
  assert not d.exists()  # no directories on GCS: an empty one does not exist

  (d / "x.txt").write_text("hello")
  (d / "y.bin").write_bytes(b"\x00\x01")
  assert (d / "x.txt").read_text() == "hello"
  assert (d / "y.bin").read_bytes() == b"\x00\x01"
  assert (d / "x.txt").exists() and (d / "x.txt").is_file() and not (d / "x.txt").is_dir()
  assert d.is_dir() and root.is_dir()  # a prefix with objects is a directory
  assert sorted(p.name for p in d.iterdir()) == ["x.txt", "y.bin"]
  assert [p.name for p in root.iterdir()] == ["a"]
  assert [p.name for p in root.glob("a/b/*.txt")] == ["x.txt"]
  with pytest.raises(NotImplementedError):  # epath refuses recursive globs on gs://
    list(root.glob("**/*.txt"))

  (d / "x.txt").rename(d / "z.txt")  # gcsfs: moveTo (served by the harness as copy + delete)
  assert not (d / "x.txt").exists() and (d / "z.txt").read_text() == "hello"
  with pytest.raises(FileExistsError):
    (d / "z.txt").rename(d / "y.bin")
  (d / "z.txt").replace(d / "y.bin")
  assert (d / "y.bin").read_text() == "hello"
  (root / "a").rename(root / "c")  # a "directory": every object under the prefix
  assert [p.name for p in root.iterdir()] == ["c"]
  d = root / "c" / "b"

  # Append is not supported: gcsfs warns and OVERWRITES.
  with pytest.warns(UserWarning, match="Append mode"):
    with (d / "y.bin").open("a") as f:
      f.write("more")
  assert (d / "y.bin").read_text() == "more"

  (d / "y.bin").unlink()
  with pytest.raises(FileNotFoundError):
    (d / "y.bin").unlink()
  (d / "y.bin").unlink(missing_ok=True)
  (d / "t").write_text("t")
  root.rmtree()
  assert not root.exists()
  assert object_names(gcs, "epath/") == []


def test_generation_preconditions(gcs):
  """Served by the harness (the bare emulator ignores them); tensorstore and locks rely on them."""
  from google.api_core.exceptions import PreconditionFailed
  from google.cloud import storage

  bucket = storage.Client().bucket(gcs.bucket)
  blob = bucket.blob("preconditions/x")
  blob.upload_from_string(b"1", if_generation_match=0)  # create only if absent
  with pytest.raises(PreconditionFailed):
    bucket.blob("preconditions/x").upload_from_string(b"2", if_generation_match=0)
  with pytest.raises(PreconditionFailed):
    bucket.blob("preconditions/x").upload_from_string(b"2", if_generation_match=blob.generation + 1)
  bucket.blob("preconditions/x").upload_from_string(b"3", if_generation_match=blob.generation)
  assert bucket.blob("preconditions/x").download_as_bytes() == b"3"


def test_orbax_checkpoint_manager_on_gcs(gcs):
  directory = epath.Path(gcs.path("run", "checkpoints"))
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  assert mesh.devices.size == 8
  shardings = {
    "w": NamedSharding(mesh, P("data", "model")),
    "b": NamedSharding(mesh, P("model")),
    "step": NamedSharding(mesh, P()),
  }
  values = {
    "w": np.arange(8 * 16, dtype=np.float32).reshape(8, 16),
    "b": np.linspace(0, 1, 16, dtype=np.float32),
    "step": np.int32(7),
  }
  tree = {k: jax.device_put(v, shardings[k]) for k, v in values.items()}
  options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
  with ocp.CheckpointManager(directory, item_names=("state", "meta"), options=options) as mngr:
    for step in (1, 2, 3):
      saved = mngr.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave({"step": step})
        ),
      )
      assert saved
      mngr.wait_until_finished()
    assert mngr.all_steps() == [2, 3]  # step 1 deleted from GCS (max_to_keep)

  # What Orbax wrote: no temporary directory and no rename on GCS, commit_success.txt markers.
  names = object_names(gcs, "run/checkpoints/")
  assert not [n for n in names if "tmp" in n]
  assert not [n for n in names if n.startswith("run/checkpoints/1/")]
  for marker in (
    "3/commit_success.txt",
    "3/state/commit_success.txt",
    "3/meta/commit_success.txt",
    "3/_CHECKPOINT_METADATA",
    "3/meta/metadata",
    "3/state/manifest.ocdbt",
  ):
    assert "run/checkpoints/" + marker in names
  assert [n for n in names if n.startswith("run/checkpoints/3/state/ocdbt.process_0/d/")]

  # A step directory without commit_success.txt (a save cut short) is not a checkpoint.
  (directory / "9" / "state" / "partial").write_text("x")

  with ocp.CheckpointManager(directory, item_names=("state", "meta")) as fresh:
    assert fresh.all_steps() == [2, 3] and fresh.latest_step() == 3
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    restored = fresh.restore(
      3,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
  assert restored["meta"] == {"step": 3}
  for k, v in values.items():
    np.testing.assert_array_equal(np.asarray(restored["state"][k]), v)
    assert restored["state"][k].sharding == shardings[k]


def read_scalars(data):
  """(tag, step, value) of every scalar in a TensorBoard event file's bytes."""
  from tensorboardX.proto.event_pb2 import Event

  out, i = [], 0
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i : i + 8])
    event = Event.FromString(data[i + 12 : i + 12 + n])
    i += 12 + n + 4  # length, its crc, record, its crc
    out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
  return out


# A training run's view: a child process with `gcs.env` writes TensorBoard events and a file.
CHILD = """
import sys
from etils import epath
from tensorboardX import SummaryWriter

writer = SummaryWriter(sys.argv[1])
for step in range(3):
  writer.add_scalar("loss", 1.0 / (step + 1), step)
writer.close()
epath.Path(sys.argv[1]).parent.joinpath("child.txt").write_text("from the child")
"""


def test_child_process_writes_tensorboard_events_to_gcs(gcs, tmp_path):
  # In a child, as in a training run: tensorboardX registers an atexit close and its GCS writer
  # uploads the whole file again from __del__ at exit, which retries for 120 s if the emulator
  # is gone by then. A child exits while the emulator still runs.
  logdir = gcs.path("child", "tb")
  proc = subprocess.run(
    [sys.executable, "-c", CHILD, logdir],
    env={**os.environ, **gcs.env},
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert epath.Path(gcs.path("child", "child.txt")).read_text() == "from the child"
  [event_file] = list(epath.Path(logdir).iterdir())
  assert event_file.name.startswith("events.out.tfevents.")
  scalars = read_scalars(event_file.read_bytes())
  assert [(t, s) for t, s, _ in scalars] == [("loss", 0), ("loss", 1), ("loss", 2)]
  np.testing.assert_allclose([v for _, _, v in scalars], [1.0, 0.5, 1 / 3], rtol=1e-6)


def test_second_emulator_in_the_same_process(gcs):
  """apply_env/restore_env switch emulators with no stale gcsfs listing or client."""
  first = epath.Path(gcs.path("switch", "a.txt"))
  first.write_text("first")
  assert [p.name for p in first.parent.iterdir()] == ["a.txt"]  # cached by gcsfs
  with gcs_emulator(bucket=gcs.bucket) as other:  # same bucket name, empty
    saved = apply_env(other.env)
    try:
      assert not first.exists() and not first.parent.exists()
      first.write_text("second")
      assert first.read_text() == "second"
    finally:
      restore_env(saved)
  assert first.read_text() == "first"


def test_no_local_gs_directory_and_no_unimplemented_requests(gcs):
  for where in (START_CWD, REPO, os.path.join(REPO, "tests")):
    assert not os.path.exists(os.path.join(where, "gs:")), where
  log = gcs.log()
  assert "GET /storage/v1/b/" in log  # the emulator did serve this module's requests
  assert "not implemented" not in log.lower(), [
    line for line in log.splitlines() if "not implemented" in line.lower()
  ]
