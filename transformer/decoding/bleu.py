"""BLEU, chrF and TER with sacrebleu: the reportable detokenized scores and the
paper-comparable BLEU.

- `corpus_scores`: BLEU, chrF (Popovic 2015) and TER (Snover et al. 2006), each with its
  sacrebleu signature: what validation and test report.
- `corpus_bleu`: sacrebleu's standard BLEU on detokenized text (13a tokenization, mixed case,
  exponential smoothing), with its signature string. This is the number to report.
- `tokenized_bleu`: the "tokenized BLEU with compound splitting" behind the BLEU numbers of
  "Attention Is All You Need" (computed by tensor2tensor's `get_ende_bleu.sh`: Moses
  tokenizer, compound splitting, `multi-bleu.perl`). Use it only to compare with the paper;
  it is not comparable across tokenizations.
"""

import dataclasses
import functools
import re

# A hyphen between two non-space characters, as in t2t's `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`.
# Lookarounds also split every hyphen of a chain ("a-b-c"), which the Perl substitution
# leaves half done because its matches cannot overlap.
_COMPOUND_HYPHEN = re.compile(r"(?<=\S)-(?=\S)")

# sacrebleu is imported where a score is computed: a translation that scores nothing (every
# `--mode=translate` of a file) does not pay for its import (benchmarks/startup.py).


@functools.cache
def _tokenize_13a():
  from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

  return Tokenizer13a()


@dataclasses.dataclass(frozen=True)
class CorpusScore:
  """A corpus-level score of one metric.

  Attributes:
    score: BLEU or chrF in [0, 100] (higher is better), or TER (edits per reference word, in
      percent; lower is better, may exceed 100).
    signature: sacrebleu's signature of the settings (plus the preprocessing, if any).
    text: sacrebleu's one-line summary (n-gram precisions, brevity penalty, lengths).
  """

  score: float
  signature: str
  text: str


def _check(hypotheses: list[str], references: list[str]) -> None:
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def corpus_bleu(hypotheses: list[str], references: list[str]) -> CorpusScore:
  """Detokenized corpus BLEU (sacrebleu defaults: 13a tokenizer, mixed case), one reference.

  Args:
    hypotheses: N detokenized system outputs.
    references: N detokenized references, aligned with `hypotheses`.
  """
  from sacrebleu.metrics import BLEU

  _check(hypotheses, references)
  metric = BLEU()
  result = metric.corpus_score(hypotheses, [references])
  return CorpusScore(result.score, str(metric.get_signature()), str(result))


def split_compounds(text: str) -> str:
  """Splits hyphenated compounds: 'Welt-Krieg' -> 'Welt ##AT##-##AT## Krieg'.

  The "##AT##" format of tensor2tensor's `get_ende_bleu.sh` (after the Stanford NMT and GNMT
  evaluations), which makes a compound count as separate words in BLEU.
  """
  return _COMPOUND_HYPHEN.sub(" ##AT##-##AT## ", text)


def tokenize_for_bleu(text: str) -> str:
  """13a tokenization (punctuation split off, hyphens inside words kept), then compounds split.

  The 13a tokenizer (mteval-v13a, sacrebleu's default) stands in for the Moses
  `tokenizer.perl` of t2t's script: both split punctuation from words and keep hyphens inside
  words, so the compound splitting afterwards sees the same "X-Y" tokens. (13a also detaches
  a hyphen that follows a digit, "1990-91" -> "1990 - 91", where Moses would keep it.)
  """
  return split_compounds(_tokenize_13a()(text.strip()))


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> CorpusScore:
  """Tokenized, compound-split BLEU, comparable to the BLEU of the paper (and of t2t/GNMT).

  Reproduces tensor2tensor's `get_ende_bleu.sh`: both sides are tokenized
  (`tokenize_for_bleu`), hyphenated compounds are split into "X ##AT##-##AT## Y", and BLEU is
  computed on the result as `multi-bleu.perl` does: case-sensitive, whitespace tokens
  (tokenize='none'), no smoothing (a zero n-gram precision gives 0).

  Args:
    hypotheses: N detokenized system outputs.
    references: N detokenized references, aligned with `hypotheses`.
  """
  from sacrebleu.metrics import BLEU

  _check(hypotheses, references)
  metric = BLEU(tokenize="none", smooth_method="none")
  result = metric.corpus_score(
    [tokenize_for_bleu(h) for h in hypotheses], [[tokenize_for_bleu(r) for r in references]]
  )
  signature = f"{metric.get_signature()}|pre:13a+compound-split"
  return CorpusScore(result.score, signature, str(result))


# The metrics `corpus_scores` computes, by the name they get in metrics.jsonl (`eval/chrf`).
METRICS = ("bleu", "chrf", "ter")


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, CorpusScore]:
  """sacrebleu's BLEU, chrF and TER (default settings, one reference) by name (`METRICS`)."""
  from sacrebleu.metrics import BLEU, CHRF, TER

  _check(hypotheses, references)
  out = {}
  for name, metric in (("bleu", BLEU()), ("chrf", CHRF()), ("ter", TER())):
    result = metric.corpus_score(hypotheses, [references])
    out[name] = CorpusScore(result.score, str(metric.get_signature()), str(result))
  return out
