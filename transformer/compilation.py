"""Compilation: the persistent cache of compiled programs, compiling ahead of time, and counting
compiles.

- `use_persistent_cache(dir)`: JAX's persistent compilation cache in a local directory (by
  default `<local cache root>/jax_compilation_cache`, beside the token cache's local copies),
  so that a restart (a resumed run, a preempted VM with the same disk) loads the compiled
  training step instead of compiling it again. A cache entry's key includes the program, the
  JAX version, the backend and the compile options, so a stale entry is never used.
- `compile_all(lowered)`: compiles lowered programs, in a few threads where the host has the
  cores (XLA releases the GIL while it compiles), and logs each one's time and whether it came
  from the persistent cache.
- `CompileCounter`: counts the XLA compiles (and persistent-cache hits) of this process while
  it is open, from JAX's monitoring events.
- `Executables`: compiled programs kept whole (`jax.experimental.serialize_executable`) beside
  the persistent cache, so that a later process loads a program without tracing it: JAX's own
  cache needs the program traced and lowered to find its key, which for a beam search costs
  about as much as the load. The key is everything the program depends on (`executable_key`),
  the project's source code included.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import pickle
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
from absl import logging

from transformer import storage
from transformer.errors import ConfigError

# Programs that compile faster than this are not written to the cache: the training, evaluation
# and decoding programs all take longer (a small model's evaluation step about half a second on
# a 2-core CPU, so a 0.5 s limit left some out), the many tiny eager programs (a few ms each)
# would only add files. JAX's own default (1 s) would leave out more. The environment variable
# JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS wins.
MIN_COMPILE_TIME_S = 0.1
# JAX's monitoring events: every XLA compile (a persistent-cache load included), and cache hits.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def default_cache_dir() -> str:
  """`<storage.local_cache_root()>/jax_compilation_cache`: local even for a gs:// workdir."""
  return os.path.join(storage.local_cache_root(), "jax_compilation_cache")


def use_persistent_cache(cache_dir: str | None) -> str | None:
  """Points JAX's persistent compilation cache at `cache_dir`; call before the first compile.

  Args:
    cache_dir: a directory (created if needed); None: `default_cache_dir()`; '': no cache.

  Returns:
    The directory in use, or None when the cache is off. A directory that cannot be created or
    written is a logged warning, and the run goes on without the cache.
  """
  path = default_cache_dir() if cache_dir is None else cache_dir
  if path:
    try:
      path = os.fspath(storage.check_writable(path, "--config.compilation_cache_dir"))
    except ConfigError as e:
      logging.warning("%s; compiling without the persistent compilation cache", e)
      path = None
  if path and "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
  if jax.config.jax_compilation_cache_dir != (path or None):
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", path or None)
    # JAX decides once per process whether it uses the cache: make it decide again.
    compilation_cache.reset_cache()
  if path:
    logging.info("Persistent compilation cache: %s", path)
  return path or None


