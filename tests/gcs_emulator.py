"""Offline Google Cloud Storage for tests: gcp-storage-emulator in a subprocess.

    with gcs_emulator() as gcs:
      subprocess.run([...], env={**os.environ, **gcs.env})   # child sees gs://gcs.bucket
      gcs.path("run", "checkpoints")                           # "gs://<bucket>/run/checkpoints"

The emulator runs as its own process (so that `python -m transformer.main` children can reach it
too) on a free 127.0.0.1 port with in-memory storage. `gcs.env` holds every variable a process
needs so that etils.epath, gcsfs/fsspec, tensorstore (Orbax) and google-cloud-storage talk to it
anonymously and never to real GCS. Several of them are read once per process (see `apply_env`),
so a child must get them at start-up; the test process itself should use the `gcs` fixture in
tests/conftest.py, which also resets the in-process caches. Let children finish inside the
block: a client whose emulator is gone retries for minutes (tensorboardX's gs:// writer uploads
once more at interpreter exit and retries 120 s).
"""

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

DEFAULT_BUCKET = "test-bucket"


@dataclasses.dataclass(frozen=True)
class GcsEmulator:
  bucket: str
  url: str  # e.g. "http://127.0.0.1:40123", no trailing slash
  env: dict[str, str]
  log_path: str  # the emulator's stdout/stderr (one line per request); gone after exit

  def log(self) -> str:
    with open(self.log_path, errors="replace") as f:
      return f.read()

  def path(self, *parts: str) -> str:
    """`gs://<bucket>/<parts...>`."""
    return "/".join([f"gs://{self.bucket}", *(p.strip("/") for p in parts)])


def emulator_env(url: str) -> dict[str, str]:
  """Environment that points every GCS client used here at the emulator at `url`."""
  return {
    # google-cloud-storage and gcsfs: endpoint (scheme included). Both read it per client/request.
    "STORAGE_EMULATOR_HOST": url,
    # gcsfs: anonymous access. fsspec turns FSSPEC_GS_TOKEN into GCSFileSystem(token="anon")
    # (read when fsspec is imported).
    "FSSPEC_GS_TOKEN": "anon",
    # gcsfs >= 2026 otherwise wraps buckets in ExtendedGcsFileSystem, which asks the gRPC
    # Storage Control API for the bucket layout (the emulator has no gRPC; it retries ~minutes).
    # Read when gcsfs is imported.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    # gcsfs: skip the GCE metadata-server probe.
    "NO_GCE_CHECK": "true",
    # etils.epath: use fsspec/gcsfs for gs:// instead of tf.io.gfile (which would go to real GCS).
    # Read once per process on the first gs:// path (functools.cache).
    "EPATH_USE_TF": "false",
    # tensorstore (Orbax array data): endpoint, a fixed bearer token instead of credential
    # discovery, plain HTTP/1.1. Read when the first gcs kvstore is opened.
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator-token",
    "TENSORSTORE_GCS_HTTP_VERSION": "1.1",
    # google-auth / google-cloud-storage: project for anonymous clients; metadata server off-net.
    "GOOGLE_CLOUD_PROJECT": "emulator-project",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "GCE_METADATA_ROOT": "127.0.0.1:9",
    # Never send local requests through a proxy (requests, curl in tensorstore).
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
  }


def _http_ok(url: str) -> bool:
  # No proxies: urllib would otherwise honour HTTP_PROXY for 127.0.0.1 as well.
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  try:
    with opener.open(url, timeout=2) as resp:
      return resp.status == 200
  except (urllib.error.URLError, OSError):
    return False


def _stop(proc: subprocess.Popen) -> None:
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait(timeout=5)


