"""What one training step costs: compilation, memory, sequential loops, time, op profile.

`measure_step` is the measurement of one shape, which benchmarks/train_step.py sets against the
machine's matmul rate; `cost_sweep` is the measurement over sequence lengths n of
experiments/seq_len.py and experiments/claims.py, for the Transformer with each attention
implementation and the LSTM baseline with the same number of parameters, and `cost_tables` /
`plot_cost` are their tables and figures. `op_profile` says where a compiled program's time
goes, from a profiler trace.

Each measurement builds the project's `Trainer`, compiles its train step ahead of time for the
batch shapes (`lower_train_step(shapes).compile()`), reads XLA's memory analysis of the
compiled step (`measure.memory_stats`) and the trip counts of its `while` loops
(`measure.loop_iterations`), then times steps of the compiled program on random batches
(ids in [2, vocab), no padding), each synchronised before its clock stops.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from measuring import measure, report
from transformer.nn.model_family import count_params

TRANSFORMER_KINDS = ("xla", "chunked", "cudnn")
# The LSTM baseline with its attention over the encoder states (the project's default, an
# O(n^2) part), and without it (pure recurrence: the source reaches the decoder only through
# the bridged initial states).
LSTM_KINDS = ("lstm", "lstm_noattn")


def measure_step(config: Any, mc: Any, batch_size: int, src_len: int, tgt_len: int, *,
                 steps: int, warmup: int = 1,
                 should_run: Callable[[dict[str, Any]], str | None] | None = None,
                 devices: Sequence[Any] | None = None, segments: int = 0,
                 profile_steps: int = 0) -> dict[str, Any]:
  """Compiles the train step for [batch, src_len] / [batch, tgt_len]; memory, loops, time.

  `segments` > 0: packed rows of that many segments per side (`measure.random_batch`).

  Unless `steps` is 0 or `should_run(record)` gives a reason not to (kept as
  `timing_skipped`), runs `warmup` untimed and `steps` timed steps: step_s is the best,
  step_cpu_s the least CPU time (all threads of this process) of a timed step,
  step_minor_faults the median minor page faults of a timed step. Then
  `profile_steps` more steps run under the JAX profiler, untimed: `profile` is their
  `op_profile`.
  """
  import jax
  import numpy as np

  from transformer import sharding as sharding_lib
  from transformer.training.trainer import Trainer

  mesh = sharding_lib.make_mesh(config.mesh, devices=devices)
  trainer = Trainer(config, mesh, mc)
  sharding = sharding_lib.batch_sharding(mesh)
  example = measure.random_batch(np.random.default_rng(0), 1, src_len, tgt_len, 3, segments)
  shapes = {k: jax.ShapeDtypeStruct((batch_size, v.shape[1]), np.int32, sharding=sharding)
            for k, v in example.items()}
  compiled, lower_s, xla_s = measure.compile_timed(lambda: trainer.lower_train_step(shapes))
  record: dict[str, Any] = {
    "batch_size": batch_size, "src_len": src_len, "tgt_len": tgt_len, "steps": steps,
    "packed_segments": segments,
    "lower_s": lower_s, "xla_compile_s": xla_s, "compile_s": lower_s + xla_s,
    **measure.memory_stats(compiled),
    **{f"hlo_{k}": v for k, v in measure.loop_iterations(compiled.as_text()).items()},
    "params": count_params(trainer.abstract_state.params),
    "step_s": None, "step_s_median": None, "step_times_s": [], "step_cpu_s": None,
    "step_cpu_s_median": None, "step_minor_faults": None, "first_step_s": None,
    "timing_skipped": None, "profile": None,
  }
  why = should_run(record) if should_run is not None else None
  if steps == 0 or why:
    record["timing_skipped"] = why
    return record
  seed = int(config.seed)
  host = np.random.default_rng(seed)
  # Every batch is on the device before the clock starts: only the step is timed.
  batches = [sharding_lib.local_batch_to_global(
    measure.random_batch(host, batch_size, src_len, tgt_len, mc.vocab_size, segments), mesh)
    for _ in range(warmup + steps)]
  jax.block_until_ready(batches)
  state, metrics, times, cpu, faults = measure.time_steps(
    compiled, trainer.init_state(seed), batches, jax.random.key(seed))
  loss = float(metrics["loss"] / metrics["tokens"])
  if not np.isfinite(loss):
    raise RuntimeError(f"the measured step produced a non-finite loss ({loss})")
  timed, timed_cpu = times[warmup:], cpu[warmup:]
  record.update(step_s=min(timed), step_s_median=statistics.median(timed), step_times_s=timed,
                step_cpu_s=min(timed_cpu), step_cpu_s_median=statistics.median(timed_cpu),
                step_minor_faults=statistics.median_low(faults[warmup:]), first_step_s=times[0],
                last_loss=loss)
  if profile_steps:
    import tempfile

    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        measure.time_steps(compiled, state, [batches[i % len(batches)]
                                             for i in range(profile_steps)], jax.random.key(seed))
      record["profile"] = op_profile(measure.trace_op_seconds(trace_dir), compiled.as_text(),
                                     profile_steps)
  return record


# (category, words of the op's JAX source, any of which puts it there), first match wins. The
# source is the `op_name` of the HLO instruction (of a fusion: of its root), forward and
# backward alike; model parts are named as in model.py.
OP_CATEGORIES = (
  ("output projection (tied embedding or logits layer)", ("embed.attend", "/logits/")),
  ("embedding lookup and its gradient", ("/embed/",)),
  ("dropout (masks and scaling)", ("Dropout", "dropout", "threefry", "random_bits")),
  ("layer norm", ("/norm/", "final_norm")),
  ("residual adds", ("_block/add",)),
  ("feed-forward", ("feed_forward",)),
  ("attention: scores, softmax, weights x values", ("dot_product_attention",)),
  ("attention: Q, K, V, O projections", ("attention",)),
  ("other model ops", ("Transformer",)),
  ("loss: log-softmax, cross-entropy, argmax", ("jvp(",)),
  ("optimizer and metrics: Adam, norms, non-finite guard", ("jit(train_step)/", "state.")),
  ("copies without a source", ("",)),
)


def op_category(op_name: str, categories: Sequence[tuple[str, tuple[str, ...]]] = OP_CATEGORIES
                ) -> str:
  """The first of `categories` (name, words) with a word in an HLO instruction's JAX source;
  the last one's words should catch everything ('')."""
  return next(name for name, words in categories if any(w in op_name for w in words))


