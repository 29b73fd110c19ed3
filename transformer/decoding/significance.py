"""Paired significance tests of systems on one test set, on sacrebleu's metrics.

`compare` scores each system's hypotheses with BLEU, chrF and TER and tests every system
against the first (the baseline) with the two paired tests of sacrebleu 2
(`sacrebleu.significance`, `--paired-bs`, `--paired-ar`), on the same sufficient statistics
(sacrebleu's, per sentence) and the same statistics of the tests:

- paired bootstrap resampling (Koehn 2004): the test set's sentences are resampled with
  replacement `bootstrap_samples` times, the same resamples for every system; each system
  gets its mean score over them and a 95% confidence interval (`estimate_ci`); the p-value
  compares the observed difference with the resampled differences centred on their mean;
- approximate randomization (Riezler and Maxwell 2005): the two systems' outputs are swapped
  sentence by sentence at random `randomization_trials` times; the p-value is the share of
  swaps whose difference is at least the observed one.

One departure from sacrebleu: a resampled difference *equal* to the observed one counts
against significance (p = (count(stat >= observed) + 1) / (trials + 1), Riezler and Maxwell's
definition), where sacrebleu counts only larger ones, on purpose (after MultEval), so that a
system compared with itself comes out "significant" at p = 1 / (trials + 1). Here a system
compared with itself has p = 1. Both tests are seeded (`seed`): a comparison is reproducible.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import estimate_ci

from transformer.errors import UserError

METRICS = ("bleu", "chrf", "ter")
# sacrebleu's defaults.
BOOTSTRAP_SAMPLES = 1000
RANDOMIZATION_TRIALS = 10000


@dataclasses.dataclass(frozen=True)
class MetricResult:
  """One metric of one system.

  Attributes:
    score: the corpus score.
    mean, ci: the bootstrap mean and the half-width of its 95% confidence interval.
    p_bootstrap, p_randomization: against the baseline (None for the baseline itself).
  """

  score: float
  mean: float
  ci: float
  p_bootstrap: float | None
  p_randomization: float | None


@dataclasses.dataclass(frozen=True)
class Comparison:
  """The systems (baseline first), each metric's result by system, and the signatures."""

  systems: list[str]
  results: dict[str, dict[str, MetricResult]]  # system -> metric -> result
  signatures: dict[str, str]
  bootstrap_samples: int
  randomization_trials: int
  seed: int
  sentences: int

  def to_json(self) -> dict[str, Any]:
    return {"systems": self.systems, "sentences": self.sentences, "seed": self.seed,
            "bootstrap_samples": self.bootstrap_samples,
            "randomization_trials": self.randomization_trials, "signatures": self.signatures,
            "results": {s: {m: dataclasses.asdict(r) for m, r in by_metric.items()}
                        for s, by_metric in self.results.items()}}


def _metrics() -> dict[str, Any]:
  return {"bleu": BLEU(), "chrf": CHRF(), "ter": TER()}


def _p_value(resampled: np.ndarray, observed: float) -> float:
  """(count(resampled >= observed) + 1) / (n + 1); ties count (module docstring)."""
  return (int(np.sum(resampled >= observed)) + 1) / (len(resampled) + 1)


def check_systems(systems: Sequence[tuple[str, Sequence[str]]], references: Sequence[str]
                  ) -> None:
  """UserError unless there are two or more systems, distinctly named, each with one
  hypothesis per reference."""
  if len(systems) < 2:
    raise UserError("a comparison needs two or more systems (the first is the baseline)")
  names = [name for name, _ in systems]
  if len(set(names)) != len(names):
    raise UserError(f"the systems' names must differ: {names}")
  if not references:
    raise UserError("the references are empty")
  for name, hyps in systems:
    if len(hyps) != len(references):
      raise UserError(f"{name}: {len(hyps)} lines but the references have {len(references)}; "
                      "a system needs one hypothesis per reference")


