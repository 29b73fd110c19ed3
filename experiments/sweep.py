"""The sweep command: the points of a sweep file, each trained in its own workdir by a child
process, their results collected, and the default report (experiments/heads.py is the same
command with its own report):

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
again. Ctrl-C (or SIGTERM to the process group) reaches the children, which save a checkpoint
before they exit.

The report, `<results>/<name>.md`, `.json` and `.png` (results `experiments/results`), holds a
table of every point's final metrics (validation perplexity, validation and test BLEU,
parameters, median training-step time), the exact command, and the hardware.
"""

from __future__ import annotations

import concurrent.futures
import copy
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

from measuring import report as report_lib
from measuring.measure import param_count
from transformer import storage
from transformer.errors import fail, flags_parser


def define_flags(default_sweep: str | None = None) -> types.SimpleNamespace:
  """Defines the sweep command's flags; called by the sweep commands (this module's and
  experiments/heads.py's) when they run, under `if __name__ == "__main__":`."""
  from absl import flags

  return types.SimpleNamespace(
    sweep=flags.DEFINE_string("sweep", default_sweep, "Sweep file with get_config(arg) and "
                              "sweep(arg), e.g. configs/sweeps/heads.py:wmt."),
    name=flags.DEFINE_string("name", None, "Sweep name (default: the sweep file's name)."),
    root=flags.DEFINE_string("root", os.path.join("runs", "sweeps"), "Workdirs: ROOT/NAME/."),
    results=flags.DEFINE_string("results", os.path.join("experiments", "results"),
                                "Directory of NAME.md and NAME.png."),
    parallel=flags.DEFINE_integer("parallel", 1, "Points trained at once (child processes)."),
    only=flags.DEFINE_list("only", [], "Run only these points (the report still lists all)."),
    set=flags.DEFINE_multi_string("set", [], "KEY=VALUE override for every point (after the "
                                  "point's own), e.g. --set=num_train_steps=100; the value is "
                                  "parsed as JSON, else taken as a string."),
    report_only=flags.DEFINE_bool("report_only", False, "Train nothing; report what is there."),
    child=flags.DEFINE_string("child", None, "Internal: train this one point in this process."),
  )


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
  """A copy of `config` with the dotted-key overrides set; KeyError names a missing field.
  (A deep copy keeps each field's type, placeholders included, for the workdir's config.)"""
  config = copy.deepcopy(config)
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


def point_translations(row: dict[str, Any]) -> list[str] | None:
  """A finished point's test translations from its final evaluation
  (`translations/test_<step>.txt`), or None."""
  if not row["finished"] or not row.get("workdir"):
    return None
  from transformer.training.evaluators import translations_path

  path = translations_path(row["workdir"], "test", row["step"])
  if not path.exists():
    return None
  return path.read_text(encoding="utf-8").splitlines()


def significance_against(sweep: Sweep, rows: list[dict[str, Any]],
                         baseline_of: Callable[[dict[str, Any]], dict[str, Any] | None],
                         samples: int = 1000, trials: int = 10000) -> dict[str, Any]:
  """Paired significance of each finished point's test BLEU, chrF and TER against its
  baseline point (`baseline_of(row)`, e.g. the same seed at the paper's setting), on the test
  references both translated: {point: {"baseline", "bleu": {p_bootstrap, p_randomization},
  ...}} (transformer/decoding/significance.py). Points without translations are left out."""
  from transformer.data import input_pipeline
  from transformer.decoding import significance

  out: dict[str, Any] = {}
  references: list[str] | None = None
  for row in rows:
    base = baseline_of(row)
    if base is None or base["name"] == row["name"]:
      continue
    mine, theirs = point_translations(row), point_translations(base)
    if mine is None or theirs is None or len(mine) != len(theirs):
      continue
    if references is None:
      pairs = input_pipeline.open_reader(point_config(sweep, sweep.points[0])).read_pairs("test")
      references = [t for _, t in pairs]
    result = significance.compare([(base["name"], theirs), (row["name"], mine)],
                                  references[: len(mine)], bootstrap_samples=samples,
                                  randomization_trials=trials)
    out[row["name"]] = {"baseline": base["name"], **{
      m: {"p_bootstrap": r.p_bootstrap, "p_randomization": r.p_randomization,
          "score": r.score, "baseline_score": result.results[base["name"]][m].score}
      for m, r in result.results[row["name"]].items()}}
  return out


