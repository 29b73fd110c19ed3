"""Measurement helpers shared by the experiments and the benchmarks: parameters, memory, loops,
timing, fits, measuring children.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# ----------------------------------------------------------------------------- arguments


def check_at_least(checks: Iterable[tuple[str, int, int]]) -> None:
  """Raises ConfigError for the first (name, value, minimum) whose value is below its minimum."""
  from transformer.errors import ConfigError

  for name, value, minimum in checks:
    if value < minimum:
      raise ConfigError(f"{name}={value}: must be >= {minimum}")


# ----------------------------------------------------------------------------- rates, sizes


def tree_bytes(path: str) -> int:
  """Bytes of the files under `path` (0 when it does not exist)."""
  return sum(os.path.getsize(os.path.join(root, f))
             for root, _, files in os.walk(path) for f in files)


def measure_matmul_flops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
  """The best FLOP/s of a jitted [n, n] @ [n, n] product in `dtype` on the default device."""
  import jax
  import jax.numpy as jnp

  kx, ky = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (n, n), dtype)
  y = jax.random.normal(ky, (n, n), dtype)
  dot = jax.jit(jnp.dot)
  for _ in range(2):
    dot(x, y).block_until_ready()
  times = []
  for _ in range(max(repeats, 1)):
    t = time.perf_counter()
    dot(x, y).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n**3 / min(times)


# ----------------------------------------------------------------------------- parameters


def param_count(config: Any) -> int:
  """Parameters of a training config's model (`model_family.param_count` of its ModelConfig)."""
  from transformer.nn import model_family
  from transformer.training.validate import model_config

  return model_family.param_count(model_config(config))


def equal_size_lstm(config: Any, attention: bool = True) -> Any:
  """A copy of a Transformer config whose model is the LSTM baseline with the same number of
  parameters (`model_family.lstm_config_for_params`), with or without its attention over the
  encoder."""
  import dataclasses

  from transformer.nn.model import ModelConfig
  from transformer.nn.model_family import lstm_config_for_params, param_count
  from transformer.training.validate import model_config

  transformer = dataclasses.replace(model_config(config), kind="transformer")
  base = dataclasses.replace(transformer, lstm_attention=attention)
  lstm = lstm_config_for_params(param_count(transformer), base)
  out = config.copy_and_resolve_references()
  for field in dataclasses.fields(ModelConfig):
    out.model[field.name] = getattr(lstm, field.name)
  return out


def decode_cache_bytes(mc: Any, n: int, batch: int = 1) -> int:
  """Bytes of the incremental-decoding cache for `batch` sentences of n source / n output
  tokens (from `jax.eval_shape`: the Transformer's keys and values, the LSTM's states)."""
  import jax
  import numpy as np

  from transformer.decoding.translate import init_cache

  shapes = jax.eval_shape(lambda: init_cache(mc, batch, n, n))
  return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in jax.tree.leaves(shapes))


# ----------------------------------------------------------------------------- batches, memory


def random_batch(rng: Any, batch_size: int, src_len: int, tgt_len: int, vocab_size: int,
                 segments: int = 0) -> dict[str, Any]:
  """Host batch of random ids in [2, vocab) (no padding, no EOS): int32 [B, S] and [B, T].

  With `segments` > 0, every row is packed: that many segments of equal length per side, with
  the segment ids and positions of transformer/data/packing.py.
  """
  import numpy as np

  batch = {
    "inputs": rng.integers(2, vocab_size, size=(batch_size, src_len)).astype(np.int32),
    "targets": rng.integers(2, vocab_size, size=(batch_size, tgt_len)).astype(np.int32),
  }
  for side, n in (("inputs", src_len), ("targets", tgt_len)):
    if segments:
      segment = 1 + np.arange(n) * segments // n
      start = np.searchsorted(segment, segment)  # first position of each position's segment
      batch[f"{side}_segment_ids"] = np.tile(segment, (batch_size, 1)).astype(np.int32)
      batch[f"{side}_position"] = np.tile(np.arange(n) - start, (batch_size, 1)).astype(np.int32)
  return batch


def memory_stats(compiled: Any) -> dict[str, int | None]:
  """Per-device byte counts from XLA's memory analysis of a compiled program.

  temp_memory_bytes: XLA's temporary buffers (activations kept for the backward pass,
  gradients, workspace), arguments and outputs excluded. peak_memory_bytes: arguments +
  outputs - aliased + temp, all live at once: an upper bound of what the program holds.
  xla_peak_memory_bytes: `peak_memory_in_bytes` as XLA reports it (on XLA:CPU about the
  arguments only, so not used for the peak). All None where the backend does not report it.
  """
  keys = (
    "temp_memory_bytes",
    "peak_memory_bytes",
    "xla_peak_memory_bytes",
    "argument_memory_bytes",
    "output_memory_bytes",
    "alias_memory_bytes",
  )
  m = compiled.memory_analysis()
  if m is None:  # some backends do not report it
    return dict.fromkeys(keys)
  args, out, alias, temp = (
    int(m.argument_size_in_bytes),
    int(m.output_size_in_bytes),
    int(m.alias_size_in_bytes),
    int(m.temp_size_in_bytes),
  )
  xla_peak = getattr(m, "peak_memory_in_bytes", None)
  values = (
    temp,
    args + out - alias + temp,
    None if xla_peak is None else int(xla_peak),
    args,
    out,
    alias,
  )
  return dict(zip(keys, values, strict=True))


