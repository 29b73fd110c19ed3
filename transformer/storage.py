"""Storage for workdirs and caches: local paths and object stores behind one `epath.Path`.

Every file the project writes under a workdir goes through this module (or through Orbax and
TFDS, which use etils.epath themselves), so `--workdir=gs://bucket/run` works like a local
directory and never creates a local directory named `gs:`.

Object stores have no atomic rename and no append, but a single object write is atomic: a
reader sees the old object or the new one, never half of one. So `write_atomic` writes to a
temporary name and renames locally, and writes the object directly on a store. Locks:

  * `WorkdirLock`: one training run per workdir. A lock file names its owner (host, pid) and
    is refreshed by a heartbeat; a lock whose owner is gone (dead pid on this host, or no
    heartbeat for `stale_after` seconds) is taken over.
  * `local_file_lock`: `fcntl.flock` on a local file, for build steps (corpus, token cache)
    that concurrent processes on one machine must not run twice. The kernel drops the lock
    when its process dies, so a killed build never blocks the next one.

gs:// paths are served by gcsfs (etils.epath with `EPATH_USE_TF=false`, set by the main program
before epath is imported), which also honours `STORAGE_EMULATOR_HOST` for offline tests. gcsfs
retries a failed connection for about two minutes, so the main program first asks the storage
service once (`check_reachable`) and reports an unreachable one in one line at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import json
import os
import socket
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from etils import epath

from transformer.errors import ConfigError, UserError

PathLike = str | os.PathLike | epath.Path
_UMASK = os.umask(0)
os.umask(_UMASK)


def is_remote(path: PathLike) -> bool:
  """True for object-store URLs (`gs://...`, `s3://...`), False for local paths."""
  return "://" in os.fspath(path)


def as_path(path: PathLike) -> epath.Path:
  """An `epath.Path`; local paths are made absolute with `~` expanded."""
  if is_remote(path):
    return epath.Path(os.fspath(path))
  return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def write_atomic(path: PathLike, data: bytes | str) -> None:
  """Writes `data` so that readers never see a partial file (creates parent directories)."""
  path = as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  raw = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(path):
    path.write_bytes(raw)  # One object upload: atomic on GCS and S3.
    return
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=os.fspath(path.parent))
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(raw)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; give it a normal file's mode
    os.replace(tmp, os.fspath(path))
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def check_writable(workdir: PathLike, what: str = "--workdir") -> epath.Path:
  """Creates `workdir` and writes (then deletes) a probe file in it.

  Raises:
    ConfigError: one line naming the path and why, when it cannot be created or written.
  """
  path = as_path(workdir)
  probe = path / f".write-probe-{socket.gethostname()}-{os.getpid()}"
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe.write_text("ok")
    probe.unlink()
  except Exception as e:  # noqa: BLE001 - OSError locally, many kinds on object stores
    raise ConfigError(f"{what}={os.fspath(workdir)} cannot be written: {_reason(e)}") from None
  return path


GCS_SCHEMES = ("gs://", "gcs://")


def gcs_endpoint() -> str:
  """The GCS endpoint gcsfs talks to: `STORAGE_EMULATOR_HOST` (an emulator) if set, else
  https://storage.googleapis.com (or the domain in `GOOGLE_CLOUD_UNIVERSE_DOMAIN`)."""
  url = os.environ.get("STORAGE_EMULATOR_HOST", "")
  if url in ("", "default"):
    return f"https://storage.{os.environ.get('GOOGLE_CLOUD_UNIVERSE_DOMAIN', 'googleapis.com')}"
  return url if url.startswith(("http://", "https://")) else f"http://{url}"


