"""A workdir in a GCS bucket (an offline emulator started by the test): a run is trained, killed
with -9, resumed as on a new VM and ends with parameters bitwise equal to an uninterrupted local
run; then translation reads the bucket. Nothing is written to a local directory named `gs:`.
(SIGTERM's checkpoint is the same save: test_faults.)"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from tests.conftest import RESUMED_RUN
from tests.gcs_emulator import emulator_env
from tests.test_train import FAST_COMPILE, REPO, TINY, assert_same_run, run_main


def objects(gcs, prefix):
  """Names of the bucket's objects under `prefix`, straight from the emulator (no caches)."""
  names, token = [], None
  while True:
    query = {"prefix": prefix, **({"pageToken": token} if token else {})}
    url = f"{gcs.url}/storage/v1/b/{gcs.bucket}/o?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as r:
      page = json.loads(r.read())
    names += [o["name"] for o in page.get("items", [])]
    token = page.get("nextPageToken")
    if not token:
      return names


def remote_steps(gcs, prefix):
  """Steps in the remote metrics.jsonl."""
  url = (f"{gcs.url}/download/storage/v1/b/{gcs.bucket}/o/"
         f"{urllib.parse.quote(prefix + '/metrics.jsonl', safe='')}?alt=media")
  try:
    with urllib.request.urlopen(url, timeout=30) as r:
      text = r.read().decode()
  except urllib.error.HTTPError:
    return []
  return [json.loads(ln)["step"] for ln in text.splitlines() if ln.strip()]


def start(args, env):
  return subprocess.Popen([sys.executable, "-m", "transformer.main", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(condition, proc, what, timeout=300):
  deadline = time.time() + timeout
  while not condition():
    if proc.poll() is not None or time.time() > deadline:
      out, err = proc.communicate()
      raise AssertionError(f"never saw {what}; exit {proc.returncode}\n{err[-3000:]}")
    time.sleep(0.05)


@pytest.mark.slow
def test_training_in_a_bucket_survives_kill_and_serves_inference(gcs, uninterrupted_run,
                                                                   tmp_path):
  """The run of conftest.RESUMED_RUN (uninterrupted, local: `uninterrupted_run`) in a bucket."""
  env = {**os.environ, **gcs.env, "XLA_FLAGS": FAST_COMPILE}
  workdir, prefix = gcs.path("run"), "run"
  args = [*RESUMED_RUN, f"--workdir={workdir}"]
  straight = uninterrupted_run[0]

  # kill -9 once a checkpoint is committed in the bucket and training has gone past it.
  first = start(args, env)
  wait_until(lambda: (f"{prefix}/checkpoints/5/commit_success.txt" in objects(gcs, prefix)
                      and max(remote_steps(gcs, prefix), default=0) >= 7), first, "checkpoint 5")
  first.send_signal(signal.SIGKILL)
  first.communicate()
  assert max(remote_steps(gcs, prefix)) < 30

  # As on a new VM after a preemption: an empty local cache is filled from the bucket's copy
  # of the token cache, not by tokenizing again.
  new_vm = {**gcs.env, "TRANSFORMER_CACHE": str(tmp_path / "new_vm_cache")}
  second = run_main(*args, env_extra=new_vm)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "taking over the lock" in second.stderr  # the killed run's lock, in the bucket
  assert "Resumed from the checkpoint of step" in second.stderr
  assert "copying the token cache" in second.stderr and "tokenizing" not in second.stderr
  assert_same_run(straight, workdir, 30)

  names = objects(gcs, prefix)
  assert f"{prefix}/vocab/spm.model" in names and f"{prefix}/.lock" not in names
  assert any(n.startswith(f"{prefix}/cache/train-") and n.endswith("/meta.json") for n in names)
  assert any(n.startswith(f"{prefix}/tb/events.out.tfevents") for n in names)
  assert f"{prefix}/translations/test_30.txt" in names

  assert f"{prefix}/config.json" in names and f"{prefix}/buckets.json" in names
  # Inference reads the bucket, from the workdir alone.
  tr = subprocess.run([sys.executable, "-m", "transformer.main", f"--workdir={workdir}",
                       "--mode=translate"], input="three hundred\n\nseven\n", cwd=REPO, env=env,
                      capture_output=True, text=True, timeout=600)
  assert tr.returncode == 0, tr.stderr[-3000:]
  assert len(tr.stdout.splitlines()) == 3 and tr.stdout.splitlines()[1] == ""
  for d in (REPO, os.getcwd(), str(tmp_path)):
    assert not os.path.exists(os.path.join(d, "gs:")), d


def test_unwritable_bucket_is_one_line(gcs):
  env = {**gcs.env, "XLA_FLAGS": FAST_COMPILE}
  proc = run_main(*TINY, "--workdir=gs://no-such-bucket/run", env_extra=env)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert len(lines) == 1 and "gs://no-such-bucket/run" in lines[0], proc.stderr[-3000:]
  assert "could not be reached" not in lines[0]  # the service answered: its own message
  assert "Traceback" not in proc.stderr


def test_unreachable_storage_service_is_one_line_without_retries():
  """A storage endpoint that drops every connection (as a dead network does): the main program
  asks it once, then exits 2 with one line; gcsfs never gets to retry."""
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(16)
  connections = []

  def drop():
    while True:
      try:
        conn, _ = listener.accept()
      except OSError:
        return  # closed at the end of the test
      connections.append(conn)
      conn.close()

  threading.Thread(target=drop, daemon=True).start()
  url = f"http://127.0.0.1:{listener.getsockname()[1]}"
  try:
    proc = run_main(*TINY, "--workdir=gs://no-such-bucket/run",
                    env_extra={**emulator_env(url), "XLA_FLAGS": FAST_COMPILE}, timeout=300)
  except subprocess.TimeoutExpired:
    raise AssertionError(f"the main program did not exit within 300 s; {len(connections)} "
                         f"connections to {url}") from None
  finally:
    listener.close()
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  # A closed connection reads as a close without an answer or as a reset, by the timing.
  reasons = ("the connection was closed without an answer", "Connection reset by peer")
  assert lines in [[f"error: --workdir=gs://no-such-bucket/run: the storage service {url} could "
                    f"not be reached ({reason}); check the network connection and "
                    f"STORAGE_EMULATOR_HOST"] for reason in reasons], proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and "retr" not in proc.stderr.lower(), proc.stderr
  assert len(connections) == 1  # one request, no retry
