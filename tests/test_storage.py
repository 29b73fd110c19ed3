"""The storage layer on local disk: atomic writes, the workdir check, the workdir lock."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from transformer import storage
from transformer.errors import ConfigError


def test_write_atomic_creates_parents_and_leaves_no_temporary_files(tmp_path):
  path = tmp_path / "a" / "b" / "f.txt"
  storage.write_atomic(path, "one")
  storage.write_atomic(path, b"two")
  assert path.read_text() == "two"
  assert os.listdir(path.parent) == ["f.txt"]
  assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # a normal file's mode, not mkstemp's


@pytest.mark.parametrize("bad", ["/proc/x", "{file}/w"])
def test_check_writable_names_the_path_in_one_line(tmp_path, bad):
  (tmp_path / "file").write_text("x")
  bad = bad.format(file=tmp_path / "file")
  with pytest.raises(ConfigError, match="--workdir=") as info:
    storage.check_writable(bad)
  assert bad in str(info.value) and "\n" not in str(info.value)


def test_check_writable_creates_the_directory(tmp_path):
  path = storage.check_writable(tmp_path / "new" / "dir")
  assert os.path.isdir(path) and os.listdir(path) == []


def write_lock(workdir, **owner):
  record = {"host": socket.gethostname(), "pid": os.getpid(), "token": "other",
            "time": time.time()}
  record.update(owner)
  (workdir / ".lock").write_text(json.dumps(record))


def test_lock_of_a_live_process_on_this_host_is_refused_with_its_owner(tmp_path):
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    write_lock(tmp_path, pid=sleeper.pid)
    with pytest.raises(storage.WorkdirLockedError) as info:
      storage.WorkdirLock(tmp_path / ".lock", settle=0).acquire()
    message = str(info.value)
    assert f"pid {sleeper.pid}" in message and socket.gethostname() in message
    assert "\n" not in message
  finally:
    sleeper.kill()
    sleeper.wait()
  # Its owner is gone now: the lock is taken over.
  with storage.WorkdirLock(tmp_path / ".lock", settle=0) as lock:
    assert json.loads((tmp_path / ".lock").read_text())["token"] == lock.token
  assert not (tmp_path / ".lock").exists()  # released


def test_lock_of_another_host_is_refused_until_its_heartbeat_is_stale(tmp_path):
  write_lock(tmp_path, host="elsewhere", pid=1, time=time.time() - 10)
  with pytest.raises(storage.WorkdirLockedError, match="host elsewhere, pid 1"):
    storage.WorkdirLock(tmp_path / ".lock", settle=0, stale_after=90).acquire()
  write_lock(tmp_path, host="elsewhere", pid=1, time=time.time() - 100)
  lock = storage.WorkdirLock(tmp_path / ".lock", settle=0, stale_after=90).acquire()
  lock.release()


def test_lock_heartbeat_keeps_it_fresh_and_a_second_lock_is_refused(tmp_path):
  lock = storage.WorkdirLock(tmp_path / ".lock", heartbeat=0.05, settle=0).acquire()
  try:
    first = json.loads((tmp_path / ".lock").read_text())["time"]
    time.sleep(0.3)
    assert json.loads((tmp_path / ".lock").read_text())["time"] > first
    with pytest.raises(storage.WorkdirLockedError, match=f"pid {os.getpid()}"):
      storage.WorkdirLock(tmp_path / ".lock", settle=0).acquire()
  finally:
    lock.release()


def test_damaged_lock_file_is_taken_over(tmp_path):
  (tmp_path / ".lock").write_text('{"host": "x", "pi')  # cut short by a kill
  storage.WorkdirLock(tmp_path / ".lock", settle=0).acquire().release()


def test_local_file_lock_excludes_other_processes(tmp_path):
  path = tmp_path / "build.lock"
  code = ("import sys, time; from transformer import storage\n"
          "with storage.local_file_lock(sys.argv[1]):\n"
          "  open(sys.argv[2], 'a').write(f'start {time.time()}\\n'); time.sleep(1.0)\n"
          "  open(sys.argv[2], 'a').write(f'end {time.time()}\\n')\n")
  log = tmp_path / "log"
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(log)], cwd=repo)
           for _ in range(2)]
  for p in procs:
    assert p.wait(timeout=120) == 0
  events = [ln.split()[0] for ln in log.read_text().splitlines()]
  assert events == ["start", "end", "start", "end"]  # never two holders at once


def test_gcs_urls_names_each_path_like_its_flag():
  values = {"--workdir": "gs://b/run", "--config": {"data_dir": None, "data": {
    "cache_dir": "gs://c/cache", "files": ["/local", "gcs://d/x.txt"]}}}
  assert list(storage.gcs_urls(values)) == [
    ("--workdir", "gs://b/run"), ("--config.data.cache_dir", "gs://c/cache"),
    ("--config.data.files[1]", "gcs://d/x.txt")]


@pytest.fixture
def refused_port():
  """A port bound but not listening: a connection to it is refused, and nothing else takes it."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]


@pytest.mark.parametrize("host, why", [("http://127.0.0.1:{port}", "Connection refused"),
                                       ("no-such-host.invalid:80", "DNS lookup failed")])
def test_unreachable_storage_service_is_one_line_naming_the_path(monkeypatch, refused_port,
                                                                 host, why):
  endpoint = host.format(port=refused_port)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
  with pytest.raises(ConfigError) as info:
    storage.check_reachable({"--workdir": "/local/run", "--config": {"data": {
      "cache_dir": "gs://bucket/cache"}}})
  message = str(info.value)
  assert message.startswith("--config.data.cache_dir=gs://bucket/cache: the storage service ")
  assert "could not be reached" in message and why in message and "\n" not in message


def test_any_http_answer_means_reachable_and_local_paths_ask_nothing(monkeypatch,
                                                                      refused_port):
  import http.server
  import threading

  requests = []

  class Forbidden(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server name
      requests.append(self.path)
      self.send_error(403)  # a missing permission is reported by the first real access

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(("127.0.0.1", 0), Forbidden)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{server.server_address[1]}")
    storage.check_reachable({"--workdir": "gs://bucket/run"})
    assert requests == ["/storage/v1/b/bucket?fields=name"]
  finally:
    server.shutdown()
    server.server_close()
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{refused_port}")
  storage.check_reachable({"--workdir": "/local/run", "--config": {"data_dir": None}})
