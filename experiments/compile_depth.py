"""Compile time against depth, with the layers unrolled and under `nn.scan`.

    python -m experiments.compile_depth

For each depth of `--layers` (encoder and decoder layers each) and each setting of
`--scan_layers`, one fresh process compiles the training step of `--benchmark_flags` (default:
the paper's base model, vocabulary 8192, float32, 8 rows of 64 + 64 tokens) and runs nothing
(`experiments.benchmark --steps=0`: lowering and XLA compilation, no persistent cache). The
report gives the compile seconds, XLA's temp memory of the step and, per scan setting, each
depth's compile time over the shallowest depth's. Writes `--out`.md and .json.
"""

from __future__ import annotations

from absl import app, flags

from experiments import report
from experiments.compile_depth_report import compile_record, with_ratios, write_report
from transformer.errors import fail, flags_parser

BASE_FLAGS = ["--config=configs/wmt.py:base", "--config.model.dtype=float32",
              "--config.model.vocab_size=8192", "--config.mesh.data=1", "--batch_size=8",
              "--src_len=64", "--tgt_len=64"]

_LAYERS = flags.DEFINE_list("layers", ["6", "24"], "Depths (encoder and decoder layers each).")
_SCAN = flags.DEFINE_list("scan_layers", ["true", "false"], "Settings of model.scan_layers.")
_BENCHMARK_FLAGS = flags.DEFINE_list("benchmark_flags", BASE_FLAGS,
                                     "Flags of every experiments.benchmark run (model, shapes).")
_TIMEOUT = flags.DEFINE_float("timeout", 1800, "Seconds allowed for one compilation.")
_OUT = flags.DEFINE_string("out", "experiments/results/compile_depth",
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
  write_report(_OUT.value, with_ratios(records), report.command_line())
  print(f"wrote {_OUT.value}.md", flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flags_parser())