def gcs_urls(values: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
  """(name, url) for every gs:// string in `values`, which maps a name (`--workdir`,
  `--config`) to a path or to nested dicts and lists of values (a config's `to_dict()`); a
  nested value is named like its override, e.g. `--config.data.cache_dir`."""
  for name, value in values.items():
    if isinstance(value, str | os.PathLike) and os.fspath(value).startswith(GCS_SCHEMES):
      yield name, os.fspath(value)
    elif isinstance(value, Mapping):
      yield from gcs_urls({f"{name}.{k}": v for k, v in value.items()})
    elif isinstance(value, list | tuple):
      yield from gcs_urls({f"{name}[{i}]": v for i, v in enumerate(value)})


def check_reachable(values: Mapping[str, Any], timeout: float = 5.0) -> None:
  """Asks the storage service of the gs:// paths in `values` (see `gcs_urls`) once.

  One HTTP request to `gcs_endpoint()`, without retries, proxies (gcsfs uses none) or
  credentials; any HTTP answer, an error status included, means the service is reachable (a
  missing bucket or a denied permission is reported by the first real access). A failed DNS
  lookup, a refused or dropped connection, or no answer within `timeout` seconds is not:
  gcsfs would retry it for about two minutes before failing.

  Raises:
    ConfigError: one line naming the first gs:// path, the endpoint and what failed.
  """
  urls = list(gcs_urls(values))
  if not urls:
    return
  name, url = urls[0]
  endpoint = gcs_endpoint()
  bucket = url.split("://", 1)[1].split("/", 1)[0]
  failure = _ask(f"{endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}?fields=name",
                 timeout)
  if failure is not None:
    raise ConfigError(f"{name}={url}: the storage service {endpoint} could not be reached "
                      f"({failure}); check the network connection"
                      + (" and STORAGE_EMULATOR_HOST" if "STORAGE_EMULATOR_HOST" in os.environ
                         else ""))


def _ask(url: str, timeout: float) -> str | None:
  """Sends one GET to `url`; None if any HTTP answer came back, else why none did.

  Runs in a daemon thread so that a DNS lookup, which has no timeout of its own, cannot hold
  the caller past `timeout`.
  """
  outcome: list[str | None] = []

  def request() -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
      with opener.open(url, timeout=timeout):
        outcome.append(None)
    except urllib.error.HTTPError:
      outcome.append(None)  # An answer: the service is there.
    except urllib.error.URLError as e:
      outcome.append(_connection_failure(e.reason, timeout))
    except (OSError, http.client.HTTPException) as e:
      outcome.append(_connection_failure(e, timeout))

  thread = threading.Thread(target=request, name="storage-probe", daemon=True)
  thread.start()
  thread.join(timeout + 1.0)
  return outcome[0] if outcome else f"no answer within {timeout:.0f} s"


def _connection_failure(e: BaseException | str, timeout: float) -> str | None:
  if isinstance(e, ssl.SSLError):
    return None  # Something answered; the clients' own TLS error is more specific.
  if isinstance(e, socket.gaierror):
    return f"DNS lookup failed: {e.strerror or e}"
  if isinstance(e, TimeoutError):
    return f"no answer within {timeout:.0f} s"
  if isinstance(e, http.client.RemoteDisconnected):
    return "the connection was closed without an answer"
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  return str(e) or type(e).__name__


def _reason(e: BaseException) -> str:
  if isinstance(e, OSError) and e.strerror:
    return e.strerror + (f" ({e.filename})" if e.filename else "")
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


class WorkdirLockedError(UserError):
  """Another live run owns the workdir."""


class WorkdirLock:
  """One live training run per workdir: its lock file (`path`, `workdir.Paths.lock`) names its
  owner.

  The owner rewrites the file every `heartbeat` seconds. Another run refuses to start while
  the owner is alive: on the same host, while its pid exists; on another host, while the
  heartbeat is younger than `stale_after` seconds (a preempted VM's lock goes stale by itself).
  A stale lock is taken over. Acquisition writes the lock and reads it back after a pause, so
  of two runs racing for a stale lock only the last writer proceeds.
  """

  def __init__(self, path: PathLike, heartbeat: float = 20.0, stale_after: float = 90.0,
               settle: float = 0.5):
    self.path = as_path(path)
    self.heartbeat = heartbeat
    self.stale_after = stale_after
    self.settle = settle
    self.token = uuid.uuid4().hex
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _record(self) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
            "time": time.time()}

  def _read(self) -> dict | None:
    try:
      return json.loads(self.path.read_text())
    except FileNotFoundError:
      return None
    except Exception:  # noqa: BLE001 - a lock cut short by a kill: treat as absent
      return None

  def _alive(self, owner: dict) -> bool:
    if owner.get("token") == self.token:
      return True
    if owner.get("host") == socket.gethostname():
      return _pid_alive(int(owner.get("pid", -1)))
    return time.time() - float(owner.get("time", 0)) < self.stale_after

  def acquire(self) -> WorkdirLock:
    owner = self._read()
    if owner is not None and self._alive(owner):
      raise WorkdirLockedError(_owner_message(self.path, owner, self.stale_after))
    if owner is not None:
      age = time.time() - float(owner.get("time", 0))
      from absl import logging

      logging.warning("taking over the lock %s of a run that is gone (host %s, pid %s, "
                      "last heartbeat %.0f s ago)", self.path, owner.get("host"),
                      owner.get("pid"), age)
    write_atomic(self.path, json.dumps(self._record()))
    time.sleep(self.settle)  # Another run taking over at the same moment writes too.
    now = self._read()
    if now is None or now.get("token") != self.token:
      raise WorkdirLockedError(_owner_message(self.path, now or {}, self.stale_after))
    self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
    self._thread.start()
    return self

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat):
      with contextlib.suppress(Exception):
        write_atomic(self.path, json.dumps(self._record()))

  def release(self) -> None:
    """Stops the heartbeat and removes the lock if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
      owner = self._read()
      if owner is not None and owner.get("token") == self.token:
        with contextlib.suppress(Exception):
          self.path.unlink()

  def __enter__(self) -> WorkdirLock:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _pid_alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Exists, owned by another user.
  return True


def _owner_message(path: epath.Path, owner: dict, stale_after: float) -> str:
  return (f"workdir in use: {path} is held by a live run (host {owner.get('host', '?')}, pid "
          f"{owner.get('pid', '?')}); stop it or use another --workdir (a lock without a "
          f"heartbeat for {stale_after:.0f} s is taken over)")


@contextlib.contextmanager
def local_file_lock(path: PathLike) -> Iterator[None]:
  """Holds an exclusive `flock` on the local file `path` (created if needed), blocking."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    while True:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        break
      except OSError as e:  # Interrupted by a signal: try again.
        if e.errno != errno.EINTR:
          raise
    yield
  finally:
    os.close(fd)  # Closing drops the lock.


def wait_for(path: PathLike, timeout: float, what: str, poll: float = 1.0) -> None:
  """Waits until `path` exists (written by another process); after `timeout` seconds raises
  `UserError` naming `what` and the path."""
  path = as_path(path)
  start = time.time()
  while not path.exists():
    if time.time() - start > timeout:
      raise UserError(f"waited {timeout:.0f} s for process 0 to write {what} {path}; "
                      "is it running?")
    time.sleep(poll)


def local_cache_root() -> str:
  """Local directory for copies of remote files that must be memory-mapped."""
  return os.environ.get("TRANSFORMER_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "transformer")
