"""The data path against the corpus size: benchmarks.pipeline's records at several sizes, one table.

    python -m benchmarks.synthetic_wmt --pair=fr-en --train_size=4508785 \
        --data_dir=/tmp/synth_fr_4m5                                # and 18000000 pairs
    python -m benchmarks.pipeline --config=configs/wmt.py:fr_base \\
        --config.data_dir=/tmp/synth_fr_4m5 --workdir=/tmp/pb_fr_4m5 \\
        --section=fr-4m5                                            # and the same for 18m
    python -m benchmarks.pipeline_scaling --runs=fr-4m5,fr-18m

Reads the records that `benchmarks/pipeline.py` wrote, sections `--runs` of `--records` (one
per corpus size: a first start on an empty workdir, then a restart) and writes one report: per
corpus size, the first start and the restart to the first step, the vocabulary's time, the
token cache's build time and size on disk, and the peak host RSS of every stage; then a linear
fit in the number of pairs of the first start and of the cache size, extrapolated to
`--extrapolate` sizes (the paper's 36M pairs and TFDS's 40.8M), and the two promises checked at
every measured size: a restart reaches the first step within `--restart_limit` seconds and no
stage of the data path holds more than `--rss_limit_gib` of host memory, and neither grows with
the corpus.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from measuring import report
from transformer.errors import fail, flags_parser

# A measured quantity "does not grow" when the largest corpus's value is within this factor of
# the smallest corpus's (timing noise on a shared machine; RSS of the allocator's arenas).
GROWTH_TOLERANCE = 1.5
GIB = 2.0**30
FIRST_STEP = "first step"  # benchmarks.pipeline's stage after the data path
# The starts of a record (benchmarks.pipeline's runs and its warm-cache restart).
FIRST, COLD, WARM = "first start", "restart", "warm restart"


def data_stages(run: dict[str, Any]) -> list[dict[str, Any]]:
  """The stages of a start before its first step: the data path (open ... batch plan)."""
  names = [s["stage"] for s in run["stages"]]
  return run["stages"][: names.index(FIRST_STEP)]


def summary(record: dict[str, Any]) -> dict[str, Any]:
  """The numbers of one benchmarks.pipeline record that the scaling report compares."""
  runs = {FIRST: record["runs"]["first start"], COLD: record["runs"]["restart"]}
  if record.get("warm_compilation_cache"):
    runs[WARM] = record["warm_compilation_cache"]
  first, restart = runs[FIRST], runs[COLD]
  stages = {s["stage"]: s for s in first["stages"]}
  return {
    "pairs": restart["train_examples"],
    "starts": {label: {
      "to_first_step_s": run["to_first_step_seconds"],
      "data_s": sum(s["seconds"] for s in data_stages(run)),
      "data_peak_bytes": max(s["peak_rss_bytes"] for s in data_stages(run)),
      "stages": {s["stage"]: s for s in run["stages"]},
    } for label, run in runs.items()},
    "vocabulary_s": stages["vocabulary"]["seconds"],
    "token_cache_s": stages["token cache"]["seconds"],
    "token_cache_bytes": restart.get("token_cache_bytes"),
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
  """(promise, holds, evidence): each restart's time to the first step, and every start's
  data-path peak RSS, at every size and against the corpus size (`rows` by size)."""
  small, large = rows[0], rows[-1]
  factor = f"{large['pairs'] / small['pairs']:.1f}x the pairs"
  checks = []
  for label in [k for k in large["starts"] if k != FIRST]:
    times = [(r["starts"][label]["to_first_step_s"], r["pairs"]) for r in rows]
    worst, at = max(times)
    checks.append((f"{label}: to the first step <= {restart_limit:.0f} s at every size",
                   worst <= restart_limit, f"largest {worst:.1f} s, at {at:,} pairs"))
    a, b = small["starts"][label]["data_s"], large["starts"][label]["data_s"]
    checks.append((f"{label}: the data path's time (open ... batch plan) does not grow with "
                   "the corpus", b / a <= GROWTH_TOLERANCE,
                   f"{b:.1f} s / {a:.1f} s = {b / a:.2f}x for {factor}"))
  for label in large["starts"]:
    peaks = [(r["starts"][label]["data_peak_bytes"], r["pairs"]) for r in rows]
    peak, at = max(peaks)
    checks.append((f"{label}: peak host RSS of every data-path stage <= {rss_limit:.0f} GiB",
                   peak <= rss_limit * GIB, f"largest {peak / GIB:.2f} GiB, at {at:,} pairs"))
    a, b = (r["starts"][label]["data_peak_bytes"] for r in (small, large))
    checks.append((f"{label}: the data path's peak host RSS does not grow with the corpus",
                   b / a <= GROWTH_TOLERANCE,
                   f"{b / GIB:.2f} GiB / {a / GIB:.2f} GiB = {b / a:.2f}x for {factor}"))
  return checks


def stage_table(rows: list[dict[str, Any]], sizes: list[str], cell: Any) -> str:
  """A table of `cell(stage record)` per stage (rows) and per start and size (columns)."""
  labels = list(rows[-1]["starts"])
  header = ["stage"] + [f"{label}, {z}" for label in labels for z in sizes]
  body = []
  for stage in rows[-1]["starts"][FIRST]["stages"]:
    body.append([stage] + [report.fmt(cell(r["starts"][label]["stages"].get(stage)))
                           for label in labels for r in rows])
  return report.markdown_table(header, body)


def report_parts(rows: list[dict[str, Any]], extrapolate: list[int], command: str,
                 restart_limit: float = 60.0, rss_limit: float = 4.0) -> dict[str, Any]:
  """`report.write`'s title, intro, body, record and command (the records' and this report's,
  `command`) from the summaries of the records (`summary`), by corpus size."""
  sizes = [f"{r['pairs'] / 1e6:.1f}M" for r in rows]
  labels = list(rows[-1]["starts"])
  main_rows = [[
    f"{r['pairs']:,}", *[f"{r['starts'][k]['to_first_step_s']:.1f}" for k in labels],
    f"{r['vocabulary_s']:.1f}", f"{r['token_cache_s']:.1f}",
    report.fmt(None if r["token_cache_bytes"] is None else r["token_cache_bytes"] / GIB),
    *[f"{r['starts'][k]['data_peak_bytes'] / GIB:.2f}" for k in labels],
  ] for r in rows]
  main_header = (["training pairs"] + [f"{k}: to the first step (s)" for k in labels]
                 + ["vocabulary (s)", "token cache build (s)", "token cache on disk (GiB)"]
                 + [f"{k}: data-path peak RSS (GiB)" for k in labels])

  pairs = [r["pairs"] for r in rows]
  fits = {f"{k}: to the first step (s)": [r["starts"][k]["to_first_step_s"] for r in rows]
          for k in labels}
  fits["token cache build (s)"] = [r["token_cache_s"] for r in rows]
  if all(r["token_cache_bytes"] is not None for r in rows):
    fits["token cache on disk (GiB)"] = [r["token_cache_bytes"] / GIB for r in rows]
  fits.update({f"{k}: data-path peak RSS (GiB)": [r["starts"][k]["data_peak_bytes"] / GIB
                                                  for r in rows] for k in labels})
  fit_rows, fit_records = [], {}
  for name, ys in fits.items():
    slope, intercept = linear_fit(pairs, ys)
    at = [slope * n + intercept for n in extrapolate]
    fit_records[name] = {"slope_per_million_pairs": slope * 1e6, "intercept": intercept,
                         "extrapolated": dict(zip(map(str, extrapolate), at, strict=True))}
    fit_rows.append([name, f"{slope * 1e6:.3f}", f"{intercept:.2f}",
                     *[f"{v:.2f}" for v in at]])
  how = ("the line through the two measured sizes" if len(rows) == 2
         else f"a least-squares line through the {len(rows)} measured sizes")

  checks = check_promises(rows, restart_limit, rss_limit)
  check_lines = [f"- {'holds' if ok else '**violated**'}: {what} ({why})."
                 for what, ok, why in checks]
  last = rows[-1]
  return {
    "title": "The data path against the corpus size: WMT14 English-French",
    "intro": "Made by `benchmarks/pipeline_scaling.py` from the records of "
    "`benchmarks/pipeline.py` (method in their docstrings), one per corpus size: "
    "the synthetic `wmt14_translate/fr-en` of `benchmarks/synthetic_wmt.py --pair=fr-en` "
    "(the real TFDS builder and layout, nonsense text with WMT-like lengths) at "
    f"{', '.join(f'{n:,}' for n in pairs)} training pairs. Each benchmark runs, each in a "
    f"fresh process: a {FIRST} on an empty workdir, a {COLD} (vocabulary and token cache "
    f"present, an empty JAX compilation cache), and a {WARM} (the first start's compilation "
    "cache: the default, a cache under the local cache root); with a tiny model, so that the "
    "data path dominates.",
    "command": {**{f"corpus {z} ({r['date']}, load {report.fmt(r['load_avg_1m'])})": r["command"]
                   for z, r in zip(sizes, rows, strict=True)}, "this report": command},
    "body": [
      "## Results\n",
      report.markdown_table(main_header, main_rows),
      "Peak host RSS per stage (GiB):\n",
      stage_table(rows, sizes,
                  lambda s: None if s is None else f"{s['peak_rss_bytes'] / GIB:.2f}"),
      "Seconds per stage:\n",
      stage_table(rows, sizes, lambda s: None if s is None else f"{s['seconds']:.1f}"),
      f"- The data path is the stages before the first step "
      f"({', '.join(last['data_stage_names'])}). The first step's RSS is mostly the step's own "
      f"buffers: XLA accounts {last['step_xla_bytes'] / GIB:.2f} GiB for the first batch "
      "(logits over the vocabulary and their gradient); on a CPU they are host memory, on a "
      "GPU or TPU device memory.\n",
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
    "record": {
      "sizes": rows, "fits": fit_records,
      "promises": [{"promise": w, "holds": ok, "evidence": why} for w, ok, why in checks]},
  }


if __name__ == "__main__":
  from absl import app, flags

  _RECORDS = flags.DEFINE_string("records", os.path.join("benchmarks", "results", "pipeline.json"),
                                 "The report of benchmarks.pipeline that holds the runs.")
  _RUNS = flags.DEFINE_list("runs", ["fr-4m5", "fr-18m"],
                            "Sections of --records, one per corpus size.")
  _OUT = flags.DEFINE_string("out", os.path.join("benchmarks", "results", "pipeline_scaling"),
                             "Report path without extension (.md and .json).")
  _EXTRAPOLATE = flags.DEFINE_list("extrapolate", ["36000000", "40836876"],
                                   "Corpus sizes (pairs) to extrapolate the linear fits to.")
  _RESTART_LIMIT = flags.DEFINE_float("restart_limit", 60.0,
                                      "Promise: seconds from a restart to the first step.")
  _RSS_LIMIT = flags.DEFINE_float("rss_limit_gib", 4.0,
                                  "Promise: peak host RSS (GiB) of every data-path stage.")

  def main(argv: list[str]) -> None:
    del argv
    sections = report.read_json(_RECORDS.value).get("sections", {})
    records = []
    for name in _RUNS.value:
      if name not in sections:
        fail(f"--runs: no section {name!r} in {_RECORDS.value} (there: {', '.join(sections)})")
      records.append(summary(sections[name]))
    try:
      extrapolate = [int(float(n)) for n in _EXTRAPOLATE.value]
    except ValueError:
      fail(f"--extrapolate={','.join(_EXTRAPOLATE.value)}: expected numbers of pairs")
    rows = sorted(records, key=lambda r: r["pairs"])
    if len({r["pairs"] for r in rows}) < 2:
      fail("--runs: need records at two or more corpus sizes for a fit")
    report.write(_OUT.value, **report_parts(rows, extrapolate, report.command_line(),
                                            _RESTART_LIMIT.value, _RSS_LIMIT.value))
    print(f"wrote {_OUT.value}.md", flush=True)

  app.run(main, flags_parser=flags_parser())
