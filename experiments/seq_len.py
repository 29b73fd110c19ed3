"""Sequence length: what a training step costs at length n, and how models trained on short
sentences translate longer ones.

    nice -n 19 python -m experiments.seq_len                 # both parts, CPU defaults
    python -m experiments.seq_len --part=cost --lengths=64,128,...,16384 --batch_size=8  # GPU

(a) cost: `step_cost.cost_sweep` for n = 64 ... 4096 (source = target = n tokens) over the
Transformer of `--config` with each attention implementation that applies here and its
equal-size LSTMs (with and without attention): XLA memory, sequential loop iterations, step
time, and growth exponents over all n and over n >= `--fit_from`.

(b) quality: the sweep `configs/sweeps/seq_len.py` trains the numbers model on training pairs of
at most 24, 48 or 64 tokens per side with the sweep runner (experiments/sweep.py: own
workdirs, resumes, skips finished points); each trained model then translates the whole
validation split, and BLEU is reported by bins of source length in tokens, so that sentences
longer than any seen in training are scored apart (`run_quality`).

Writes experiments/results/seq_len.md, seq_len.png and seq_len.json (every record); a part
that does not run keeps its records from the last run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from experiments import sweep as sweep_lib
from measuring import report, step_cost
from transformer.errors import UserError, fail, flags_parser


def length_bins(edges: Sequence[int]) -> list[tuple[int, int | None]]:
  """[(1, e0), (e0 + 1, e1), ..., (e_last + 1, None)]: inclusive token-count ranges."""
  out, lo = [], 1
  for e in edges:
    out.append((lo, int(e)))
    lo = int(e) + 1
  return out + [(lo, None)]


def bleu_by_bin(sources: list[list[int]], hyps: list[str], refs: list[str],
                bins: list[tuple[int, int | None]]) -> list[dict[str, Any]]:
  """Corpus BLEU of the sentences whose source length (tokens, EOS included) is in each bin."""
  from transformer.decoding import bleu as bleu_lib

  out = []
  for lo, hi in bins:
    idx = [i for i, s in enumerate(sources) if len(s) >= lo and (hi is None or len(s) <= hi)]
    score = None
    if idx:
      score = bleu_lib.corpus_bleu([hyps[i] for i in idx], [refs[i] for i in idx]).score
    out.append({"bin": f"{lo}-{hi}" if hi is not None else f">{lo - 1}", "lo": lo, "hi": hi,
                "sentences": len(idx), "bleu": score})
  return out


def run_quality(sweep_spec: str, root: str, bins: list[tuple[int, int | None]],
                log: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains the sweep's points (skipping finished ones); BLEU of each by source-length bin."""
  from transformer import infer
  from transformer.data import input_pipeline
  from transformer.data.token_cache import TokenizedSplit
  from transformer.decoding import bleu as bleu_lib

  sweep = sweep_lib.load_sweep(sweep_spec)
  failed = sweep_lib.run_points(sweep_spec, sweep, root, parallel=1, log=log)
  if failed:
    raise RuntimeError(f"quality sweep points failed: {', '.join(failed)}")
  rows = {r["name"]: r for r in sweep_lib.collect(sweep, root)}
  splits = input_pipeline.load_splits(sweep.config)  # the points do not change the data
  tokenized: dict[str, TokenizedSplit] = {}  # by vocabulary: the points share one
  models = []
  for p in sweep.points:
    config = sweep_lib.point_config(sweep, p)
    log(f"[seq_len quality] {p.name}: translating the validation split")
    restored = infer.restore(config, sweep_lib.workdir_of(root, sweep.name, p))
    tokenizer = restored.tokenizer
    sources = [tokenizer.encode(s) for s, _ in splits["validation"]]
    hyps = [tokenizer.decode(ids)
            for ids in restored.translator.translate_ids(restored.params, sources)]
    refs = [t for _, t in splits["validation"]]
    # How many training pairs the point kept: the input pipeline's own filter.
    if tokenizer.sha256 not in tokenized:
      tokenized[tokenizer.sha256] = TokenizedSplit.from_sequences(
        *input_pipeline.tokenize_pairs(tokenizer, splits["train"]))
    kept = input_pipeline.train_batches(tokenized[tokenizer.sha256], config).num_examples
    models.append({"point": p.name, "max_len": int(config.data.max_source_len),
                   "step": rows[p.name]["step"], "train_kept": kept,
                   "train_total": len(splits["train"]),
                   "eval": {"checkpoint": restored.label,
                            "bleu_all": bleu_lib.corpus_bleu(hyps, refs).score,
                            "bins": bleu_by_bin(sources, hyps, refs, bins)},
                   "eval_bleu_sweep": rows[p.name]["eval/bleu"],
                   "test_bleu_sweep": rows[p.name]["test/bleu"]})
  return {"sweep": sweep_spec, "sweep_name": sweep.name, "models": models,
          "workdirs": os.path.join(root, sweep.name), "sentences": len(splits["validation"]),
          "beam_size": int(sweep.config.decode.beam_size)}


