"""Sequence length: what a training step costs at length n, and how models trained on short
sentences translate longer ones.

    nice -n 19 python -m experiments.seq_len                 # both parts, CPU defaults
    python -m experiments.seq_len --part=cost --lengths=64,128,...,16384 --batch_size=8  # GPU

(a) cost. For n = 64, 128, ..., 4096 (source and target both n tokens, `--batch_size` rows of
random ids without padding) and each model, the project's `Trainer` compiles its train step
ahead of time (`lower_train_step(shapes).compile()`), XLA's memory analysis of the compiled
step gives its memory (measure.memory_stats: `temp` = the temporary buffers, i.e.
activations kept for the backward pass, gradients and workspace; `peak` = arguments +
outputs - aliased + temp), the while loops of the compiled HLO give the number of sequential
loop iterations, and a few steps are timed (best of `--steps` after one warm-up step).
Timing is skipped where a step is predicted (from the two previous lengths) to take more than
`--max_step_s` seconds, or where the compiled step would need more than `--max_run_gb` of
memory: memory analysis needs compilation only, so every length gets its memory. Models: the
Transformer of configs/numbers.py (d_model 128, 2 + 2 layers, 4 heads, d_ff 256, vocabulary
256) with each attention implementation that applies on this backend (`xla`, `chunked`;
`cudnn` only on GPU, where it needs bfloat16), and the LSTM baseline with the same number of
parameters (`rnn.lstm_config_for_params`), with its attention over the encoder states (`lstm`,
the project's default) and without (`lstm_noattn`, pure recurrence). Growth exponents are
least-squares slopes of log(y) on log(n), over all lengths and over n >= `--fit_from`.

(b) quality. The sweep `configs/sweeps/seq_len.py` trains the numbers model three times, on
training pairs of at most 24, 48 or 64 tokens per side (`data.max_source_len`,
`max_target_len` and the buckets limited to that length), with the sweep runner
(experiments/sweep.py: own workdirs under runs/sweeps/seq_len, resumes, skips finished points).
Each trained model then translates the whole validation split, and BLEU is reported by bins
of source length in tokens, so that sentences longer than any seen in training are scored
apart.

Writes experiments/results/seq_len.md, seq_len.png and seq_len.json (every record).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from collections.abc import Callable, Sequence
from typing import Any

from absl import app

from experiments import measure, report
from experiments import sweep as sweep_lib
from transformer.errors import fail

_F = types.SimpleNamespace()  # the command-line flags, once define_flags() ran


def define_flags() -> None:
  """Defines this command's flags (only when it runs, so modules import together)."""
  flag = sweep_lib.define_flag
  _F.part = flag("list", "part", ["cost", "quality"], "cost, quality, or both.")
  _F.config = flag("config_file", "config", None,
                   "Model of the cost part (default configs/numbers.py).")
  _F.lengths = flag("list", "lengths", [str(2**k) for k in range(6, 13)],
                    "Sequence lengths n (source = target = n).")
  _F.batch = flag("integer", "batch_size", 2, "Rows per training step (cost).")
  _F.kinds = flag("list", "kinds", [], "Models: xla, chunked, cudnn (Transformer attention), "
                  "lstm, lstm_noattn; default: all that apply here (cudnn only on GPU).")
  _F.steps = flag("integer", "steps", 3, "Timed steps per length (best is kept).")
  _F.max_step_s = flag("float", "max_step_s", 20.0, "Do not time steps predicted slower.")
  _F.max_run_gb = flag("float", "max_run_gb", 6.0, "Do not run steps needing more memory.")
  _F.fit_from = flag("integer", "fit_from", 512, "Second fit: lengths >= this only.")
  _F.quality_sweep = flag("string", "quality_sweep", "configs/sweeps/seq_len.py",
                          "Sweep file of the quality part.")
  _F.bins = flag("list", "bins", ["16", "24", "32", "48", "64"],
                 "Upper edges of the source-length bins (tokens).")
  _F.out = flag("string", "out", os.path.join("experiments", "results"), "Results directory.")
  _F.root = flag("string", "root", os.path.join("runs", "sweeps"), "Quality runs' root.")


