"""Gradient accumulation (`config.grad_accum_steps` = k): the train step's memory and time.

    python -m benchmarks.accum_memory

Memory: the train step of `--config` (default: configs/wmt.py:base, vocabulary 37,000) for one
batch of `--rows` x `--length` tokens per side (96 x 256 = 24,576, about the paper's 25,000),
compiled ahead of time on one device for each k of `--memory_k`, never run
(`step_cost.measure_step` with no steps): XLA's memory analysis of the compiled step
(`measure.memory_stats`), temp bytes (activations kept for the backward pass, gradients and
their accumulators, workspace) and the peak (arguments + outputs - aliased + temp).

Time: the step of `--time_config` (default: configs/numbers.py, a small model) on its packed
batch shape (rows = data.tokens_per_batch // the longer packed length; with data.packing off,
the largest bucket on both sides) on this host's first device for each k of `--time_k`. After
one untimed round (compiling), every round runs `--steps_per_round` steps of each k in turn
(`measure.time_interleaved`), so that the load of a shared machine falls on all alike; the
ratios to k = 1 are of the median round. Each k trains from the same state on the same
random batches, and the report gives how far its losses are from k = 1's.

Fields of either model can be overridden when its file is given, e.g.
`--config=configs/wmt.py:base --config.model.dropout_rate=0`. Writes `--out`.md and .json.
"""

from __future__ import annotations

import statistics
from typing import Any

from measuring import measure, report, step_cost
from transformer.errors import UserError, fail, flags_parser


def one_device_config(config: Any, k: int) -> Any:
  """A copy of `config` on one device with grad_accum_steps = k (no data: the data vocabulary
  follows the model's)."""
  out = config.copy_and_resolve_references()
  out.mesh.data, out.mesh.fsdp, out.mesh.tensor = 1, 1, 1
  out.data.vocab_size = out.model.vocab_size
  out.grad_accum_steps = k
  return out


def check_ks(name: str, ks: list[int]) -> None:
  measure.check_at_least((f"{name} (each)", k, 1) for k in ks)