def quality_markdown(quality: dict[str, Any]) -> list[str]:
  models = quality["models"]
  counts = {b["bin"]: b["sentences"] for b in models[0]["eval"]["bins"]}
  header = ["trained on <= (tokens)", "training pairs kept", "steps", "all"] + [
    f"{b} ({n})" for b, n in counts.items()]
  rows = [[m["max_len"], f"{m['train_kept']:,} / {m['train_total']:,}", m["step"],
           report.fmt(m["eval"]["bleu_all"])]
          + [report.fmt(b["bleu"]) + (" *" if b["lo"] > m["max_len"] else "")
             for b in m["eval"]["bins"]] for m in models]
  return [
    "\n## (b) Translating sentences longer than any seen in training\n",
    f"Sweep `{quality['sweep']}` (trained by the sweep runner in "
    f"`{quality.get('workdirs', quality['sweep_name'])}/`). Validation BLEU of the whole "
    f"validation split ({quality['sentences']} sentences) by bin of source length in tokens "
    "(EOS included; sentence count in brackets), decoding as in the config "
    f"(beam {quality['beam_size']}). * marks bins entirely longer than the model's training "
    "limit.\n",
    report.markdown_table(header, rows),
  ]


def report_parts(cost: list[dict[str, Any]] | None, quality: dict[str, Any] | None,
                 fit_from: int, png_path: str) -> dict[str, Any]:
  """The report of the parts there are (`report.write`'s title, intro, body and record); draws
  the figure into `png_path`."""
  body = []
  if cost:
    tables = step_cost.cost_tables(cost, fit_from)
    body += ["## (a) Cost of one training step against n\n",
             f"Batch {cost[0]['batch_size']} x n source + n target tokens. Models: "
             f"{step_cost.models_line(cost)}. `xla`/`chunked`/`cudnn` are the Transformer's "
             "attention implementations (`cudnn` runs on GPUs only and is absent from a CPU "
             "run).\n",
             "### Training-step time\n", tables["time"] + step_cost.not_timed(cost),
             "\n### Memory of the compiled step (XLA memory analysis, per device)\n",
             tables["memory"],
             "\n### Sequential loop iterations in the compiled step (HLO `while` trip counts)\n",
             tables["loops"],
             "\n### Fitted growth exponents (slope of log y on log n)\n", tables["exponents"]]
  if quality:
    body += quality_markdown(quality)
  if cost or quality:
    _plot(cost, quality, png_path)
    body.append(f"\n![seq_len]({os.path.basename(png_path)})\n")
  return {"title": "Sequence length: cost of a training step, and translating longer sentences",
          "intro": "Produced by `experiments/seq_len.py` (method in its docstring and in "
                   "`measuring/step_cost.py`); every record is in `seq_len.json`.",
          "body": body, "record": {"cost": cost, "quality": quality}}


