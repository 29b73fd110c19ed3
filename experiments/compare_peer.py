"""Our training step against the PyTorch peer, alternated in one run, with ratios.

    python -m venv /tmp/torch-peer && /tmp/torch-peer/bin/pip install -r requirements-peer.txt
    python -m experiments.compare_peer --peer_python=/tmp/torch-peer/bin/python

For each of `--rounds` rounds, runs `python -m experiments.benchmark` once per variant, each
followed by one run of the peer (`experiments/torch_peer.py` by default: torch.nn.Transformer
at the same shapes, vocabulary 8192, d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, batch 32 x
64 source + 64 target tokens, dropout 0.1, label smoothing 0.1; `--peer_flags` are passed on to
it). Alternating spreads the load of a shared machine over both programs alike. Every JSON line
goes to `--out`.jsonl, and the table (best of the rounds for each side, the ratio of those
bests, the fractions of each framework's own matmul rate measured in the same run, memory from
XLA) to `--out`.md. The command written in the table shows the peer's Python as `PY`.

The peer needs PyTorch, which is not in requirements.txt: install requirements-peer.txt in a
separate virtual environment (the first line above) and pass its Python as `--peer_python`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from absl import app, flags

from experiments import measure
from experiments import report as report_lib  # `report` is this module's report
from transformer.errors import fail, parse_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "experiments", "torch_peer.py")
BASE = [
  "--config=configs/wmt.py:base", "--config.model.dtype=float32",
  "--config.model.vocab_size=8192", "--config.mesh.data=1",
  "--batch_size=32", "--src_len=64", "--tgt_len=64",
]
# name -> extra flags of experiments.benchmark; the peer always runs dropout 0.1.
VARIANTS = {
  "base": [],
  "exact_dropout": ["--config.model.dropout_mask_bits=32"],
  "no_dropout": ["--config.model.dropout_rate=0.0"],
}
DESCRIPTIONS = {
  "base": "dropout 0.1, 8-bit dropout masks (the default)",
  "exact_dropout": "dropout 0.1, 32-bit masks (`--config.model.dropout_mask_bits=32`)",
  "no_dropout": "dropout 0.0 (`--config.model.dropout_rate=0.0`)",
}

_PEER_PYTHON = flags.DEFINE_string("peer_python", os.environ.get("PEER_PYTHON", ""),
                                   "Python with torch installed (or $PEER_PYTHON).")
_PEER = flags.DEFINE_string("peer", PEER, "The peer's script (experiments/torch_peer.py).")
_PEER_FLAGS = flags.DEFINE_list("peer_flags", [], "Extra flags of the peer, e.g. its shapes.")
_BENCHMARK_FLAGS = flags.DEFINE_list(
  "benchmark_flags", BASE, "Flags of experiments.benchmark shared by every variant (the "
  "peer's shapes by default).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds; each runs every variant and the peer.")
_STEPS = flags.DEFINE_integer("timed_steps", 3, "Timed steps per run (both programs).")
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), f"Subset of {list(VARIANTS)}.")
_OUT = flags.DEFINE_string("out", os.path.join("experiments", "results", "benchmark_vs_peer"),
                           "Output path without extension (.jsonl and .md are written).")


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per variant: best of ours, best of the peer runs paired with that variant."""
  rows = []
  for name in dict.fromkeys(r["variant"] for r in records):
    ours = [r for r in records if r["variant"] == name and r["program"] == "ours"]
    peer = [r for r in records if r["variant"] == name and r["program"] == "peer"]
    best = max(ours, key=lambda r: r["tokens_per_s"])
    best_peer = max(peer, key=lambda r: r["tokens_per_s"])
    rows.append({
      "variant": name,
      "ours_tokens_per_s": [r["tokens_per_s"] for r in ours],
      "peer_tokens_per_s": [r["tokens_per_s"] for r in peer],
      "ours_best": best["tokens_per_s"], "peer_best": best_peer["tokens_per_s"],
      "ratio": best["tokens_per_s"] / best_peer["tokens_per_s"],
      "ours_fraction": best["fraction_of_matmul_peak"],
      "peer_fraction": best_peer["fraction_of_matmul_peak"],
      "ours_matmul_gflops": best["matmul_flops_per_s"] / 1e9,
      "peer_matmul_gflops": best_peer["matmul_peak_flops"] / 1e9,  # the peer's name
      "ours_step_cpu_s": min(r["step_cpu_s"] for r in ours),
      "compile_s": min(r["compile_s"] for r in ours),
      "temp_mib": best["temp_memory_bytes"] / 2**20,
    })
  return rows