def memory_by_k(config: Any, rows: int, length: int, ks: list[int]) -> list[dict[str, Any]]:
  """Per k: micro-batch rows, XLA's memory analysis and the compile time of the train step for
  [rows, length] on both sides, on one device, compiled only."""
  import jax

  from transformer.training.validate import validate

  measure.check_at_least((("--rows", rows, 1), ("--length", length, 2)))
  check_ks("--memory_k", ks)
  configs = {k: one_device_config(config, k) for k in ks}
  models = {k: validate(c, 1) for k, c in configs.items()}  # every k, before any work
  out = []
  for k in ks:
    r = step_cost.measure_step(configs[k], models[k], rows, length, length, steps=0,
                               devices=jax.devices()[:1])
    out.append({"k": k, "micro_batch_rows": -(-rows // k), "rows": rows, "length": length,
                "compute_dtype": str(models[k].compute_dtype),
                **{key: r[key] for key in ("temp_memory_bytes", "peak_memory_bytes",
                                           "argument_memory_bytes", "output_memory_bytes",
                                           "alias_memory_bytes", "compile_s", "params")}})
    print(f"memory k={k}: temp {r['temp_memory_bytes'] / 2**30:.2f} GiB, peak "
          f"{r['peak_memory_bytes'] / 2**30:.2f} GiB, compile {r['compile_s']:.0f} s",
          flush=True)
  return out


def batch_shape(config: Any) -> tuple[int, int, int, int]:
  """(rows, source length, target length, packed segments per row) of a training batch of
  `config`: packed rows as data.packing plans them, or rows of the largest bucket."""
  from transformer.errors import ConfigError

  d = config.data
  fields = ("packed_source_len", "packed_target_len") if d.packing else ("bucket_lengths",)
  for field in fields:
    if d[field] == "auto":  # derived from a corpus; none is read here
      example = "[32,64]" if field == "bucket_lengths" else "64"
      raise ConfigError(f"--time_config: data.{field}='auto' needs the corpus; set it, e.g. "
                        f"--time_config.data.{field}={example}")
  if d.packing:
    src, tgt = int(d.packed_source_len), int(d.packed_target_len)
    return max(1, int(d.tokens_per_batch) // max(src, tgt)), src, tgt, 2
  length = int(d.bucket_lengths[-1])
  return max(1, int(d.tokens_per_batch) // length), length, length, 0


def time_by_k(config: Any, ks: list[int], rounds: int,
              steps_per_round: int) -> list[dict[str, Any]]:
  """Per k: step times (s) of the interleaved rounds and the losses, on one device."""
  import jax
  import numpy as np

  from transformer import sharding as sharding_lib
  from transformer.training.trainer import Trainer
  from transformer.training.validate import validate

  measure.check_at_least((("--rounds", rounds, 1), ("--steps_per_round", steps_per_round, 1)))
  check_ks("--time_k", ks)
  rows, src, tgt, segments = batch_shape(config)
  host = np.random.default_rng(int(config.seed))
  vocab = int(config.model.vocab_size)
  batches = [measure.random_batch(host, rows, src, tgt, vocab, segments)
             for _ in range((rounds + 1) * steps_per_round)]
  runs = {}
  for k in ks:
    c = one_device_config(config, k)
    mesh = sharding_lib.make_mesh(c.mesh, jax.devices()[:1])
    trainer = Trainer(c, mesh, validate(c, 1))
    runs[k] = {"trainer": trainer, "state": trainer.init_state(int(c.seed)), "losses": [],
               "batches": [sharding_lib.local_batch_to_global(b, mesh) for b in batches]}
  rng = jax.random.key(int(config.seed))

  def run(k: int, i: int) -> None:
    r = runs[k]
    for b in r["batches"][i * steps_per_round:(i + 1) * steps_per_round]:
      r["state"], metrics = r["trainer"].train_step(r["state"], b, rng)
      r["losses"].append(metrics["loss"] / metrics["tokens"])
    jax.block_until_ready(r["state"])

  times, _ = measure.time_interleaved({k: lambda i, k=k: run(k, i) for k in ks}, rounds + 1,
                                      warmup=1, log=print)
  out = []
  for k in ks:
    losses = [float(x) for x in jax.device_get(runs[k]["losses"])]
    step_s = [t / steps_per_round for t in times[k]]
    out.append({"k": k, "rows": rows, "src_len": src, "tgt_len": tgt,
                "packed_segments": segments, "micro_batch_rows": -(-rows // k),
                "step_s": step_s, "step_s_median": statistics.median(step_s),
                "losses": losses})
  return out


def report_parts(config: Any, time_config: Any, memory: list[dict[str, Any]],
                 timing: list[dict[str, Any]]) -> dict[str, Any]:
  """`report.write`'s title, intro, body (tables of both parts) and record."""
  import numpy as np

  gib = lambda b: f"{b / 2**30:.2f}"
  body = []
  if memory:
    m, base = config.model, memory[0]
    body += [
      "## Memory of the train step (XLA's analysis, compiled only)\n",
      f"Model `{config.name}`: {m.num_layers} + {m.num_layers} layers, d_model {m.d_model}, "
      f"d_ff {m.d_ff}, {m.num_heads} heads, vocabulary {m.vocab_size}, dropout "
      f"{m.dropout_rate}, {base['params']:,} parameters, compute dtype "
      f"{base['compute_dtype']}; one batch of {base['rows']} rows x {base['length']} tokens "
      f"per side ({base['rows'] * base['length']:,} tokens per side), on one device.\n",
      report.markdown_table(
        ["k", "micro-batch rows", "temp (GiB)", "peak (GiB)", f"temp / k={base['k']}",
         f"peak / k={base['k']}", "arguments (GiB)", "compile (s)"],
        [[r["k"], r["micro_batch_rows"], gib(r["temp_memory_bytes"]),
          gib(r["peak_memory_bytes"]),
          f"{r['temp_memory_bytes'] / base['temp_memory_bytes']:.3f}",
          f"{r['peak_memory_bytes'] / base['peak_memory_bytes']:.3f}",
          gib(r["argument_memory_bytes"]), f"{r['compile_s']:.0f}"] for r in memory]),
      "- temp: XLA's temporary buffers (activations kept for the backward pass, gradients and "
      "their float32 accumulators, workspace); peak: arguments + outputs - aliased + temp "
      "(`measure.memory_stats`). The arguments (state and batch) do not depend on k.\n",
    ]
  if timing:
    m, base = time_config.model, timing[0]
    ref = np.asarray(base["losses"])
    body += [
      "## Step time on this CPU (small model, measured)\n",
      f"Model `{time_config.name}`: {m.num_layers} + {m.num_layers} layers, d_model "
      f"{m.d_model}, d_ff {m.d_ff}, {m.num_heads} heads, vocabulary {m.vocab_size}, dropout "
      f"{m.dropout_rate}; batches of {base['rows']} rows x {base['src_len']} / "
      f"{base['tgt_len']} tokens"
      + (f" ({base['packed_segments']} packed segments a row)" if base["packed_segments"]
         else "") + f", one device; {len(base['step_s'])} interleaved rounds.\n",
      report.markdown_table(
        ["k", "micro-batch rows", "step (ms, median round)", "fastest round (ms)",
         f"median / k={base['k']}", f"max loss difference to k={base['k']} (relative)"],
        [[r["k"], r["micro_batch_rows"], f"{1e3 * r['step_s_median']:.1f}",
          f"{1e3 * min(r['step_s']):.1f}", f"{r['step_s_median'] / base['step_s_median']:.2f}",
          f"{float(np.max(np.abs(np.asarray(r['losses']) - ref) / np.abs(ref))):.1e}"]
         for r in timing]),
      "- Each k trains from the same state on the same random batches; the loss difference "
      "is the largest over all steps (float32 summation order only).\n",
    ]
  return {"title": "Gradient accumulation: memory and step time against k",
          "intro": "Made by `benchmarks/accum_memory.py` (method in its docstring). "
                   "`config.grad_accum_steps` = k runs each batch as k micro-batches in one "
                   "jitted step and makes one update with the whole batch's mean gradient.",
          "body": body, "record": {"memory": memory, "time": timing}}


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Model of the memory part; default configs/wmt.py:base.", lock_config=False)
  _TIME_CONFIG = config_flags.DEFINE_config_file(
    "time_config", None, "Model and batch shape of the time part; default configs/numbers.py.",
    lock_config=False)
  _ROWS = flags.DEFINE_integer("rows", 96, "Memory part: rows of the batch.")
  _LENGTH = flags.DEFINE_integer("length", 256, "Memory part: source and target tokens per row.")
  _MEMORY_K = flags.DEFINE_list("memory_k", ["1", "2", "4", "8"], "Memory part: values of k.")
  _TIME_K = flags.DEFINE_list("time_k", ["1", "2", "4"], "Time part: values of k (empty: none).")
  _ROUNDS = flags.DEFINE_integer("rounds", 5, "Time part: timed rounds.")
  _STEPS = flags.DEFINE_integer("steps_per_round", 4, "Time part: steps of each k per round.")
  _OUT = flags.DEFINE_string("out", "benchmarks/results/accum_memory",
                             "Report path without extension.")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    try:
      memory_k = [int(k) for k in _MEMORY_K.value]
      time_k = [int(k) for k in _TIME_K.value]
    except ValueError:
      fail("--memory_k and --time_k are lists of integers, e.g. --memory_k=1,2,4,8")
    from configs import numbers, wmt

    config = _CONFIG.value or wmt.get_config("base")
    time_config = _TIME_CONFIG.value or numbers.get_config()
    try:
      check_ks("--memory_k", memory_k)
      check_ks("--time_k", time_k)
      timing = time_by_k(time_config, time_k, _ROUNDS.value, _STEPS.value) if time_k else []
      memory = memory_by_k(config, _ROWS.value, _LENGTH.value, memory_k)
    except UserError as e:
      fail(str(e))
    report.write(_OUT.value, command=report.command_line(),
                 **report_parts(config, time_config, memory, timing))
    print(f"wrote {_OUT.value}.md", flush=True)

  app.run(main, flags_parser=flags_parser())
