"""Our training step against the PyTorch peer, alternated in one run, with ratios.

    python -m venv /tmp/torch-peer && /tmp/torch-peer/bin/pip install -r requirements-peer.txt
    python -m benchmarks.compare_peer --peer_python=/tmp/torch-peer/bin/python

For each of `--rounds` rounds and each shape of `--shapes` (SHAPES: `small`, a 3 + 3 layer
pre-layer-norm model of width 256 on batches of 96 x 32 + 32 tokens; `base`, the paper's base
model on 32 x 64 + 64 tokens; `custom`, no preset), runs `python -m benchmarks.train_step` once
per variant, each followed by one run of the peer (`benchmarks/torch_peer.py` by default:
torch.nn.Transformer at the same shapes, dropout 0.1, label smoothing 0.1). `--benchmark_flags`
and `--peer_flags` are added to every run of ours and of the peer. Alternating spreads the load
of a shared machine over both programs alike. In the last round, our run of the first variant
also profiles `--profile_steps` more steps (`step_cost.op_profile`: the costliest XLA ops and
the share of each part of the model). The run is the `--section` of the report `--out`.md and
.json (the other sections, other environments or kernels, are kept): the tables (best of the
rounds for each side, the ratio of those bests, the fractions of each framework's own matmul
rate measured in the same run, CPU time, memory from XLA, the profiles) and every run's JSON
record, written again after each run of the peer. The command written there shows the peer's
Python as `PY`.

Both programs get `XLA_FLAGS=--xla_flags` (empty by default: nothing inherited) and every
`--env=NAME=VALUE`, e.g. `--xla_flags=--xla_cpu_max_isa=AVX2`, which keeps XLA's generated code
to AVX2, or `--env=GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, which backs large allocations with
huge pages (fewer page faults in every step of both programs).

The peer needs PyTorch, which is not in requirements.txt: install requirements-peer.txt in a
separate virtual environment (the first line above) and pass its Python as `--peer_python`.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from measuring import measure
from measuring import report as report_lib  # `report` is this module's report
from transformer.errors import fail, flags_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "benchmarks", "torch_peer.py")
# name -> (flags of benchmarks.train_step, flags of the peer, description).
SHAPES = {
  "small": (
    ["--config=configs/wmt.py:base", "--config.model.dtype=float32",
     "--config.model.vocab_size=8000", "--config.mesh.data=1", "--config.model.num_layers=3",
     "--config.model.d_model=256", "--config.model.d_ff=1024", "--config.model.num_heads=4",
     "--config.model.pre_layer_norm=True", "--batch_size=96", "--src_len=32", "--tgt_len=32"],
    ["--vocab", "8000", "--layers", "3", "--d_model", "256", "--d_ff", "1024", "--heads", "4",
     "--pre_layer_norm", "--batch_size", "96", "--src_len", "32", "--tgt_len", "32"],
    "3 + 3 layers, d_model 256, d_ff 1024, 4 heads, vocabulary 8000, pre-layer-norm; "
    "96 x (32 + 32) tokens",
  ),
  "base": (
    ["--config=configs/wmt.py:base", "--config.model.dtype=float32",
     "--config.model.vocab_size=8192", "--config.mesh.data=1",
     "--batch_size=32", "--src_len=64", "--tgt_len=64"],
    [],  # the peer's defaults
    "6 + 6 layers, d_model 512, d_ff 2048, 8 heads, vocabulary 8192, post-layer-norm; "
    "32 x (64 + 64) tokens",
  ),
  "custom": ([], [], "the shapes of --benchmark_flags and --peer_flags"),
}
# name -> extra flags of benchmarks.train_step; the peer always runs dropout 0.1.
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

def thousands(count: float | None) -> float:
  """A count in thousands; NaN where a record has none (a peer that does not count it)."""
  return float("nan") if count is None else count / 1e3


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per shape and variant: best of ours, best of the peer runs paired with them."""
  rows = []
  for shape, name in dict.fromkeys((r["shape"], r["variant"]) for r in records):
    mine = [r for r in records if r["shape"] == shape and r["variant"] == name]
    ours = [r for r in mine if r["program"] == "ours"]
    peer = [r for r in mine if r["program"] == "peer"]
    best = max(ours, key=lambda r: r["tokens_per_s"])
    best_peer = max(peer, key=lambda r: r["tokens_per_s"])
    rows.append({
      "shape": shape, "variant": name,
      "ours_tokens_per_s": [r["tokens_per_s"] for r in ours],
      "peer_tokens_per_s": [r["tokens_per_s"] for r in peer],
      "ours_best": best["tokens_per_s"], "peer_best": best_peer["tokens_per_s"],
      "ratio": best["tokens_per_s"] / best_peer["tokens_per_s"],
      "ours_fraction": best["fraction_of_matmul_peak"],
      "peer_fraction": best_peer["fraction_of_matmul_peak"],
      "ours_matmul_gflops": best["matmul_flops_per_s"] / 1e9,
      "peer_matmul_gflops": best_peer["matmul_peak_flops"] / 1e9,  # the peer's name
      "ours_step_cpu_s": min(r["step_cpu_s"] for r in ours),
      "peer_step_cpu_s": min((r.get("step_cpu_s") or float("nan")) for r in peer),
      # The best run's least CPU time of a step over its best step time: busy threads.
      "ours_threads": best["step_cpu_s"] / best["step_s"],
      "peer_threads": (best_peer.get("step_cpu_s") or float("nan")) / best_peer["step_s"],
      # Minor page faults of the best runs' median step, in thousands.
      "ours_kfaults": thousands(best.get("step_minor_faults")),
      "peer_kfaults": thousands(best_peer.get("step_minor_faults")),
      "compile_s": min(r["compile_s"] for r in ours),
      "temp_mib": best["temp_memory_bytes"] / 2**20,
      "profile": next((r["profile"] for r in reversed(ours) if r.get("profile")), None),
    })
  return rows