@contextlib.contextmanager
def gcs_emulator(bucket: str = DEFAULT_BUCKET, timeout: float = 30.0) -> Iterator[GcsEmulator]:
  """Runs an in-memory GCS emulator holding an empty `bucket` for the duration of the block.

  Does not modify os.environ; pass `.env` to children (or use the `gcs` pytest fixture). The
  emulator binds a free port itself (no probe-then-bind race). Raises RuntimeError with the
  emulator's output if it does not answer within `timeout` seconds. Stops it on exit, errors
  included.
  """
  if not re.fullmatch(r"[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9]", bucket):
    raise ValueError(f"invalid GCS bucket name {bucket!r}")
  with tempfile.TemporaryDirectory(prefix="gcs_emulator_") as tmp:
    log_path = os.path.join(tmp, "emulator.log")
    port_path = os.path.join(tmp, "port")
    # -P: nothing from tests/ on the emulator's sys.path; the file runs `_serve` below.
    cmd = [sys.executable, "-P", os.path.abspath(__file__), port_path, bucket]
    with open(log_path, "w") as log:
      proc = subprocess.Popen(
        cmd, cwd=tmp, env={**os.environ, "STORAGE_BASE": tmp}, stdin=subprocess.DEVNULL,
        stdout=log, stderr=subprocess.STDOUT,
      )  # fmt: skip
    try:
      url = None
      deadline = time.monotonic() + timeout
      while proc.poll() is None and time.monotonic() < deadline:
        if url is None and os.path.exists(port_path):
          with open(port_path) as f:
            url = f"http://127.0.0.1:{int(f.read())}"
        if url is not None and _http_ok(f"{url}/storage/v1/b/{bucket}"):
          break
        time.sleep(0.05)
      else:
        with open(log_path, errors="replace") as f:
          output = f.read()[-4000:]
        state = "timed out" if proc.poll() is None else f"exited with code {proc.poll()}"
        raise RuntimeError(
          f"GCS emulator never answered ({state}; url {url}; timeout {timeout:.0f}s).\n"
          f"Command: {' '.join(cmd)}\nEmulator output:\n{output}"
        )
      yield GcsEmulator(bucket=bucket, url=url, env=emulator_env(url), log_path=log_path)
    finally:
      _stop(proc)


def apply_env(env: dict[str, str]) -> dict[str, str | None]:
  """Sets `env` in os.environ and resets the per-process caches that read it.

  Returns the previous values, for `restore_env`. Resets: etils.epath's cached EPATH_USE_TF
  decision and its cached fsspec filesystem, fsspec's `gs` token config (FSSPEC_GS_TOKEN is only
  read at `import fsspec`), gcsfs' instance cache (an instance keeps its credentials and listing
  cache, stale after an emulator restart) and Orbax's cached bucket per name. gcsfs reads
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT at `import gcsfs`; if it was imported with it on, gs:// is
  re-registered to the plain GCSFileSystem.
  """
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  _reset_caches()
  return old


def restore_env(old: dict[str, str | None]) -> None:
  for k, v in old.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  _reset_caches()


def _reset_caches() -> None:
  # etils.epath: the EPATH_USE_TF decision and the fsspec filesystem are both cached.
  if "etils.epath" in sys.modules:
    from etils.epath import backend, gpath

    gpath._is_tf_installed.cache_clear()
    backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  # Orbax caches a google-cloud-storage bucket (with its client's endpoint) per bucket name.
  if "orbax.checkpoint" in sys.modules:
    from orbax.checkpoint._src.path import gcs_utils

    gcs_utils.get_bucket.cache_clear()
  if "fsspec" not in sys.modules:
    return  # fsspec reads FSSPEC_GS_TOKEN when it is imported
  import fsspec.config

  gs_conf = fsspec.config.conf.setdefault("gs", {})
  if "FSSPEC_GS_TOKEN" in os.environ:
    gs_conf["token"] = os.environ["FSSPEC_GS_TOKEN"]
  else:
    gs_conf.pop("token", None)
  if "gcsfs" not in sys.modules:
    return
  import gcsfs.core

  if os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "true").lower() not in ("true", "1"):
    for protocol in ("gs", "gcs"):
      if fsspec.get_filesystem_class(protocol) is not gcsfs.core.GCSFileSystem:
        fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
  # Instances keep credentials, a listing cache and an aiohttp session from the last emulator.
  for protocol in ("gs", "gcs"):
    fsspec.get_filesystem_class(protocol).clear_instance_cache()


