"""Attention against recurrence: the three usual claims, each measured side by side.

    nice -n 19 python -m experiments.claims                   # CPU defaults, about 15 minutes
    python -m experiments.claims --config=configs/wmt.py:base --lengths=128,256,...,16384 \
        --batch_size=8 --lr_d_model=256 --lr_max_distance=2000 --lr_steps=2000   # accelerators

The Transformer and the LSTM baseline (`model.kind='lstm'`, transformer/rnn.py) always have
the same number of parameters (`rnn.lstm_config_for_params`) and get the same training budget
(the same batches, steps and optimiser recipe).

1. Parallelism. Training-step time against n, and the number of sequential steps: the while
   loops of the compiled train step and their trip counts (`measure.loop_iterations`), so a
   scan over time shows up as n iterations run one after another. Measured with
   `seq_len.cost_sweep` (random batches of `--batch_size` x n source and target tokens) for
   the Transformer of `--config` with `xla` and `chunked` attention and its equal-size LSTM.
2. Long-range dependencies. The recall task of experiments/tasks.py: the answer is the token
   exactly d positions back. A tiny Transformer and its equal-size LSTM train for `--lr_steps`
   steps on d uniform in [2, `--lr_max_distance`] with the project's Trainer and train_step,
   then answer fresh examples at fixed d (accuracy over `--lr_eval_examples` each; chance is
   1 / `--lr_keys`).
3. Memory. XLA's memory analysis of the same compiled steps (temporary memory: activations
   kept for the backward pass, gradients, workspace) against n, and the decoding cache a
   model keeps per sentence while generating (from `jax.eval_shape` of its cache), against
   the complexity table usually quoted (the paper's Table 1) and the folk claim.

Writes experiments/results/claims.md, claims.json and claims_parallelism.png,
claims_long_range.png, claims_memory.png.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import types
from typing import Any

from absl import app

from experiments import measure, report, seq_len, tasks
from experiments import sweep as sweep_lib
from transformer.errors import fail

_F = types.SimpleNamespace()  # the command-line flags, once define_flags() ran


def define_flags() -> None:
  """Defines this command's flags (only when it runs, so modules import together)."""
  flag = sweep_lib.define_flag
  _F.part = flag("list", "part", ["cost", "long_range"],
                 "cost (parallelism and memory), long_range, or both.")
  _F.config = flag("config_file", "config", None,
                   "Model of the cost part (default configs/numbers.py).")
  _F.lengths = flag("list", "lengths", [str(2**k) for k in range(5, 12)], "Lengths n.")
  _F.batch = flag("integer", "batch_size", 2, "Rows per step in the cost part.")
  _F.steps = flag("integer", "steps", 3, "Timed steps per length (best is kept).")
  _F.max_step_s = flag("float", "max_step_s", 20.0, "Do not time steps predicted slower.")
  _F.fit_from = flag("integer", "fit_from", 256, "Exponents are fitted over n >= this too.")
  _F.cost_from = flag(
    "string", "cost_from", "", "Read the cost records (parallelism, memory) from this "
    "seq_len.json (from `python -m experiments.seq_len --part=cost`) instead of measuring.")
  _F.lr_d_model = flag("integer", "lr_d_model", 32, "Long range: the Transformer's d_model.")
  _F.lr_layers = flag("integer", "lr_layers", 1, "Long range: layers (encoder and decoder).")
  _F.lr_heads = flag("integer", "lr_heads", 2, "Long range: heads.")
  _F.lr_keys = flag("integer", "lr_keys", 8, "Long range: number of key symbols.")
  _F.lr_max_d = flag("integer", "lr_max_distance", 400, "Long range: largest distance d.")
  _F.lr_steps = flag("integer", "lr_steps", 1000, "Long range: training steps per model.")
  _F.lr_batch = flag("integer", "lr_batch_size", 16, "Long range: rows per training step.")
  _F.lr_warmup = flag("integer", "lr_warmup", 100, "Long range: warm-up steps.")
  _F.lr_eval = flag("integer", "lr_eval_examples", 128, "Long range: examples per distance.")
  _F.lr_distributions = flag("list", "lr_distributions", ["uniform", "log_uniform"],
                             "Long range: distributions of the training distances; both "
                             "models are trained once per distribution.")
  _F.lr_distances = flag("list", "lr_distances",
                         ["2", "5", "10", "25", "50", "100", "200", "300", "400"],
                         "Long range: distances evaluated (at most --lr_max_distance).")
  _F.seed = flag("integer", "seed", 0, "Seed of parameters and batches.")
  _F.out = flag("string", "out", os.path.join("experiments", "results"), "Results directory.")


