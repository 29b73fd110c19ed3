"""What `--mode=translate` reads and holds to translate one sentence: bytes read and peak RSS.

A workdir of the base shapes (6 + 6 layers, d_model 512, d_ff 2,048, 8 heads; the numbers
task's vocabulary) is written once: its config, vocabulary and one checkpoint of a train state
(parameters and Adam's two moments, random as a trained run's are, as training saves them). Then
`python -m transformer.main --mode=translate --workdir=W` translates one sentence from stdin
in a child process, once per program tree (this checkout, and with `--against=DIR` another
checkout of the project, e.g. an older commit), and the child's bytes read (`/proc/PID/io`:
`rchar`, every read, imports included; `read_bytes`, from the block device) and its peak RSS
(`VmHWM` of /proc/PID/status) are recorded, read every 20 ms until it exits. The ratios
compare the trees in one run, on one machine.

    python -m benchmarks.inference_memory [--against=/tmp/before]
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_SHAPES = {"model.d_model": 512, "model.num_layers": 6, "model.num_heads": 8,
               "model.d_ff": 2048}


def base_config(data_dir: str) -> Any:
  """The numbers config at the base shapes."""
  from configs import numbers

  config = numbers.get_config()
  config.data_dir = data_dir
  for field, value in BASE_SHAPES.items():
    section, name = field.split(".")
    config[section][name] = value
  return config


def write_workdir(workdir: str, data_dir: str) -> dict[str, Any]:
  """A workdir at step 0: config, vocabulary, buckets, one checkpoint of a fresh train state."""
  import jax
  import jax.numpy as jnp

  from transformer import sharding as sharding_lib
  from transformer import workdir as workdir_lib
  from transformer.data import bucketing, input_pipeline, vocabulary
  from transformer.training.checkpoint import Checkpointer
  from transformer.training.run_meta import run_meta
  from transformer.training.trainer import Trainer
  from transformer.training.validate import validate

  config = base_config(data_dir)
  mc = validate(config, jax.device_count())
  tokenizer = vocabulary.get_tokenizer(config, workdir, input_pipeline.open_reader(config))
  workdir_lib.save(config, workdir)
  bucketing.save_buckets(workdir, bucketing.default_buckets(config))
  trainer = Trainer(config, sharding_lib.make_mesh(config.mesh), mc)
  state = trainer.init_state(config.seed)
  # Adam's moments as a trained run has them: not the zeros of step 0, which the checkpoint
  # would compress to nothing.
  leaves, tree = jax.tree.flatten(state.opt_state)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  state = state.replace(opt_state=jax.tree.unflatten(tree, [
    jax.random.normal(k, x.shape, x.dtype) * 1e-3 if jnp.issubdtype(x.dtype, jnp.floating)
    else x for k, x in zip(keys, leaves, strict=True)]))
  checkpointer = Checkpointer(workdir_lib.paths(workdir).checkpoints, None, async_save=False)
  checkpointer.save(0, state, run_meta(config, mc, tokenizer.sha256))
  checkpointer.close()
  count = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
  on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, names in
                os.walk(workdir_lib.paths(workdir).checkpoints) for f in names)
  return {"param_bytes": count(state.params), "state_bytes": count(state),
          "checkpoint_bytes": on_disk}


def _io(pid: int) -> dict[str, int]:
  """The process's I/O counters and its peak RSS so far (VmHWM, bytes), from /proc."""
  try:
    with open(f"/proc/{pid}/io") as f:
      out = {k: int(v) for k, v in (ln.split(": ") for ln in f.read().splitlines())}
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          out["peak_rss"] = int(line.split()[1]) * 1024
    return out
  except (OSError, ValueError):
    return {}