def op_profile(op_seconds: dict[str, float], hlo_text: str, steps: int, top: int = 8,
               categories: Sequence[tuple[str, tuple[str, ...]]] = OP_CATEGORIES
               ) -> dict[str, Any]:
  """Where the compiled step's time goes, from a profiler trace (`measure.trace_op_seconds`).

  Keeps the events named after an instruction of the compiled module (`hlo_text`), except
  loops and calls, whose bodies are events of their own. Seconds are per step, summed over
  the threads that ran the op; shares are of their total (which exceeds the step's wall time
  when both cores work). Returns {'op_seconds_per_step', 'top_ops': the `top` costliest
  instructions with their share, shape, source and category, 'categories': every category's
  seconds and share, costliest first}. `categories` sorts the ops (`op_category`).
  """
  instructions = measure.hlo_instructions(hlo_text)
  ops = {name: secs / steps for name, secs in op_seconds.items()
         if name in instructions
         and instructions[name]["opcode"] not in ("while", "call", "conditional")}
  total = sum(ops.values()) or 1.0
  by_category: dict[str, float] = {}
  for name, secs in ops.items():
    category = op_category(instructions[name]["op_name"], categories)
    by_category[category] = by_category.get(category, 0.0) + secs
  top_ops = [{"op": name, "seconds": secs, "share": secs / total,
              "shape": re.sub(r"\{[^}]*\}", "", instructions[name]["shape"]),  # no layouts
              "source": instructions[name]["op_name"],
              "category": op_category(instructions[name]["op_name"], categories)}
             for name, secs in sorted(ops.items(), key=lambda kv: -kv[1])[:top]]
  return {
    "op_seconds_per_step": sum(ops.values()), "steps": steps, "top_ops": top_ops,
    "categories": [{"category": c, "seconds": v, "share": v / total}
                   for c, v in sorted(by_category.items(), key=lambda kv: -kv[1])],
  }


# ----------------------------------------------------------------------------- against n


