"""Sequence-level knowledge distillation (Kim and Rush 2016): a student of about a quarter of the
teacher's parameters trained on the teacher's beam translations, against the same student on
the original targets.

From the numbers corpus: `--pairs` English-German training pairs (the first of its training
split), its validation and test splits. The commands, run as a user would
(experiments/commands.py) and recorded in the report:

1. the teacher, configs/text.py:en-de,small (2 + 2 layers, d_model 128), on the pairs;
2. the teacher's beam translations (beam 4) of the training sources: the distilled targets;
3. two students, d_model 64, d_ff 128 (the same layers and heads), with the same steps and
   recipe: one on the original pairs, one on the sources with the distilled targets.

Test BLEU, chrF and TER of the final evaluations (the mean of each run's last three
checkpoints, beam 4), every student tested against the student on the original targets with
paired bootstrap resampling and approximate randomization (decoding/significance.py), and each
model's decoding speed: sentences per second of beam search over the test sources (after a
first pass that compiles), in this process, on this machine's CPU. One training seed per model.

    python -m experiments.distillation [--pairs=20000] [--steps=1500]
"""

from __future__ import annotations

import os
import time
from typing import Any

from experiments.commands import (
  Commands,
  final_metrics,
  numbers_files,
  numbers_split,
  test_translations,
  text_args,
)

STUDENT = ["--config.model.d_model=64", "--config.model.d_ff=128"]
SYSTEMS = ("student, original targets", "student, distilled targets", "teacher")


def decoding_speed(workdir: str, sources: list[str]) -> tuple[float, int]:
  """(sentences per second of the workdir's beam search over `sources`, after a first pass
  that compiles; its parameter count)."""
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.nn.model_family import count_params

  model = infer.restore(workdir_lib.load(workdir), workdir)
  ids = [model.tokenizer.encode(s) for s in sources]
  model.translator.translate_ids(model.params, ids)  # compiles every shape
  t0 = time.perf_counter()
  model.translator.translate_ids(model.params, ids)
  return len(sources) / (time.perf_counter() - t0), count_params(model.params)


def run(root: str, pairs: int, steps: int, vocab_size: int, samples: int, trials: int,
        commands: Commands) -> dict[str, Any]:
  from transformer.decoding import significance

  splits = {s: numbers_split(s) for s in ("train", "validation", "test")}
  test = splits["test"]
  data = os.path.join(root, "data")
  files = numbers_files(data, splits, "train", pairs)
  args = text_args("configs/text.py:en-de,small", "en", "de", files, steps, vocab_size)
  teacher = os.path.join(root, "teacher")
  commands.train("teacher", teacher, args)
  distilled = os.path.join(data, "distilled.de")
  commands.translate("the teacher's translations of the training sources (beam 4)", teacher,
                     files["train.en"], distilled)
  students = {SYSTEMS[0]: os.path.join(root, "student-original"),
              SYSTEMS[1]: os.path.join(root, "student-distilled")}
  commands.train(SYSTEMS[0], students[SYSTEMS[0]], [*args, *STUDENT])
  commands.train(SYSTEMS[1], students[SYSTEMS[1]],
                 [*args, *STUDENT, f"--config.data.train_files.de={distilled}"])
  workdirs = {**students, SYSTEMS[2]: teacher}
  systems = [(s, test_translations(workdirs[s])) for s in SYSTEMS]
  comparison = significance.compare(systems, test["de"], bootstrap_samples=samples,
                                    randomization_trials=trials, seed=0)
  speed, params = {}, {}
  for s in SYSTEMS:
    speed[s], params[s] = decoding_speed(workdirs[s], test["en"])
  return {"pairs": pairs, "steps": steps, "vocab_size": vocab_size, "workdirs": workdirs,
          "test_bleu": {s: final_metrics(w)["test/bleu"] for s, w in workdirs.items()},
          "sentences_per_s": speed, "params": params, "seconds": commands.seconds,
          "comparison": comparison.to_json(), "table": significance.table(comparison)}


def report_lines(record: dict[str, Any]) -> list[str]:
  from transformer.decoding import significance

  c = record["comparison"]
  rows = ["| model | parameters | BLEU | chrF | TER | p vs student on original targets, BLEU "
          "(bootstrap / randomization) | decoding (sentences/s) |",
          "|---|---:|---:|---:|---:|---|---:|"]
  for name in c["systems"]:
    r = c["results"][name]
    cells = [name, f"{record['params'][name]:,}", *significance.summary_cells(r),
             f"{record['sentences_per_s'][name]:.1f}"]
    rows.append("| " + " | ".join(cells) + " |")
  ratio = record["params"][SYSTEMS[0]] / record["params"][SYSTEMS[2]]
  return ["## Results\n",
          f"{record['pairs']:,} training pairs, {record['steps']:,} training steps per model, "
          f"a vocabulary of {record['vocab_size']} pieces per run; {c['sentences']:,} test "
          f"sentences. The students have {ratio:.2f} of the teacher's parameters. Decoding: "
          "beam 4 over the test sources, one process, on the CPU of `## Machine`. p-values "
          f"against the student on the original targets, {c['bootstrap_samples']} bootstrap "
          f"samples and {c['randomization_trials']} randomization trials; one training seed "
          "per model.\n",
          "\n".join(rows) + "\n",
          "Every metric with its bootstrap mean, 95% interval and both p-values:\n",
          record["table"] + "\n"]


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import flags_parser

  _ROOT = flags.DEFINE_string("root", os.path.join("runs", "distillation"),
                              "The runs' workdirs and files.")
  _PAIRS = flags.DEFINE_integer("pairs", 20000, "Training pairs.")
  _STEPS = flags.DEFINE_integer("steps", 1500, "Training steps of every model.")
  _VOCAB = flags.DEFINE_integer("vocab_size", 256, "Pieces of each run's vocabulary.")
  _SAMPLES = flags.DEFINE_integer("bootstrap_samples", 1000, "Bootstrap resamples.")
  _TRIALS = flags.DEFINE_integer("randomization_trials", 10000, "Randomization trials.")
  _OUT = flags.DEFINE_string("out", "experiments/results/distillation",
                             "Report path without extension (.md and .json are written).")

  def main(argv: list[str]) -> None:
    del argv
    commands = Commands()
    record = run(_ROOT.value, _PAIRS.value, _STEPS.value, _VOCAB.value, _SAMPLES.value,
                 _TRIALS.value, commands)
    body = report_lines(record) + ["## The commands\n", "```\n" + "\n".join(commands.lines)
                                        + "\n```\n"]
    report.write(_OUT.value, "Sequence-level distillation: a quarter-size student on the "
                 "teacher's translations", __doc__.split("\n\n")[1],
                 report.public_command(report.command_line()), body, record)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
