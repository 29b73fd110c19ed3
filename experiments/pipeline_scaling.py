"""The data path against the corpus size: pipeline_benchmark's records at several sizes, one table.

    python -m experiments.synthetic_wmt --pair=fr-en --train_size=4508785 \
        --data_dir=/tmp/synth_fr_4m5                                # and 18000000 pairs
    python -m experiments.pipeline_benchmark --config=configs/wmt.py:fr_base \\
        --config.data_dir=/tmp/synth_fr_4m5 --workdir=/tmp/pb_fr_4m5 \\
        --out=experiments/results/pipeline_fr_4m5                   # and the same for 18m
    python -m experiments.pipeline_scaling \\
        --runs=experiments/results/pipeline_fr_4m5.json,experiments/results/pipeline_fr_18m.json \\
        --out=experiments/results/pipeline_fr

Reads the JSON records that `experiments/pipeline_benchmark.py` wrote (one per corpus size: a
first start on an empty workdir, then a restart) and writes one report: per corpus size, the
first start and the restart to the first step, the vocabulary's time, the token cache's build
time and size on disk, and the peak host RSS of every stage; then a linear fit in the number of
pairs of the first start and of the cache size, extrapolated to `--extrapolate` sizes (the
paper's 36M pairs and TFDS's 40.8M), and the two promises checked at every measured size: a
restart reaches the first step within `--restart_limit` seconds and no stage of the data path
holds more than `--rss_limit_gib` of host memory, and neither grows with the corpus.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from absl import app, flags

from experiments import report
from transformer.errors import fail, parse_flags

_RUNS = flags.DEFINE_list(
  "runs",
  [os.path.join("experiments", "results", f"pipeline_fr_{s}.json") for s in ("4m5", "18m")],
  "JSON records of experiments.pipeline_benchmark, one per corpus size.",
)
_OUT = flags.DEFINE_string("out", os.path.join("experiments", "results", "pipeline_fr"),
                           "Report path without extension (.md and .json).")
_EXTRAPOLATE = flags.DEFINE_list("extrapolate", ["36000000", "40836876"],
                                 "Corpus sizes (pairs) to extrapolate the linear fits to.")
_RESTART_LIMIT = flags.DEFINE_float("restart_limit", 60.0,
                                    "Promise: seconds from a restart to the first step.")
_RSS_LIMIT = flags.DEFINE_float("rss_limit_gib", 4.0,
                                "Promise: peak host RSS (GiB) of every data-path stage.")
# A measured quantity "does not grow" when the largest corpus's value is within this factor of
# the smallest corpus's (timing noise on a shared machine; RSS of the allocator's arenas).
GROWTH_TOLERANCE = 1.5
GIB = 2.0**30
FIRST_STEP = "first step"  # pipeline_benchmark's stage after the data path


def data_stages(run: dict[str, Any]) -> list[dict[str, Any]]:
  """The stages of a start before its first step: the data path (open ... batch plan)."""
  names = [s["stage"] for s in run["stages"]]
  return run["stages"][: names.index(FIRST_STEP)]


def summary(record: dict[str, Any]) -> dict[str, Any]:
  """The numbers of one pipeline_benchmark record that the scaling report compares."""
  runs = record["runs"]
  first, restart = runs["first start"], runs["restart"]

  def by_stage(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {s["stage"]: s for s in run["stages"]}

  def data_peak(run: dict[str, Any]) -> float:
    return max(s["peak_rss_bytes"] for s in data_stages(run))

  return {
    "pairs": restart["train_examples"],
    "first_start_s": first["to_first_step_seconds"],
    "restart_s": restart["to_first_step_seconds"],
    "restart_data_s": sum(s["seconds"] for s in data_stages(restart)),
    "vocabulary_s": by_stage(first)["vocabulary"]["seconds"],
    "token_cache_s": by_stage(first)["token cache"]["seconds"],
    "token_cache_bytes": restart.get("token_cache_bytes"),
    "first_start_stages": by_stage(first),
    "restart_stages": by_stage(restart),
    "first_start_data_peak": data_peak(first),
    "restart_data_peak": data_peak(restart),
    "data_stage_names": [s["stage"] for s in data_stages(restart)],
    "step_xla_bytes": restart["step_xla_bytes"],
    "command": record["command"],
    "date": record["hardware"]["date"],
    "load_avg_1m": record["hardware"]["load_avg_1m"],
  }


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
  """Least-squares (slope, intercept) of ys against xs: the line through two points."""
  slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
  return float(slope), float(intercept)


def check_promises(rows: list[dict[str, Any]], restart_limit: float,
                   rss_limit: float) -> list[tuple[str, bool, str]]:
  """(promise, holds, evidence) for the restart time and each data stage's peak RSS."""
  small, large = rows[0], rows[-1]
  checks = []
  worst = max(rows, key=lambda r: r["restart_s"])
  checks.append((f"restart to the first step <= {restart_limit:.0f} s at every size",
                 worst["restart_s"] <= restart_limit,
                 f"largest {worst['restart_s']:.1f} s, at {worst['pairs']:,} pairs"))
  for key, what in (("restart_s", "restart to the first step"),
                    ("restart_data_s", "restart's data path (open ... batch plan)")):
    growth = large[key] / small[key]
    checks.append((f"the {what} does not grow with the corpus", growth <= GROWTH_TOLERANCE,
                   f"{large[key]:.1f} s / {small[key]:.1f} s = {growth:.2f}x for "
                   f"{large['pairs'] / small['pairs']:.1f}x the pairs"))
  for start in ("first_start", "restart"):
    label = start.replace("_", " ")
    peaks = [(r[f"{start}_data_peak"], r["pairs"]) for r in rows]
    peak, pairs = max(peaks)
    checks.append((f"{label}: peak host RSS of every data stage <= {rss_limit:.0f} GiB",
                   peak <= rss_limit * GIB, f"largest {peak / GIB:.2f} GiB, at {pairs:,} pairs"))
    growth = large[f"{start}_data_peak"] / small[f"{start}_data_peak"]
    checks.append((f"{label}: peak host RSS of the data path does not grow with the corpus",
                   growth <= GROWTH_TOLERANCE,
                   f"{large[f'{start}_data_peak'] / GIB:.2f} GiB / "
                   f"{small[f'{start}_data_peak'] / GIB:.2f} GiB = {growth:.2f}x"))
  return checks


