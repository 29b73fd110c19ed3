"""Real tokens per second where users look: whole training runs, WMT's fixed buckets against the
default (packed rows), on the numbers corpus and on short natural-language sentences.

    python -m benchmarks.real_tokens --steps=200 --rounds=2

The sentences are the German message catalogues installed on this machine (`--catalogues`),
as `benchmarks.messages` reads them (one-line messages of 3 to 20 words without placeholders),
shuffled with `--seed`, at most `--max_pairs` of them, written line-aligned as
`<workdir>/messages/train.en` and `train.de`; the report records their number, the catalogues
read, the mean words per side and the files' SHA-256: another machine has other catalogues.

Each corpus trains with the main program in a child process of its own (`python -m
transformer.main --config=... --workdir=...`), `--steps` steps, in two layouts:

  buckets   `data.packing=False` with WMT's bucket lengths 16, 24, 32, 48, 64, 96, 128, 192,
            256 (`model.max_len=256` so that the largest fits; the sinusoidal table only)
  default   the config as it is: packed rows

taking turns (buckets, default, buckets, default, ...) for `--rounds` rounds, so that a shared
machine's load falls on both alike; each run starts in an empty workdir with the compilation
cache off (`compilation_cache_dir=''`), as a first start. Per run, from its `metrics.jsonl`:

  real tokens/s     real (non-padding) source + target tokens over the wall time of the training
                    steps after the first log window (`--log_every` steps), nothing else inside
                    (evaluation and checkpoints only after the last step)
  real fraction     real tokens over the batches' positions, both sides, all steps
  to first step     the process's start to the first training step (`startup/seconds`)
  compile           of which the ahead-of-time compile of every batch shape
                    (`startup/compile_s`)
  test BLEU         at the end (`test/bleu`), after the same number of steps, not the same
                    time: the layout with more real tokens per batch has seen more examples

The table shows each side's best run and default / buckets. Writes `--out`.md and .json.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

from benchmarks.messages import write_messages
from measuring import measure, report
from transformer.errors import UserError, fail, flags_parser

CORPORA = ("numbers", "messages")
LAYOUTS = ("buckets", "default")
WMT_BUCKETS = [16, 24, 32, 48, 64, 96, 128, 192, 256]  # configs/wmt.py's list, as users had it
# Fields set for a corpus unless the command line sets them: the small model's vocabulary (its
# 8,000 pieces would spend most of a CPU step on the logits of sentences of a few words).
DEFAULTS = {"numbers": {}, "messages": {"data.vocab_size": 2000}}
# ----------------------------------------------------------------------------- the runs


def config_args(flag: str) -> dict[str, str]:
  """The command line's overrides of config flag `flag` (`--flag.FIELD=VALUE` or
  `--flag.FIELD VALUE`): {FIELD: VALUE as written}."""
  out, argv = {}, sys.argv[1:]
  for i, arg in enumerate(argv):
    name, eq, value = arg.partition("=")
    if name.startswith(f"--{flag}."):
      out[name[len(f"--{flag}."):]] = value if eq else argv[i + 1]
  return out


def fixed_overrides(corpus: str, layout: str, config: Any, steps: int, log_every: int,
                    messages_dir: str) -> dict[str, Any]:
  """The fields a run sets, whatever the command line says: its length, windows, corpus files
  and layout."""
  out: dict[str, Any] = {
    "num_train_steps": steps, "log_every_steps": log_every,
    # Evaluation and checkpoints only after the last step, outside the timed windows.
    "evals.valid_loss.every_steps": steps, "checkpoint_every_steps": steps,
    "evals.valid_translation.every_steps": 0,
    "compilation_cache_dir": "",  # every run compiles, as a first start does
  }
  if corpus == "messages":
    out.update({"data.train_files.en": os.path.join(messages_dir, "train.en"),
                "data.train_files.de": os.path.join(messages_dir, "train.de")})
  if layout == "buckets":
    out.update({"data.packing": False, "data.bucket_lengths": WMT_BUCKETS,
                "model.max_len": max(int(config.model.max_len), WMT_BUCKETS[-1])})
  return out


def run_plan(corpus: str, config: Any, user: dict[str, str], steps: int, log_every: int,
             messages_dir: str) -> dict[str, tuple[Any, list[str]]]:
  """Each layout's config and its `--config.` overrides for the main program: the corpus's
  DEFAULTS the command line leaves alone, the command line's (`user`, already applied to
  `config`), then the fixed ones. Raises ConfigError for a command-line override of a field
  the runs set."""
  from transformer.errors import ConfigError

  defaults = {k: v for k, v in DEFAULTS[corpus].items() if k not in user}
  config = apply(config, defaults)
  plan = {}
  for layout in LAYOUTS:
    fixed = fixed_overrides(corpus, layout, config, steps, log_every, messages_dir)
    # model.max_len is the larger of the command line's and the buckets' need.
    taken = sorted(set(user) & set(fixed_overrides(corpus, "buckets", config, steps, log_every,
                                                   messages_dir)) - {"model.max_len"})
    if taken:
      raise ConfigError(f"--{corpus}.{taken[0]}: set by this experiment for every run; use "
                        "its own flags (--steps, --log_every, ...)")
    args = [*(as_flag(k, v) for k, v in defaults.items()),
            *(f"--config.{k}={v}" for k, v in user.items()),
            *(as_flag(k, v) for k, v in fixed.items())]
    plan[layout] = (apply(config, fixed), args)
  return plan


def apply(config: Any, overrides: dict[str, Any]) -> Any:
  """A copy of `config` with dotted `overrides` set."""
  import copy

  out = copy.deepcopy(config)
  for key, value in overrides.items():
    *path, field = key.split(".")
    node = out
    for p in path:
      node = node[p]
    node[field] = value
  return out


def as_flag(key: str, value: Any) -> str:
  if isinstance(value, list):
    value = "[" + ",".join(str(v) for v in value) + "]"
  return f"--config.{key}={value}"


def run_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
  """A finished run's figures (see the module doc) from its metrics.jsonl records."""
  windows, last = [], 0
  for r in records:
    if "train/tokens_per_s" in r:
      seconds = (r["step"] - last) / r["train/steps_per_s"]
      real = r["train/tokens_per_s"] * seconds
      windows.append({"steps": r["step"] - last, "seconds": seconds, "real": real,
                      "positions": real / r["train/real_token_fraction"]})
      last = r["step"]
  if len(windows) < 2:
    raise RuntimeError(f"{len(windows)} log windows in metrics.jsonl; need 2 or more")
  startup = next((r for r in records if "startup/seconds" in r), None)
  if startup is None:
    raise RuntimeError("metrics.jsonl has no startup/seconds (a start that trained no step)")
  timed = windows[1:]
  final = next(r for r in reversed(records) if "test/bleu" in r)
  per_step = [w["seconds"] / w["steps"] for w in windows]
  return {
    "real_tokens_per_s": sum(w["real"] for w in timed) / sum(w["seconds"] for w in timed),
    "real_fraction": sum(w["real"] for w in windows) / sum(w["positions"] for w in windows),
    "to_first_step_s": startup["startup/seconds"], "compile_s": startup["startup/compile_s"],
    "first_window_step_s": per_step[0], "later_step_s": sum(w["seconds"] for w in timed) /
    sum(w["steps"] for w in timed), "test_bleu": final["test/bleu"],
    "eval_perplexity": final.get("eval/perplexity"),
    "batch_shapes": startup.get("startup/batch_shapes"), "windows": windows,
  }