def decode_cache_bytes(mc: Any, n: int, batch: int = 1) -> int:
  """Bytes of the incremental-decoding cache for `batch` sentences of n source / n output
  tokens (from `jax.eval_shape`: the Transformer's keys and values, the LSTM's states)."""
  import jax
  import numpy as np

  from transformer.translate import init_cache

  shapes = jax.eval_shape(lambda: init_cache(mc, batch, n, n))
  return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in jax.tree.leaves(shapes))


# ----------------------------------------------------------------------------- long range


@dataclasses.dataclass
class LongRangeSettings:
  d_model: int = 32
  layers: int = 1
  heads: int = 2
  num_keys: int = 8
  max_distance: int = 400
  steps: int = 1000
  batch_size: int = 16
  warmup: int = 100
  distribution: str = "log_uniform"  # of the training distances: uniform | log_uniform
  eval_examples: int = 128
  distances: tuple[int, ...] = (2, 5, 10, 25, 50, 100, 200, 300, 400)
  seed: int = 0


def long_range_configs(s: LongRangeSettings) -> list[tuple[str, Any, Any]]:
  """[(label, config, ModelConfig)] for the Transformer and its equal-size LSTM."""
  from configs import numbers
  from transformer.model import ModelConfig
  from transformer.rnn import lstm_config_for_params
  from transformer.validate import model_config

  config = numbers.get_config()
  vocab = tasks.vocab_size(s.num_keys)
  config.data.vocab_size = vocab
  config.label_smoothing = 0.0
  config.optimizer.warmup_steps = s.warmup
  config.mesh.data = 1
  m = config.model
  m.vocab_size = vocab
  m.num_layers = s.layers
  m.d_model = s.d_model
  m.d_ff = 2 * s.d_model
  m.num_heads = s.heads
  m.dropout_rate = 0.0
  m.max_len = s.max_distance + 2
  m.dtype = "float32"
  transformer = model_config(config)
  lstm = lstm_config_for_params(measure.model_param_count(transformer), transformer)
  lstm_config = config.copy_and_resolve_references()
  for field in dataclasses.fields(ModelConfig):
    lstm_config.model[field.name] = getattr(lstm, field.name)
  return [("transformer", config, transformer), ("lstm", lstm_config, model_config(lstm_config))]