def short_source(op_name: str) -> str:
  """An op's JAX source without the transformations and the repeated module path."""
  path = re.sub(r"^jit\(train_step\)/|(transpose\()?jvp\([\w.]*\)\)?/", "", op_name)
  path = re.sub(r"Transformer\.(decode_logits|decode|encode)/", "", path)
  return path[-80:]


def profile_section(shape: str, profile: dict[str, Any]) -> str:
  """Markdown: the shares of the model's parts and the costliest ops of one profiled step."""
  parts = report_lib.markdown_table(
    ["part of the step (forward and backward)", "share", "ms per step"],
    [[c["category"], f"{100 * c['share']:.1f}%", f"{1e3 * c['seconds']:.0f}"]
     for c in profile["categories"] if c["seconds"] > 0])
  top = report_lib.markdown_table(
    ["XLA op", "result", "share", "ms per step", "part", "pass", "from (JAX source)"],
    [[f"`{o['op']}`", f"`{o['shape']}`", f"{100 * o['share']:.1f}%",
      f"{1e3 * o['seconds']:.0f}", o["category"],
      "backward" if "transpose(" in o["source"] else "forward", f"`{short_source(o['source'])}`"]
     for o in profile["top_ops"]], align="lllrrll")
  return (f"### Where our step's time goes: `{shape}`\n\n{profile['steps']} steps under "
          f"`jax.profiler`; {1e3 * profile['op_seconds_per_step']:.0f} ms of op time per step, "
          "summed over the threads that ran each op (`measuring/step_cost.py`, "
          "`op_profile`).\n\n" + parts + "\n" + top)


