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
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Mapping
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