def train_long_range(config: Any, mc: Any, s: LongRangeSettings, log=print) -> dict[str, Any]:
  """Trains on recall batches with the project's Trainer; accuracy at each evaluated distance."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from transformer import sharding as sharding_lib
  from transformer.model_family import build_model
  from transformer.train import Trainer

  mesh = sharding_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  trainer = Trainer(config, mesh, mc)
  state = trainer.init_state(s.seed)
  rng = jax.random.key(s.seed)
  host = np.random.default_rng([s.seed, 1])  # the same batches for every model
  losses = []
  t0 = time.time()
  for step in range(s.steps):
    batch = tasks.training_batch(host, s.batch_size, 2, s.max_distance, s.num_keys,
                                 s.distribution)
    batch = sharding_lib.local_batch_to_global(
      {"inputs": batch["inputs"], "targets": batch["targets"]}, mesh)
    state, metrics = trainer.train_step(state, batch, rng)
    if step == 0:
      jax.block_until_ready(state)
      t1 = time.time()  # after the first step, which compiles
    if (step + 1) % 50 == 0 or step + 1 == s.steps:
      m = jax.device_get(metrics)
      losses.append((step + 1, float(m["loss"] / m["tokens"])))
      log(f"[claims long range] {mc.kind}, d {s.distribution}: step {step + 1}/{s.steps}  "
          f"loss {losses[-1][1]:.4f}  ({time.time() - t0:.0f} s)")
  jax.block_until_ready(state)
  train_s = time.time() - t0
  step_s = (time.time() - t1) / max(s.steps - 1, 1)

  model = build_model(mc)
  apply = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y))
  eval_rng = np.random.default_rng([s.seed, 2])
  accuracy = {}
  for d in s.distances:
    batch = tasks.recall_batch(eval_rng, np.full(s.eval_examples, d), s.num_keys,
                               length=s.max_distance + 2)
    logits = apply(state.params, jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"]))
    pred = np.asarray(jnp.argmax(logits[np.arange(s.eval_examples), batch["distance"]], -1))
    accuracy[str(int(d))] = float(np.mean(pred == batch["answer"]))
  log(f"[claims long range] {mc.kind}, d {s.distribution}: accuracy by distance {accuracy}")
  params = measure.count_params(state.params)
  return {"kind": mc.kind, "d_model": mc.d_model, "params": params, "accuracy": accuracy,
          "losses": losses, "train_s": train_s, "step_s": step_s, "steps": s.steps}


# ----------------------------------------------------------------------------- report


def write_report(out_dir: str, command: dict[str, str], cost: list[dict[str, Any]] | None,
                 caches: list[dict[str, Any]] | None, long_range: dict[str, Any] | None,
                 fit_from: int) -> list[str]:
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f"claims{k}") for k in
           (".md", ".json", "_parallelism.png", "_long_range.png", "_memory.png")}
  with open(paths[".json"], "w") as f:
    json.dump({"command": command, "cost": cost, "decode_cache": caches,
               "long_range": long_range}, f, indent=1)
  text = ["# Attention against recurrence: parallelism, long-range dependencies, memory\n",
          "Produced by `experiments/claims.py` (method in its docstring; every record in "
          "`claims.json`). Transformer and LSTM always have equal parameter counts "
          "(`rnn.lstm_config_for_params`) and equal training budgets.\n",
          "## Commands\n"]
  text += [f"{part}:\n\n```\n{cmd}\n```\n" for part, cmd in command.items()]
  text += ["## Machine\n", report.hardware_markdown(report.hardware())]
  if cost:
    text += _parallelism_md(cost, fit_from)
    _plot_parallelism(cost, paths["_parallelism.png"])
    text.append(f"\n![parallelism]({os.path.basename(paths['_parallelism.png'])})\n")
  if long_range:
    text += _long_range_md(long_range)
    _plot_long_range(long_range, paths["_long_range.png"])
    text.append(f"\n![long range]({os.path.basename(paths['_long_range.png'])})\n")
  if cost:
    text += _memory_md(cost, caches or [], fit_from)
    _plot_memory(cost, caches or [], paths["_memory.png"])
    text.append(f"\n![memory]({os.path.basename(paths['_memory.png'])})\n")
  text += _table1_md(cost, caches, long_range, fit_from)
  with open(paths[".md"], "w") as f:
    f.write("\n".join(text))
  return [p for p in paths.values() if os.path.exists(p)]


def _by(cost):
  return {(r["kind"], r["n"]): r for r in cost}


def _kinds(cost):
  return list(dict.fromkeys(r["kind"] for r in cost))


def _e(v) -> str:
  return "-" if v is None else f"{v:.2f}"


def _parallelism_md(cost, fit_from) -> list[str]:
  kinds, by = _kinds(cost), _by(cost)
  batch_size = cost[0]["batch_size"]
  lengths = sorted({r["n"] for r in cost})
  first = {k: next(r for r in cost if r["kind"] == k) for k in kinds}
  desc = "; ".join(f"`{k}`: {first[k]['model']}, d_model {first[k]['d_model']}, "
                   f"{first[k]['params']:,} parameters" for k in kinds)
  header = ["n"] + [f"{k} step (ms)" for k in kinds] + [f"{k} sequential iterations"
                                                      for k in kinds]
  rows = []
  for n in lengths:
    row = [n]
    for k in kinds:
      r = by.get((k, n))
      row.append("-" if r is None or r["step_s"] is None else f"{r['step_s'] * 1e3:,.1f}")
    for k in kinds:
      r = by.get((k, n))
      row.append("-" if r is None else f"{r['hlo_iterations']:,} ({r['hlo_loops']} loops)")
    rows.append(row)
  t_exp = measure.exponents(cost, "step_s", fit_from)
  i_exp = measure.exponents(cost, "hlo_iterations", fit_from)
  exp_rows = [[k, _e(t_exp[k][0]), _e(t_exp[k][1]), _e(i_exp[k][1])] for k in kinds]
  lstm = [r for r in cost if r["model"] == "lstm"]
  per_n = ""
  if lstm:
    ratios = sorted({round(r["hlo_iterations"] / r["n"], 2) for r in lstm})
    per_n = (f" For the LSTM the count is {', '.join(str(x) for x in ratios)} x n at every n: "
             "one scan of n steps per encoder layer and direction and per decoder layer in the "
             "forward pass, and as many reversed scans in the backward pass.")
  return [
    "## 1. Parallelism: step time and sequential steps against n\n",
    f"Batch {batch_size} x n source and n target tokens, random ids; {desc}. Sequential "
    "iterations = trip counts of the `while` loops in the compiled train step (forward and "
    "backward), nested loops multiplied; loops = number of `while` ops." + per_n + "\n",
    report.markdown_table(header, rows),
    "\nFitted exponents (slope of log y on log n):\n",
    report.markdown_table(["model", "step time: all n", f"step time: n >= {fit_from}",
                           f"sequential iterations: n >= {fit_from}"], exp_rows),
  ]


def _long_range_md(lr) -> list[str]:
  s = lr["settings"]
  runs = lr["runs"]
  distances = sorted({int(d) for r in runs for m in r["models"] for d in m["accuracy"]})
  header = ["training distances", "model", "d_model", "params", "step (ms)", "train (s)",
            "final loss"] + [f"d={d}" for d in distances]
  rows = [[r["distribution"].replace("_", "-"), m["kind"], m["d_model"], f"{m['params']:,}",
           report.fmt(1e3 * m["step_s"] if m.get("step_s") else None, 1),
           f"{m['train_s']:.0f}", f"{m['losses'][-1][1]:.3f}"]
          + [report.fmt(m["accuracy"].get(str(d))) for d in distances]
          for r in runs for m in r["models"]]
  return [
    "\n## 2. Long-range dependencies: recall after d positions\n",
    f"Task: experiments/tasks.py (the answer is the token exactly d positions back; blanks in "
    f"between; {s['num_keys']} keys, chance {1 / s['num_keys']:.3f}). For each distribution of "
    f"the training distances d in [2, {s['max_distance']}] (uniform: every d equally likely, "
    "so almost all are long; log-uniform: each factor of two equally likely, so short ones are "
    f"common), both models are trained {s['steps']} steps of {s['batch_size']} sequences (the "
    "same batches for both), Adam with the paper's schedule (warm-up "
    f"{s['warmup']}), no label smoothing; Transformer {s['layers']} + {s['layers']} layers, "
    f"{s['heads']} heads, d_model {s['d_model']}; the LSTM has {s['layers']} + {s['layers']} "
    "layers and the width that matches the parameter count. Accuracy of the answer token on "
    f"{s['eval_examples']} fresh examples per distance (teacher-forced; argmax at the answer "
    "position). step (ms): mean training-step time after the first (compiling) step; "
    "train (s): all steps, compilation included.\n",
    report.markdown_table(header, rows),
  ]


def _memory_md(cost, caches, fit_from) -> list[str]:
  kinds, by = _kinds(cost), _by(cost)
  lengths = sorted({r["n"] for r in cost})
  header = ["n"] + [f"{k} temp (MiB)" for k in kinds]
  rows = [[n] + [f"{by[(k, n)]['temp_memory_bytes'] / 2**20:,.2f}" if (k, n) in by else "-"
                 for k in kinds] for n in lengths]
  m_exp = measure.exponents(cost, "temp_memory_bytes", fit_from)
  lines = ["\n## 3. Memory against n\n",
           "Training: XLA's temporary memory of the compiled train step (per device; the "
           "parameters and optimiser state, constant in n, are excluded).\n",
           report.markdown_table(header, rows),
           "\nFitted exponents of training memory:\n",
           report.markdown_table(
             ["model", "all n", f"n >= {fit_from}"],
             [[k, _e(m_exp[k][0]), _e(m_exp[k][1])] for k in kinds])]
  if caches:
    ck = list(dict.fromkeys(c["kind"] for c in caches))
    cby = {(c["kind"], c["n"]): c["bytes"] for c in caches}
    cn = sorted({c["n"] for c in caches})
    lines += ["\nDecoding: the cache one sentence keeps while generating n tokens from an "
              "n-token source (Transformer: self-attention keys and values of every layer and "
              "the cross-attention keys and values; LSTM: one (c, h) state per layer), bytes "
              "from `jax.eval_shape`. The LSTM still reads the n encoder states through its "
              "attention; they are not counted for either model.\n",
              report.markdown_table(["n"] + [f"{k} cache (KiB)" for k in ck],
                                    [[n] + [f"{cby[(k, n)] / 1024:,.1f}" for k in ck]
                                     for n in cn])]
  return lines


def _table1_md(cost, caches, lr, fit_from) -> list[str]:
  """The paper's Table 1 and the folk memory claim beside what was measured."""
  if not cost:
    return []
  t_exp = measure.exponents(cost, "step_s", fit_from)
  m_exp = measure.exponents(cost, "temp_memory_bytes", fit_from)
  i_exp = measure.exponents(cost, "hlo_iterations", fit_from)
  c_exp = {}
  for family in dict.fromkeys(c["kind"] for c in caches or []):
    cs = [c for c in caches if c["kind"] == family]
    c_exp[family] = measure.fit_exponent([c["n"] for c in cs], [c["bytes"] for c in cs])
  by = _by(cost)
  n_max = max(r["n"] for r in cost)

  def iters(kind):
    r = by.get((kind, n_max))
    return "-" if r is None else f"{r['hlo_iterations']:,} at n={n_max}"

  def acc(family):
    if not lr:
      return "not run"
    parts = []
    for run in lr["runs"]:
      m = next((m for m in run["models"] if m["kind"] == family), None)
      if m is not None:
        d = max(int(k) for k in m["accuracy"])
        parts.append(f"{m['accuracy'][str(d)]:.2f} at d={d} "
                     f"({run['distribution'].replace('_', '-')})")
    return "accuracy " + "; ".join(parts) if parts else "-"

  def power(v):
    return "-" if v is None else f"n^{max(v, 0.0):.2f}"

  # kind: (family, compute, sequential ops, path length, folk training memory)
  claims = {"xla": ("transformer", "O(n^2 d)", "O(1)", "O(1)", "O(1)"),
            "chunked": ("transformer", "O(n^2 d)", "O(1)", "O(1)", "O(1)"),
            "cudnn": ("transformer", "O(n^2 d)", "O(1)", "O(1)", "O(1)"),
            "lstm": ("lstm", "O(n d^2)", "O(n)", "O(n)", "O(n)"),
            "lstm_noattn": ("lstm", "O(n d^2)", "O(n)", "O(n)", "O(n)")}
  rows = []
  for kind in _kinds(cost):
    family, compute, seq_ops, path, memory = claims[kind]
    rows.append([kind, compute, power(t_exp[kind][1]), seq_ops,
                 f"{power(i_exp[kind][1])} ({iters(kind)})", path, acc(family), memory,
                 power(m_exp[kind][1]), power(c_exp.get(family))])
  return [
    "\n## The complexity table against the measurements\n",
    "Claimed: the paper's Table 1 (per layer: complexity, sequential operations, maximum path "
    "length; self-attention O(n^2 d), O(1), O(1); recurrent O(n d^2), O(n), O(n)) and the folk "
    "memory claim \"RNN O(n) memory, Transformer O(1)\". Measured: growth exponents fitted over "
    f"n >= {fit_from} (step time, sequential loop iterations, training memory; the decoding "
    "cache over all n; n^0.00 = constant), and the long-range accuracy at the largest "
    "distance. The long-range task ran once per family (the Transformer with `xla` "
    "attention, the LSTM with its attention): its source is a single token, so that "
    "attention has nothing to read, and the rows of a family share the run.\n",
    report.markdown_table(
      ["model", "compute (claimed)", "step time (measured)", "sequential ops (claimed)",
       "sequential iterations (measured)", "path length (claimed)", "long range (measured)",
       "memory (folk claim)", "training memory (measured)", "decoding cache (measured)"],
      rows),
  ]


