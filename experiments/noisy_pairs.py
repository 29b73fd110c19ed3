"""Score mode at work: finding misaligned pairs in a corpus by their scores.

`--pairs` pairs of the numbers corpus's test split, `--noise` of them misaligned (each given
the target of another pair, the commonest noise of crawled corpora), are scored by
`--mode=score`'s own code (`files.score_corpus`, into a JSON-lines file). Ranked by
perplexity (the per-token score) and by log probability (the sum), how many of the misaligned
pairs are among the lowest-scoring ones, as many as there are misaligned ones (precision =
recall at that cut)?

    python -m experiments.noisy_pairs --workdir=runs/numbers
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from typing import Any

from transformer import infer
from transformer import workdir as workdir_lib
from transformer.decoding import files
from transformer.errors import UserError


def noisy_corpus(pairs: list[tuple[str, str]], noise: float, seed: int
                 ) -> tuple[list[tuple[str, str]], set[int]]:
  """`pairs` with round(noise * n) of them given another pair's target; their indices."""
  rng = random.Random(seed)
  n = len(pairs)
  chosen = sorted(rng.sample(range(n), round(noise * n)))
  out = list(pairs)
  for i in chosen:
    j = rng.choice([k for k in range(n) if pairs[k][1] != pairs[i][1]])
    out[i] = (pairs[i][0], pairs[j][1])
  return out, set(chosen)


def caught(scores: list[float], noisy: set[int]) -> int:
  """How many of `noisy` are among the len(noisy) lowest `scores`."""
  lowest = sorted(range(len(scores)), key=lambda i: scores[i])[: len(noisy)]
  return len(noisy.intersection(lowest))


def run(workdir: str, num_pairs: int, noise: float, seed: int) -> dict[str, Any]:
  from transformer.data import numbers as nb

  config = workdir_lib.load(workdir)
  if config is None:
    raise UserError(f"--workdir={workdir}: no {workdir_lib.CONFIG}; train it first")
  pairs, noisy = noisy_corpus(list(nb.generate("test", num_pairs)), noise, seed)
  scratch = tempfile.mkdtemp(prefix="noisy-pairs-")
  tsv, out = os.path.join(scratch, "pairs.tsv"), os.path.join(scratch, "scores.jsonl")
  with open(tsv, "w") as f:
    f.writelines(f"{s}\t{t}\n" for s, t in pairs)
  model = infer.restore(config, workdir)
  files.score_corpus(files.CorpusRun(model, tsv, out, {"run": "noisy_pairs"}), config,
                      files.check_score_input(tsv))
  with open(out) as f:
    scored = [json.loads(line) for line in f]
  by_perplexity = [-s["perplexity"] for s in scored]
  by_logprob = [s["logprob"] for s in scored]
  return {"pairs": num_pairs, "noisy": len(noisy), "seed": seed, "parameters": model.label,
          "caught_by_perplexity": caught(by_perplexity, noisy),
          "caught_by_logprob": caught(by_logprob, noisy),
          "lowest": [{"source": pairs[i][0], "target": pairs[i][1], "noisy": i in noisy,
                      **scored[i]} for i in sorted(range(len(scored)),
                                                   key=lambda i: by_perplexity[i])[:5]]}


def report_lines(record: dict[str, Any]) -> list[str]:
  n = record["noisy"]
  lines = ["## Results\n",
           f"{record['pairs']:,} pairs, {n} misaligned (seed {record['seed']}); parameters of "
           f"{record['parameters']}.\n",
           "| ranked by | misaligned among the lowest-scoring " + str(n) + " |",
           "|---|---:|",
           f"| perplexity (per token) | **{record['caught_by_perplexity']} of {n}** |",
           f"| log probability (sum) | {record['caught_by_logprob']} of {n} |\n",
           "The five highest perplexities:\n",
           "| source | target | misaligned | perplexity |", "|---|---|---|---:|"]
  lines += [f"| {r['source']} | {r['target']} | {'yes' if r['noisy'] else 'no'} | "
            f"{r['perplexity']:.1f} |" for r in record["lowest"]]
  return lines


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import fail, flags_parser

  _WORKDIR = flags.DEFINE_string("workdir", "runs/numbers", "A trained workdir.")
  _PAIRS = flags.DEFINE_integer("pairs", 2000, "Pairs of the test split to score.")
  _NOISE = flags.DEFINE_float("noise", 0.03, "Fraction of them to misalign.")
  _SEED = flags.DEFINE_integer("seed", 0, "Which pairs are misaligned, and how.")
  _OUT = flags.DEFINE_string("out", "experiments/results/noisy_pairs",
                             "Report path without extension (.md and .json are written).")

  def main(argv: list[str]) -> None:
    del argv
    try:
      record = run(_WORKDIR.value, _PAIRS.value, _NOISE.value, _SEED.value)
    except UserError as e:
      fail(str(e))
    report.write(_OUT.value, "Finding misaligned pairs by their scores",
                 __doc__.split("\n\n")[1], report.public_command(report.command_line()),
                 report_lines(record), record)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