def _plot(cost: list[dict[str, Any]] | None, quality: dict[str, Any] | None, path: str) -> None:
  panels = (2 if cost else 0) + (1 if quality else 0)
  fig, axes = report.figure(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
  axes = list(axes[0])
  if cost:
    step_cost.plot_cost(axes[:2], cost, ("step_s", "temp_memory_bytes"))
  if quality:
    ax = axes[-1]
    records = [{"model": f"trained on <= {m['max_len']}", "x": i, "bleu": b["bleu"]}
               for m in quality["models"] for i, b in enumerate(m["eval"]["bins"])]
    report.plot_series(ax, records, "x", "bleu", group="model")
    bins = quality["models"][0]["eval"]["bins"]
    ax.set_xticks(range(len(bins)), [b["bin"] for b in bins], fontsize=8)
    ax.set(ylabel="validation BLEU", title="BLEU by source length")
    report.finish_axes([ax], "source length (tokens)")
  report.save_figure(fig, path)


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _PART = flags.DEFINE_list("part", ["cost", "quality"], "cost, quality, or both.")
  _CONFIG = config_flags.DEFINE_config_file("config", None,
                                            "Model of the cost part (configs/numbers.py).")
  _LENGTHS = flags.DEFINE_list("lengths", [str(2**k) for k in range(6, 13)],
                               "Sequence lengths n (source = target = n).")
  _BATCH = flags.DEFINE_integer("batch_size", 2, "Rows per training step (cost).")
  _KINDS = flags.DEFINE_list("kinds", [], "Models: xla, chunked, cudnn (Transformer "
                             "attention), lstm, lstm_noattn; default: all that apply here "
                             "(cudnn only on GPU).")
  _STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per length (best is kept).")
  _MAX_STEP_S = flags.DEFINE_float("max_step_s", 20.0, "Do not time steps predicted slower.")
  _MAX_RUN_GB = flags.DEFINE_float("max_run_gb", 6.0, "Do not run steps needing more memory.")
  _FIT_FROM = flags.DEFINE_integer("fit_from", 512, "Second fit: lengths >= this only.")
  _QUALITY_SWEEP = flags.DEFINE_string("quality_sweep", "configs/sweeps/seq_len.py",
                                       "Sweep file of the quality part.")
  _BINS = flags.DEFINE_list("bins", ["16", "24", "32", "48", "64"],
                            "Upper edges of the source-length bins (tokens).")
  _OUT = flags.DEFINE_string("out", os.path.join("experiments", "results"),
                             "Results directory.")
  _ROOT = flags.DEFINE_string("root", os.path.join("runs", "sweeps"), "Quality runs' root.")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    parts = set(_PART.value)
    if not parts or parts - {"cost", "quality"}:
      fail(f"--part={','.join(_PART.value)}: use cost, quality or both")
    command = report.command_line()
    # A part that does not run keeps its results (and command) from the last run.
    path = os.path.join(_OUT.value, "seq_len")
    old = report.read_json(path + ".json")
    commands = dict(old.get("command") or {})
    cost, quality = old.get("cost"), old.get("quality")
    try:
      if "cost" in parts:
        cost = step_cost.cost_sweep(_CONFIG.value, _KINDS.value or step_cost.default_kinds(),
                                    [int(n) for n in _LENGTHS.value], _BATCH.value,
                                    _STEPS.value, _MAX_STEP_S.value, _MAX_RUN_GB.value * 1e9)
        commands["cost"] = command
      if "quality" in parts:
        quality = run_quality(_QUALITY_SWEEP.value, _ROOT.value,
                              length_bins([int(b) for b in _BINS.value]))
        commands["quality"] = command
    except (UserError, ValueError) as e:
      fail(str(e))
    paths = report.write(path, command=commands,
                         **report_parts(cost, quality, _FIT_FROM.value, path + ".png"))
    print(f"wrote {', '.join(paths)}", flush=True)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser(config="configs/numbers.py"))