def train_once(spec: str, args: list[str], workdir: str, timeout: float) -> dict[str, Any]:
  """One training run of the main program in a child process; its summary and wall time.
  Raises UserError for a user error of the child (exit status 2), RuntimeError otherwise."""
  from transformer.metrics import read_metrics

  shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(workdir)
  log_path = os.path.join(workdir, "train.log")
  cmd = [sys.executable, "-m", "transformer.main", f"--config={spec}", f"--workdir={workdir}",
         *args]
  started = time.time()
  with open(log_path, "w") as log:
    try:
      rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired as e:
      raise RuntimeError(f"over the {timeout:.0f} s limit; log {log_path}") from e
  wall = time.time() - started
  with open(log_path) as f:
    text = f.read()
  if rc:
    last = (text.strip().splitlines() or ["no output"])[-1]
    if rc == 2:
      raise UserError(f"{spec}: {last.removeprefix('error: ')}")
    raise RuntimeError(f"exit {rc}: {last[:300]}; log {log_path}")
  return {**run_summary(read_metrics(workdir)), "wall_s": wall,
          "workdir": workdir}


def plan_runs(configs: dict[str, tuple[str, Any, dict[str, str]]], steps: int, rounds: int,
              log_every: int, root: str) -> dict[tuple[str, str], tuple[str, Any, list[str]]]:
  """(corpus, layout) -> (config spec, config, `--config.` overrides) of every run, each
  config validated; `configs` maps a corpus to its config spec, its config (the command line's
  overrides applied) and those overrides (`config_args`). Raises UserError; writes nothing."""
  import jax

  from transformer.training.validate import validate

  measure.check_at_least((("--log_every", log_every, 1), ("--steps", steps, 2 * log_every),
                          ("--rounds", rounds, 1)))
  plans = {}
  for corpus, (spec, config, user) in configs.items():
    plan = run_plan(corpus, config, user, steps, log_every, os.path.join(root, "messages"))
    for layout, (cfg, args) in plan.items():
      validate(cfg, jax.device_count())
      plans[corpus, layout] = (spec, cfg, args)
  return plans


