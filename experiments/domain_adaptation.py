"""Fine-tuning against training from scratch on a small corpus of another domain.

The general model is the offline default (`--general`, trained on cardinal numbers: "three
hundred and forty-seven" -> "dreihundertsiebenundvierzig"). The new domain is ordinals in a
short phrase ("the twenty-first and then the third" -> "der einundzwanzigste und dann der
dritte"), written as text files of `--train_pairs` training pairs, with validation and test
numbers that training never sees (the numbers corpus's split of the integers). Two runs of
`configs/text.py:en-de,small` train on it for the same `--steps`: one fine-tuned from the
general model (`config.init_from`: its parameters and vocabulary), one from scratch (its own
vocabulary of the same size). Reported: BLEU and chrF on the ordinal test split of the
general model as it is, and of both runs; and BLEU on the cardinal test split, of the general
model and of the fine-tuned one (what fine-tuning forgets).

    python -m experiments.domain_adaptation --general=runs/numbers
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from transformer.errors import UserError

MAX_ORDINALS = 2  # per sentence


def ordinal(n: int, lang: str) -> str:
  from num2words import num2words

  return num2words(n, to="ordinal", lang=lang).replace(",", "")


def ordinal_pairs(split: str, size: int, seed: int = 0) -> list[tuple[str, str]]:
  """`size` (English, German) phrases of 1 or 2 ordinals whose numbers belong to `split`."""
  from transformer.data import numbers as nb

  rng = np.random.default_rng([seed, {"train": 0, "validation": 1, "test": 2}[split]])
  split_id = {"train": 0, "validation": 1, "test": 2}[split]
  pairs = []
  while len(pairs) < size:
    # Small numbers are common, as in text: a log-uniform draw up to the corpus's maximum.
    draws = np.unique(np.exp(rng.uniform(0, np.log(nb.MAX_NUMBER), 64)).astype(np.int64))
    numbers = [int(n) for n in draws[nb.split_of(draws) == split_id] if n > 0]
    rng.shuffle(numbers)
    while numbers and len(pairs) < size:
      k = min(int(rng.integers(1, MAX_ORDINALS + 1)), len(numbers))
      chosen, numbers = numbers[:k], numbers[k:]
      pairs.append((" and then ".join(f"the {ordinal(n, 'en')}" for n in chosen),
                    " und dann ".join(f"der {ordinal(n, 'de')}" for n in chosen)))
  return pairs


def write_corpus(directory: str, train_pairs: int, heldout: int) -> dict[str, dict[str, str]]:
  """The ordinal corpus as line-aligned text files; returns split -> language -> path."""
  os.makedirs(directory, exist_ok=True)
  files = {}
  for split, size in (("train", train_pairs), ("validation", heldout), ("test", heldout)):
    pairs = ordinal_pairs(split, size)
    files[split] = {}
    for side, lang in enumerate(("en", "de")):
      path = os.path.join(directory, f"{split}.{lang}")
      with open(path, "w") as f:
        f.writelines(pair[side] + "\n" for pair in pairs)
      files[split][lang] = path
  return files


def domain_config(general: Any, files: dict[str, dict[str, str]], steps: int,
                  warmup: int) -> Any:
  """configs/text.py:en-de,small on the ordinal files, with the general model's model fields
  and vocabulary size (as fine-tuning requires), the same for both runs."""
  from configs import text

  config = text.get_config("en-de,small")
  for key, field in (("train", "train_files"), ("validation", "eval_files"),
                     ("test", "test_files")):
    for lang, path in files[key].items():
      config.data[field][lang] = path
  config.data.vocab_size = general.data.vocab_size
  config.data.spm_train_sentences = 10**6  # all of the training split
  for field, value in general.model.items():
    config.model[field] = value
  config.num_train_steps = steps
  config.optimizer.warmup_steps = warmup
  config.log_every_steps = max(steps // 5, 1)
  config.checkpoint_every_steps = steps
  config.evals.valid_loss.every_steps = 0
  config.evals.valid_translation.sentences = 0
  config.average_last_checkpoints = 0
  return config


def scores_of(model: Any, pairs: list[tuple[str, str]]) -> dict[str, float]:
  from transformer.decoding import bleu

  tok = model.tokenizer
  hyps = [tok.decode(ids) for ids in
          model.translator.translate_ids(model.params, [tok.encode(s) for s, _ in pairs])]
  scored = bleu.corpus_scores(hyps, [t for _, t in pairs])
  return {"bleu": scored["bleu"].score, "chrf": scored["chrf"].score}


def run(general_workdir: str, out_dir: str, train_pairs: int, heldout: int, steps: int,
        warmup: int) -> dict[str, Any]:
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.data import numbers as nb
  from transformer.training.train import train_and_evaluate

  general = workdir_lib.load(general_workdir)
  if general is None:
    raise UserError(f"--general={general_workdir}: no {workdir_lib.CONFIG}; train it first")
  if os.path.exists(out_dir):
    raise UserError(f"--workdir={out_dir} exists: give a new directory")
  files = write_corpus(os.path.join(out_dir, "corpus"), train_pairs, heldout)
  ordinal_test = ordinal_pairs("test", heldout)
  cardinal_test = list(nb.generate("test", heldout))
  record: dict[str, Any] = {"general": general_workdir, "train_pairs": train_pairs,
                            "test_pairs": heldout, "steps": steps, "warmup_steps": warmup,
                            "examples": ordinal_test[:3], "runs": {}}
  model = infer.restore(general, general_workdir)
  record["runs"]["general model, not adapted"] = {
    "ordinals": scores_of(model, ordinal_test), "cardinals": scores_of(model, cardinal_test),
    "parameters": model.label}
  for name, init_from in (("fine-tuned from the general model", general_workdir),
                          ("trained from scratch", "")):
    config = domain_config(general, files, steps, warmup)
    config.init_from = init_from
    workdir = os.path.join(out_dir, "fine_tuned" if init_from else "scratch")
    start = time.time()
    train_and_evaluate(config, workdir)
    seconds = time.time() - start
    model = infer.restore(config, workdir)
    entry = {"ordinals": scores_of(model, ordinal_test), "seconds": seconds,
             "parameters": model.label}
    if init_from:
      entry["cardinals"] = scores_of(model, cardinal_test)
    record["runs"][name] = entry
  return record


def report_lines(record: dict[str, Any]) -> list[str]:
  lines = ["## Results\n",
           f"{record['train_pairs']:,} ordinal training pairs, {record['steps']} steps for each "
           f"run (warm-up {record['warmup_steps']}); {record['test_pairs']:,} test pairs of "
           "each domain, beam search as configured. Examples of the new domain:\n"]
  lines += [f"- {s} -> {t}" for s, t in record["examples"]]
  lines += ["", "| model | ordinals BLEU | ordinals chrF | cardinals BLEU | training s |",
            "|---|---:|---:|---:|---:|"]
  for name, entry in record["runs"].items():
    cardinal = f"{entry['cardinals']['bleu']:.2f}" if "cardinals" in entry else "-"
    seconds = f"{entry['seconds']:.0f}" if "seconds" in entry else "-"
    lines.append(f"| {name} | {entry['ordinals']['bleu']:.2f} | "
                 f"{entry['ordinals']['chrf']:.2f} | {cardinal} | {seconds} |")
  return lines


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import fail, flags_parser

  _GENERAL = flags.DEFINE_string("general", "runs/numbers",
                                 "The general model's workdir (the offline default).")
  _WORKDIR = flags.DEFINE_string("workdir", "runs/domain_adaptation",
                                 "A new directory for the corpus and the two runs.")
  _TRAIN = flags.DEFINE_integer("train_pairs", 2000, "Ordinal training pairs.")
  _HELDOUT = flags.DEFINE_integer("heldout", 500, "Validation and test pairs of each domain.")
  _STEPS = flags.DEFINE_integer("steps", 300, "Training steps of each run.")
  _WARMUP = flags.DEFINE_integer("warmup", 100, "Warm-up steps of each run's schedule.")
  _OUT = flags.DEFINE_string("out", "experiments/results/domain_adaptation",
                             "Report path without extension (.md and .json are written).")

  def main(argv: list[str]) -> None:
    del argv
    try:
      record = run(_GENERAL.value, _WORKDIR.value, _TRAIN.value, _HELDOUT.value, _STEPS.value,
                   _WARMUP.value)
    except UserError as e:
      fail(str(e))
    report.write(_OUT.value, "Domain adaptation: fine-tuning against training from scratch",
                 __doc__.split("\n\n")[1], report.public_command(report.command_line()),
                 report_lines(record), record)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