def translate_once(tree: str, workdir: str, sentence: str = "three hundred and five"
                   ) -> dict[str, Any]:
  """One `--mode=translate` of `sentence` with the program of `tree`: its output, wall time,
  bytes read (the last reading of /proc/PID/io before it exits) and peak RSS."""
  env = {**os.environ, "PYTHONPATH": tree, "JAX_PLATFORMS": "cpu"}
  t0 = time.time()
  proc = subprocess.Popen([sys.executable, "-m", "transformer.main", "--mode=translate",
                           f"--workdir={workdir}"], cwd=tree, env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  last: dict[str, int] = {}
  done = threading.Event()

  def poll() -> None:
    while not done.is_set():
      last.update(_io(proc.pid) or {})
      time.sleep(0.02)

  watcher = threading.Thread(target=poll, daemon=True)
  watcher.start()
  proc.stdin.write(sentence + "\n")
  proc.stdin.close()
  out = proc.stdout.read()
  err = proc.stderr.read()
  # (Not wait4's ru_maxrss: Linux keeps it across fork and exec, so a child of this large
  # process would report this one's peak.)
  status = os.waitpid(proc.pid, 0)[1]
  done.set()
  watcher.join()
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode != 0:
    raise RuntimeError(f"translate in {tree} failed ({proc.returncode}): {err[-2000:]}")
  return {"output": out.strip(), "wall_s": time.time() - t0, "rchar": last.get("rchar", 0),
          "read_bytes": last.get("read_bytes", 0), "peak_rss": last.get("peak_rss", 0)}


def run_benchmark(scratch: str, against: str | None, rounds: int) -> dict[str, Any]:
  workdir = os.path.join(scratch, "workdir")
  sizes = write_workdir(workdir, os.path.join(scratch, "data"))
  trees = {"this tree": REPO, **({"against": os.path.abspath(against)} if against else {})}
  rows = {}
  for name, tree in trees.items():
    translate_once(tree, workdir)  # warms the compilation cache and the page cache
    runs = [translate_once(tree, workdir) for _ in range(rounds)]
    commit = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    rows[name] = {**min(runs, key=lambda r: r["peak_rss"]), "tree": tree, "commit": commit,
                  "rchar_all": [r["rchar"] for r in runs],
                  "peak_rss_all": [r["peak_rss"] for r in runs]}
  return {**sizes, "rounds": rounds, "rows": rows}


def report_lines(record: dict[str, Any]) -> list[str]:
  mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
  lines = ["## Results\n",
           f"Parameters {mib(record['param_bytes'])} MiB; the train state (parameters and "
           f"Adam's moments) {mib(record['state_bytes'])} MiB; the checkpoint on disk "
           f"{mib(record['checkpoint_bytes'])} MiB. Least peak RSS of {record['rounds']} runs "
           "after a warm-up run (compilation cache and page cache warm).\n",
           "| program | commit | bytes read, rchar (MiB) | peak RSS (MiB) | wall (s) |",
           "|---|---|---:|---:|---:|"]
  for name, r in record["rows"].items():
    lines.append(f"| {name} | {r['commit']} | {mib(r['rchar'])} | {mib(r['peak_rss'])} | "
                 f"{r['wall_s']:.1f} |")
  outputs = {r["output"] for r in record["rows"].values()}
  lines.append(f"\nThe translations are {'the same' if len(outputs) == 1 else 'different'} "
               "(an untrained model's).")
  if "against" in record["rows"]:
    new, old = record["rows"]["this tree"], record["rows"]["against"]
    lines.append(f"\nThis tree against the other: bytes read **{new['rchar'] / old['rchar']:.2f}x**"
                 f" ({mib(old['rchar'] - new['rchar'])} MiB less), peak RSS "
                 f"**{new['peak_rss'] / old['peak_rss']:.2f}x** "
                 f"({mib(old['peak_rss'] - new['peak_rss'])} MiB less).")
  return lines


if __name__ == "__main__":
  import tempfile

  from absl import app, flags

  from measuring import report
  from transformer.errors import flags_parser

  _AGAINST = flags.DEFINE_string("against", None, "Another checkout of the project to measure "
                                 "beside this one (e.g. `git worktree add /tmp/before HEAD~1`).")
  _ROUNDS = flags.DEFINE_integer("rounds", 2, "Measured runs of each program.")
  _OUT = flags.DEFINE_string("out", "benchmarks/results/inference_memory",
                             "Report path without extension (.md and .json are written).")

  def main(argv: list[str]) -> None:
    del argv
    with tempfile.TemporaryDirectory() as scratch:
      record = run_benchmark(scratch, _AGAINST.value, _ROUNDS.value)
    report.write(_OUT.value, "What translating one sentence reads and holds",
                 __doc__.split("\n\n")[1], report.public_command(report.command_line()),
                 report_lines(record), record)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