def model_setup(base: Any, kind: str, max_len: int) -> tuple[Any, Any]:
  """(config, ModelConfig) of one model of the sweep over n, on one device.

  kind: an attention implementation (the Transformer of `base`), 'lstm' (the LSTM with the
  Transformer's parameter count) or 'lstm_noattn' (the same without attention). The data
  vocabulary is set to the model's, and model.max_len to at least `max_len`.
  """
  from transformer.training.validate import model_config

  config = base.copy_and_resolve_references()
  with config.unlocked():
    config.model.max_len = max(int(config.model.max_len), max_len)
    config.data.vocab_size = config.model.vocab_size
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
    if kind in TRANSFORMER_KINDS:
      config.model.kind = "transformer"
      config.model.attention = kind
      if kind == "cudnn" and config.model.dtype in ("auto", "float32"):
        config.model.dtype = "bfloat16"  # cuDNN's fused attention needs 16-bit inputs
    elif kind in LSTM_KINDS:
      config = measure.equal_size_lstm(config, attention=kind == "lstm")
    else:
      raise ValueError(f"unknown model kind {kind!r}: use xla, chunked, cudnn, lstm or "
                       "lstm_noattn")
  return config, model_config(config)


def predict_step_s(measured: list[tuple[int, float]], n: int) -> float | None:
  """Step time at n extrapolated from the last two measured lengths (exponent at least 1)."""
  if not measured:
    return None
  if len(measured) == 1:
    n0, t0 = measured[0]
    return t0 * (n / n0) ** 2
  (n1, t1), (n2, t2) = measured[-2], measured[-1]
  e = max(1.0, math.log(t2 / t1) / math.log(n2 / n1)) if t1 > 0 and t2 > 0 else 2.0
  return t2 * (n / n2) ** e


def default_kinds() -> list[str]:
  """xla and chunked attention (and cudnn on a GPU), then the two LSTMs."""
  import jax

  return ["xla", "chunked", *(["cudnn"] if jax.default_backend() == "gpu" else []), *LSTM_KINDS]