def _plot_parallelism(cost, path):
  fig, axes = report.figure(1, 2, figsize=(9.5, 3.8))
  for i, k in enumerate(_kinds(cost)):
    rs = [r for r in cost if r["kind"] == k and r["step_s"] is not None]
    axes[0].plot([r["n"] for r in rs], [1e3 * r["step_s"] for r in rs], "o-", color=f"C{i}",
                 label=k)
    rs = [r for r in cost if r["kind"] == k]
    axes[1].plot([r["n"] for r in rs], [max(r["hlo_iterations"], 0.8) for r in rs], "o-",
                 color=f"C{i}", label=k)
  axes[0].set(ylabel="training step (ms)", title="step time")
  axes[1].set(ylabel="sequential loop iterations per step", title="sequential steps (HLO)")
  for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (tokens per side)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  report.save_figure(fig, path)


def _plot_long_range(lr, path):
  fig, axes = report.figure(1, 2, figsize=(10, 3.8))
  styles = ["-", "--", ":"]
  for j, run in enumerate(lr["runs"]):
    dist = run["distribution"].replace("_", "-")
    for i, m in enumerate(run["models"]):
      ds = sorted(int(d) for d in m["accuracy"])
      acc = [m["accuracy"][str(d)] for d in ds]
      label = f"{m['kind']}, d {dist}"
      axes[0].plot(ds, acc, "o" + styles[j % 3], color=f"C{i}", label=label)
      axes[1].plot([t for t, _ in m["losses"]], [v for _, v in m["losses"]], styles[j % 3],
                   color=f"C{i}", label=label)
  axes[0].axhline(1 / lr["settings"]["num_keys"], color="gray", ls=":", label="chance")
  axes[0].set(xscale="log", xlabel="distance d", ylabel="accuracy", title="recall after d",
              ylim=(0, 1.05))
  axes[1].set(xlabel="step", ylabel="training loss per token", title="training", yscale="log")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  report.save_figure(fig, path)