TRANSFORMER_KINDS = ("xla", "chunked", "cudnn")
# The LSTM baseline with its attention over the encoder states (the project's default, an
# O(n^2) part), and without it (pure recurrence: the source reaches the decoder only through
# the bridged initial states).
LSTM_KINDS = ("lstm", "lstm_noattn")
DEFAULT_CONFIG = "configs/numbers.py"


# ----------------------------------------------------------------------------- cost


def model_setup(base: Any, kind: str, max_len: int) -> tuple[Any, Any]:
  """(config, ModelConfig) of one model of the cost measurement.

  kind: an attention implementation (the Transformer of `base`), 'lstm' (the LSTM with the
  Transformer's parameter count) or 'lstm_noattn' (the same without attention). `base` is a
  config (e.g. configs/numbers.py); the data vocabulary is set to the model's, and
  model.max_len to at least `max_len`.
  """
  from transformer.model import ModelConfig
  from transformer.rnn import lstm_config_for_params
  from transformer.validate import model_config

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
      transformer = dataclasses.replace(model_config(config), kind="transformer")
      target = measure.model_param_count(transformer)
      base_lstm = dataclasses.replace(transformer, lstm_attention=kind == "lstm")
      lstm = lstm_config_for_params(target, base_lstm)
      for field in dataclasses.fields(ModelConfig):
        config.model[field.name] = getattr(lstm, field.name)
    else:
      raise ValueError(f"unknown model kind {kind!r}: use xla, chunked, cudnn, lstm or "
                       "lstm_noattn")
  return config, model_config(config)


def measure_step(config: Any, mc: Any, batch_size: int, length: int, *, steps: int = 2,
                 should_run: Callable[[dict[str, Any]], str | None] | None = None,
                 seed: int = 0) -> dict[str, Any]:
  """Compiles the train step for [batch, length] source and target; memory, loops, and time.

  Then, unless `should_run(record)` returns a reason not to (kept as `timing_skipped`), runs
  one warm-up step and `steps` timed steps of the compiled program (step_s = the best).
  One device.
  """
  import jax
  import numpy as np

  from transformer import sharding as sharding_lib
  from transformer.train import Trainer

  mesh = sharding_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  trainer = Trainer(config, mesh, mc)
  sharding = sharding_lib.batch_sharding(mesh)
  shape = jax.ShapeDtypeStruct((batch_size, length), np.int32, sharding=sharding)
  compiled, lower_s, xla_s = measure.compile_timed(
    lambda: trainer.lower_train_step({"inputs": shape, "targets": shape}))
  record: dict[str, Any] = {
    "n": length,
    "batch_size": batch_size,
    "compile_s": lower_s + xla_s,
    **measure.memory_stats(compiled),
    **{f"hlo_{k}": v for k, v in measure.loop_iterations(compiled.as_text()).items()},
    "params": measure.count_params(trainer.abstract_state.params),
    "step_s": None,
    "step_times_s": [],
    "timing_skipped": None,
  }
  why = should_run(record) if should_run is not None else None
  if why:
    record["timing_skipped"] = why
    return record
  state = trainer.init_state(seed)
  rng = jax.random.key(seed)
  host = np.random.default_rng(seed)
  batch = sharding_lib.local_batch_to_global(
    measure.random_batch(host, batch_size, length, length, mc.vocab_size), mesh)
  _, _, times, _ = measure.time_steps(compiled, state, [batch] * (1 + steps), rng)
  times = times[1:]  # without the warm-up step
  record["step_s"] = min(times)
  record["step_times_s"] = times
  return record


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
  import jax

  kinds = ["xla", "chunked"]
  if jax.default_backend() == "gpu":
    kinds.append("cudnn")
  return kinds + list(LSTM_KINDS)


