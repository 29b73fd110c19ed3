"""The decoding side of an experiments section: members, their ensemble and MBR, with
significance.

Two runs of `configs/numbers.py` that differ only in their seed (`--seeds`, `--steps` steps
each; trained here by the main program unless their workdirs exist; the second with the
first's vocabulary, as an ensemble's members share one) translate the numbers test split
(`--sentences` of its pairs). Each member with beam search (the paper's, beam 4) and with
greedy search, their ensemble (`infer.restore_ensemble`: log probabilities averaged at every
step), and the first member with MBR (`decode.method='mbr'`, chrF utility; over 16 samples,
and over the n-best list of a beam of 8) are scored with BLEU, chrF and TER, and every system
is tested against the first member's beam search with paired bootstrap resampling and
approximate randomization (`decoding/significance.py`).

    python -m experiments.decoding [--steps=800] [--seeds=0,1] [--root=runs/decoding]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# MBR's two candidate sets: 16 samples (temperature 1), or the n-best list of a beam of 8.
MBR = {"MBR (16 samples, chrF)": {"method": "mbr", "mbr_candidates": 16, "mbr_sampler": "sample",
                                  "mbr_utility": "chrf", "temperature": 1.0},
       "MBR (beam-8 n-best, chrF)": {"method": "mbr", "mbr_candidates": 8, "beam_size": 8,
                                     "mbr_sampler": "beam", "mbr_utility": "chrf"}}


def train(workdir: str, seed: int, steps: int) -> None:
  """A run of the default config with this seed and number of steps (resumed if it exists;
  nothing to do if it finished)."""
  from experiments.sweep import is_finished

  if is_finished(workdir):
    return
  cmd = [sys.executable, "-m", "transformer.main", "--config=configs/numbers.py",
         f"--workdir={workdir}", f"--config.seed={seed}", f"--config.num_train_steps={steps}",
         "--config.average_last_checkpoints=0"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"training {workdir} failed: {proc.stderr[-3000:]}")


def hypotheses(model: Any, sources: list[str]) -> tuple[list[str], float]:
  """The translations of `sources` and the seconds they took."""
  t0 = time.time()
  ids = model.translator.translate_ids(model.params, [model.tokenizer.encode(s) for s in sources])
  return [model.tokenizer.decode(x) for x in ids], time.time() - t0


def run(root: str, seeds: list[int], steps: int, sentences: int, samples: int, trials: int
        ) -> dict[str, Any]:
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.data import numbers as nb
  from transformer.decoding import significance

  workdirs = [os.path.join(root, f"seed{s}") for s in seeds]
  for i, (workdir, seed) in enumerate(zip(workdirs, seeds, strict=True)):
    if i > 0 and not os.path.exists(workdir):
      # An ensemble's members share one vocabulary: the first run's, copied before the start
      # (training loads a workdir's vocabulary instead of training one).
      shutil.copytree(workdir_lib.paths(workdirs[0]).vocab_dir,
                      workdir_lib.paths(workdir).vocab_dir)
    train(workdir, seed, steps)
  pairs = list(nb.generate("test", sentences))
  sources, references = [s for s, _ in pairs], [t for _, t in pairs]
  configs = [workdir_lib.load(w) for w in workdirs]
  systems, seconds = [], {}
  for i, (workdir, config) in enumerate(zip(workdirs, configs, strict=True)):
    model = infer.restore(config, workdir)
    name = f"seed {seeds[i]}, beam 4"
    hyps, seconds[name] = hypotheses(model, sources)
    systems.append((name, hyps))
    greedy = config.copy_and_resolve_references()
    greedy.decode.method = "greedy"
    name = f"seed {seeds[i]}, greedy"
    hyps, seconds[name] = hypotheses(infer.restore(greedy, workdir), sources)
    systems.append((name, hyps))
  ensemble = infer.restore_ensemble(configs[0], workdirs[0], workdirs[1:])
  name = f"ensemble of seeds {', '.join(map(str, seeds))}, beam 4"
  hyps, seconds[name] = hypotheses(ensemble, sources)
  systems.append((name, hyps))
  for label, fields in MBR.items():
    mbr = configs[0].copy_and_resolve_references()
    for field, value in fields.items():
      mbr.decode[field] = value
    name = f"seed {seeds[0]}, {label}"
    hyps, seconds[name] = hypotheses(infer.restore(mbr, workdirs[0]), sources)
    systems.append((name, hyps))
  comparison = significance.compare(systems, references, bootstrap_samples=samples,
                                    randomization_trials=trials, seed=seeds[0])
  return {"seeds": seeds, "steps": steps, "sentences": sentences, "workdirs": workdirs,
          "seconds": seconds, "comparison": comparison.to_json(),
          "table": significance.table(comparison)}


def report_lines(record: dict[str, Any]) -> list[str]:
  from transformer.decoding import significance

  c = record["comparison"]
  rows = ["| system | BLEU | chrF | TER | p vs baseline, BLEU (bootstrap / randomization) | "
          "decoding (s) |", "|---|---:|---:|---:|---|---:|"]
  for name in c["systems"]:
    r = c["results"][name]
    cells = [name, *significance.summary_cells(r), f"{record['seconds'][name]:.1f}"]
    rows.append("| " + " | ".join(cells) + " |")
  return ["## Results\n",
          f"{record['sentences']:,} test sentences of the numbers task; two runs of "
          f"`configs/numbers.py` with seeds {record['seeds']}, {record['steps']} steps each, "
          "evaluated at their last step. p-values of each system against the first one, "
          f"{c['bootstrap_samples']} bootstrap samples and {c['randomization_trials']} "
          "randomization trials (ties count against significance).\n",
          "\n".join(rows) + "\n",
          "Every metric with its bootstrap mean, 95% interval and both p-values:\n",
          record["table"] + "\n"]


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import flags_parser

  _ROOT = flags.DEFINE_string("root", os.path.join("runs", "decoding"), "The runs' workdirs.")
  _SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "The seeds of the ensemble's members.")
  _STEPS = flags.DEFINE_integer("steps", 800, "Training steps of each run.")
  _SENTENCES = flags.DEFINE_integer("sentences", 1000, "Test sentences.")
  _SAMPLES = flags.DEFINE_integer("bootstrap_samples", 1000, "Bootstrap resamples.")
  _TRIALS = flags.DEFINE_integer("randomization_trials", 10000, "Randomization trials.")
  _OUT = flags.DEFINE_string("out", "experiments/results/decoding",
                             "Report path without extension (.md and .json are written).")

  def main(argv: list[str]) -> None:
    del argv
    record = run(_ROOT.value, [int(s) for s in _SEEDS.value], _STEPS.value, _SENTENCES.value,
                 _SAMPLES.value, _TRIALS.value)
    report.write(_OUT.value, "Decoding: members, their ensemble and MBR, with significance",
                 __doc__.split("\n\n")[1], report.public_command(report.command_line()),
                 report_lines(record), record)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