# ----------------------------------------------------------------------------- timing


def compile_timed(lower: Callable[[], Any]) -> tuple[Any, float, float]:
  """(compiled program, lowering seconds, XLA compilation seconds) of `lower()`'s program."""
  t0 = time.perf_counter()
  lowered = lower()
  t1 = time.perf_counter()
  compiled = lowered.compile()
  return compiled, t1 - t0, time.perf_counter() - t1


def time_interleaved(fns: dict[Any, Callable[[int], Any]], rounds: int, warmup: int = 0,
                     log: Callable[[str], None] | None = None
                     ) -> tuple[dict[Any, list[float]], dict[Any, list[Any]]]:
  """Round i calls every `fns[k](i)` one after the other, so that a change in the load of a
  shared machine falls on all alike; each call must return its result ready (on the host).

  Returns the seconds of each k's calls in the rounds after the first `warmup`, and every
  round's results.
  """
  times: dict[Any, list[float]] = {k: [] for k in fns}
  outputs: dict[Any, list[Any]] = {k: [] for k in fns}
  for i in range(rounds):
    for k, fn in fns.items():
      t = time.perf_counter()
      outputs[k].append(fn(i))
      if i >= warmup:
        times[k].append(time.perf_counter() - t)
    if i >= warmup and log is not None:
      log(f"round {i - warmup + 1}/{rounds - warmup}: " + ", ".join(
        f"{' '.join(map(str, k)) if isinstance(k, tuple) else k} {v[-1]:.3f} s"
        for k, v in times.items()))
  return times, outputs


def minor_faults() -> int:
  """Minor page faults of this process so far: pages the kernel mapped (and zeroed) on first
  touch. Memory that a step frees to the OS and maps again faults in every step."""
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_steps(step: Callable[..., tuple[Any, Any]], state: Any, batches: Sequence[Any],
               rng: Any) -> tuple[Any, Any, list[float], list[float], list[int]]:
  """Runs `state, metrics = step(state, batch, rng)` over `batches`, one after the other.

  Each step is synchronised (`block_until_ready`) before its clocks stop. Returns the last
  state and metrics, and the wall and CPU (all threads of this process) seconds and the minor
  page faults of each step; the caller drops the warm-up steps.
  """
  import jax

  metrics = None
  times, cpu_times, faults = [], [], []
  for batch in batches:
    f = minor_faults()
    c = time.process_time()
    t = time.perf_counter()
    state, metrics = step(state, batch, rng)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t)
    cpu_times.append(time.process_time() - c)
    faults.append(minor_faults() - f)
  return state, metrics, times, cpu_times, faults


def run_json(cmd: Sequence[str], timeout: float | None = None,
             env: dict[str, str] | None = None) -> dict[str, Any]:
  """The last JSON line a measuring child prints, with `wall_s` and the load at its start.

  Raises RuntimeError naming the command and the last line of its stderr when it fails,
  prints no JSON line or runs past `timeout` seconds.
  """
  import json
  import os
  import subprocess

  load, t0 = os.getloadavg()[0], time.time()
  try:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"over the {timeout:.0f} s limit: {' '.join(cmd)}") from e
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
  if proc.returncode or not lines:
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"exit {proc.returncode}: {tail[:300]} ({' '.join(cmd)})")
  return {**json.loads(lines[-1]), "wall_s": time.time() - t0, "load_at_start": load}


class PeakRSS:
  """Samples this process's resident memory in a thread; `take()` returns the peak since the
  last `take()` (in bytes)."""

  def __init__(self, interval: float = 0.05):
    import threading

    import psutil

    self._proc = psutil.Process()
    self._peak = self._proc.memory_info().rss
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
    self._thread.start()

  def _run(self, interval: float) -> None:
    while not self._stop.wait(interval):
      rss = self._proc.memory_info().rss
      with self._lock:
        self._peak = max(self._peak, rss)

  def take(self) -> int:
    rss = self._proc.memory_info().rss
    with self._lock:
      peak, self._peak = max(self._peak, rss), rss
    return peak

  def close(self) -> None:
    self._stop.set()
    self._thread.join()


# ----------------------------------------------------------------------------- op profiles