def run_all(plans: dict[tuple[str, str], tuple[str, Any, list[str]]], rounds: int, root: str,
            timeout: float) -> dict[str, Any]:
  """Every planned run, `rounds` times, taking turns; each run's figures by corpus and layout.
  Raises UserError (the corpus, or a run's config) or RuntimeError (a run failed)."""
  from transformer.data import input_pipeline

  corpora = list(dict.fromkeys(c for c, _ in plans))
  for corpus in corpora:
    # The corpus (the numbers corpus is generated once) before any run's clock starts.
    input_pipeline.open_reader(plans[corpus, "default"][1])
  runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {k: [] for k in LAYOUTS}
                                                      for c in corpora}
  for r in range(rounds):
    for (corpus, layout), (spec, cfg, args) in plans.items():
      workdir = os.path.join(root, "runs", f"{corpus}-{layout}")
      try:
        run = train_once(spec, args, workdir, timeout)
      except RuntimeError as e:
        raise RuntimeError(f"{corpus} {layout}, round {r + 1}: {e}") from e
      run.update(layout="packed" if cfg.data.packing else "bucketed", round=r + 1)
      runs[corpus][layout].append(run)
      print(f"round {r + 1}/{rounds} {corpus} {layout}: {run['real_tokens_per_s']:,.0f} real "
            f"tokens/s, real fraction {run['real_fraction']:.3f}, first step after "
            f"{run['to_first_step_s']:.1f} s, test BLEU {run['test_bleu']:.2f}", flush=True)
  return {"runs": runs,
          "configs": {c: describe(plans[c, "default"][1], plans[c, "buckets"][1]) for c in corpora},
          "overrides": {f"{c} {k}": plans[c, k][2] for c in corpora for k in LAYOUTS}}


def describe(default: Any, buckets: Any) -> dict[str, Any]:
  """What a corpus's two layouts train (for the report)."""
  m = default.model
  return {"dataset": default.dataset, "tokens_per_batch": default.data.tokens_per_batch,
          "vocab_size": default.data.vocab_size, "packing": bool(default.data.packing),
          "packed_source_len": default.data.packed_source_len,
          "packed_target_len": default.data.packed_target_len,
          "default_buckets": default.data.bucket_lengths,
          "buckets": list(buckets.data.bucket_lengths),
          "model": f"{m.num_layers} + {m.num_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}, "
                   f"{m.num_heads} heads, dropout {m.dropout_rate}"}


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
  """Each figure's best over the runs (highest rate, shortest times; the fraction and BLEU of
  the fastest run)."""
  fastest = max(runs, key=lambda r: r["real_tokens_per_s"])
  return {"real_tokens_per_s": fastest["real_tokens_per_s"],
          "real_fraction": fastest["real_fraction"], "test_bleu": fastest["test_bleu"],
          "to_first_step_s": min(r["to_first_step_s"] for r in runs),
          "compile_s": min(r["compile_s"] for r in runs),
          "later_step_s": min(r["later_step_s"] for r in runs),
          "first_window_step_s": min(r["first_window_step_s"] for r in runs),
          "layout": fastest["layout"], "batch_shapes": fastest["batch_shapes"]}