def write_report(rows: list[dict[str, Any]], extrapolate: list[int], command: str) -> None:
  sizes = [f"{r['pairs'] / 1e6:.1f}M" for r in rows]
  main_rows = [[
    f"{r['pairs']:,}", f"{r['first_start_s']:.1f}", f"{r['restart_s']:.1f}",
    f"{r['vocabulary_s']:.1f}", f"{r['token_cache_s']:.1f}",
    report.fmt(None if r["token_cache_bytes"] is None else r["token_cache_bytes"] / GIB),
    f"{r['first_start_data_peak'] / GIB:.2f}", f"{r['restart_data_peak'] / GIB:.2f}",
  ] for r in rows]
  stages = list(rows[0]["first_start_stages"])
  rss_rows = []
  for stage in stages:
    cells = [f"{r[f'{s}_stages'][stage]['peak_rss_bytes'] / GIB:.2f}"
             for s in ("first_start", "restart") for r in rows]
    rss_rows.append([stage, *cells])
  time_rows = []
  for stage in stages:
    cells = [f"{r[f'{s}_stages'][stage]['seconds']:.1f}"
             for s in ("first_start", "restart") for r in rows]
    time_rows.append([stage, *cells])
  cols = [f"first start {z}" for z in sizes] + [f"restart {z}" for z in sizes]

  pairs = [r["pairs"] for r in rows]
  fits = {"first start to the first step (s)": [r["first_start_s"] for r in rows],
          "token cache build (s)": [r["token_cache_s"] for r in rows],
          "restart to the first step (s)": [r["restart_s"] for r in rows]}
  if all(r["token_cache_bytes"] is not None for r in rows):
    fits["token cache on disk (GiB)"] = [r["token_cache_bytes"] / GIB for r in rows]
  fit_rows, fit_records = [], {}
  for name, ys in fits.items():
    slope, intercept = linear_fit(pairs, ys)
    at = [slope * n + intercept for n in extrapolate]
    fit_records[name] = {"slope_per_million_pairs": slope * 1e6, "intercept": intercept,
                         "extrapolated": dict(zip(map(str, extrapolate), at, strict=True))}
    fit_rows.append([name, f"{slope * 1e6:.2f}", f"{intercept:.1f}", *[f"{v:.1f}" for v in at]])
  how = ("the line through the two measured sizes" if len(rows) == 2
         else f"a least-squares line through the {len(rows)} measured sizes")

  checks = check_promises(rows, _RESTART_LIMIT.value, _RSS_LIMIT.value)
  check_lines = [f"- {'holds' if ok else '**violated**'}: {what} ({why})."
                 for what, ok, why in checks]
  step = rows[-1]
  report.write_markdown(
    _OUT.value + ".md", "The data path against the corpus size: WMT14 English-French",
    "Made by `experiments/pipeline_scaling.py` from the records of "
    "`experiments/pipeline_benchmark.py` (method in their docstrings), one per corpus size: "
    "the synthetic `wmt14_translate/fr-en` of `experiments/synthetic_wmt.py --pair=fr-en` "
    "(the real TFDS builder and layout, nonsense text with WMT-like lengths) at "
    f"{', '.join(f'{n:,}' for n in pairs)} training pairs; each benchmark runs a first start "
    "on an empty workdir and a restart, each in a fresh process, with a tiny model so that the "
    "data path dominates.",
    {**{f"corpus {z} ({r['date']}, load {report.fmt(r['load_avg_1m'])})": r["command"]
        for z, r in zip(sizes, rows, strict=True)}, "this report": command},
    [
      "## Results\n",
      report.markdown_table(
        ["training pairs", "first start to the first step (s)",
         "restart to the first step (s)", "vocabulary (s)", "token cache build (s)",
         "token cache on disk (GiB)", "peak RSS data path, first start (GiB)",
         "peak RSS data path, restart (GiB)"], main_rows),
      "Peak host RSS per stage (GiB):\n",
      report.markdown_table(["stage", *cols], rss_rows),
      "Seconds per stage:\n",
      report.markdown_table(["stage", *cols], time_rows),
      f"- The first step's RSS is the step's own buffers: XLA accounts "
      f"{step['step_xla_bytes'] / GIB:.2f} GiB for the first batch (logits over the "
      "vocabulary and their gradient); on a CPU they are host memory, on a GPU or TPU device "
      "memory. The data path's peak is the largest of the stages before the first step "
      f"({', '.join(step['data_stage_names'])}).\n",
      "## Promises\n",
      *check_lines,
      "",
      "## Extrapolation\n",
      f"Not measured: {how} in the number of pairs, evaluated at "
      f"{', '.join(f'{n:,}' for n in extrapolate)} pairs (36M: the paper's English-French "
      "corpus; 40,836,876: TFDS's `wmt14_translate/fr-en` train split).\n",
      report.markdown_table(["quantity", "slope per 1M pairs", "intercept",
                             *[f"at {n / 1e6:.1f}M pairs" for n in extrapolate]], fit_rows),
    ],
  )
  report.write_json(_OUT.value + ".json", {
    "command": command, "hardware": report.hardware(),
    "sizes": [{k: v for k, v in r.items() if not k.endswith("_stages")} for r in rows],
    "fits": fit_records,
    "promises": [{"promise": w, "holds": ok, "evidence": why} for w, ok, why in checks],
  })


def main(argv: list[str]) -> None:
  del argv
  records = []
  for path in _RUNS.value:
    record = report.read_json(path)
    if not record:
      fail(f"--runs: no pipeline_benchmark record at {path}")
    records.append(summary(record))
  try:
    extrapolate = [int(float(n)) for n in _EXTRAPOLATE.value]
  except ValueError:
    fail(f"--extrapolate={','.join(_EXTRAPOLATE.value)}: expected numbers of pairs")
  rows = sorted(records, key=lambda r: r["pairs"])
  if len({r["pairs"] for r in rows}) < 2:
    fail("--runs: need records at two or more corpus sizes for a fit")
  write_report(rows, extrapolate, report.command_line())
  print(f"wrote {_OUT.value}.md", flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
