"""The library of experiments/compile_depth.py: one compile-only child per point, the ratios to
the shallowest depth, and the report."""

from __future__ import annotations

import sys
from typing import Any

from experiments import measure, report


def compile_record(benchmark_flags: list[str], layers: int, scan: bool,
                   timeout: float) -> dict[str, Any]:
  """experiments.benchmark's record of compiling (never running) the step at this depth."""
  cmd = [sys.executable, "-m", "experiments.benchmark", *benchmark_flags,
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


def write_report(path: str, records: list[dict[str, Any]], command: str) -> None:
  """Writes `path`.md (the table, the command, the machine) and `path`.json (the records)."""
  rows = [[r["layers"], r["scan_layers"], f"{r['compile_s']:.1f}",
           f"{r['temp_memory_bytes'] / 2**20:,.0f}", f"{r['compile_vs_shallowest']:.2f}x",
           f"{r['load_at_start']:.2f}"] for r in records]
  table = report.markdown_table(
    ["layers (each side)", "scan_layers", "compile s", "temp MiB", "vs fewest layers",
     "load at start"], rows)
  intro = ("The training step compiled, never run, once per depth and scan setting, each in a "
           "fresh process (`experiments.benchmark --steps=0`: lowering and XLA compilation, no "
           "persistent compilation cache). Produced by `experiments/compile_depth.py`.")
  report.write_markdown(path + ".md", "Compile time against depth (nn.scan)", intro, command,
                        ["## Results\n", table])
  report.write_json(path + ".json", {"command": command, "hardware": report.hardware(),
                                     "records": records})
