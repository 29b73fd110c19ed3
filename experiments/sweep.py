"""Sweep runner: the points of a sweep file, each trained in its own workdir, then a report.

    python -m experiments.sweep --sweep=configs/sweeps/heads.py [--parallel=2] [--only=a,b]

A sweep file is a config file with one more function beside `get_config(arg)`:

    def sweep(arg=None) -> dict[str, dict[str, Any]] | list[dict[str, Any]]

Each point is a dict of overrides with dotted config keys (`{"model.num_heads": 8, "seed": 1}`)
applied to `get_config(arg)`; a dict of points names them, a list is named from its overrides
(`num_heads-8_seed-1`). Point `p` of sweep `name` trains with `train_and_evaluate` in
`<root>/<name>/<p>` (root `runs/sweeps`), in a child process of its own (`--parallel=N` runs up
to N at once), whose log goes to `<workdir>/sweep.log`.

Resuming: a point is finished when its `metrics.jsonl` has `test/bleu`; finished points are
skipped, and an unfinished one resumes from its newest checkpoint (`train_and_evaluate`
does that), so an interrupted sweep continues where it stopped when the same command runs
again. Ctrl-C (or SIGTERM) reaches the children, which save a checkpoint before they exit.

The report, `<results>/<name>.md` and `<name>.png` (results `experiments/results`), holds a
table of every point's final metrics (validation perplexity, validation and test BLEU,
parameters, median training-step time), the exact command, and the hardware. Experiments
with their own report (experiments/heads.py) call `main` with a `report` function.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags

from experiments import report as report_lib  # `report` is main's report function
from experiments.measure import param_count
from transformer import storage
from transformer.errors import fail

_F = types.SimpleNamespace()  # the command-line flags, once define_flags() ran


def define_flag(kind: str, name: str, default: Any, help_: str, **kwargs: Any) -> Any:
  """Defines a flag (`kind`: string, integer, ..., or config_file) and returns its holder.

  A flag of that name defined already in this process (by another experiment's
  `define_flags`, as when tests run several) is reused, with `default` as its new default.
  """
  if name in flags.FLAGS:
    if default is not None:
      flags.FLAGS.set_default(name, default)
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])
  if kind == "config_file":
    from ml_collections import config_flags

    return config_flags.DEFINE_config_file(name, default, help_, lock_config=True)
  return getattr(flags, f"DEFINE_{kind}")(name, default, help=help_, **kwargs)


def define_flags() -> None:
  """Defines the sweep command's flags (only when it runs, so modules import together)."""
  flag = define_flag
  _F.sweep = flag("string", "sweep", None, "Sweep file with get_config(arg) and sweep(arg), "
                  "e.g. configs/sweeps/heads.py:wmt.")
  _F.name = flag("string", "name", None, "Sweep name (default: the sweep file's name).")
  _F.root = flag("string", "root", os.path.join("runs", "sweeps"), "Workdirs: ROOT/NAME/.")
  _F.results = flag("string", "results", os.path.join("experiments", "results"),
                    "Directory of NAME.md and NAME.png.")
  _F.parallel = flag("integer", "parallel", 1, "Points trained at once (child processes).")
  _F.only = flag("list", "only", [], "Run only these points (the report still lists all).")
  _F.set = flag("multi_string", "set", [], "KEY=VALUE override for every point (after the "
                "point's own), e.g. --set=num_train_steps=100; the value is parsed as JSON, "
                "else taken as a string.")
  _F.report_only = flag("bool", "report_only", False, "Train nothing; report what is there.")
  _F.child = flag("string", "child", None, "Internal: train this one point in this process.")


FINAL_KEYS = ("eval/perplexity", "eval/bleu", "test/bleu", "eval/accuracy", "eval/loss")


@dataclasses.dataclass(frozen=True)
class Point:
  """One point of a sweep: its name and its config overrides (dotted keys)."""

  name: str
  overrides: dict[str, Any]


@dataclasses.dataclass
class Sweep:
  """A loaded sweep file: where it is, its variant argument, base config and points."""

  path: str
  arg: str | None
  name: str
  config: Any  # ml_collections.ConfigDict
  points: list[Point]


def point_name(overrides: dict[str, Any]) -> str:
  """Directory-safe name of overrides: {"model.num_heads": 8, "seed": 1} -> num_heads-8_seed-1."""
  parts = []
  for key, value in overrides.items():
    text = json.dumps(value) if not isinstance(value, str) else value
    text = "".join(c if c.isalnum() or c in ".-" else "-" for c in text)
    parts.append(f"{key.split('.')[-1]}-{text}")
  return "_".join(parts) or "default"


