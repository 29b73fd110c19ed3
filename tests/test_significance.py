"""Paired significance tests (transformer/decoding/significance.py) against sacrebleu's own."""

import os
import random

import pytest
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import PairedTest

from transformer.decoding import significance
from transformer.errors import UserError


def corpus(n=80, seed=0):
  rng = random.Random(seed)
  refs = [" ".join(rng.choice("abcdefghij") for _ in range(rng.randint(4, 12))) for _ in range(n)]
  # "worse" drops every third word of each sentence, as an undertrained model might.
  worse = [" ".join(w for j, w in enumerate(r.split()) if j % 3) for r in refs]
  # "close" is the references but for one sentence in four, which is the worse one's.
  close = [r if i % 4 else worse[i] for i, r in enumerate(refs)]
  return refs, worse, close


def test_a_system_against_itself_is_never_significant():
  refs, worse, close = corpus()
  for baseline in (refs, worse, close):
    result = significance.compare([("a", baseline), ("a again", list(baseline))], refs,
                                  bootstrap_samples=200, randomization_trials=300)
    for metric in significance.METRICS:
      r = result.results["a again"][metric]
      assert r.p_bootstrap == 1.0 and r.p_randomization == 1.0, (metric, r)
      assert r.score == result.results["a"][metric].score


def test_a_clearly_worse_system_is_significant():
  refs, worse, close = corpus()
  result = significance.compare([("close", close), ("worse", worse)], refs,
                                bootstrap_samples=500, randomization_trials=1000)
  for metric in significance.METRICS:
    r = result.results["worse"][metric]
    assert r.p_bootstrap < 0.01 and r.p_randomization < 0.01, (metric, r)
  assert result.results["worse"]["bleu"].score < result.results["close"]["bleu"].score
  assert result.results["worse"]["ter"].score > result.results["close"]["ter"].score


def test_scores_intervals_and_p_values_are_sacrebleus_where_no_difference_ties():
  """sacrebleu's PairedTest on the same systems with the same seed: the same draws, so the
  same means, intervals and p-values (ties, where the two definitions differ, cannot occur
  between these systems)."""
  refs, worse, close = corpus(n=60, seed=3)
  systems = [("close", close), ("worse", worse)]
  ours = significance.compare(systems, refs, bootstrap_samples=300, randomization_trials=400,
                              seed=7)
  os.environ["SACREBLEU_SEED"] = "7"
  try:
    metrics = lambda: {"bleu": BLEU(), "chrf": CHRF(), "ter": TER()}  # noqa: E731
    _, bs = PairedTest(systems, metrics(), [refs], test_type="bs", n_samples=300)()
    _, ar = PairedTest(systems, metrics(), [refs], test_type="ar", n_samples=400)()
  finally:
    del os.environ["SACREBLEU_SEED"]
  for key, metric in (("BLEU", "bleu"), ("chrF2", "chrf"), ("TER", "ter")):
    for i, name in enumerate(("close", "worse")):
      r = ours.results[name][metric]
      assert r.score == pytest.approx(bs[key][i].score, abs=1e-9)
      assert r.mean == pytest.approx(bs[key][i].mean, abs=1e-4)
      assert r.ci == pytest.approx(bs[key][i].ci, abs=1e-4)
    r = ours.results["worse"][metric]
    assert r.p_bootstrap == pytest.approx(bs[key][1].p_value)
    assert r.p_randomization == pytest.approx(ar[key][1].p_value)


def test_a_comparison_is_reproducible_under_its_seed():
  refs, worse, close = corpus()
  run = lambda seed: significance.compare([("c", close), ("w", worse)], refs, seed=seed,  # noqa: E731
                                          bootstrap_samples=100, randomization_trials=100)
  assert run(1).to_json() == run(1).to_json()
  assert run(1).to_json() != run(2).to_json()


@pytest.mark.parametrize("systems, match", [
  ([("a", ["x"] * 3)], "two or more"),
  ([("a", ["x"] * 3), ("a", ["y"] * 3)], "differ"),
  ([("a", ["x"] * 3), ("b", ["y"] * 2)], "b: 2 lines"),
])
def test_bad_comparisons_are_refused(systems, match):
  with pytest.raises(UserError, match=match):
    significance.compare(systems, ["r"] * 3)


def test_the_table_has_a_row_per_system_and_marks_the_baseline():
  refs, worse, close = corpus()
  result = significance.compare([("close", close), ("worse", worse)], refs,
                                bootstrap_samples=50, randomization_trials=50)
  lines = significance.table(result).splitlines()
  assert len(lines) == 4 and lines[2].startswith("| close |") and "baseline" in lines[2]
  assert lines[3].startswith("| worse |") and "baseline" not in lines[3]


def test_mcnemar_exact():
  """McNemar's exact p against the binomial tail written out, and its edge cases."""
  from math import comb

  a = [1] * 30 + [0] * 10 + [1] * 5 + [0] * 2
  b = [1] * 30 + [0] * 10 + [0] * 5 + [1] * 2
  r = significance.mcnemar(a, b)
  assert (r["a_only"], r["b_only"]) == (5, 2)
  assert r["p"] == pytest.approx(2 * sum(comb(7, i) for i in range(3)) / 2**7)
  assert significance.mcnemar(b, a)["p"] == r["p"]  # symmetric
  assert significance.mcnemar(a, a)["p"] == 1.0  # never disagree
  assert significance.mcnemar([1] * 20, [0] * 20)["p"] == pytest.approx(2 / 2**20)
  with pytest.raises(UserError, match="equal-length"):
    significance.mcnemar([1, 0], [1])
