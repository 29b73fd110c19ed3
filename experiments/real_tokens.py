"""Real tokens per second where users look: whole training runs, WMT's fixed buckets against the
default (packed rows), on the numbers corpus and on short natural-language sentences.

    python -m experiments.real_tokens --steps=200 --rounds=2

The sentences are the German message catalogues installed on this machine (`--catalogues`,
`*.mo` read with `gettext.GNUTranslations`): every single-line English message with its German
translation, both sides 3 to 20 words and free of format placeholders (`%s`, `{}`), the
English side unique, shuffled with `--seed`, at most `--max_pairs` of them. They are written
line-aligned as `<workdir>/messages/train.en` and `train.de`, and the report records their
number, the catalogues read, the mean words per side and the files' SHA-256: another machine
has other catalogues.

Each corpus trains with the main program in a child process of its own (`python -m
transformer.main --config=... --workdir=...`), `--steps` steps, in two layouts:

  buckets   `data.packing=False` with WMT's bucket lengths 16, 24, 32, 48, 64, 96, 128, 192,
            256 (`model.max_len=256` so that the largest fits; the sinusoidal table only)
  default   the config as it is: packed rows

taking turns (buckets, default, buckets, default, ...) for `--rounds` rounds, so that a shared
machine's load falls on both alike; each run starts in an empty workdir with the compilation
cache off (`compilation_cache_dir=''`), as a first start. Per run, from its `metrics.jsonl` and
its log:

  real tokens/s     real (non-padding) source + target tokens over the wall time of the training
                    steps after the first log window (`--log_every` steps), nothing else inside
                    (evaluation and checkpoints only after the last step)
  real fraction     real tokens over the batches' positions, both sides, all steps
  to first step     the process's start to the first training step: the first progress line's
                    log time less the first window's time (1 / train/steps_per_s per step)
  compile           of which the ahead-of-time compile of every batch shape: from the log line
                    `Model: ...` (just before it) to the first step
  test BLEU         at the end (`test/bleu`), after the same number of steps, not the same
                    time: the layout with more real tokens per batch has seen more examples

The table shows each side's best run and default / buckets. Writes `--out`.md and .json.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from experiments import report
from experiments.real_tokens_report import (
  CORPORA,
  config_args,
  plan_runs,
  run_all,
  write_messages,
  write_report,
)
from transformer.errors import UserError, fail, flags_parser

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
_OUT = flags.DEFINE_string("out", os.path.join("experiments", "results", "real_tokens"),
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
  write_report(_OUT.value, report.command_line(), corpus, result, _STEPS.value, _LOG_EVERY.value)
  print(f"wrote {_OUT.value}.md", flush=True)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser(numbers="configs/numbers.py",
                                           messages="configs/text.py:en-de,small"))