def cost_sweep(base: Any, kinds: Sequence[str], lengths: Sequence[int], batch_size: int,
               steps: int = 2, max_step_s: float = 20.0, max_run_bytes: float = 6e9,
               log=print) -> list[dict[str, Any]]:
  """measure_step for every kind and length; skips timing as the module docstring says."""
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

      rec = measure_step(config, mc, batch_size, n, steps=steps, should_run=skip)
      why = rec["timing_skipped"]
      rec.update({"kind": kind, "model": mc.kind, "attention": mc.attention if mc.kind ==
                  "transformer" else None, "d_model": mc.d_model, "layers": mc.num_layers,
                  "dtype": str(mc.compute_dtype), "predicted_step_s": predicted})
      if rec["step_s"] is not None:
        measured.append((n, rec["step_s"]))
      step = "-" if rec["step_s"] is None else f"{rec['step_s'] * 1e3:.1f} ms"
      log(f"[seq_len cost] {kind:8s} n={n:5d}: step {step:>10s}  temp "
          f"{rec['temp_memory_bytes'] / 2**20:9.1f} MiB  loops {rec['hlo_loops']:3d} "
          f"iterations {rec['hlo_iterations']:7d}  compile {rec['compile_s']:.1f} s"
          f"{'  (' + why + ')' if why else ''}")
      records.append(rec)
  return records


# ----------------------------------------------------------------------------- quality


def length_bins(edges: Sequence[int]) -> list[tuple[int, int | None]]:
  """[(1, e0), (e0 + 1, e1), ..., (e_last + 1, None)]: inclusive token-count ranges."""
  out, lo = [], 1
  for e in edges:
    out.append((lo, int(e)))
    lo = int(e) + 1
  out.append((lo, None))
  return out


def bin_label(lo: int, hi: int | None) -> str:
  return f"{lo}-{hi}" if hi is not None else f">{lo - 1}"


def bleu_by_bin(sources: list[list[int]], hyps: list[str], refs: list[str],
                bins: list[tuple[int, int | None]]) -> list[dict[str, Any]]:
  """Corpus BLEU of the sentences whose source length (tokens, EOS included) is in each bin."""
  from transformer import bleu as bleu_lib

  out = []
  for lo, hi in bins:
    idx = [i for i, s in enumerate(sources) if len(s) >= lo and (hi is None or len(s) <= hi)]
    score = None
    if idx:
      score = bleu_lib.corpus_bleu([hyps[i] for i in idx], [refs[i] for i in idx]).score
    out.append({"bin": bin_label(lo, hi), "lo": lo, "hi": hi, "sentences": len(idx),
                "bleu": score})
  return out


def evaluate_by_length(config: Any, workdir: str, pairs: list[tuple[str, str]],
                       bins: list[tuple[int, int | None]]) -> dict[str, Any]:
  """Translates `pairs`' sources with a trained workdir's newest checkpoint; BLEU by bin."""
  from transformer import bleu as bleu_lib
  from transformer import infer

  model = infer.restore(config, workdir)
  tokenizer, translator, params, label = (model.tokenizer, model.translator, model.params,
                                          model.label)
  sources = [tokenizer.encode(s) for s, _ in pairs]
  hyps = [tokenizer.decode(ids) for ids in translator.translate_ids(params, sources)]
  refs = [t for _, t in pairs]
  return {
    "checkpoint": label,
    "bleu_all": bleu_lib.corpus_bleu(hyps, refs).score,
    "bins": bleu_by_bin(sources, hyps, refs, bins),
  }


# ----------------------------------------------------------------------------- report


def _gb(b: int | None) -> str:
  return "-" if b is None else f"{b / 2**20:,.1f}"