# An instruction of a compiled HLO module: `%name = shape opcode(...` and its op_name metadata.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_instructions(hlo_text: str) -> dict[str, dict[str, str]]:
  """Every instruction of a compiled HLO module (its `as_text()`), by name: its opcode, result
  shape and the JAX source it came from (`op_name` metadata, '' when absent)."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m:
      source = _OP_NAME.search(line)
      out[m.group(1)] = {"opcode": m.group(3), "shape": m.group(2),
                         "op_name": source.group(1) if source else ""}
  return out


def trace_op_seconds(trace_dir: str) -> dict[str, float]:
  """Seconds per event name, summed over all threads, in the perfetto trace that
  `jax.profiler.trace(trace_dir, create_perfetto_trace=True)` wrote (the newest one).

  On XLA:CPU every executed HLO instruction (a fusion, a dot, a copy) is an event named after
  it; Python frames and runtime events are there too, under other names.
  """
  import glob
  import gzip
  import json
  import os

  paths = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
  if not paths:
    raise FileNotFoundError(f"no perfetto trace under {trace_dir}")
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  seconds: dict[str, float] = {}
  for e in events:
    if e.get("ph") == "X":
      seconds[e["name"]] = seconds.get(e["name"], 0.0) + e.get("dur", 0) * 1e-6
  return seconds


# ----------------------------------------------------------------------------- HLO loops


_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\([^)]*\)|\(.*\))?.*\{\s*$")
_WHILE = re.compile(r"\bwhile\(.*?body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?')
_CALLEE = re.compile(
  r"\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def loop_iterations(hlo_text: str) -> dict[str, Any]:
  """Sequential loop iterations in a compiled HLO module (its `as_text()`).

  Every `while` runs its body `known_trip_count` times one after the other; a loop inside
  another's body runs that often per outer iteration. Returns {'loops': number of while ops,
  'iterations': total sequential iterations (outer trip counts multiplied in), 'unknown':
  loops without a known trip count (counted once), 'trip_counts': sorted list}.
  """
  computations: dict[str, list[str]] = {}
  entry = None
  current = None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if current is None:
      m = _COMPUTATION.match(line)
      if m and "=" not in stripped.split("(")[0]:
        current = m.group(1)
        computations[current] = []
        if stripped.startswith("ENTRY"):
          entry = current
      continue
    if stripped == "}":
      current = None
      continue
    computations[current].append(stripped)

  loops: list[tuple[str, int | None, str]] = []  # (computation holding it, trips, body)
  edges: dict[str, list[tuple[str, bool, str]]] = {c: [] for c in computations}
  for name, lines in computations.items():
    for ln in lines:
      w = _WHILE.search(ln)
      trip = None
      if w:
        t = _TRIP.search(ln)
        trip = int(t.group(1)) if t else None
        loops.append((name, trip, w.group(1)))
      for callee in _CALLEE.findall(ln):
        is_body = bool(w) and callee == w.group(1)
        edges[name].append((callee, is_body, ln))
      for group in _BRANCHES.findall(ln):
        for callee in re.findall(r"%?([\w.\-]+)", group):
          edges[name].append((callee, False, ln))

  # Multiplicity of each computation: how many times it runs per step (outer trips multiplied).
  mult: dict[str, int] = {}

  def visit(name: str, factor: int, depth: int = 0) -> None:
    if depth > 64 or name not in computations:
      return
    mult[name] = mult.get(name, 0) + factor
    for callee, is_body, ln in edges.get(name, []):
      trip = 1
      if is_body:
        t = _TRIP.search(ln)
        trip = int(t.group(1)) if t else 1
      visit(callee, factor * trip, depth + 1)

  visit(entry or next(iter(computations), ""), 1)
  total = 0
  unknown = 0
  for holder, trip, _ in loops:
    runs = mult.get(holder, 0)
    if trip is None:
      unknown += 1
      total += runs
    else:
      total += runs * trip
  return {
    "loops": len(loops),
    "iterations": total,
    "unknown": unknown,
    "trip_counts": sorted(t for _, t, _ in loops if t is not None),
  }


# ----------------------------------------------------------------------------- growth fits


def fit_exponent(ns: Sequence[float], ys: Sequence[float | None]) -> float | None:
  """Least-squares slope of log(y) against log(n) over the points with y > 0 (None if < 2)."""
  pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys, strict=True) if y and y > 0]
  if len(pts) < 2:
    return None
  mx = sum(x for x, _ in pts) / len(pts)
  my = sum(y for _, y in pts) / len(pts)
  sxx = sum((x - mx) ** 2 for x, _ in pts)
  if sxx == 0:
    return None
  return sum((x - mx) * (y - my) for x, y in pts) / sxx


def exponents(records: list[dict[str, Any]], key: str,
              fit_from: int) -> dict[str, tuple[float | None, float | None]]:
  """Per kind: slope of log(key) on log(n) over all n and over n >= fit_from.

  `records` are dicts with 'kind', 'n' and `key` (step_cost.cost_sweep's records).
  """
  out = {}
  for kind in dict.fromkeys(r["kind"] for r in records):
    rs = [r for r in records if r["kind"] == kind]
    tail = [r for r in rs if r["n"] >= fit_from]
    out[kind] = (
      fit_exponent([r["n"] for r in rs], [r[key] for r in rs]),
      fit_exponent([r["n"] for r in tail], [r[key] for r in tail]),
    )
  return out
