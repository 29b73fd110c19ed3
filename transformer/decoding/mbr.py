"""Minimum Bayes risk (MBR) decoding: of a set of candidate translations, the one with the
highest expected utility against the others (Kumar and Byrne 2004; Freitag et al. 2022, "High
Quality Rather than High Model Probability").

The candidates are drawn from the model (`decode.mbr_sampler`: ancestral sampling, or the beam's
n-best list; `decode.mbr_candidates` of them) and serve as pseudo-references as well: the
expected utility of candidate i is the mean of utility(c_i, c_j) over the other candidates j,
with sacrebleu's sentence-level chrF (the default) or BLEU (`decode.mbr_utility`). Repeated
samples count as often as they were drawn (a Monte Carlo estimate of the model's
distribution). Ties go to the earlier candidate, so the choice is a function of the candidates
alone: the same under a seed on any mesh, as the samples are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

UTILITIES = ("chrf", "bleu")
SAMPLERS = ("sample", "beam")


def utility_function(name: str) -> Callable[[str, str], float]:
  """utility(hypothesis, reference) -> sacrebleu's sentence score in [0, 100]."""
  # Imported here: a translation without MBR does not pay for sacrebleu (benchmarks/startup.py).
  from sacrebleu.metrics import BLEU, CHRF

  if name == "chrf":
    metric = CHRF()
  elif name == "bleu":
    # Sentence BLEU needs smoothing of the n-gram orders a short sentence lacks.
    metric = BLEU(effective_order=True)
  else:
    raise ValueError(f"unknown MBR utility {name!r}: one of {', '.join(UTILITIES)}")
  return lambda hypothesis, reference: float(metric.sentence_score(hypothesis,
                                                                   [reference]).score)


def expected_utilities(candidates: Sequence[str], utility: str) -> list[float]:
  """For each candidate, the mean utility against every other candidate (as reference);
  each distinct (hypothesis, reference) pair of texts is scored once. At least 2 candidates."""
  if len(candidates) < 2:
    raise ValueError(f"MBR needs at least 2 candidates, got {len(candidates)}")
  score = utility_function(utility)
  known: dict[tuple[str, str], float] = {}
  out = []
  for i, hypothesis in enumerate(candidates):
    total = 0.0
    for j, reference in enumerate(candidates):
      if i != j:
        if (hypothesis, reference) not in known:
          known[hypothesis, reference] = score(hypothesis, reference)
        total += known[hypothesis, reference]
    out.append(total / (len(candidates) - 1))
  return out


def rank(candidates: Sequence[str], utility: str) -> list[tuple[int, float]]:
  """(candidate index, expected utility), highest utility first, ties by index."""
  utilities = expected_utilities(candidates, utility)
  return sorted(enumerate(utilities), key=lambda iu: (-iu[1], iu[0]))