def significance_table(tests: dict[str, Any]) -> list[str]:
  """The markdown of `significance_against`'s results (nothing if there are none)."""
  if not tests:
    return []
  fmt = report_lib.fmt
  rows = [[name, t["baseline"], *(f"{fmt(t[m]['score'])} vs {fmt(t[m]['baseline_score'])}, "
                                  f"p {t[m]['p_bootstrap']:.3f} / {t[m]['p_randomization']:.3f}"
                                  for m in ("bleu", "chrf", "ter"))]
          for name, t in tests.items()]
  return ["\n### Significance of the test scores\n",
          "Each point's test translations against its baseline's on the same references: "
          "paired bootstrap resampling / approximate randomization p-values "
          "(transformer/decoding/significance.py).\n",
          report_lib.markdown_table(["point", "baseline", "BLEU", "chrF", "TER"], rows)]


def default_report(sweep: Sweep, rows: list[dict[str, Any]], png_path: str) -> dict[str, Any]:
  """A table of every point (`report.write`'s title, intro, body and record); draws the
  points' final metrics into `png_path`."""
  keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
  fmt = report_lib.fmt
  table = [[r["name"], *[fmt(r["overrides"].get(k)) for k in keys], fmt(r["step"]),
            fmt(r["eval/perplexity"], 3), fmt(r["eval/bleu"]), fmt(r["test/bleu"]),
            f"{r['params']:,}", fmt(None if r["step_s"] is None else 1e3 * r["step_s"], 1)]
           for r in rows]
  unfinished = [r["name"] for r in rows if not r["finished"]]
  intro = (
    f"Points of `{sweep.path}{':' + sweep.arg if sweep.arg else ''}` (`sweep()` in it), each "
    "trained with `train_and_evaluate` in its own workdir, by `experiments/sweep.py`. valid = "
    "the config's validation split (BLEU on its first `evals.valid_translation.sentences`), "
    "step (ms) = "
    "median training-step time over the logged windows after the first.")
  # Every point against the first.
  tests = significance_against(sweep, rows, lambda _: rows[0] if rows else None)
  body = (
    ["## Results\n", report_lib.markdown_table(
      ["point", *keys, "step", "valid PPL", "valid BLEU", "test BLEU", "params", "step (ms)"],
      table)]
    + ([f"\nUnfinished points (no test/bleu yet): {', '.join(unfinished)}.\n"] if unfinished
       else []) + significance_table(tests)
    + [f"\n![{sweep.name}]({os.path.basename(png_path)})\n"])

  metrics = [("eval/perplexity", "validation perplexity"), ("eval/bleu", "validation BLEU"),
             ("test/bleu", "test BLEU")]
  fig, axes = report_lib.figure(1, len(metrics), figsize=(4.2 * len(metrics), 3.4))
  x_key = keys[0] if keys else None
  xs = [r["overrides"].get(x_key, i) for i, r in enumerate(rows)]
  numeric = all(isinstance(x, int | float) for x in xs)
  points = [{**r, "x": x if numeric else i} for i, (x, r) in enumerate(zip(xs, rows,
                                                                          strict=True))]
  for ax, (key, label) in zip(axes, metrics, strict=True):
    report_lib.plot_series(ax, points, "x", key, group=lambda _: x_key or "point", style="o")
    if not numeric:
      ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=45, ha="right", fontsize=7)
    ax.set(xlabel=x_key or "point", title=label)
    ax.grid(alpha=0.3)
  report_lib.save_figure(fig, png_path)
  return {"title": f"Sweep `{sweep.name}`", "intro": intro, "body": body,
          "record": {"rows": rows, "significance": tests}}