class CompileCounter:
  """Counts XLA compiles and persistent-cache hits while open (`with CompileCounter() as c`).

  Hits are kept per thread as well (`hits_in(thread_id)`), so a thread that compiles one
  program at a time can tell whether its program came from the cache.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._compiles: collections.Counter = collections.Counter()
    self._hits: collections.Counter = collections.Counter()

  def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
    if event == COMPILE_EVENT:
      with self._lock:
        self._compiles[threading.get_ident()] += 1

  def _on_event(self, event: str, **kwargs: Any) -> None:
    if event == CACHE_HIT_EVENT:
      with self._lock:
        self._hits[threading.get_ident()] += 1

  @property
  def compiles(self) -> int:
    """XLA compiles so far, persistent-cache loads included."""
    with self._lock:
      return sum(self._compiles.values())

  @property
  def cache_hits(self) -> int:
    with self._lock:
      return sum(self._hits.values())

  def hits_in(self, thread_id: int) -> int:
    with self._lock:
      return self._hits[thread_id]

  def __enter__(self) -> CompileCounter:
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    jax.monitoring.register_event_listener(self._on_event)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_duration_listener(self._on_duration)
    jax.monitoring.unregister_event_listener(self._on_event)


def compile_threads(programs: int) -> int:
  """Threads for compiling `programs` programs at once: one per 4 cores, at least one.

  XLA compiles a program with threads of its own, so on a small host several compiles at once
  only compete for the same cores (on 2 cores, 4 threads were no faster than one:
  `benchmarks.pipeline --compile_threads`); a many-core host compiles in parallel.
  """
  return max(1, min(programs, (os.cpu_count() or 1) // 4))


def compile_all(lowered: Mapping[str, Callable[[], Any]],
                threads: int | None = None) -> dict[str, Any]:
  """Compiles programs ahead of time and logs each one's compile time.

  Args:
    lowered: name -> a function returning the lowered program (`jitted.lower(...)`); lowering
      traces Python, so it runs in this thread, in the caller's mesh and axis-rule context.
    threads: compile threads (default `compile_threads`).

  Returns:
    name -> compiled program (`jax.stages.Compiled`).
  """
  if not lowered:
    return {}
  start = time.time()
  programs = {name: lower() for name, lower in lowered.items()}
  lower_s = time.time() - start
  threads = threads or compile_threads(len(programs))
  with CompileCounter() as counter:

    def compile_one(item: tuple[str, Any]) -> tuple[str, Any, float, bool]:
      name, program = item
      hits, t = counter.hits_in(threading.get_ident()), time.time()
      compiled = program.compile()
      loaded = counter.hits_in(threading.get_ident()) > hits
      return name, compiled, time.time() - t, loaded

    if threads == 1:
      results = [compile_one(item) for item in programs.items()]
    else:
      with ThreadPoolExecutor(threads, thread_name_prefix="compile") as pool:
        results = list(pool.map(compile_one, programs.items()))
  for name, _, seconds, loaded in results:
    logging.info("Compiled the %s in %.1f s%s", name, seconds,
                 " (loaded from the persistent compilation cache)" if loaded else "")
  logging.info("Compiled %d programs before the first step: lowering %.1f s, compiling %.1f s "
               "(%d thread%s); %d loaded from the persistent compilation cache", len(results),
               lower_s, time.time() - start - lower_s, threads, "" if threads == 1 else "s",
               sum(loaded for *_, loaded in results))
  return {name: compiled for name, compiled, _, _ in results}


EXECUTABLES_DIR = "executables"


def beside_persistent_cache(name: str, cache: str | None = None) -> str | None:
  """`<cache>/<name>`: where a process keeps something for the next one (compiled programs,
  restored parameters, the model's layout) beside the persistent compilation cache `cache`
  (default: JAX's, where in use). None without a cache, on a remote one (what is kept there is
  read and written as local files), or in a run of several processes (each holds its part)."""
  cache = cache or jax.config.jax_compilation_cache_dir
  if not cache or storage.is_remote(cache) or jax.process_count() != 1:
    return None
  return os.path.join(cache, name)


_COMPILE_LOCK = threading.Lock()


@functools.cache
def code_version() -> str:
  """SHA-256 of the package's Python sources: a kept executable of other code is never used."""
  root = os.path.dirname(os.path.abspath(__file__))
  h = hashlib.sha256()
  for directory, _, names in sorted(os.walk(root)):
    for name in sorted(n for n in names if n.endswith(".py")):
      path = os.path.join(directory, name)
      h.update(os.path.relpath(path, root).encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def _abstract(x: Any) -> str:
  sharding = getattr(x, "sharding", None)
  return f"{getattr(x, 'shape', ())}:{getattr(x, 'dtype', type(x).__name__)}:{sharding}"


@functools.cache
def _host_identity() -> str:
  """What every kept program of this process depends on besides its own settings and
  arguments: the devices, the backend, JAX and jaxlib, the CPU's flags, the code, XLA's flags
  (computed once: programs are looked up at every batch)."""
  import jaxlib

  devices = jax.devices()
  flags = ""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      flags = next((line for line in f if line.startswith("flags")), "")
  return json.dumps({
    "devices": [(d.id, d.platform, d.device_kind) for d in devices],
    "backend": [devices[0].client.platform, devices[0].client.platform_version],
    "versions": [jax.__version__, jaxlib.__version__], "machine": platform.machine(),
    "cpu": hashlib.sha256(flags.encode()).hexdigest(), "code": code_version(),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }, sort_keys=True)


def executable_key(name: str, parts: Any, args: Sequence[Any]) -> str:
  """A hash of everything a compiled program depends on: its name and `parts` (the settings it
  was built from, as text), the arguments' shapes, dtypes and shardings, the devices, the
  JAX and jaxlib versions, the backend, the host's CPU (XLA:CPU compiles for its features) and
  the project's code."""
  text = json.dumps({
    "name": name, "parts": str(parts),
    "args": [_abstract(x) for x in jax.tree.leaves(args)],
    "tree": str(jax.tree.structure(args)), "host": _host_identity(),
  }, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def _compile_afresh(jitted: Any, args: Sequence[Any]) -> tuple[Any, bool]:
  """`jitted` compiled for `args` with JAX's persistent cache off (JAX decides once per
  process whether it uses the cache, so the decision is reset around the compile); returns the
  program and whether it was really compiled, not loaded from that cache."""
  from jax.experimental.compilation_cache import compilation_cache

  with _COMPILE_LOCK, CompileCounter() as counter:
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
      program = jitted.lower(*args).compile()
    finally:
      jax.config.update("jax_enable_compilation_cache", enabled)
      compilation_cache.reset_cache()
    return program, counter.cache_hits == 0


class Executables:
  """Compiled programs of this process by key, each loaded from `directory` when a former
  process kept it there, else compiled (its lowering from the persistent cache if it is there)
  and kept. `directory` None: compiled in memory only.

  A kept program that cannot be read (another jaxlib wrote it, a damaged file) is compiled
  again, with a warning; a program that cannot be written costs only the next start's time.
  """

  def __init__(self, directory: str | None):
    self.directory = directory
    self._programs: dict[str, Any] = {}
    self._lock = threading.Lock()
    self.loaded = 0
    self.compiled = 0
    self._from_disk: set[str] = set()  # keys of the programs loaded from `directory`

  @classmethod
  def beside_persistent_cache(cls) -> Executables:
    """Kept in `<persistent compilation cache>/executables` when that cache is in use, in a
    single-process run (the programs of several processes, over every host's devices, are
    left to JAX's own cache)."""
    return cls(beside_persistent_cache(EXECUTABLES_DIR))

  def get(self, name: str, parts: Any, jitted: Any, args: Sequence[Any]) -> Any:
    """The compiled `jitted` for `args` (concrete arrays or `jax.ShapeDtypeStruct`s)."""
    return self._get(executable_key(name, parts, args), name, jitted, args)

  def _get(self, key: str, name: str, jitted: Any, args: Sequence[Any]) -> Any:
    with self._lock:
      program = self._programs.get(key)
    if program is not None:
      return program
    program = self._load(key)
    if program is None:
      if self.directory is None:
        program = jitted.lower(*args).compile()
      else:
        # Compiled afresh: an executable that JAX loaded from its persistent cache serializes
        # without its kernels (jaxlib 0.10 on CPU: "Function ... not found" when run after
        # loading), so the kept copy must come from a real compile.
        program, fresh = _compile_afresh(jitted, args)
        if fresh:
          self._keep(key, program)
      self.compiled += 1
    else:
      self.loaded += 1
      self._from_disk.add(key)
      logging.info("loaded the compiled %s program %s from %s", name, key, self.directory)
    with self._lock:
      self._programs[key] = program
    return program

  def run(self, name: str, parts: Any, jitted: Any, args: Sequence[Any]) -> Any:
    """`get(...)(*args)`. A kept program that fails to run (a jaxlib whose executables do not
    survive serialization, a damaged file that still loaded) is a warning: it is dropped,
    compiled afresh and run again. So a program loaded from `directory` is waited for the
    first time it runs (`jax.block_until_ready`); every other call returns as soon as it is
    dispatched, so that the caller can prepare the next call while this one runs."""
    key = executable_key(name, parts, args)
    program = self._get(key, name, jitted, args)
    if key not in self._from_disk:
      return program(*args)
    try:
      out = jax.block_until_ready(program(*args))
      with self._lock:
        self._from_disk.discard(key)  # it runs: later calls need not wait
      return out
    except jax.errors.JaxRuntimeError as e:
      logging.warning("compiling again: the kept program %s failed to run: %s", key,
                      str(e).splitlines()[0])
      path = self._path(key)
      if path is not None and os.path.exists(path):
        os.remove(path)
      with self._lock:
        self._programs.pop(key, None)
        self._from_disk.discard(key)
      program, fresh = _compile_afresh(jitted, args)
      if fresh:
        self._keep(key, program)
      with self._lock:
        self._programs[key] = program
      return jax.block_until_ready(program(*args))

  def _path(self, key: str) -> str | None:
    return None if self.directory is None else os.path.join(self.directory, f"{key}.pkl")

  def _load(self, key: str) -> Any:
    from jax.experimental import serialize_executable

    path = self._path(key)
    if path is None or not os.path.exists(path):
      return None
    try:
      with open(path, "rb") as f:
        blob, in_tree, out_tree = pickle.load(f)
      return serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
    except Exception as e:  # noqa: BLE001 - any unreadable entry is compiled again
      logging.warning("compiling again: the kept program %s cannot be loaded: %s", path, e)
      return None

  def _keep(self, key: str, program: Any) -> None:
    from jax.experimental import serialize_executable

    path = self._path(key)
    if path is None:
      return
    # A program on part of the devices comes back from serialization expecting all of them
    # (jaxlib 0.10): only programs over every device are kept.
    shardings = jax.tree.leaves(program.input_shardings)
    if any(len(s.device_set) != jax.device_count() for s in shardings):
      return
    try:
      data = pickle.dumps(serialize_executable.serialize(program))
      os.makedirs(self.directory, exist_ok=True)
      storage.write_atomic(path, data)
    except Exception as e:  # noqa: BLE001 - a program that cannot be kept is compiled next time
      logging.warning("could not keep the compiled program in %s: %s", path, e)