def expand(points: dict[str, dict[str, Any]] | Sequence[dict[str, Any]]) -> list[Point]:
  """The points of a `sweep()` result, named; raises ValueError on duplicate names."""
  if isinstance(points, dict):
    out = [Point(str(name), dict(o)) for name, o in points.items()]
  else:
    out = [Point(point_name(o), dict(o)) for o in points]
  names = [p.name for p in out]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"sweep points with the same name: {', '.join(duplicates)}")
  for p in out:
    if not p.name or os.sep in p.name or p.name.startswith("."):
      raise ValueError(f"bad sweep point name {p.name!r}")
  return out


def _load_module(path: str) -> Any:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--sweep: no such file {path}")
  name = "_sweep_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for fn in ("get_config", "sweep"):
    if not callable(getattr(module, fn, None)):
      raise AttributeError(f"--sweep={path}: the file has no function {fn}(arg)")
  return module


def load_sweep(spec: str, name: str | None = None) -> Sweep:
  """Loads `path.py[:arg]`: its base config (`get_config(arg)`) and points (`sweep(arg)`)."""
  path, _, arg = spec.partition(":")
  module = _load_module(path)
  arg = arg or None
  config = module.get_config(arg)
  points = expand(module.sweep(arg))
  for p in points:  # fail now, not after an hour, on an override that does not apply
    apply_overrides(config, p.overrides)
  default_name = os.path.splitext(os.path.basename(path))[0] + (f"-{arg}" if arg else "")
  return Sweep(path, arg, name or default_name, config, points)


def parse_value(text: str) -> Any:
  """A --set value: JSON if it parses (numbers, true/false, lists), else the string."""
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise ValueError(f"--set={item!r}: expected KEY=VALUE")
    out[key.strip()] = parse_value(value)
  return out


def apply_overrides(config: Any, overrides: dict[str, Any]) -> Any:
  """A copy of `config` with the dotted-key overrides set; KeyError names a missing field."""
  config = config.copy_and_resolve_references()
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for part in parents:
      if part not in node:
        raise KeyError(f"sweep override {key!r}: the config has no field {part!r}")
      node = node[part]
    if leaf not in node:
      raise KeyError(f"sweep override {key!r}: the config has no field {leaf!r}")
    with node.unlocked():
      node[leaf] = value
  return config


def point_config(sweep: Sweep, point: Point, extra: dict[str, Any] | None = None) -> Any:
  """The config a point trains with: the base, the point's overrides, then `extra`."""
  return apply_overrides(apply_overrides(sweep.config, point.overrides), extra or {})


def workdir_of(root: str, sweep_name: str, point: Point) -> str:
  return os.path.join(root, sweep_name, point.name)


def log_path(workdir: str, sweep_name: str, point: Point) -> str:
  """The point's `sweep.log`: in its workdir, or on local disk when the workdir is remote."""
  if storage.is_remote(workdir):
    path = os.path.join(storage.local_cache_root(), "sweep-logs", sweep_name, point.name + ".log")
  else:
    path = os.path.join(workdir, "sweep.log")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return path


def is_finished(workdir: str) -> bool:
  """A point is finished when its metrics.jsonl has test/bleu."""
  from transformer.metrics import read_metrics

  try:
    return any("test/bleu" in r for r in read_metrics(workdir))
  except (OSError, json.JSONDecodeError):
    return False


def step_time(records: list[dict[str, Any]]) -> float | None:
  """Median seconds per training step over the logged windows, the first (compilation) left out.

  Each window is `log_every_steps` steps; its time includes checkpoint saves and any
  evaluation done in it, which the median mostly ignores.
  """
  rates = [r["train/steps_per_s"] for r in records if r.get("train/steps_per_s")]
  if len(rates) > 1:
    rates = rates[1:]
  return statistics.median(1.0 / r for r in rates) if rates else None


def collect(sweep: Sweep, root: str) -> list[dict[str, Any]]:
  """One row per point: name, overrides, final metrics, params, step time, finished, wall time."""
  from transformer.metrics import read_metrics

  rows = []
  for p in sweep.points:
    workdir = workdir_of(root, sweep.name, p)
    records = read_metrics(workdir)
    final: dict[str, Any] = {}
    for r in records:
      if "test/bleu" in r:
        final = r
    info_path = storage.as_path(workdir) / "sweep_point.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    params = info.get("params")
    if params is None:
      params = param_count(point_config(sweep, p))
    rows.append({
      "name": p.name,
      "overrides": p.overrides,
      "workdir": workdir,
      "finished": bool(final),
      "step": final.get("step"),
      **{k: final.get(k) for k in FINAL_KEYS},
      "params": params,
      "step_s": step_time(records),
      "wall_s": info.get("wall_s"),
    })
  return rows