def write_report(out_dir: str, commands: dict[str, str], cost: list[dict[str, Any]] | None,
                 quality: dict[str, Any] | None, fit_from: int) -> list[str]:
  """seq_len.md, seq_len.png and seq_len.json from the parts that ran (commands by part)."""
  os.makedirs(out_dir, exist_ok=True)
  md_path = os.path.join(out_dir, "seq_len.md")
  png_path = os.path.join(out_dir, "seq_len.png")
  json_path = os.path.join(out_dir, "seq_len.json")
  with open(json_path, "w") as f:
    json.dump({"commands": commands, "cost": cost, "quality": quality}, f, indent=1)
  _plot(cost, quality, png_path)
  text = ["# Sequence length: cost of a training step, and translating longer sentences\n",
          "Produced by `experiments/seq_len.py` (method in its docstring); every record is in "
          "`seq_len.json`.\n",
          "## Commands\n"]
  text += [f"{part}:\n\n```\n{cmd}\n```\n" for part, cmd in commands.items()]
  text += ["## Machine\n", report.hardware_markdown(report.hardware())]
  if cost:
    text += cost_markdown(cost, fit_from)
  if quality:
    text += quality_markdown(quality)
  text.append(f"\n![seq_len]({os.path.basename(png_path)})\n")
  with open(md_path, "w") as f:
    f.write("\n".join(text))
  return [md_path, png_path, json_path]


def cost_markdown(cost: list[dict[str, Any]], fit_from: int) -> list[str]:
  kinds = list(dict.fromkeys(r["kind"] for r in cost))
  lengths = sorted({r["n"] for r in cost})
  by = {(r["kind"], r["n"]): r for r in cost}
  first = {k: next(r for r in cost if r["kind"] == k) for k in kinds}
  models = ", ".join(
    f"`{k}`: {first[k]['model']} d_model {first[k]['d_model']}, {first[k]['layers']} + "
    f"{first[k]['layers']} layers, {first[k]['params']:,} parameters, {first[k]['dtype']}"
    for k in kinds)
  batch_size = cost[0]["batch_size"]
  lines = ["## (a) Cost of one training step against n\n",
           f"Batch {batch_size} x n source + n target tokens. Models: {models}. "
           "`xla`/`chunked`/`cudnn` are the Transformer's attention implementations "
           "(`cudnn` runs on GPUs only and is absent from a CPU run).\n"]
  header = ["n"] + [f"{k} step (ms)" for k in kinds]
  rows = []
  for n in lengths:
    row = [n]
    for k in kinds:
      r = by.get((k, n))
      if r is None:
        row.append("-")
      elif r["step_s"] is None:
        row.append("not timed")
      else:
        row.append(f"{r['step_s'] * 1e3:,.1f}")
    rows.append(row)
  lines += ["### Training-step time\n", report.markdown_table(header, rows)]
  skipped = [r for r in cost if r["timing_skipped"]]
  if skipped:
    lines.append("\nNot timed: " + "; ".join(
      f"{r['kind']} n={r['n']} ({r['timing_skipped']})" for r in skipped) + ".\n")
  header = ["n"] + [f"{k} temp (MiB)" for k in kinds] + [f"{k} peak (MiB)" for k in kinds]
  rows = [[n] + [_gb(by[(k, n)]["temp_memory_bytes"]) if (k, n) in by else "-" for k in kinds]
          + [_gb(by[(k, n)]["peak_memory_bytes"]) if (k, n) in by else "-" for k in kinds]
          for n in lengths]
  lines += ["\n### Memory of the compiled step (XLA memory analysis, per device)\n",
            report.markdown_table(header, rows)]
  header = ["n"] + [f"{k} loops / iterations" for k in kinds]
  rows = [[n] + [f"{by[(k, n)]['hlo_loops']} / {by[(k, n)]['hlo_iterations']:,}"
                 if (k, n) in by else "-" for k in kinds] for n in lengths]
  lines += ["\n### Sequential loop iterations in the compiled step (HLO `while` trip counts)\n",
            report.markdown_table(header, rows)]
  t_exp = measure.exponents(cost, "step_s", fit_from)
  m_exp = measure.exponents(cost, "temp_memory_bytes", fit_from)
  p_exp = measure.exponents(cost, "peak_memory_bytes", fit_from)
  i_exp = measure.exponents(cost, "hlo_iterations", fit_from)
  header = ["model", "time: all n", f"time: n >= {fit_from}", "temp: all n",
            f"temp: n >= {fit_from}", "peak: all n", f"peak: n >= {fit_from}",
            f"loop iterations: n >= {fit_from}"]
  e = lambda v: "-" if v is None else f"{v:.2f}"
  rows = [[k, e(t_exp[k][0]), e(t_exp[k][1]), e(m_exp[k][0]), e(m_exp[k][1]), e(p_exp[k][0]),
           e(p_exp[k][1]), e(i_exp[k][1])] for k in kinds]
  lines += ["\n### Fitted growth exponents (slope of log y on log n)\n",
            report.markdown_table(header, rows)]
  return lines


