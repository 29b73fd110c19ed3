"""Compile time against depth, with the layers unrolled and under `nn.scan`.

    python -m benchmarks.compile_depth

For each depth of `--layers` (encoder and decoder layers each) and each setting of
`--scan_layers`, one fresh process compiles the training step of `--benchmark_flags` (default:
the paper's base model, vocabulary 8192, float32, 8 rows of 64 + 64 tokens) and runs nothing
(`benchmarks.train_step --steps=0`: lowering and XLA compilation, no persistent cache). The
report gives the compile seconds, XLA's temp memory of the step and, per scan setting, each
depth's compile time over the shallowest depth's. Writes `--out`.md and .json.
"""

from __future__ import annotations

import sys
from typing import Any

from measuring import measure, report
from transformer.errors import fail, flags_parser

BASE_FLAGS = ["--config=configs/wmt.py:base", "--config.model.dtype=float32",
              "--config.model.vocab_size=8192", "--config.mesh.data=1", "--batch_size=8",
              "--src_len=64", "--tgt_len=64"]


def compile_record(benchmark_flags: list[str], layers: int, scan: bool,
                   timeout: float) -> dict[str, Any]:
  """benchmarks.train_step's record of compiling (never running) the step at this depth."""
  cmd = [sys.executable, "-m", "benchmarks.train_step", *benchmark_flags,
         f"--config.model.num_layers={layers}", f"--config.model.scan_layers={scan}", "--steps=0"]
  r = measure.run_json(cmd, timeout=timeout)
  return {"layers": layers, "scan_layers": scan, "compile_s": r["compile_s"],
          "temp_memory_bytes": r["temp_memory_bytes"], "load_at_start": r["load_at_start"]}


def with_ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Adds `compile_vs_shallowest`: compile_s over that of the fewest layers, same scan."""
  out = []
  for r in records:
    same = [s for s in records if s["scan_layers"] == r["scan_layers"]]
    shallowest = min(same, key=lambda s: s["layers"])
    out.append({**r, "compile_vs_shallowest": r["compile_s"] / shallowest["compile_s"]})
  return out


def report_parts(records: list[dict[str, Any]]) -> dict[str, Any]:
  """`report.write`'s title, intro, body (a table) and record of the records."""
  rows = [[r["layers"], r["scan_layers"], f"{r['compile_s']:.1f}",
           f"{r['temp_memory_bytes'] / 2**20:,.0f}", f"{r['compile_vs_shallowest']:.2f}x",
           f"{r['load_at_start']:.2f}"] for r in records]
  table = report.markdown_table(
    ["layers (each side)", "scan_layers", "compile s", "temp MiB", "vs fewest layers",
     "load at start"], rows)
  intro = ("The training step compiled, never run, once per depth and scan setting, each in a "
           "fresh process (`benchmarks.train_step --steps=0`: lowering and XLA compilation, no "
           "persistent compilation cache). Produced by `benchmarks/compile_depth.py`.")
  return {"title": "Compile time against depth (nn.scan)", "intro": intro,
          "body": ["## Results\n", table], "record": {"records": records}}


if __name__ == "__main__":
  from absl import app, flags

  _LAYERS = flags.DEFINE_list("layers", ["6", "24"], "Depths (encoder and decoder layers each).")
  _SCAN = flags.DEFINE_list("scan_layers", ["true", "false"], "Settings of model.scan_layers.")
  _BENCHMARK_FLAGS = flags.DEFINE_list("benchmark_flags", BASE_FLAGS,
                                       "Flags of every benchmarks.train_step run (model, shapes).")
  _TIMEOUT = flags.DEFINE_float("timeout", 1800, "Seconds allowed for one compilation.")
  _OUT = flags.DEFINE_string("out", "benchmarks/results/compile_depth",
                             "Report path without extension.")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    try:
      depths = [int(x) for x in _LAYERS.value]
    except ValueError:
      fail(f"--layers={','.join(_LAYERS.value)}: a list of integers, e.g. --layers=6,24")
    if not depths or min(depths) < 1:
      fail(f"--layers={','.join(_LAYERS.value)}: every depth must be at least 1")
    scans = [s.lower() for s in _SCAN.value]
    if not scans or set(scans) - {"true", "false"}:
      fail(f"--scan_layers={','.join(_SCAN.value)}: a list of true and false")
    records = []
    for scan in scans:
      for layers in depths:
        try:
          r = compile_record(_BENCHMARK_FLAGS.value, layers, scan == "true", _TIMEOUT.value)
        except RuntimeError as e:
          fail(f"compiling {layers} layers with scan_layers={scan} failed: {e}")
        print(f"layers {layers}, scan_layers {scan}: compile {r['compile_s']:.1f} s", flush=True)
        records.append(r)
    report.write(_OUT.value, command=report.command_line(),
                 **report_parts(with_ratios(records)))
    print(f"wrote {_OUT.value}.md", flush=True)

  app.run(main, flags_parser=flags_parser())