def default_report(sweep: Sweep, rows: list[dict[str, Any]], command: str,
                   results_dir: str) -> list[str]:
  """Writes `<name>.md` (a table of every point) and `<name>.png`; returns the paths."""
  md_path = os.path.join(results_dir, f"{sweep.name}.md")
  png_path = os.path.join(results_dir, f"{sweep.name}.png")
  keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
  header = ["point", *keys, "step", "valid PPL", "valid BLEU", "test BLEU", "params",
            "step (ms)"]
  fmt = report_lib.fmt
  table = [
    [r["name"], *[fmt(r["overrides"].get(k)) for k in keys], fmt(r["step"]),
     fmt(r["eval/perplexity"], 3), fmt(r["eval/bleu"]), fmt(r["test/bleu"]),
     f"{r['params']:,}", fmt(None if r["step_s"] is None else 1e3 * r["step_s"], 1)]
    for r in rows
  ]
  unfinished = [r["name"] for r in rows if not r["finished"]]
  text = [f"# Sweep `{sweep.name}`\n",
          f"Points of `{sweep.path}{':' + sweep.arg if sweep.arg else ''}` (`sweep()` in it), "
          "each trained with `train_and_evaluate` in its own workdir, by `experiments/sweep.py`."
          " valid = the config's validation split (BLEU on its first `eval_bleu_sentences`), "
          "step (ms) = median training-step time over the logged windows after the first.\n",
          "## Command\n", f"```\n{command}\n```\n", "## Machine\n",
          report_lib.hardware_markdown(report_lib.hardware()),
          "## Results\n", report_lib.markdown_table(header, table)]
  if unfinished:
    text.append(f"\nUnfinished points (no test/bleu yet): {', '.join(unfinished)}.\n")
  text.append(f"\n![{sweep.name}]({os.path.basename(png_path)})\n")
  os.makedirs(results_dir, exist_ok=True)
  with open(md_path, "w") as f:
    f.write("\n".join(text))

  metrics = [("eval/perplexity", "validation perplexity"), ("eval/bleu", "validation BLEU"),
             ("test/bleu", "test BLEU")]
  fig, axes = report_lib.figure(1, len(metrics), figsize=(4.2 * len(metrics), 3.4))
  x_key = keys[0] if keys else None
  for ax, (key, label) in zip(axes, metrics, strict=True):
    xs = [r["overrides"].get(x_key, i) for i, r in enumerate(rows)]
    ys = [r[key] for r in rows]
    numeric = all(isinstance(x, int | float) for x in xs)
    pos = xs if numeric else list(range(len(xs)))
    ax.plot([p for p, y in zip(pos, ys, strict=True) if y is not None],
            [y for y in ys if y is not None], "o")
    if not numeric:
      ax.set_xticks(pos, [str(x) for x in xs], rotation=45, ha="right", fontsize=7)
    ax.set_xlabel(x_key or "point")
    ax.set_title(label)
    ax.grid(alpha=0.3)
  report_lib.save_figure(fig, png_path)
  return [md_path, png_path]


def _child_command(sweep_spec: str, sweep_name: str, root: str, point: Point,
                   sets: Sequence[str]) -> list[str]:
  cmd = [sys.executable, "-m", "experiments.sweep", f"--sweep={sweep_spec}",
         f"--name={sweep_name}", f"--root={root}", f"--child={point.name}"]
  return cmd + [f"--set={s}" for s in sets]


