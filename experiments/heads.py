"""Heads sweep: the paper's Table 3, row (A), on the numbers corpus (or WMT on accelerators).

    nice -n 19 python -m experiments.heads                  # 18 CPU runs, configs/sweeps/heads.py
    python -m experiments.heads --sweep=configs/sweeps/heads.py:wmt   # WMT14 base, GPUs/TPUs

The points come from `configs/sweeps/heads.py` (h in {1, 2, 4, 8, 16, 32} at fixed d_model,
d_k = d_v = d_model / h, three seeds) and run with the sweep runner (experiments/sweep.py: the
flags of experiments/sweep.py, resuming, `--parallel`).

The report, `experiments/results/heads.md` (with `.json` and `.png`), gives per h the mean and
standard deviation over seeds of validation perplexity, validation and test BLEU, the parameter
count and the median training-step time, beside the paper's row (A) (Vaswani et al. 2017, Table 3:
WMT14 en-de newstest2013, base model, 100k steps).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from experiments import sweep as sweep_lib
from measuring import report as report_lib  # `report` is this module's report
from transformer.errors import flags_parser

# Vaswani et al. (2017), "Attention Is All You Need", Table 3, rows (A) and base:
# h -> (d_k = d_v, dev perplexity per wordpiece, dev BLEU), newstest2013, d_model 512.
PAPER_ROW_A = {
  1: (512, 5.29, 24.9),
  4: (128, 5.00, 25.5),
  8: (64, 4.92, 25.8),  # the base model
  16: (32, 4.91, 25.8),
  32: (16, 5.01, 25.4),
}
PAPER_CITATION = (
  "A. Vaswani, N. Shazeer, N. Parmar, J. Uszkoreit, L. Jones, A. N. Gomez, L. Kaiser, "
  "I. Polosukhin, \"Attention Is All You Need\", NeurIPS 2017, Table 3 (rows \"base\" and (A): "
  "English-to-German newstest2013, beam search without checkpoint averaging, perplexity per "
  "wordpiece)"
)

SweepRow = dict[str, Any]
# The paper's base model's number of heads: the baseline of the significance tests.
BASE_HEADS = 8


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
  values = [v for v in values if v is not None]
  if not values:
    return None, None
  return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _pm(values: list[float], digits: int) -> str:
  mean, std = _mean_std(values)
  if mean is None:
    return "-"
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


def summarize_by_heads(rows: list[SweepRow], d_model: int) -> list[dict[str, Any]]:
  """Rows grouped by model.num_heads: means and standard deviations over the finished seeds."""
  heads = sorted({r["overrides"]["model.num_heads"] for r in rows})
  out = []
  for h in heads:
    group = [r for r in rows if r["overrides"]["model.num_heads"] == h]
    done = [r for r in group if r["finished"]]
    step_times = [r["step_s"] for r in done if r["step_s"] is not None]
    out.append({
      "h": h,
      "d_k": d_model // h,
      "seeds": len(done),
      "of": len(group),
      "ppl": [r["eval/perplexity"] for r in done],
      "bleu": [r["eval/bleu"] for r in done],
      "test_bleu": [r["test/bleu"] for r in done],
      "params": group[0]["params"],
      "step_ms": 1e3 * statistics.median(step_times) if step_times else None,
      "paper": PAPER_ROW_A.get(h),
    })
  return out


def report_parts(sweep: sweep_lib.Sweep, rows: list[SweepRow], png_path: str) -> dict[str, Any]:
  """The report of the sweep's rows (`report.write`'s title, intro, body and record); draws
  its figure into `png_path`."""
  cfg = sweep.config
  d_model = int(cfg.model.d_model)
  groups = summarize_by_heads(rows, d_model)
  _plot(groups, rows, png_path)
  fmt = report_lib.fmt
  table = [[g["h"], g["d_k"], f"{g['seeds']}/{g['of']}", _pm(g["ppl"], 3), _pm(g["bleu"], 2),
            _pm(g["test_bleu"], 2), f"{g['params']:,}", fmt(g["step_ms"], 1),
            *(fmt(v, d) for v, d in zip(g["paper"] or (None,) * 3, (2, 2, 1), strict=True))]
           for g in groups]
  per_point = [[r["name"], r["overrides"]["model.num_heads"], r["overrides"].get("seed", "-"),
                fmt(r["step"]), fmt(r["eval/perplexity"], 3), fmt(r["eval/bleu"]),
                fmt(r["test/bleu"]), fmt(None if r["step_s"] is None else 1e3 * r["step_s"], 1),
                fmt(r["wall_s"], 0)] for r in rows]
  wall = sum(r["wall_s"] or 0.0 for r in rows)
  # Each point against the paper's base setting (h = 8) with the same seed.
  base = {r["overrides"].get("seed"): r for r in rows
          if r["overrides"]["model.num_heads"] == BASE_HEADS}
  tests = sweep_lib.significance_against(sweep, rows,
                                         lambda r: base.get(r["overrides"].get("seed")))
  spec = f"{sweep.path}{':' + sweep.arg if sweep.arg else ''}"
  decode = cfg.decode
  unfinished = [r["name"] for r in rows if not r["finished"]]
  intro = (
    f"Each point trains the model of `{spec}` with `train_and_evaluate` (d_model {d_model}, "
    f"{cfg.model.num_layers} + {cfg.model.num_layers} layers, d_ff {cfg.model.d_ff}, "
    f"{cfg.num_train_steps} steps of about {cfg.data.tokens_per_batch} tokens per side, "
    f"warm-up {cfg.optimizer.warmup_steps}, dataset `{cfg.dataset}`), varying only h with "
    "d_k = d_v = d_model / h, so every point has the same parameter count and FLOPs. "
    f"valid = the validation split: perplexity on all of it, BLEU on its first "
    f"{cfg.evals.valid_translation.sentences or 'all'} sentences; test BLEU on the whole test "
    "split; "
    f"decoding with beam {decode.beam_size}"
    f"{' (greedy)' if decode.beam_size == 1 else f', alpha {decode.alpha}'}. "
    "Means ± standard deviations over seeds (the seed changes the initialisation, the batch "
    "order and the SentencePiece sample). step (ms) = median over the finished seeds of each "
    "run's median training-step time (logged windows after the first, which holds the "
    "compilation).\n\n"
    "The paper's columns are " + PAPER_CITATION + ". They are WMT numbers for a 512-wide "
    "model trained for 12 hours on 8 GPUs and are shown for their trend only: the absolute "
    "values are not comparable with a 128-wide model on the numbers corpus. The paper has no "
    "h = 2 row.")
  body = [
      "## Results\n",
      f"Training time of all points: {wall / 60:.1f} min (sum of the points' wall times).\n",
      report_lib.markdown_table(["h", "d_k = d_v", "seeds", "valid PPL", "valid BLEU",
                                 "test BLEU", "params", "step (ms)", "paper d_k", "paper PPL",
                                 "paper BLEU"], table),
      f"\n![heads]({os.path.basename(png_path)})\n", "## Every point\n",
      report_lib.markdown_table(["point", "h", "seed", "step", "valid PPL", "valid BLEU",
                                 "test BLEU", "step (ms)", "wall (s)"], per_point),
    ] + ([f"\nUnfinished points (no test/bleu yet): {', '.join(unfinished)}.\n"]
         if unfinished else []) + sweep_lib.significance_table(tests)
  return {"title": f"Number of attention heads (Table 3, row A): `{sweep.name}`",
          "intro": intro, "body": body,
          "record": {"groups": groups, "rows": rows, "significance": tests}}


def _plot(groups: list[dict[str, Any]], rows: list[SweepRow], path: str) -> None:
  fig, axes = report_lib.figure(1, 3, figsize=(13, 3.6))
  panels = [("ppl", "eval/perplexity", "validation perplexity", 1),
            ("bleu", "eval/bleu", "validation BLEU", 2)]
  for ax, (key, row_key, label, paper_index) in zip(axes[:2], panels, strict=True):
    for r in rows:
      if r["finished"]:
        ax.plot(r["overrides"]["model.num_heads"], r[row_key], ".", color="C0", alpha=0.4)
    hs = [g["h"] for g in groups if g[key]]
    means = [_mean_std(g[key])[0] for g in groups if g[key]]
    ax.plot(hs, means, "o-", color="C0", label="this run (mean of seeds)")
    ax.set_xscale("log", base=2)
    ax.set_xticks([g["h"] for g in groups], [str(g["h"]) for g in groups])
    ax.set_xlabel("heads h (d_k = d_model / h)")
    ax.set_ylabel(label, color="C0")
    twin = ax.twinx()
    paper = sorted((h, v[paper_index]) for h, v in PAPER_ROW_A.items())
    twin.plot([h for h, _ in paper], [v for _, v in paper], "s--", color="C3",
              label="paper, WMT dev (right axis)")
    twin.set_ylabel(f"paper {label.split()[-1]}", color="C3")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [ln.get_label() for ln in lines], fontsize=7, loc="best")
    ax.grid(alpha=0.3)
  ax = axes[2]
  hs = [g["h"] for g in groups if g["step_ms"] is not None]
  ax.plot(hs, [g["step_ms"] for g in groups if g["step_ms"] is not None], "o-", color="C2")
  ax.set_xscale("log", base=2)
  ax.set_xticks([g["h"] for g in groups], [str(g["h"]) for g in groups])
  ax.set_xlabel("heads h")
  ax.set_ylabel("training step (ms, median)")
  ax.grid(alpha=0.3)
  report_lib.save_figure(fig, path)


if __name__ == "__main__":
  from absl import app

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  FLAGS = sweep_lib.define_flags(default_sweep="configs/sweeps/heads.py")
  app.run(lambda argv: sweep_lib.main(argv, FLAGS, report=report_parts),
          flags_parser=flags_parser())