def quality_markdown(quality: dict[str, Any]) -> list[str]:
  models = quality["models"]
  bins = [b["bin"] for b in models[0]["eval"]["bins"]]
  counts = {b["bin"]: b["sentences"] for b in models[0]["eval"]["bins"]}
  header = ["trained on <= (tokens)", "training pairs kept", "steps", "all"] + [
    f"{b} ({counts[b]})" for b in bins]
  rows = []
  for m in models:
    cells = [m["max_len"], f"{m['train_kept']:,} / {m['train_total']:,}", m["step"],
             report.fmt(m["eval"]["bleu_all"])]
    for b in m["eval"]["bins"]:
      cell = report.fmt(b["bleu"])
      if b["lo"] > m["max_len"]:
        cell += " *"
      cells.append(cell)
    rows.append(cells)
  return [
    "\n## (b) Translating sentences longer than any seen in training\n",
    f"Sweep `{quality['sweep']}` (trained by the sweep runner in "
    f"`{quality.get('workdirs', quality['sweep_name'])}/`). Validation BLEU of the whole "
    "validation split "
    f"({quality['sentences']} sentences) by bin of source length in tokens (EOS included; "
    "sentence count in brackets), decoding as in the config "
    f"(beam {quality['beam_size']}). * marks bins entirely longer than the model's training "
    "limit.\n",
    report.markdown_table(header, rows),
  ]