def write_report(path: str, records: list[dict[str, Any]], command: str) -> str:
  rows = summarize(records)
  ours0 = next(r for r in records if r["program"] == "ours")
  peer0 = next(r for r in records if r["program"] == "peer")
  loads = [r["load_at_start"] for r in records]
  header = ["variant (ours)", "ours tokens/s (runs)", "peer tokens/s (runs)", "ratio",
            "ours / peer fraction of own matmul rate (GFLOP/s)", "ours best CPU s per step",
            "compile s", "temp MiB"]
  table = [[
    DESCRIPTIONS.get(r["variant"], r["variant"]),
    f"**{r['ours_best']:.0f}** (" + ", ".join(f"{x:.0f}" for x in r["ours_tokens_per_s"]) + ")",
    f"**{r['peer_best']:.0f}** (" + ", ".join(f"{x:.0f}" for x in r["peer_tokens_per_s"]) + ")",
    f"**{r['ratio']:.2f}**",
    f"{r['ours_fraction']:.2f} ({r['ours_matmul_gflops']:.0f}) / "
    f"{r['peer_fraction']:.2f} ({r['peer_matmul_gflops']:.0f})",
    f"{r['ours_step_cpu_s']:.2f}", f"{r['compile_s']:.1f}", f"{r['temp_mib']:.0f}",
  ] for r in rows]
  return report_lib.write_markdown(
    path, "Our training step against the PyTorch peer, alternated in one run",
    "Made by `experiments/compare_peer.py` (method in its docstring); every run's JSON line "
    f"is in `{os.path.basename(_OUT.value)}.jsonl`. Tokens/s count source + target tokens; "
    "each side's best run, ratio = our best / the peer's best. Model FLOPs per step: "
    f"{ours0['model_flops_per_step']:,} (ours) and {peer0['model_flops_per_step']:,} (peer), "
    "by the same formula. In the command, `PY` is a Python with torch (requirements-peer.txt); "
    f"the peer's script is `{report_lib.public_path(_PEER.value)}`.", command,
    ["## Results\n", report_lib.markdown_table(header, table)],
    machine_note=f"- Peer: torch {peer0.get('torch', '?')}, {peer0.get('threads', '?')} "
    f"threads. Load average (1 min) at the start of the runs: {min(loads):.2f} to "
    f"{max(loads):.2f}.\n")


def main(argv: list[str]) -> None:
  del argv
  if not _PEER_PYTHON.value:
    fail("--peer_python (or $PEER_PYTHON): a Python with torch is needed")
  if not os.path.exists(_PEER.value):
    fail(f"--peer={_PEER.value}: no such file")
  unknown = set(_VARIANTS.value) - set(VARIANTS)
  if unknown:
    fail(f"--variants: unknown {sorted(unknown)}; use {list(VARIANTS)}")
  records = []
  jsonl = _OUT.value + ".jsonl"
  os.makedirs(os.path.dirname(jsonl) or ".", exist_ok=True)
  with open(jsonl, "w") as f:
    for round_ in range(_ROUNDS.value):
      for name in _VARIANTS.value:
        for program, cmd in (
          ("ours", [sys.executable, "-m", "experiments.benchmark", *_BENCHMARK_FLAGS.value,
                    *VARIANTS[name],
                    f"--steps={_STEPS.value}"]),
          ("peer", [_PEER_PYTHON.value, _PEER.value, "--repeats", str(_STEPS.value),
                    *_PEER_FLAGS.value]),
        ):
          t = time.time()
          record = {"variant": name, "program": program, "round": round_,
                    **measure.run_json(cmd, env={"XLA_FLAGS": ""})}
          f.write(json.dumps(record) + "\n")
          f.flush()
          records.append(record)
          print(f"[compare_peer] round {round_ + 1}/{_ROUNDS.value} {name:14s} {program}: "
                f"{record['tokens_per_s']:.0f} tokens/s ({time.time() - t:.0f} s)", flush=True)
  write_report(_OUT.value + ".md", records,
               report_lib.public_command(report_lib.command_line(), hide=("--peer_python",)))
  for r in summarize(records):
    print(f"[compare_peer] {r['variant']}: ours {r['ours_best']:.0f} / peer {r['peer_best']:.0f} "
          f"tokens/s = {r['ratio']:.2f}x")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
