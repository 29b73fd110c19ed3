"""One prepared check of a GPU machine: training step and beam search, a report section per GPU.

    python -m benchmarks.gpu_check                     # one NVIDIA GPU, under 10 minutes
    python -m benchmarks.gpu_check --smoke --out=/tmp/gpu   # any machine: tiny shapes

Each measurement runs `python -m benchmarks.train_step` (or `benchmarks.decode`)
in a child process with a time limit, so that one that fails or runs out of memory leaves the
others' results:

- the base model's training step (configs/wmt.py:base, bfloat16) at about 25,000 tokens per
  side per batch, with `xla` and `cudnn` attention, on bucket-like rows (392 x 64 tokens) and
  on packed rows (98 x 256 tokens, 8 segments per row with segment ids and positions): step
  time, tokens/s, model FLOPs utilisation against the GPU's dense bfloat16 peak
  (`transformer.hardware.peak_of`, from NVIDIA's data sheets) and against a bfloat16 matmul
  measured in the same run, compile time and XLA's memory analysis;
- beam search (beam 4, alpha 0.6, batch 32, 64 output tokens) of the base model in bfloat16:
  output tokens per second.

`--smoke` runs the same programs on configs/wmt.py:tiny with tiny shapes and one timed step,
so that the whole path is tested on a CPU (tests/test_gpu_check.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from transformer.errors import fail, flags_parser
from transformer.hardware import peak_of

FULL = {"config": ["--config=configs/wmt.py:base", "--config.model.dtype=bfloat16",
                   "--config.mesh.data=1"],
        "bucketed": ["--batch_size=392", "--src_len=64", "--tgt_len=64"],
        "packed": ["--batch_size=98", "--src_len=256", "--tgt_len=256", "--packed_segments=8"],
        "steps": ["--steps=10", "--warmup_steps=3", "--matmul_size=8192",
                  "--matmul_dtype=bfloat16"],
        "decode": ["--batch_size=32", "--src_len=32", "--out_len=64", "--beam_size=4",
                   "--repeats=3", "--config.model.vocab_size=37000"]}
SMOKE = {"config": ["--config=configs/wmt.py:tiny", "--config.model.vocab_size=64",
                    "--config.mesh.data=1"],
         "bucketed": ["--batch_size=4", "--src_len=8", "--tgt_len=8"],
         "packed": ["--batch_size=2", "--src_len=16", "--tgt_len=16", "--packed_segments=2"],
         "steps": ["--steps=1", "--warmup_steps=1", "--matmul_size=64",
                   "--matmul_dtype=bfloat16"],
         "decode": ["--batch_size=2", "--src_len=4", "--out_len=6", "--beam_size=4",
                    "--repeats=1", "--warmup=0"]}


def run_json(module: str, args: list[str], timeout: float) -> dict[str, Any]:
  """The last JSON line printed by `python -m module args`, or {'error': why}."""
  from measuring import measure

  try:
    return measure.run_json([sys.executable, "-m", module, *args], timeout)
  except RuntimeError as e:
    return {"error": str(e)}


def check(shapes: dict[str, list[str]], out: str, timeout: float) -> str:
  """Every measurement of `shapes` (FULL or SMOKE) in its child process; writes the device
  kind's section of `out`.md and .json and returns the markdown's path."""
  from measuring import report

  command = report.command_line()
  train = []
  for attention in ("xla", "cudnn"):
    for rows in ("bucketed", "packed"):
      args = [*shapes["config"], f"--config.model.attention={attention}", *shapes[rows],
              *shapes["steps"]]
      r = run_json("benchmarks.train_step", args, timeout)
      train.append({"attention": attention, "rows": rows, **r})
      done = r.get("error") or f"{r['tokens_per_s']:.0f} tokens/s"
      print(f"[gpu_check] train {attention} {rows}: {done}", flush=True)
  decode = run_json("benchmarks.decode",
                    [*shapes["config"], *shapes["decode"], "--out="], timeout)
  print(f"[gpu_check] decode: {decode.get('error') or 'done'}", flush=True)
  kind = next((r["device_kind"] for r in train if "device_kind" in r), "unknown device")
  # After the children ran: this process touches the GPU only now.
  path = report.write(out, command=command, section=kind, **report_parts(kind, train, decode))[0]
  print(f"wrote {path}", flush=True)
  return path


def report_parts(kind: str, train: list[dict[str, Any]], decode: dict[str, Any]
                 ) -> dict[str, Any]:
  """`report.write`'s title, intro, body and record of the measurements on a `kind` device."""
  from benchmarks import decode as decode_benchmark
  from measuring import report

  peak = peak_of(kind)
  rows = []
  for r in train:
    if "error" in r:
      rows.append([r["attention"], r["rows"], r["error"]] + ["-"] * 7)
      continue
    tflops = r["achieved_flops_per_s"] / 1e12
    rows.append([
      r["attention"], r["rows"], f"{r['batch_size']} x {r['src_len']} / {r['tgt_len']}",
      f"{r['step_s'] * 1e3:.1f}", f"{r['tokens_per_s']:,.0f}", f"{tflops:.1f}",
      report.fmt(None if peak is None else r["achieved_flops_per_s"] / peak),
      f"{r['fraction_of_matmul_peak']:.2f} ({r['matmul_flops_per_s'] / 1e12:.1f})",
      f"{r['compile_s']:.1f}", f"{r['temp_memory_bytes'] / 2**30:.2f}"])
  body = ["## Training step\n", report.markdown_table(
    ["attention", "rows", "batch (rows x source / target)", "step (ms)", "tokens/s",
     "model TFLOP/s", "MFU (bf16 peak)", "fraction of measured bf16 matmul (TFLOP/s)",
     "compile (s)", "temp (GiB)"], rows),
    "\nModel FLOPs: `hardware.model_flops_per_step` (6 x parameters x tokens / 2), as the "
    "training loop's MFU. Packed rows count as many tokens as unpacked rows of the same shape, "
    "and every position of these random batches is a real token. `cudnn` falls back to `xla` "
    "where cuDNN's fused attention does not apply (not a GPU, float32).\n",
    "## Beam search\n"]
  if "error" in decode:
    body.append(f"Not measured: {decode['error']}.\n")
  else:
    body += [f"Batch {decode['batch_sizes'][0]}, {decode['src_len']} source tokens, exactly "
             f"{decode['out_len']} output tokens, {decode['dtype']}, random weights "
             f"(`benchmarks.decode`, best of {decode['repeats']}).\n",
             decode_benchmark.results_table(decode)]
  body.insert(0, "Peak: " + ("unknown for this device." if peak is None
                             else f"{peak / 1e12:.0f} TFLOP/s dense bf16.\n"))
  return {"title": "GPU check", "intro": "Made by `benchmarks/gpu_check.py` (method in its "
          "docstring), a section per device kind.", "body": body,
          "record": {"train": train, "decode": decode}}


if __name__ == "__main__":
  from absl import app, flags

  _SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes on any machine: the path, not the speed.")
  _OUT = flags.DEFINE_string("out", os.path.join("benchmarks", "results", "gpu_check"),
                             "Report path without extension (.md and .json).")
  _TIMEOUT = flags.DEFINE_integer("timeout_s", 110, "Time limit of each measurement (seconds).")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    check(SMOKE if _SMOKE.value else FULL, _OUT.value, _TIMEOUT.value)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser())