def _plot(cost, quality, path: str) -> None:
  panels = (2 if cost else 0) + (1 if quality else 0)
  if not panels:
    return
  fig, axes = report.figure(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
  axes = list(axes[0])
  if cost:
    kinds = list(dict.fromkeys(r["kind"] for r in cost))
    ax = axes.pop(0)
    for i, k in enumerate(kinds):
      rs = [r for r in cost if r["kind"] == k and r["step_s"] is not None]
      ax.plot([r["n"] for r in rs], [r["step_s"] * 1e3 for r in rs], "o-", color=f"C{i}",
              label=k)
    ax.set(xscale="log", yscale="log", xlabel="n (tokens per side)",
           ylabel="training step (ms)", title="step time")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax = axes.pop(0)
    for i, k in enumerate(kinds):
      rs = [r for r in cost if r["kind"] == k]
      ax.plot([r["n"] for r in rs], [r["temp_memory_bytes"] / 2**20 for r in rs], "o-",
              color=f"C{i}", label=f"{k} temp")
    ax.set(xscale="log", yscale="log", xlabel="n (tokens per side)", ylabel="MiB",
           title="XLA temporary memory of the step")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
  if quality:
    ax = axes.pop(0)
    for i, m in enumerate(quality["models"]):
      bins = m["eval"]["bins"]
      xs = list(range(len(bins)))
      ax.plot(xs, [b["bleu"] if b["bleu"] is not None else float("nan") for b in bins], "o-",
              color=f"C{i}", label=f"trained on <= {m['max_len']}")
      ax.set_xticks(xs, [b["bin"] for b in bins], fontsize=8)
    ax.set(xlabel="source length (tokens)", ylabel="validation BLEU",
           title="BLEU by source length")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  report.save_figure(fig, path)


def run_quality(sweep_spec: str, root: str, bins: list[tuple[int, int | None]],
                log=print) -> dict[str, Any]:
  """Trains the sweep's points (skipping finished ones) and evaluates each by length bin."""
  from transformer import storage
  from transformer.data import input_pipeline
  from transformer.data.token_cache import TokenizedSplit
  from transformer.data.tokenizer import Tokenizer

  sweep = sweep_lib.load_sweep(sweep_spec)
  failed = sweep_lib.run_points(sweep_spec, sweep, root, parallel=1, log=log)
  if failed:
    raise RuntimeError(f"quality sweep points failed: {', '.join(failed)}")
  rows = {r["name"]: r for r in sweep_lib.collect(sweep, root)}
  splits = input_pipeline.load_splits(sweep.config)  # the points do not change the data
  tokenized: dict[bytes, tuple[list, list]] = {}
  models = []
  for p in sweep.points:
    config = sweep_lib.point_config(sweep, p)
    workdir = sweep_lib.workdir_of(root, sweep.name, p)
    log(f"[seq_len quality] {p.name}: translating the validation split")
    result = evaluate_by_length(config, workdir, splits["validation"], bins)
    # How many training pairs the point kept: the input pipeline's own filter.
    vocab = input_pipeline.vocab_path(workdir)
    key = storage.as_path(vocab).read_bytes()
    if key not in tokenized:
      tokenized[key] = TokenizedSplit.from_sequences(
        *input_pipeline.tokenize_pairs(Tokenizer.load(vocab), splits["train"]))
    kept = input_pipeline.TrainBatches(tokenized[key], config).num_examples
    models.append({"point": p.name, "max_len": int(config.data.max_source_len),
                   "step": rows[p.name]["step"], "train_kept": kept,
                   "train_total": len(splits["train"]), "eval": result,
                   "eval_bleu_sweep": rows[p.name]["eval/bleu"],
                   "test_bleu_sweep": rows[p.name]["test/bleu"]})
  return {"sweep": sweep_spec, "sweep_name": sweep.name, "models": models,
          "workdirs": os.path.join(root, sweep.name),
          "sentences": len(splits["validation"]),
          "beam_size": int(sweep.config.decode.beam_size)}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  parts = set(_F.part.value)
  if not parts or parts - {"cost", "quality"}:
    fail(f"--part={','.join(_F.part.value)}: use cost, quality or both")
  from transformer.errors import UserError

  command = report.command_line()
  # A part that does not run keeps its results (and command) from the last run.
  old = _previous(os.path.join(_F.out.value, "seq_len.json"))
  commands = dict(old.get("commands") or {})
  cost, quality = old.get("cost"), old.get("quality")
  try:
    if "cost" in parts:
      base = _F.config.value or load_module_config(DEFAULT_CONFIG)
      kinds = _F.kinds.value or default_kinds()
      lengths = [int(n) for n in _F.lengths.value]
      cost = cost_sweep(base, kinds, lengths, _F.batch.value, _F.steps.value,
                        _F.max_step_s.value, _F.max_run_gb.value * 1e9)
      commands["cost"] = command
    if "quality" in parts:
      quality = run_quality(_F.quality_sweep.value, _F.root.value,
                            length_bins([int(b) for b in _F.bins.value]))
      commands["quality"] = command
  except (UserError, ValueError) as e:
    fail(str(e))
  paths = write_report(_F.out.value, commands, cost, quality, _F.fit_from.value)
  print(f"wrote {', '.join(paths)}", flush=True)


def load_module_config(spec: str) -> Any:
  """get_config(arg) of a config file given as path[:arg]."""
  import importlib.util

  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"--config: no such file {path}")
  module_spec = importlib.util.spec_from_file_location("_seq_len_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def _previous(path: str) -> dict[str, Any]:
  """The last run's records, so that running one part keeps the other part's results."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  define_flags()
  app.run(main)