def _plot_memory(cost, caches, path):
  fig, axes = report.figure(1, 2, figsize=(9.5, 3.8))
  for i, k in enumerate(_kinds(cost)):
    rs = [r for r in cost if r["kind"] == k]
    axes[0].plot([r["n"] for r in rs], [r["temp_memory_bytes"] / 2**20 for r in rs], "o-",
                 color=f"C{i}", label=k)
  axes[0].set(ylabel="MiB", title="training: XLA temporary memory")
  for i, k in enumerate(dict.fromkeys(c["kind"] for c in caches)):
    cs = [c for c in caches if c["kind"] == k]
    axes[1].plot([c["n"] for c in cs], [c["bytes"] / 1024 for c in cs], "o-", color=f"C{i}",
                 label=k)
  axes[1].set(ylabel="KiB per sentence", title="decoding cache")
  for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (tokens)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  report.save_figure(fig, path)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  parts = set(_F.part.value)
  if not parts or parts - {"cost", "long_range"}:
    fail(f"--part={','.join(_F.part.value)}: use cost, long_range or both")
  command = report.command_line()
  previous = {}
  json_path = os.path.join(_F.out.value, "claims.json")
  if os.path.exists(json_path):
    with open(json_path) as f:
      previous = json.load(f)
  commands = dict(previous.get("command") or {})
  cost, caches, long_range = previous.get("cost"), previous.get("decode_cache"), previous.get(
    "long_range")
  if "cost" in parts:
    base = _F.config.value or seq_len.load_module_config(seq_len.DEFAULT_CONFIG)
    if _F.cost_from.value:
      with open(_F.cost_from.value) as f:
        source = json.load(f)
      cost = source["cost"]
      lengths = sorted({r["n"] for r in cost})
      commands["parallelism and memory"] = (
        f"{command}\n# cost records read from {_F.cost_from.value}, measured by:\n"
        f"{(source.get('commands') or {}).get('cost', '?')}")
    else:
      lengths = [int(n) for n in _F.lengths.value]
      cost = seq_len.cost_sweep(base, ["xla", "chunked", *seq_len.LSTM_KINDS], lengths,
                                _F.batch.value,
                                _F.steps.value, _F.max_step_s.value)
      commands["parallelism and memory"] = command
    caches = []
    for kind in ("xla", "lstm"):
      _, mc = seq_len.model_setup(base, kind, max(lengths))
      for n in lengths:
        caches.append({"kind": "transformer" if kind == "xla" else "lstm", "n": n,
                       "bytes": decode_cache_bytes(mc, n)})
  if "long_range" in parts:
    distances = tuple(int(d) for d in _F.lr_distances.value if int(d) <= _F.lr_max_d.value)
    s = LongRangeSettings(_F.lr_d_model.value, _F.lr_layers.value, _F.lr_heads.value,
                          _F.lr_keys.value, _F.lr_max_d.value, _F.lr_steps.value,
                          _F.lr_batch.value, _F.lr_warmup.value, "uniform",
                          _F.lr_eval.value, distances, _F.seed.value)
    runs = []
    for distribution in _F.lr_distributions.value:
      sd = dataclasses.replace(s, distribution=distribution)
      runs.append({"distribution": distribution,
                   "models": [train_long_range(config, mc, sd)
                              for _, config, mc in long_range_configs(sd)]})
    long_range = {"settings": dataclasses.asdict(s), "runs": runs}
    commands["long-range dependencies"] = command
  paths = write_report(_F.out.value, commands, cost, caches, long_range, _F.fit_from.value)
  print(f"wrote {', '.join(paths)}", flush=True)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  define_flags()
  app.run(main)