def cost_sweep(base: Any, kinds: Sequence[str], lengths: Sequence[int], batch_size: int,
               steps: int = 2, max_step_s: float = 20.0, max_run_bytes: float = 6e9,
               log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """`measure_step` of every kind at every n (source = target = n tokens), one device.

  Timing is skipped where a step is predicted (from the two previous lengths) to take more
  than `max_step_s`, or would need more than `max_run_bytes`: memory analysis needs
  compilation only, so every length gets its memory.
  """
  import jax

  records = []
  for kind in kinds:
    config, mc = model_setup(base, kind, max(lengths))
    measured: list[tuple[int, float]] = []
    for n in sorted(lengths):
      predicted = predict_step_s(measured, n)

      def skip(rec: dict[str, Any], predicted: float | None = predicted) -> str | None:
        if predicted is not None and predicted > max_step_s:
          return f"predicted step {predicted:.0f} s > {max_step_s:g} s"
        if rec["peak_memory_bytes"] and rec["peak_memory_bytes"] > max_run_bytes:
          return f"needs {rec['peak_memory_bytes'] / 1e9:.1f} GB > {max_run_bytes / 1e9:g} GB"
        return None

      rec = measure_step(config, mc, batch_size, n, n, steps=steps, should_run=skip,
                         devices=jax.devices()[:1])
      rec.update({"n": n, "kind": kind, "model": mc.kind, "d_model": mc.d_model,
                  "attention": mc.attention if mc.kind == "transformer" else None,
                  "layers": mc.num_layers, "dtype": str(mc.compute_dtype),
                  "predicted_step_s": predicted})
      if rec["step_s"] is not None:
        measured.append((n, rec["step_s"]))
      why = rec["timing_skipped"]
      step = "-" if rec["step_s"] is None else f"{rec['step_s'] * 1e3:.1f} ms"
      log(f"[cost] {kind:8s} n={n:5d}: step {step:>10s}  temp "
          f"{rec['temp_memory_bytes'] / 2**20:9.1f} MiB  loops {rec['hlo_loops']:3d} "
          f"iterations {rec['hlo_iterations']:7d}  compile {rec['compile_s']:.1f} s"
          f"{'  (' + why + ')' if why else ''}")
      records.append(rec)
  return records


def _mib(b: int | None, digits: int = 1) -> str:
  return "-" if b is None else f"{b / 2**20:,.{digits}f}"


def _e(v: float | None) -> str:
  return "-" if v is None else f"{v:.2f}"


def models_line(cost: list[dict[str, Any]]) -> str:
  """`kind`: model, width, layers, parameters and dtype of each kind measured."""
  first = {r["kind"]: r for r in reversed(cost)}
  return ", ".join(f"`{k}`: {r['model']} d_model {r['d_model']}, {r['layers']} + "
                   f"{r['layers']} layers, {r['params']:,} parameters, {r['dtype']}"
                   for k, r in reversed(first.items()))


def cost_tables(cost: list[dict[str, Any]], fit_from: int,
                memory_digits: int = 1) -> dict[str, str]:
  """Markdown tables against n: 'time', 'memory', 'loops' and 'exponents' (fitted growth)."""
  def table(label: str, cell: Callable[[dict[str, Any]], str]) -> str:
    ns, kinds, rows = report.grid(cost, "n", "kind", cell)
    return report.markdown_table(["n"] + [f"{k} {label}" for k in kinds],
                                 [[n, *row] for n, row in zip(ns, rows, strict=True)])

  kinds = list(dict.fromkeys(r["kind"] for r in cost))
  fits = {key: measure.exponents(cost, key, fit_from) for key in
          ("step_s", "temp_memory_bytes", "peak_memory_bytes", "hlo_iterations")}
  exponents = report.markdown_table(
    ["model", "time: all n", f"time: n >= {fit_from}", "temp: all n", f"temp: n >= {fit_from}",
     "peak: all n", f"peak: n >= {fit_from}", f"loop iterations: n >= {fit_from}"],
    [[k, *(_e(v) for key in ("step_s", "temp_memory_bytes", "peak_memory_bytes")
           for v in fits[key][k]), _e(fits["hlo_iterations"][k][1])] for k in kinds])
  ns, _, temp = report.grid(cost, "n", "kind", lambda r: _mib(r["temp_memory_bytes"],
                                                               memory_digits))
  _, _, peak = report.grid(cost, "n", "kind", lambda r: _mib(r["peak_memory_bytes"],
                                                              memory_digits))
  memory = report.markdown_table(
    ["n"] + [f"{k} temp (MiB)" for k in kinds] + [f"{k} peak (MiB)" for k in kinds],
    [[n, *t, *p] for n, t, p in zip(ns, temp, peak, strict=True)])
  return {
    "time": table("step (ms)", lambda r: "not timed" if r["step_s"] is None
                  else f"{r['step_s'] * 1e3:,.1f}"),
    "memory": memory,
    "loops": table("loops / iterations", lambda r: f"{r['hlo_loops']} / "
                   f"{r['hlo_iterations']:,}"),
    "exponents": exponents,
  }


def not_timed(cost: list[dict[str, Any]]) -> str:
  """The line listing the steps that were not timed, and why ('' if all were)."""
  skipped = [f"{r['kind']} n={r['n']} ({r['timing_skipped']})" for r in cost
             if r["timing_skipped"]]
  return "\nNot timed: " + "; ".join(skipped) + ".\n" if skipped else ""


# (record key, y scale, y label, title) of the figure panels against n.
PANELS = {
  "step_s": (1e3, "training step (ms)", "step time"),
  "temp_memory_bytes": (2.0**-20, "MiB", "XLA temporary memory of the step"),
  "hlo_iterations": (1.0, "sequential loop iterations per step", "sequential steps (HLO)"),
}


def plot_cost(axes: Sequence[Any], cost: list[dict[str, Any]], keys: Sequence[str]) -> None:
  """One panel per key of PANELS against n (log-log), a line per kind."""
  for ax, key in zip(axes, keys, strict=True):
    scale, ylabel, title = PANELS[key]
    # A step without loops has 0 iterations: drawn just under 1 on the log axis.
    floor = 0.8 if key == "hlo_iterations" else 0.0
    report.plot_series(ax, cost, "n", lambda r, k=key, s=scale, f=floor: None if r[k] is None
                       else max(r[k] * s, f))
    ax.set(ylabel=ylabel, title=title)
  report.finish_axes(axes, "n (tokens per side)", log2_x=True, log_y=True)
