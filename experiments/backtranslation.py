"""Back-translation in a low-resource setting: real pairs only, plus back-translation by beam
search, by sampling, and tagged, each tested against the real pairs alone.

The setting, from the numbers corpus: `--real` English-German training pairs (the first of its
training split) and `--mono` German sentences of the rest of it, their English never used
(monolingual text); validation and test are the corpus's own (numbers never seen in training).
The commands, run as a user would (experiments/commands.py), and recorded in the report:

1. the reverse model, German to English, on the real pairs (configs/text.py:de-en,small);
2. the monolingual German translated by it into synthetic English, with beam search (beam 4)
   and with sampling (`decode.method=sample`, temperature 1; Edunov et al. 2018);
3. forward models, English to German, all with the same steps and recipe: on the real pairs
   alone (configs/text.py:en-de,small); on the real pairs plus the beam back-translations, plus
   the sampled ones, and plus the beam ones tagged `<BT>` (Caswell et al. 2019)
   (configs/backtranslation.py:en-de,small).

Every forward model's test translations (its final evaluation: the mean of its last three
checkpoints, beam 4) are scored with BLEU, chrF and TER and tested against the real-pairs model
with paired bootstrap resampling and approximate randomization (decoding/significance.py). One
training seed per system: the tests cover the test sentences, not the spread over seeds.

    python -m experiments.backtranslation [--real=2000] [--mono=20000] [--steps=1500]
"""

from __future__ import annotations

import os
from typing import Any

from experiments.commands import (
  Commands,
  final_metrics,
  numbers_files,
  numbers_split,
  test_translations,
  text_args,
  write_lines,
)

SYSTEMS = ("real pairs only", "+ back-translation (beam)", "+ back-translation (sampling)",
           "+ tagged back-translation (beam, <BT>)")


def run(root: str, real: int, mono: int, steps: int, vocab_size: int, samples: int,
        trials: int, commands: Commands) -> dict[str, Any]:
  from transformer.decoding import significance
  from transformer.decoding.bleu import corpus_scores

  splits = {s: numbers_split(s) for s in ("train", "validation", "test")}
  train, test = splits["train"], splits["test"]
  if real + mono > len(train["en"]):
    raise ValueError(f"--real + --mono = {real + mono} > the {len(train['en'])} training pairs")
  data = os.path.join(root, "data")
  files = numbers_files(data, splits, "real", real)
  mono_de = write_lines(os.path.join(data, "mono.de"), train["de"][real:real + mono])

  reverse = os.path.join(root, "reverse-de-en")
  commands.train("reverse model (de-en, real pairs)", reverse,
                 text_args("configs/text.py:de-en,small", "de", "en", files, steps, vocab_size))
  synthetic = {"beam": os.path.join(data, "synthetic-beam.en"),
               "sample": os.path.join(data, "synthetic-sample.en")}
  commands.translate("back-translation (beam 4)", reverse, mono_de, synthetic["beam"])
  commands.translate("back-translation (sampling)", reverse, mono_de, synthetic["sample"],
                     ["--config.decode.method=sample", "--config.decode.seed=0"])

  forward = text_args("configs/text.py:en-de,small", "en", "de", files, steps, vocab_size)
  bt = text_args("configs/backtranslation.py:en-de,small", "en", "de", files, steps,
                 vocab_size)
  runs = {SYSTEMS[0]: ("real", forward)}
  for system, (name, source, tag) in zip(SYSTEMS[1:], (
      ("bt-beam", synthetic["beam"], ""), ("bt-sample", synthetic["sample"], ""),
      ("bt-beam-tagged", synthetic["beam"], "<BT>")), strict=True):
    runs[system] = (name, [*bt, f"--config.data.corpora.synthetic.train_files.en={source}",
                           f"--config.data.corpora.synthetic.train_files.de={mono_de}",
                           f"--config.data.corpora.synthetic.tag={tag}"])
  for system, (name, args) in runs.items():
    commands.train(f"forward model: {system}", os.path.join(root, name), args)

  systems = [(s, test_translations(os.path.join(root, name))) for s, (name, _) in runs.items()]
  comparison = significance.compare(systems, test["de"], bootstrap_samples=samples,
                                    randomization_trials=trials, seed=0)
  truth = train["en"][real:real + mono]
  synthetic_bleu = {kind: corpus_scores(open(path, encoding="utf-8").read().splitlines(),
                                        truth)["bleu"].score for kind, path in synthetic.items()}
  return {"real": real, "mono": mono, "steps": steps, "vocab_size": vocab_size,
          "workdirs": {s: os.path.join(root, n) for s, (n, _) in runs.items()},
          "reverse_test_bleu": final_metrics(reverse)["test/bleu"],
          "synthetic_bleu": synthetic_bleu, "seconds": commands.seconds,
          "comparison": comparison.to_json(), "table": significance.table(comparison)}


def report_lines(record: dict[str, Any]) -> list[str]:
  from transformer.decoding import significance

  c = record["comparison"]
  rows = ["| system | BLEU | chrF | TER | p vs real pairs only, BLEU (bootstrap / "
          "randomization) |", "|---|---:|---:|---:|---|"]
  for name in c["systems"]:
    r = c["results"][name]
    rows.append("| " + " | ".join([name, *significance.summary_cells(r)]) + " |")
  sb = record["synthetic_bleu"]
  return ["## Results\n",
          f"{record['real']:,} real pairs, {record['mono']:,} monolingual German sentences, "
          f"{record['steps']:,} training steps per model, a vocabulary of "
          f"{record['vocab_size']} pieces per run; {c['sentences']:,} test sentences. The "
          f"reverse model's own test BLEU (German to English): "
          f"{record['reverse_test_bleu']:.2f}; BLEU of its synthetic English against the "
          f"monolingual text's true English: beam {sb['beam']:.2f}, sampling "
          f"{sb['sample']:.2f}. p-values against the real-pairs model, "
          f"{c['bootstrap_samples']} bootstrap samples and {c['randomization_trials']} "
          "randomization trials; one training seed per system.\n",
          "\n".join(rows) + "\n",
          "Every metric with its bootstrap mean, 95% interval and both p-values:\n",
          record["table"] + "\n"]


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import flags_parser

  _ROOT = flags.DEFINE_string("root", os.path.join("runs", "backtranslation"),
                              "The runs' workdirs and files.")
  _REAL = flags.DEFINE_integer("real", 2000, "Real training pairs.")
  _MONO = flags.DEFINE_integer("mono", 20000, "Monolingual target-side sentences.")
  _STEPS = flags.DEFINE_integer("steps", 1500, "Training steps of every model.")
  _VOCAB = flags.DEFINE_integer("vocab_size", 256, "Pieces of each run's vocabulary.")
  _SAMPLES = flags.DEFINE_integer("bootstrap_samples", 1000, "Bootstrap resamples.")
  _TRIALS = flags.DEFINE_integer("randomization_trials", 10000, "Randomization trials.")
  _OUT = flags.DEFINE_string("out", "experiments/results/backtranslation",
                             "Report path without extension (.md and .json are written).")

  def main(argv: list[str]) -> None:
    del argv
    commands = Commands()
    record = run(_ROOT.value, _REAL.value, _MONO.value, _STEPS.value, _VOCAB.value,
                 _SAMPLES.value, _TRIALS.value, commands)
    body = report_lines(record) + ["## The commands\n", "```\n" + "\n".join(commands.lines)
                                   + "\n```\n"]
    report.write(_OUT.value, "Back-translation: real pairs, plus beam, sampled and tagged "
                 "back-translations", __doc__.split("\n\n")[1],
                 report.public_command(report.command_line()), body, record)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