# ----------------------------------------------------------------------------- the report


def report_parts(corpus: dict[str, Any] | None, result: dict[str, Any], steps: int,
                 log_every: int) -> dict[str, Any]:
  """`report.write`'s title, intro, body and record of `run_all`'s result."""
  rows, notes = [], []
  summary = {}
  for name, by_layout in result["runs"].items():
    b, d = best(by_layout["buckets"]), best(by_layout["default"])
    summary[name] = {"buckets": b, "default": d,
                     "ratio_real_tokens_per_s": d["real_tokens_per_s"] / b["real_tokens_per_s"]}
    for label, x in (("buckets", b), ("default", d)):
      rows.append([name, f"{label} ({x['layout']})", f"**{x['real_tokens_per_s']:,.0f}**",
                   f"{x['real_fraction']:.3f}", f"{x['to_first_step_s']:.1f}",
                   f"{x['compile_s']:.1f}", f"{x['first_window_step_s']:.3f}",
                   f"{x['later_step_s']:.3f}", f"{x['test_bleu']:.2f}"])
    rows.append([name, "**default / buckets**",
                 f"**{summary[name]['ratio_real_tokens_per_s']:.2f}x**",
                 f"{d['real_fraction'] / b['real_fraction']:.2f}x",
                 f"{d['to_first_step_s'] / b['to_first_step_s']:.2f}x",
                 f"{d['compile_s'] / max(b['compile_s'], 1e-9):.2f}x", "", "", ""])
    notes.append(f"- {name}, training batch shapes (rows, length[, target length]): buckets "
                 f"{b['batch_shapes']}; default {d['batch_shapes']}.")
  runs_rows = [[name, label, r["round"], f"{r['real_tokens_per_s']:,.0f}",
                f"{r['real_fraction']:.3f}", f"{r['to_first_step_s']:.1f}",
                f"{r['wall_s']:.0f}", f"{r['test_bleu']:.2f}"]
               for name, by_layout in result["runs"].items()
               for label in LAYOUTS for r in by_layout[label]]
  corpora_lines = []
  for name, c in result["configs"].items():
    corpora_lines.append(
      f"- **{name}**: dataset `{c['dataset']}`, vocabulary {c['vocab_size']}, "
      f"{c['tokens_per_batch']} tokens per batch and side; model {c['model']}. Default: "
      + (f"packed rows of {c['packed_source_len']} source and {c['packed_target_len']} target "
         "positions" if c["packing"] else f"buckets {c['default_buckets']}")
      + f"; buckets: {c['buckets']}.")
  if corpus is not None:
    corpora_lines.append(
      f"- The messages: {corpus['pairs']:,} English -> German pairs from "
      f"{corpus['catalogues']} catalogues in `{corpus['catalogue_dir']}` "
      f"({corpus['unreadable']} unreadable, skipped); mean words per side "
      f"{corpus['mean_words_en']:.2f} (en), {corpus['mean_words_de']:.2f} (de); SHA-256 "
      f"train.en `{corpus['files']['en']['sha256']}`, train.de "
      f"`{corpus['files']['de']['sha256']}` (another machine's catalogues give other "
      "sentences).")
  notes.append(
    f"- Every run: {steps} training steps, windows of {log_every} steps; real tokens/s over "
    f"the windows after the first; each side's best run (the fastest run's real fraction and "
    "BLEU; the shortest times). Times to the first step include the start of Python, the "
    "vocabulary, the token cache and the compile, in an empty workdir and without the "
    "compilation cache, up to the first training step (`startup/seconds` of the run's "
    "metrics.jsonl).")
  intro = (
    "Made by `benchmarks/real_tokens.py` (method in its docstring): whole training runs of "
    "`python -m transformer.main`, WMT's fixed buckets (`data.packing=False`) against the "
    "config as it is (packed rows), the runs taking turns.")
  body = ["## Corpora\n", "\n".join(corpora_lines) + "\n", "## Results (best of the runs)\n",
     report.markdown_table(["corpus", "layout", "real tokens/s", "real fraction",
                            "to first step (s)", "compile (s)", "s/step, first window",
                            "s/step, later", "test BLEU"], rows, "llrrrrrrr"),
     *notes, "\n## Every run\n",
     report.markdown_table(["corpus", "layout", "round", "real tokens/s", "real fraction",
                            "to first step (s)", "whole run (s)", "test BLEU"], runs_rows,
                           "llrrrrrr")]
  return {"title": "Real tokens per second: WMT's buckets against the default", "intro": intro,
          "body": body, "record": {"messages": corpus, "steps": steps, "log_every": log_every,
                                   "summary": summary, **result}}


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _NUMBERS = config_flags.DEFINE_config_file(
    "numbers", None, "Config of the numbers corpus (configs/numbers.py); override fields with "
    "--numbers.FIELD=VALUE.", lock_config=False)
  _MESSAGES = config_flags.DEFINE_config_file(
    "messages", None, "Config of the messages corpus (configs/text.py:en-de,small); override "
    "fields with --messages.FIELD=VALUE.", lock_config=False)
  _CATALOGUES = flags.DEFINE_string("catalogues", "/usr/share/locale/de/LC_MESSAGES",
                                    "Directory of the German message catalogues (*.mo).")
  _MAX_PAIRS = flags.DEFINE_integer("max_pairs", 20000, "Sentence pairs kept at most.")
  _SEED = flags.DEFINE_integer("seed", 0, "Seed of the sentence pairs' shuffle.")
  _CORPORA = flags.DEFINE_list("corpora", ["numbers", "messages"], "Corpora to train on.")
  _STEPS = flags.DEFINE_integer("steps", 200, "Training steps of every run.")
  _ROUNDS = flags.DEFINE_integer("rounds", 2, "Runs of each layout, taking turns.")
  _LOG_EVERY = flags.DEFINE_integer("log_every", 20, "Steps per log window (the first window is "
                                    "not timed).")
  _TIMEOUT = flags.DEFINE_float("timeout", 3600.0, "Seconds a run may take.")
  _WORKDIR = flags.DEFINE_string("workdir", os.path.join("runs", "real_tokens"),
                                 "Holds the messages corpus and the runs' workdirs (emptied).")
  _OUT = flags.DEFINE_string("out", os.path.join("benchmarks", "results", "real_tokens"),
                             "Report path without extension (.md and .json).")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    corpora = list(dict.fromkeys(_CORPORA.value))
    if not corpora or set(corpora) - set(CORPORA):
      fail(f"--corpora={','.join(_CORPORA.value)}: use numbers, messages or both")
    root = _WORKDIR.value
    flag_of = {"numbers": _NUMBERS, "messages": _MESSAGES}
    try:
      plans = plan_runs({c: (flags.FLAGS[c].serialize().split("=", 1)[1], flag_of[c].value,
                             config_args(c)) for c in corpora},
                        _STEPS.value, _ROUNDS.value, _LOG_EVERY.value, root)
      corpus = None
      if "messages" in corpora:
        corpus = write_messages(_CATALOGUES.value, os.path.join(root, "messages"),
                                _MAX_PAIRS.value, _SEED.value)
        print(f"messages: {corpus['pairs']:,} pairs from {corpus['catalogues']} catalogues, "
              f"{corpus['mean_words_en']:.1f} / {corpus['mean_words_de']:.1f} words", flush=True)
      result = run_all(plans, _ROUNDS.value, root, _TIMEOUT.value)
    except UserError as e:
      fail(str(e))
    except RuntimeError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(1)
    report.write(_OUT.value, command=report.command_line(),
                 **report_parts(corpus, result, _STEPS.value, _LOG_EVERY.value))
    print(f"wrote {_OUT.value}.md", flush=True)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser(numbers="configs/numbers.py",
                                           messages="configs/text.py:en-de,small"))