def run_points(sweep_spec: str, sweep: Sweep, root: str, parallel: int,
               only: Sequence[str] = (), sets: Sequence[str] = (),
               log: Callable[[str], None] = print) -> list[str]:
  """Trains every unfinished point (in `only`, if given) in child processes, at most
  `parallel` at once; finished points are skipped. Returns the names of the failed ones."""
  unknown = sorted(set(only) - {p.name for p in sweep.points})
  if unknown:
    raise ValueError(f"--only: no such points {', '.join(unknown)}")
  todo = []
  for p in sweep.points:
    workdir = workdir_of(root, sweep.name, p)
    if only and p.name not in only:
      continue
    if is_finished(workdir):
      log(f"[sweep {sweep.name}] {p.name}: finished, skipped ({workdir})")
    else:
      todo.append(p)

  def train(i: int, p: Point) -> str | None:
    workdir = workdir_of(root, sweep.name, p)
    log(f"[sweep {sweep.name}] {p.name} ({i + 1}/{len(todo)}): training in {workdir}")
    cmd = [sys.executable, "-m", "experiments.sweep", f"--sweep={sweep_spec}",
           f"--name={sweep.name}", f"--root={root}", f"--child={p.name}",
           *[f"--set={s}" for s in sets]]
    t0 = time.time()
    with open(log_path(workdir, sweep.name, p), "a") as logf:
      rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT).returncode
    ok = rc == 0 and is_finished(workdir)
    log(f"[sweep {sweep.name}] {p.name}: {'done' if ok else f'FAILED (exit {rc})'} in "
        f"{time.time() - t0:.0f} s; log {log_path(workdir, sweep.name, p)}")
    return None if ok else p.name

  # Ctrl-C reaches the children too (same process group): they save and exit, and leaving
  # the pool waits for them.
  with concurrent.futures.ThreadPoolExecutor(max(parallel, 1)) as pool:
    return [name for name in pool.map(train, range(len(todo)), todo) if name]


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
  from absl import logging

  from transformer.training.train import train_and_evaluate

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


# (sweep, rows, the figure's path) -> `report.write`'s title, intro, body and record.
Report = Callable[[Sweep, list[dict[str, Any]], str], dict[str, Any]]


def main(argv: Sequence[str], flags: types.SimpleNamespace,
         report: Report = default_report) -> None:
  """The sweep command on `flags` (from `define_flags`), with its report function."""
  if len(argv) > 1:
    fail(f"unexpected arguments {' '.join(argv[1:])!r}")
  spec, root = flags.sweep.value, flags.root.value
  if spec is None:
    fail("--sweep is required, e.g. --sweep=configs/sweeps/heads.py")
  try:
    sets = parse_sets(flags.set.value)
    if flags.child.value:
      sys.exit(child_main(spec, flags.name.value, root, flags.child.value, sets))
    sweep = load_sweep(spec, flags.name.value)
    for p in sweep.points:
      point_config(sweep, p, sets)
  except (FileNotFoundError, AttributeError, KeyError, TypeError, ValueError) as e:
    fail(str(e).strip("'\""))
  command = report_lib.command_line()
  t0 = time.time()
  failed: list[str] = []
  if not flags.report_only.value:
    try:
      failed = run_points(spec, sweep, root, flags.parallel.value, flags.only.value,
                          flags.set.value)
    except KeyboardInterrupt:
      print(f"[sweep {sweep.name}] interrupted: run the same command again to resume",
            flush=True)
      sys.exit(130)
  rows = collect(sweep, root)
  path = os.path.join(flags.results.value, sweep.name)
  paths = report_lib.write(path, command=command, **report(sweep, rows, path + ".png"))
  paths.append(path + ".png")
  print(f"[sweep {sweep.name}] {sum(r['finished'] for r in rows)}/{len(rows)} points finished "
        f"({time.time() - t0:.0f} s); wrote {', '.join(paths)}", flush=True)
  if failed:
    print(f"[sweep {sweep.name}] failed points: {', '.join(failed)}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  from absl import app

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  FLAGS = define_flags()
  app.run(lambda argv: main(argv, FLAGS), flags_parser=flags_parser())