def report_parts(records: list[dict[str, Any]], env: str, peer: str) -> dict[str, Any]:
  """`report.write`'s title, intro, body, record and machine note of the records; `env` is
  both programs' environment, `peer` the peer's script."""
  rows = summarize(records)
  loads = [r["load_at_start"] for r in records]
  peer0 = next(r for r in records if r["program"] == "peer")
  shapes = list(dict.fromkeys(r["shape"] for r in rows))
  flops = {(s, p): next(r["model_flops_per_step"] for r in records
                        if r["shape"] == s and r["program"] == p)
           for s in shapes for p in ("ours", "peer")}
  header = ["shape", "variant (ours)", "ours tokens/s (runs)", "peer tokens/s (runs)", "ratio",
            "ours / peer fraction of own matmul rate (GFLOP/s)",
            "ours / peer best CPU s per step", "ours / peer busy threads",
            "ours / peer page faults per step (thousands)", "compile s", "temp MiB"]
  table = [[
    f"`{r['shape']}`", DESCRIPTIONS.get(r["variant"], r["variant"]),
    f"**{r['ours_best']:.0f}** (" + ", ".join(f"{x:.0f}" for x in r["ours_tokens_per_s"]) + ")",
    f"**{r['peer_best']:.0f}** (" + ", ".join(f"{x:.0f}" for x in r["peer_tokens_per_s"]) + ")",
    f"**{r['ratio']:.2f}**",
    f"{r['ours_fraction']:.2f} ({r['ours_matmul_gflops']:.0f}) / "
    f"{r['peer_fraction']:.2f} ({r['peer_matmul_gflops']:.0f})",
    f"{r['ours_step_cpu_s']:.2f} / {r['peer_step_cpu_s']:.2f}",
    f"{r['ours_threads']:.2f} / {r['peer_threads']:.2f}",
    f"{r['ours_kfaults']:.0f} / {r['peer_kfaults']:.0f}", f"{r['compile_s']:.1f}",
    f"{r['temp_mib']:.0f}",
  ] for r in rows]
  shape_lines = "".join(f"- `{s}`: {SHAPES[s][2]}; model FLOPs per step "
                        f"{flops[s, 'ours']:,.0f} (ours) and {flops[s, 'peer']:,.0f} (peer), by "
                        "the same formula (6 x each model's parameters x tokens / 2).\n"
                        for s in shapes)
  body = [f"The peer's script: `{report_lib.public_path(peer)}`. Shapes:\n\n{shape_lines}",
          "## Results\n", report_lib.markdown_table(header, table)]
  body += [profile_section(r["shape"], r["profile"]) for r in rows if r["profile"]]
  return {
    "title": "Our training step against the PyTorch peer, alternated in one run",
    "intro": "Made by `benchmarks/compare_peer.py` (method in its docstring), a section per "
    "environment of both programs (`--section`); every run's JSON record is in the `.json` "
    "beside this file. Tokens/s count source + target tokens; each side's best run, ratio = "
    "our best / the peer's best. CPU s per step: the least CPU time (all threads) of a timed "
    "step, which moves less than wall time with the load of other processes. Page faults: "
    "the minor page faults of the best run's median step, memory the kernel maps and zeroes "
    "on first touch (freed to the OS and mapped again in every step). In the commands, `PY` "
    "is a Python with torch (requirements-peer.txt).",
    "body": body, "record": {"records": records},
    "machine_note": f"- Peer: torch {peer0.get('torch', '?')}, {peer0.get('threads', '?')} "
    f"threads. Load average (1 min) at the start of the runs: {min(loads):.2f} to "
    f"{max(loads):.2f}. Environment of both programs: `{env}`.\n"}


def parse_env(pairs: list[str]) -> dict[str, str]:
  """--env values NAME=VALUE as a dict; a value without '=' is a one-line error."""
  env = {}
  for pair in pairs:
    name, sep, value = pair.partition("=")
    if not sep or not name:
      fail(f"--env={pair}: expected NAME=VALUE")
    env[name] = value
  return env


def compare(peer_python: str, peer: str, shapes: list[str], variants: list[str], rounds: int,
            steps: int, profile_steps: int, benchmark_flags: list[str], peer_flags: list[str],
            env: dict[str, str], done: Callable[[list[dict[str, Any]]], Any] = lambda r: None
            ) -> list[dict[str, Any]]:
  """Every round: each shape and variant of ours, each followed by a run of the peer, after
  which `done(records so far)` is called (the report: a failure later keeps what ran).
  Returns the records."""
  records = []
  for round_ in range(rounds):
    for shape in shapes:
      ours_flags, shape_peer_flags, _ = SHAPES[shape]
      for i, name in enumerate(variants):
        profile = profile_steps if round_ == rounds - 1 and i == 0 else 0
        for program, cmd in (
          ("ours", [sys.executable, "-m", "benchmarks.train_step", *ours_flags,
                    *benchmark_flags, *VARIANTS[name], f"--steps={steps}",
                    f"--profile_steps={profile}"]),
          ("peer", [peer_python, peer, "--repeats", str(steps), *shape_peer_flags, *peer_flags]),
        ):
          t = time.time()
          record = {"shape": shape, "variant": name, "program": program, "round": round_,
                    **measure.run_json(cmd, env=env)}
          records.append(record)
          print(f"[compare_peer] round {round_ + 1}/{rounds} {shape:6s} {name:14s} "
                f"{program}: {record['tokens_per_s']:.0f} tokens/s ({time.time() - t:.0f} s)",
                flush=True)
        done(records)
  return records


