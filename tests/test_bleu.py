"""BLEU wrappers against sacrebleu and an independent pure-Python BLEU."""

import collections
import math

import pytest
import sacrebleu

from transformer.decoding import bleu

REFERENCES = [
  "the cat sat on the mat and looked at the door",
  "there is a small house near the river in the valley",
  "we will meet again tomorrow morning at nine",
]
HYPOTHESES = [
  "the cat sat on a mat and looked at the door",
  "a small house is near the river in a valley",
  "we meet again tomorrow at nine",
]


def reference_bleu(hypotheses, references):
  """Corpus BLEU on whitespace tokens (Papineni et al., 2002), no smoothing, one reference."""
  matches, totals = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references, strict=True):
    h, r = hyp.split(), ref.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_ngrams = collections.Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
      r_ngrams = collections.Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum((h_ngrams & r_ngrams).values())
      totals[n - 1] += max(len(h) - n + 1, 0)
  if min(matches) == 0:
    return 0.0
  log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
  brevity = min(0.0, 1.0 - ref_len / hyp_len)
  return 100.0 * math.exp(log_precision + brevity)


def test_references_against_themselves_score_100():
  assert bleu.corpus_bleu(REFERENCES, REFERENCES).score == pytest.approx(100.0)
  assert bleu.tokenized_bleu(REFERENCES, REFERENCES).score == pytest.approx(100.0)


def test_corpus_bleu_matches_sacrebleu():
  hyps = [h.capitalize() + "." for h in HYPOTHESES]
  refs = [r.capitalize() + "." for r in REFERENCES]
  result = bleu.corpus_bleu(hyps, refs)
  expected = sacrebleu.corpus_bleu(hyps, [refs])
  assert result.score == pytest.approx(expected.score)
  assert 0.0 < result.score < 100.0
  assert result.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
  assert result.text.startswith("BLEU = ")


def test_tokenized_bleu_matches_independent_reference():
  # Lower-case words without punctuation or hyphens: tokenization changes nothing.
  expected = reference_bleu(HYPOTHESES, REFERENCES)
  assert bleu.tokenized_bleu(HYPOTHESES, REFERENCES).score == pytest.approx(expected, rel=1e-9)
  assert 0.0 < expected < 100.0


def test_split_compounds():
  assert bleu.split_compounds("Welt-Krieg") == "Welt ##AT##-##AT## Krieg"
  assert bleu.split_compounds("Nord-Ost-Passage") == "Nord ##AT##-##AT## Ost ##AT##-##AT## Passage"
  assert bleu.split_compounds("a - b") == "a - b"  # a free-standing dash is no compound
  assert (
    bleu.tokenize_for_bleu("Der Zweite Welt-Krieg, sagte er.")
    == "Der Zweite Welt ##AT##-##AT## Krieg , sagte er ."
  )


def test_compound_splitting_gives_partial_credit():
  # Split, "Welt" matches on its own: 7 of 8 unigrams match instead of 5 of 6.
  hyps, refs = ["der Welt-Krieg war lang und hart"], ["der Welt-Frieden war lang und hart"]
  result = bleu.tokenized_bleu(hyps, refs)
  split = result.score
  assert split == pytest.approx(
    reference_bleu(
      [bleu.tokenize_for_bleu(h) for h in hyps], [bleu.tokenize_for_bleu(r) for r in refs]
    )
  )
  assert result.text.startswith("BLEU = 50.00 87.5/") and "hyp_len = 8" in result.text
  assert "pre:13a+compound-split" in result.signature


def test_length_mismatch_is_an_error():
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    bleu.corpus_bleu(["a b", "c d"], ["a b"])
  with pytest.raises(ValueError):
    bleu.tokenized_bleu(["a b"], [])