def _serve(port_path: str, bucket: str) -> None:
  """Emulator process: gcp-storage-emulator in memory on a free port, written to `port_path`.

  Additions to the emulator, for the clients used here:
  * Generation preconditions (`ifGenerationMatch` / `ifGenerationNotMatch`, which the emulator
    ignores) on reads and uploads, and an `x-goog-generation` header on reads. Tensorstore
    revalidates a cached OCDBT manifest with `ifGenerationNotMatch`; without a 304 and that
    header an Orbax save fails at random with "Malformed StorageGeneration".
  * `POST .../o/{src}/moveTo/o/{dst}` (gcsfs' rename). The emulator answers 501, which gcsfs
    retries with backoff for ~33 s per file before it falls back to copy + delete. Served here
    as copy + delete (not atomic, unlike real GCS).
  * A listen backlog of 128 instead of 5: the server is single-threaded and tensorstore opens
    many connections at once.
  It exits when its parent does (e.g. a killed pytest), so it never outlives the tests.
  """
  import http.server
  import logging
  from http import HTTPStatus

  from gcp_storage_emulator import server
  from gcp_storage_emulator.exceptions import NotFound
  from gcp_storage_emulator.handlers import objects

  def generation(storage, bucket_name, name):
    try:
      return storage.get_file_obj(bucket_name, name)["generation"]
    except NotFound:
      return "0"  # GCS: ifGenerationMatch=0 means "does not exist"

  def precondition_failed(request, current):
    """The status for a failed generation precondition, or None."""
    match = request.query.get("ifGenerationMatch")
    if match and match[0] != current:
      return HTTPStatus.PRECONDITION_FAILED
    not_match = request.query.get("ifGenerationNotMatch")
    if not_match and not_match[0] == current:
      return HTTPStatus.NOT_MODIFIED if request.method == "GET" else HTTPStatus.PRECONDITION_FAILED
    return None

  original_download, original_insert = objects.download, objects.insert

  def download(request, response, storage, *args, **kwargs):
    params = request.params
    current = generation(storage, params["bucket_name"], params["object_id"])
    if current != "0":
      failed = precondition_failed(request, current)
      if failed:
        response.status = failed
        return
      response["x-goog-generation"] = current
      response["x-goog-metageneration"] = "1"
    original_download(request, response, storage)

  def insert(request, response, storage, *args, **kwargs):
    if "upload_id" not in request.query:  # not a chunk of a started resumable upload
      name = request.query.get("name", [None])[0]
      data = request.data
      if name is None and isinstance(data, dict):
        name = data.get("meta", data).get("name")
      if name is not None:
        failed = precondition_failed(
          request, generation(storage, request.params["bucket_name"], name)
        )
        if failed:
          response.status = failed
          return
    original_insert(request, response, storage)

  def move(request, response, storage, *args, **kwargs):
    params = request.params  # cached dict: `copy` reads the destination bucket from it
    params["dest_bucket_name"] = params["bucket_name"]
    objects.copy(request, response, storage)
    if response.status == HTTPStatus.OK:
      storage.delete_file(params["bucket_name"], params["object_id"])

  objects.download = download  # also what objects.get calls for ?alt=media
  replace = {original_download: download, original_insert: insert}
  route = r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
  route += r"(?P<dest_object_id>.*[^/]+)$"
  server.HANDLERS = ((route, {"POST": move}),) + tuple(
    (regex, {method: replace.get(f, f) for method, f in handlers.items()})
    for regex, handlers in server.HANDLERS
  )
  http.server.HTTPServer.request_queue_size = 128

  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")  # a line a request
  emulator = server.create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
  emulator.start()  # returns once the HTTP server is bound
  port = emulator._api._httpd.server_address[1]
  with open(port_path + ".tmp", "w") as f:
    f.write(str(port))
  os.replace(port_path + ".tmp", port_path)
  parent = os.getppid()
  while os.getppid() == parent:  # serve until SIGTERM or the parent is gone
    time.sleep(1)
  os._exit(0)  # the server thread is not a daemon


if __name__ == "__main__":
  _serve(*sys.argv[1:])