if __name__ == "__main__":
  from absl import app, flags

  _PEER_PYTHON = flags.DEFINE_string("peer_python", os.environ.get("PEER_PYTHON", ""),
                                     "Python with torch installed (or $PEER_PYTHON).")
  _PEER = flags.DEFINE_string("peer", PEER, "The peer's script (benchmarks/torch_peer.py).")
  _SHAPES = flags.DEFINE_list("shapes", ["small", "base"], f"Presets of {list(SHAPES)}.")
  _PEER_FLAGS = flags.DEFINE_list("peer_flags", [], "Extra flags of every peer run.")
  _BENCHMARK_FLAGS = flags.DEFINE_list(
    "benchmark_flags", [], "Extra flags of every run of benchmarks.train_step (after the "
    "shape's: a repeated flag takes the last value).")
  _ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds; each runs every shape, variant and peer.")
  _STEPS = flags.DEFINE_integer("timed_steps", 3, "Timed steps per run (both programs).")
  _PROFILE_STEPS = flags.DEFINE_integer(
    "profile_steps", 2, "Steps profiled after the timed ones, in the last round (0: none).")
  _VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), f"Subset of {list(VARIANTS)}.")
  _XLA_FLAGS = flags.DEFINE_string("xla_flags", "", "XLA_FLAGS of both programs.")
  _ENV = flags.DEFINE_multi_string("env", [], "NAME=VALUE set for both programs.")
  _OUT = flags.DEFINE_string("out", os.path.join("benchmarks", "results", "train_step_vs_torch"),
                             "Report path without extension (.md and .json).")
  _SECTION = flags.DEFINE_string("section", "default", "The report's section this run writes "
                                 "(the others are kept), e.g. hugepages.")

  def main(argv: list[str]) -> None:
    del argv
    if not _PEER_PYTHON.value:
      fail("--peer_python (or $PEER_PYTHON): a Python with torch is needed")
    if not os.path.exists(_PEER.value):
      fail(f"--peer={_PEER.value}: no such file")
    for flag, chosen, known in (("--variants", _VARIANTS.value, VARIANTS),
                                ("--shapes", _SHAPES.value, SHAPES)):
      unknown = set(chosen) - set(known)
      if unknown or not chosen:
        fail(f"{flag}: unknown {sorted(unknown)}; use some of {list(known)}")
    if "custom" in _SHAPES.value and not _BENCHMARK_FLAGS.value:
      fail("--shapes=custom: give the shapes in --benchmark_flags (and --peer_flags)")
    env = {**parse_env(_ENV.value), "XLA_FLAGS": _XLA_FLAGS.value}
    os.environ["XLA_FLAGS"] = _XLA_FLAGS.value  # the report's machine section names it
    command = report_lib.public_command(report_lib.command_line(), hide=("--peer_python",))
    programs_env = " ".join([f"XLA_FLAGS={_XLA_FLAGS.value!r}", *_ENV.value])

    def write(records: list[dict[str, Any]]) -> None:
      report_lib.write(_OUT.value, command=command, section=_SECTION.value,
                       **report_parts(records, programs_env, _PEER.value))

    records = compare(_PEER_PYTHON.value, _PEER.value, _SHAPES.value, _VARIANTS.value,
                      _ROUNDS.value, _STEPS.value, _PROFILE_STEPS.value, _BENCHMARK_FLAGS.value,
                      _PEER_FLAGS.value, env, write)
    for r in summarize(records):
      print(f"[compare_peer] {r['shape']} {r['variant']}: ours {r['ours_best']:.0f} / peer "
            f"{r['peer_best']:.0f} tokens/s = {r['ratio']:.2f}x")

  app.run(main, flags_parser=flags_parser())