def compare(systems: Sequence[tuple[str, Sequence[str]]], references: Sequence[str], *,
            bootstrap_samples: int = BOOTSTRAP_SAMPLES,
            randomization_trials: int = RANDOMIZATION_TRIALS, seed: int = 12345) -> Comparison:
  """Scores and tests `systems` ([(name, hypotheses)], the first the baseline) against one
  reference per sentence (module docstring)."""
  check_systems(systems, references)
  if bootstrap_samples < 1 or randomization_trials < 1:
    raise UserError("the numbers of bootstrap samples and randomization trials must be >= 1")
  n = len(references)
  # The draws of sacrebleu's tests for the same seed: one generator each.
  resamples = np.random.default_rng(seed).choice(n, size=(bootstrap_samples, n), replace=True)
  swaps = np.random.default_rng(seed).integers(2, size=(randomization_trials, n), dtype=bool)
  metrics = _metrics()
  results: dict[str, dict[str, MetricResult]] = {name: {} for name, _ in systems}
  for metric_name, metric in metrics.items():
    # Sentence-level sufficient statistics, [n, k] per system (sacrebleu's own).
    stats = {name: np.asarray(metric._extract_corpus_statistics(list(hyps), [list(references)]),
                              np.float64) for name, hyps in systems}

    def score(summed: np.ndarray, metric: Any = metric) -> float:
      return float(metric._compute_score_from_stats(list(summed)).score)

    def bootstrap(x: np.ndarray, score: Any = score) -> np.ndarray:
      return np.array([score(x[idx].sum(0)) for idx in resamples])

    baseline_name = systems[0][0]
    base = stats[baseline_name]
    base_score, base_boot = score(base.sum(0)), bootstrap(base)
    mean, ci = estimate_ci(base_boot)
    results[baseline_name][metric_name] = MetricResult(base_score, float(mean), float(ci),
                                                       None, None)
    for name, _ in systems[1:]:
      x = stats[name]
      sys_score, sys_boot = score(x.sum(0)), bootstrap(x)
      observed = abs(sys_score - base_score)
      diffs = np.abs(sys_boot - base_boot)
      p_bootstrap = _p_value(diffs - diffs.mean(), observed)
      a = np.where(swaps[:, :, None], base[None], x[None]).sum(1)
      b = np.where(swaps[:, :, None], x[None], base[None]).sum(1)
      shuffled = np.abs(np.array([score(u) for u in a]) - np.array([score(v) for v in b]))
      mean, ci = estimate_ci(sys_boot)
      results[name][metric_name] = MetricResult(sys_score, float(mean), float(ci), p_bootstrap,
                                                _p_value(shuffled, observed))
  signatures = {m: str(metric.get_signature()) for m, metric in metrics.items()}
  return Comparison([name for name, _ in systems], results, signatures, bootstrap_samples,
                    randomization_trials, seed, n)


def summary_cells(results: dict[str, Any]) -> list[str]:
  """A system's cells of a short table, from its `Comparison.to_json()['results']` entry:
  BLEU, chrF and TER with two decimals, and BLEU's p-values 'bootstrap / randomization'
  ('baseline' for the baseline)."""
  bleu = results["bleu"]
  p = ("baseline" if bleu["p_bootstrap"] is None else
       f"{bleu['p_bootstrap']:.4f} / {bleu['p_randomization']:.4f}")
  return [f"{results[m]['score']:.2f}" for m in METRICS] + [p]


def table(comparison: Comparison) -> str:
  """A markdown table: each metric's score, bootstrap mean +- 95% interval, and both
  p-values against the baseline (the first row)."""
  head = "| system |" + "".join(f" {m} | mean +- 95% CI | p (bootstrap) | p (randomization) |"
                                for m in ("BLEU", "chrF", "TER"))
  lines = [head, "|---|" + "---:|" * 12]
  for name in comparison.systems:
    cells = []
    for metric in METRICS:
      r = comparison.results[name][metric]
      p = ("baseline", "baseline") if r.p_bootstrap is None else (
        f"{r.p_bootstrap:.4f}", f"{r.p_randomization:.4f}")
      cells.append(f" {r.score:.2f} | {r.mean:.2f} +- {r.ci:.2f} | {p[0]} | {p[1]} |")
    lines.append(f"| {name} |" + "".join(cells))
  return "\n".join(lines)


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict[str, float | int]:
  """McNemar's exact test of two classifiers answering the same examples (Dietterich 1998,
  "Approximate Statistical Tests for Comparing Supervised Classification Learning
  Algorithms"): under the null hypothesis each example that exactly one of them gets right
  is a fair coin, so the two-sided p-value is 2 P(X <= min(b, c)) for X ~ Binomial(b + c,
  1/2), capped at 1 (1 when they never disagree).

  Returns {'a_only', 'b_only', 'p'}: the examples only a (only b) answers correctly, and p.
  """
  a, b = np.asarray(correct_a, bool), np.asarray(correct_b, bool)
  if a.shape != b.shape or a.ndim != 1:
    raise UserError(f"McNemar's test needs two equal-length answer vectors, got {a.shape} "
                    f"and {b.shape}")
  a_only, b_only = int(np.sum(a & ~b)), int(np.sum(~a & b))
  n, k = a_only + b_only, min(a_only, b_only)
  # Exact in integers: sum_{i <= k} C(n, i) / 2^n.
  tail = sum(math.comb(n, i) for i in range(k + 1))
  p = min(1.0, 2 * tail / 2**n)
  return {"a_only": a_only, "b_only": b_only, "p": p}