def run_points(sweep_spec: str, sweep: Sweep, root: str, parallel: int,
               only: Sequence[str] = (), sets: Sequence[str] = (),
               log: Callable[[str], None] = print) -> list[str]:
  """Trains every unfinished point (in `only`, if given) in child processes; returns failures.

  Finished points are skipped. At most `parallel` children run at once.
  """
  unknown = sorted(set(only) - {p.name for p in sweep.points})
  if unknown:
    raise ValueError(f"--only: no such points {', '.join(unknown)}")
  todo = []
  for p in sweep.points:
    if only and p.name not in only:
      continue
    workdir = workdir_of(root, sweep.name, p)
    if is_finished(workdir):
      log(f"[sweep {sweep.name}] {p.name}: finished, skipped ({workdir})")
      continue
    todo.append(p)
  running: list[tuple[Point, subprocess.Popen, Any, float]] = []
  failed: list[str] = []

  def reap(block: bool) -> None:
    for item in list(running):
      p, proc, logf, t0 = item
      if block or proc.poll() is not None:
        rc = proc.wait()
        logf.close()
        running.remove(item)
        workdir = workdir_of(root, sweep.name, p)
        state = "done" if rc == 0 and is_finished(workdir) else f"FAILED (exit {rc})"
        if state != "done":
          failed.append(p.name)
        log(f"[sweep {sweep.name}] {p.name}: {state} in {time.time() - t0:.0f} s; log "
            f"{log_path(workdir, sweep.name, p)}")
        if block:
          return

  try:
    for i, p in enumerate(todo):
      while len(running) >= max(parallel, 1):
        time.sleep(0.5)
        reap(block=False)
      workdir = workdir_of(root, sweep.name, p)
      logf = open(log_path(workdir, sweep.name, p), "a")  # noqa: SIM115 - closed in reap
      log(f"[sweep {sweep.name}] {p.name} ({i + 1}/{len(todo)}): training in {workdir}")
      proc = subprocess.Popen(_child_command(sweep_spec, sweep.name, root, p, sets),
                              stdout=logf, stderr=subprocess.STDOUT)
      running.append((p, proc, logf, time.time()))
    while running:
      reap(block=True)
  except KeyboardInterrupt:
    # The children got the signal too (same process group): they save and exit.
    for _, proc, logf, _ in running:
      proc.wait()
      logf.close()
    raise
  return failed


def child_main(sweep_spec: str, sweep_name: str, root: str, point_name_: str,
               sets: dict[str, Any]) -> int:
  """Trains one point in this process; exit status 0 when it finished, 3 when interrupted."""
  sweep = load_sweep(sweep_spec, sweep_name)
  point = next((p for p in sweep.points if p.name == point_name_), None)
  if point is None:
    raise ValueError(f"--child: no point {point_name_!r} in {sweep_spec}")
  config = point_config(sweep, point, sets)
  workdir = workdir_of(root, sweep.name, point)
  info_path = storage.as_path(workdir) / "sweep_point.json"
  info = {"sweep": sweep_spec, "point": point.name, "overrides": point.overrides, "set": sets,
          "params": param_count(config), "wall_s": 0.0}
  if info_path.exists():  # time of earlier, interrupted tries
    info["wall_s"] = json.loads(info_path.read_text()).get("wall_s", 0.0)
  storage.write_atomic(storage.as_path(workdir) / "config.json", config.to_json(indent=2))
  from absl import logging

  from transformer.train import train_and_evaluate

  logging.set_verbosity(logging.INFO)
  t0 = time.time()
  result = train_and_evaluate(config, workdir)
  info["wall_s"] += time.time() - t0
  storage.write_atomic(info_path, json.dumps(info, indent=2))
  if result.get("interrupted"):
    print(f"interrupted by {result['interrupted']} at step {result['step']}", flush=True)
    return 3
  print(f"finished: eval/perplexity {result['eval/perplexity']:.3f}, eval/bleu "
        f"{result['eval/bleu']:.2f}, test/bleu {result['test/bleu']:.2f}", flush=True)
  return 0


Report = Callable[[Sweep, list[dict[str, Any]], str, str], list[str]]


def main(argv: Sequence[str], default_sweep: str | None = None,
         report: Report = default_report) -> None:
  """The sweep command; experiments with their own report call this with `report`."""
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  spec = _F.sweep.value or default_sweep
  if spec is None:
    fail("--sweep is required, e.g. --sweep=configs/sweeps/heads.py")
  try:
    sets = parse_sets(_F.set.value)
    if _F.child.value:
      sys.exit(child_main(spec, _F.name.value, _F.root.value, _F.child.value, sets))
    sweep = load_sweep(spec, _F.name.value)
    for p in sweep.points:
      point_config(sweep, p, sets)
  except (FileNotFoundError, AttributeError, KeyError, TypeError, ValueError) as e:
    fail(str(e).strip("'\""))
  command = report_lib.command_line()
  t0 = time.time()
  failed: list[str] = []
  if not _F.report_only.value:
    try:
      failed = run_points(spec, sweep, _F.root.value, _F.parallel.value, _F.only.value,
                          _F.set.value)
    except KeyboardInterrupt:
      print(f"[sweep {sweep.name}] interrupted: run the same command again to resume",
            flush=True)
      sys.exit(130)
  rows = collect(sweep, _F.root.value)
  paths = report(sweep, rows, command, _F.results.value)
  print(f"[sweep {sweep.name}] {sum(r['finished'] for r in rows)}/{len(rows)} points finished "
        f"({time.time() - t0:.0f} s); wrote {', '.join(paths)}", flush=True)
  if failed:
    print(f"[sweep {sweep.name}] failed points: {', '.join(failed)}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  define_flags()
  app.run(main)
