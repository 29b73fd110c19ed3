"""A synthetic stand-in for WMT14 en-de and en-fr, written through the real TFDS builder.

    python -m benchmarks.synthetic_wmt --data_dir=/tmp/synth_wmt \
        [--pair=de-en --train_size=4508785 --validation_size=3000 --test_size=3003 --seed=0]
    python -m benchmarks.synthetic_wmt --pair=fr-en --data_dir=/tmp/synth_fr  # 40,836,876 pairs

Then train or evaluate with `--config.data_dir=/tmp/synth_wmt` (offline, no download). Sizes
left out are the pair's TFDS sizes. Does nothing if the dataset is already there. Prints the
build time, the size on disk and the examples and shards of each split.

For offline work (tests, benchmarks, machines without the 1.6 GB or 6.2 GB download): the corpus
has WMT14's split sizes and roughly its sentence-length distribution, and it is written by the
real TFDS builder (`tensorflow_datasets.translate.wmt14.Wmt14Translate`, config `de-en` or
`fr-en`, version 1.0.0), so the data dir holds what `tfds build wmt14_translate/PAIR` writes:

    DIR/wmt14_translate/.config/metadata.json
    DIR/wmt14_translate/PAIR/1.0.0/{dataset_info.json, features.json,
                                    wmt14_translate-{train,validation,test}.tfrecord-*-of-*}

and `tfds.builder("wmt14_translate/PAIR", data_dir=DIR)` reads it as usual (features
`{"de": Text, "en": Text}` or `{"en": Text, "fr": Text}`). Only the builder instance's
`_split_generators` is replaced (its class, module, name, version, features and info stay
TFDS's), so nothing is downloaded. What tells the data apart: the text is nonsense, and
`dataset_info.json` has no `downloadSize`.

English. A lexicon of `VOCAB_SIZE` English word types (the same for both pairs): 58 real English
function words at the top ranks, then words built from syllables (so shared subword units
exist), about 6% of them capitalised names and 1% numbers. Tokens are drawn with
Zipf-Mandelbrot frequencies p(rank) ~ (rank + ZIPF_SHIFT) ** -ZIPF_EXPONENT. Sentences start
with a capital letter, commas and a few semicolons/colons follow words, and most end in '.',
some in '?', '!' or nothing (headline-like).

German (de-en). A deterministic function of the English words plus noise: each English type
has a German counterpart (real German function words, with case variants for articles; syllable
words with umlauts and ß for the rest; names and numbers copied, decimal point -> comma), a few
types have two German synonyms, and per token: function words dropped now and then, particles
("sich", "noch", ...) inserted, a word near the start moved to the end in a quarter of the
sentences (verb-final), adjacent German nouns (capitalised) merged into compounds. German's
words-per-sentence ratio to English comes out near 0.95.

French (fr-en). Also a function of the English words plus noise (its own random streams): real
French function words (le/la/les, un/une, de, à, que, ...; the English articles agree with the
gender of the next noun), syllable words with é è ê à â ô ç for the rest (names and numbers
copied as in German), two synonyms for a few types, and per token: function words dropped now
and then, articles inserted before bare nouns ("la France", "les gens"), "ne" put before the
word ahead of "pas", adjectives moved after their noun most of the time ("une maison rouge"),
noun-noun compounds turned around with "de" ("oil price" -> "prix de pétrole"), particles
("bien", "même", "y", ...) inserted; then the contractions de le -> du, de les -> des, à le ->
au, à les -> aux, and elision before a vowel or h (le, la -> l'; de -> d'; que -> qu'; ne -> n';
se -> s'; ce -> c', written without a space, as one whitespace word). French's
words-per-sentence ratio to English comes out near 1.13.

Length model (words = whitespace-separated tokens of the raw, untokenised sentence, as in the
TFDS text): English length ~ round(LogNormal(log(median), sigma)) clipped to [1, 250], with
median 20 and sigma 0.57 for train (mean ~23.5, ~0.7% over 80 words) and median 19, sigma
0.50 for validation/test (newstest: mean ~21.5), for both pairs. Sources, approximate and not
fitted to the data here: Luong et al. 2015 ("Effective Approaches to Attention-based Neural
Machine Translation", Sec. 4) give WMT'14 en-de training as 4.5M pairs with 116M English and
110M German (tokenised) words, i.e. ~25.7 tokens per English sentence, ~23.5 whitespace words
once ~2 punctuation tokens per sentence are removed, and a German/English ratio of ~0.95;
Sutskever et al. 2014 ("Sequence to Sequence Learning with Neural Networks", Sec. 3.1) give
their 12M-sentence subset of WMT'14 en-fr as 348M French and 304M English words, i.e. ~25.3
tokens per English sentence (so the same English length model) and a French/English ratio of
~1.145; the median and the tail are the usual right-skewed shape of sentence lengths. The split
sizes are TFDS's (de-en: 4,508,785 train; fr-en: 40,836,876 train; both: 3,000 validation =
newstest2013, 3,003 test = newstest2014; TFDS catalog, `wmt14_translate`).

Everything is a pure function of the seed. Generation is vectorised with NumPy in chunks of
`CHUNK_SIZE` sentences (each chunk has its own random stream, so the first n pairs of a split
do not depend on the split's size); the TFDS writer (encoding, hashing, shuffling ~30k
examples/s) is the slow part of a build, and a second process generates chunks meanwhile.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from transformer.errors import fail, flags_parser

# TFDS configs of `wmt14_translate`: "<target>-en" (the first language is the other side).
PAIRS = ("de-en", "fr-en")
SPLITS = ("train", "validation", "test")
SPLIT_SIZES = {
  "de-en": {"train": 4_508_785, "validation": 3000, "test": 3003},
  "fr-en": {"train": 40_836_876, "validation": 3000, "test": 3003},
}

CHUNK_SIZE = 16_384  # sentences per generated chunk (part of the definition of the data)
VOCAB_SIZE = 400_000  # English word types
ZIPF_EXPONENT = 1.2
ZIPF_SHIFT = 4.0
MAX_WORDS = 250
# (median, sigma) of the lognormal English length in words, per split.
LENGTHS = {"train": (20.0, 0.57), "validation": (19.0, 0.50), "test": (19.0, 0.50)}

# Type classes of content words (the rest are plain lowercase words).
_P_NAME = 0.06
_P_NUMBER = 0.01
_P_NOUN = 0.40
_P_SYNONYM = 0.04  # content types with a second German (French) word
# Per-token noise on the German side.
_P_DROP_FUNCTION = 0.12
_P_INSERT = 0.03
_P_VERB_FINAL = 0.25
_P_COMPOUND = 0.6
# French: the "other" content types that are adjectives; per-token noise.
_P_ADJECTIVE = 0.35
_P_DROP_FUNCTION_FR = 0.04
_P_ARTICLE = 0.95  # an article before a noun that has no determiner or adjective before it
_P_PLURAL = 0.3  # an article is les
_P_ADJECTIVE_AFTER = 0.7
_P_NOUN_DE = 0.7  # "oil price" -> "prix de pétrole"
_P_INSERT_FR = 0.06
# Mid-sentence suffixes: " ", ", ", "; ", ": " (probabilities per word, English then German).
_MID_P_EN = (0.942, 0.052, 0.003, 0.003)
_MID_P_DE = (0.932, 0.062, 0.003, 0.003)
_MID_P_FR = (0.937, 0.057, 0.003, 0.003)
# Sentence ends: ".", "?", "!", ":", nothing.
_END_P = (0.87, 0.025, 0.01, 0.005, 0.09)
_SUFFIXES = (" ", ", ", "; ", ": ", "", ".\n", "?\n", "!\n", ":\n", "\n")
_JOIN = 4  # index of "" (compound join, elision) in _SUFFIXES
_END0 = 5  # index of the first sentence end in _SUFFIXES
_SPLIT_TAGS = {"train": 1, "validation": 2, "test": 3}
_PAIR_TAGS = {"de-en": (), "fr-en": (1,)}  # appended to each chunk's seed


def _table(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
  """'en:x1/x2 ...' -> ((en, (x1, x2)), ...); one variant is picked per token."""
  return tuple((en, tuple(xs.split("/"))) for en, xs in (p.split(":") for p in text.split()))


# Top English ranks and their German counterparts.
_FUNCTION_WORDS = _table(
  """
  the:der/die/das/den/dem/des of:von/der and:und to:zu/nach a:ein/eine/einen/einem in:in/im
  is:ist that:dass/das for:für it:es on:auf/am with:mit as:als/wie be:sein/werden
  this:dies/diese/dieser are:sind by:durch/von we:wir not:nicht have:haben at:bei/an
  from:aus/von which:die/der/welche will:wird/werden has:hat an:ein/eine or:oder but:aber
  was:war/wurde they:sie also:auch all:alle their:ihre/ihrer there:dort been:worden/gewesen
  more:mehr would:würde can:kann/können should:sollte its:seine/ihre our:unsere these:diese
  other:andere very:sehr must:muss/müssen who:der/die if:wenn/ob only:nur you:Sie/du
  about:über/etwa one:eins what:was new:neue/neuen when:wenn/als up:auf out:aus so:so/also
  no:kein/keine
  """
)
_GERMAN_PARTICLES = ("sich", "noch", "doch", "ja", "schon", "dann", "es", "zu", "ganz", "eben")
# The same English words and their French counterparts ("the" and "a": masculine, feminine
# [, plural] first, in that order, for the agreement with the next noun).
_FRENCH_FUNCTION_WORDS = dict(
  _table(
    """
    the:le/la/les of:de and:et to:à/pour/de a:un/une in:dans/en is:est that:que/qui/ce
    for:pour it:il/elle/cela on:sur with:avec as:comme be:être this:ce/cette/cet are:sont
    by:par we:nous not:pas have:avoir/ont at:à from:de which:qui/que/lequel/laquelle
    will:va/sera has:a an:un/une or:ou but:mais was:était/fut they:ils/elles
    also:aussi/également all:tous/toutes/tout their:leur/leurs there:là/y been:été more:plus
    would:serait/aurait can:peut/peuvent should:devrait its:son/sa/ses our:notre/nos these:ces
    other:autre/autres very:très must:doit/doivent who:qui if:si only:seulement you:vous/tu
    about:sur/environ one:un/une what:ce/quoi new:nouveau/nouvelle/nouveaux
    when:quand/lorsque up:haut out:hors/dehors so:donc/ainsi/si no:non/aucun/aucune
    """
  )
)
_FRENCH_AGREEING = ("the", "a", "an")  # variants: masculine, feminine[, plural]
_ENGLISH_DETERMINERS = ("the", "a", "an", "this", "these", "its", "their", "our", "no", "one",
                        "other", "all", "what")
_FRENCH_PARTICLES = ("bien", "même", "encore", "déjà", "donc", "alors", "ainsi", "y", "en", "se")
_FRENCH_ELISIONS = {"le": "l'", "la": "l'", "de": "d'", "que": "qu'", "ne": "n'", "se": "s'",
                    "ce": "c'"}
_FRENCH_CONTRACTIONS = {("de", "le"): "du", ("de", "les"): "des", ("à", "le"): "au",
                        ("à", "les"): "aux"}
_FRENCH_VOWELS = frozenset("aeiouyhàâéèêëîïôûœ")

# Syllable parts ("" repeated where an empty onset or coda should be commoner).
_EN_ONSETS = ("",) + tuple(
  "b c d f g h j k l m n p r s t v w y z br cr dr fr gr pr tr bl cl fl gl pl sl sh ch th wh st sp"
  " sc sk sm sn sw str spr qu".split()
)
_EN_NUCLEI = tuple("a e i o u ea ee oo ou ai ay ie y io oa".split())
_EN_CODAS = ("", "", "") + tuple("n r s t l m nd nt st ng ck rt ll ss th sh rd ct x ve re".split())
_EN_SUFFIXES = tuple("ing ed s tion ly er ment ness al ity ive es".split())
_DE_ONSETS = ("",) + tuple(
  "b d f g h j k l m n p r s t w z br dr fr gr kr pr tr bl fl gl kl pl sch schw schl schm st sp"
  " str spr pf zw kn ch".split()
)
_DE_NUCLEI = tuple("a e i o u a e i o u a e i e ei au eu ie ei e ä ö ü äu".split())
_DE_CODAS = ("", "") + tuple("n r s t l m ch cht ng nk ß tz ck rn ln st ft nd rt lt hl hr".split())
_DE_SUFFIXES = tuple("en er ung heit keit lich ig isch chen e t en ern schaft".split())
_FR_ONSETS = ("", "") + tuple(
  "b c d f g j l m n p r s t v ch gn qu br cr dr fr gr pr tr vr bl cl fl gl pl ç".split()
)
_FR_NUCLEI = tuple("a e i o u a e i o u a e i é è ê à â ô ou ai au eau oi eu ui ie".split())
_FR_CODAS = ("", "", "", "") + tuple("n r s t l m nt rt st x c rs".split())
_FR_SUFFIXES = tuple("tion ment é ée er eur euse ique isme ité age ance ence eux elle ette ière"
                     .split())


@dataclasses.dataclass(frozen=True)
class Pieces:
  """Strings as one UTF-8 byte buffer: piece i is buf[off[i]:off[i] + len[i]]."""

  buf: np.ndarray  # uint8
  off: np.ndarray  # int64
  len: np.ndarray  # int64

  @classmethod
  def of(cls, strings: list[str] | tuple[str, ...]) -> Pieces:
    encoded = [s.encode("utf-8") for s in strings]
    lens = np.fromiter(map(len, encoded), np.int64, len(encoded))
    return cls(np.frombuffer(b"".join(encoded), np.uint8), np.cumsum(lens) - lens, lens)

  @classmethod
  def concat(cls, *parts: Pieces) -> Pieces:
    shift = np.cumsum([0] + [len(p.buf) for p in parts[:-1]])
    return cls(
      np.concatenate([p.buf for p in parts]),
      np.concatenate([p.off + k for p, k in zip(parts, shift, strict=True)]),
      np.concatenate([p.len for p in parts]),
    )

  def capitalised(self, mask: np.ndarray | None = None) -> Pieces:
    """The same pieces with a capital first letter (where `mask`): a-z and à-þ except ÷."""
    buf = self.buf.copy()
    first = self.off[self.len > 0] if mask is None else self.off[mask & (self.len > 0)]
    lower = (buf[first] >= ord("a")) & (buf[first] <= ord("z"))
    buf[first[lower]] -= 32
    latin1 = first[buf[first] == 0xC3] + 1  # second bytes of U+00C0..U+00FF
    second = buf[latin1]
    # U+00E0..U+00FE (second bytes A0..BE) less U+00F7 (÷) -> U+00C0..U+00DE: ä -> Ä, é -> É.
    buf[latin1[(second >= 0xA0) & (second <= 0xBE) & (second != 0xB7)]] -= 32
    return Pieces(buf, self.off, self.len)

  def join(self, ids: np.ndarray) -> str:
    """The concatenation of pieces `ids`."""
    lens = self.len[ids]
    out_start = np.cumsum(lens) - lens
    idx = np.repeat(self.off[ids] - out_start, lens)
    idx += np.arange(len(idx))
    return self.buf[idx].tobytes().decode("utf-8")

  def render(self, words: np.ndarray, suffixes: np.ndarray, suffix0: int) -> list[str]:
    """Joins piece `words[i]` then piece `suffix0 + suffixes[i]` for all i; splits at '\\n'."""
    ids = np.empty(2 * len(words), np.int64)
    ids[0::2] = words
    ids[1::2] = suffixes + suffix0
    return self.join(ids).split("\n")[:-1]


@dataclasses.dataclass(frozen=True)
class _GermanRules:
  noun: np.ndarray  # bool [W]: a German noun (capitalised; may be compounded)


@dataclasses.dataclass(frozen=True)
class _FrenchRules:
  """Where French reorders, inserts, contracts and elides words (W: French entries)."""

  adjective: np.ndarray  # bool [V]: an English type whose French word follows its noun
  agreeing: np.ndarray  # bool [V]: English articles whose variant follows the next noun
  determiner: np.ndarray  # bool [V]: English determiners (no article is inserted after them)
  gender: np.ndarray  # int64 [W]: 0 masculine, 1 feminine (used for nouns)
  articles: np.ndarray  # int64 [3]: entries of le, la, les
  elided: np.ndarray  # int64 [W]: the elided entry (l', d', ...) or -1
  vowel: np.ndarray  # bool [W]: starts with a vowel or h (elision before it)
  preposition: np.ndarray  # int64 [W]: 0 de, 1 à, else -1
  article: np.ndarray  # int64 [W]: 0 le, 1 les, else -1
  contracted: np.ndarray  # int64 [2, 2]: entries of du, des (de + le, les); au, aux (à + ...)
  ne: int  # entry of "ne"
  de: int  # entry of "de"
  not_rank: int  # English rank of "not"


@dataclasses.dataclass(frozen=True)
class _Lexicon:
  """Both vocabularies and the English -> target-language word map, as arrays."""

  cdf: np.ndarray  # cumulative Zipf probabilities of the English ranks
  en: Pieces  # [natural forms (V), sentence-initial forms (V), _SUFFIXES]
  en_function: np.ndarray  # bool [V]: a function word
  en_noun: np.ndarray  # bool [V]: a noun
  tgt: Pieces  # German: [natural, sentence-initial, lowercase, _SUFFIXES]; French: no lowercase
  tgt_start: np.ndarray  # int64 [V]: first target entry of each English type
  tgt_count: np.ndarray  # int64 [V]: number of target entries (variants) of each English type
  tgt_particles: np.ndarray  # int64: target entries that may be inserted
  rules: _GermanRules | _FrenchRules
  num_en: int
  num_tgt: int


def _syllable_words(
  rng: np.random.Generator,
  ranks: np.ndarray,
  parts: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
  suffixes: tuple[str, ...],
  p_suffix: float,
  extra_syllable: float,
  taken: set[str],
) -> list[str]:
  """Distinct new words (not in `taken`, which grows) for `ranks`; rarer ranks get longer ones."""
  onsets, nuclei, codas = parts
  count = len(ranks)
  syllables = [o + n + c for o in onsets for n in nuclei for c in codas]
  # Zipfian syllable frequencies, the short syllables mostly at the top.
  size = np.array([len(x.encode("utf-8")) for x in syllables])  # umlauts count as longer
  order = np.argsort(size + 3.0 * rng.random(len(syllables)))
  table = Pieces.of([syllables[i] for i in order] + list(suffixes) + ["", "\n"])
  ns, empty = len(syllables), len(syllables) + len(suffixes)
  syl_p = 1.0 / np.arange(1, ns + 1) ** 0.9
  syl_cdf = np.cumsum(syl_p) / syl_p.sum()
  words: list[str] = []
  while len(words) < count:
    r = ranks[len(words) :]
    r = np.concatenate([r, np.full(len(r) // 8 + 16, r[-1])])  # spares for duplicates
    p_more = np.clip(extra_syllable + 0.06 * np.log10(r + 1.0), 0.0, 0.9)
    n_syl = 1 + rng.binomial(4, p_more)
    ids = np.full((len(r), 7), empty)
    syl = np.minimum(np.searchsorted(syl_cdf, rng.random((len(r), 5)), side="right"), ns - 1)
    ids[:, :5] = np.where(np.arange(5) < n_syl[:, None], syl, empty)
    suf = rng.integers(0, len(suffixes), len(r))
    ids[:, 5] = np.where(rng.random(len(r)) < p_suffix, ns + suf, empty)
    ids[:, 6] = empty + 1  # "\n"
    for w in table.join(ids.ravel()).split("\n")[:-1]:
      if w not in taken:
        taken.add(w)
        words.append(w)
        if len(words) == count:
          break
  return words


def _number_words(rng: np.random.Generator, count: int) -> list[str]:
  """`count` distinct number strings: integers (and years), decimals, percentages."""
  pool = [str(i) for i in range(10_000)]
  pool += [f"{i},{j:03d}" for i in range(1, 1000) for j in (0, 500)]
  pool += [f"{i}.{j}" for i in range(100) for j in range(1, 10)]
  pool += [f"{i}%" for i in range(1, 100)] + [f"{i}.{j}%" for i in range(1, 20) for j in range(10)]
  pool = list(dict.fromkeys(pool))
  return [pool[i] for i in rng.permutation(len(pool))[:count]]


def _decimal_comma(s: str) -> str:
  """German (and French) digit grouping and decimal separators: 1,250 -> 1.250, 3.5 -> 3,5."""
  return s.translate(str.maketrans(",.", ".,"))


def _english_words(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The content ranks, their kinds (0 name, 1 number, 2 noun, 3 other) and English words."""
  ranks = np.arange(len(_FUNCTION_WORDS), VOCAB_SIZE)
  kind = np.searchsorted(
    np.cumsum([_P_NAME, _P_NUMBER, _P_NOUN]), rng.random(len(ranks)), side="right"
  )
  name, number = kind == 0, kind == 1
  en_parts = (_EN_ONSETS, _EN_NUCLEI, _EN_CODAS)
  taken = {w for w, _ in _FUNCTION_WORDS}
  en = np.array(_syllable_words(rng, ranks, en_parts, _EN_SUFFIXES, 0.3, 0.0, taken), object)
  en[name] = [w[:1].upper() + w[1:] for w in en[name]]
  en[number] = _number_words(rng, int(number.sum()))
  return ranks, kind, en


def _english_side(kind: np.ndarray, en: np.ndarray) -> dict[str, Any]:
  """The English fields of a `_Lexicon`."""
  nf = len(_FUNCTION_WORDS)
  en_pieces = Pieces.of([w for w, _ in _FUNCTION_WORDS] + en.tolist())
  zipf = (np.arange(1, VOCAB_SIZE + 1) + ZIPF_SHIFT) ** -ZIPF_EXPONENT
  return {
    "cdf": np.cumsum(zipf) / zipf.sum(),
    "en": Pieces.concat(en_pieces, en_pieces.capitalised(), Pieces.of(_SUFFIXES)),
    "en_function": np.arange(VOCAB_SIZE) < nf,
    "en_noun": np.concatenate([np.zeros(nf, bool), kind == 2]),
    "num_en": VOCAB_SIZE,
  }


def _synonym_entries(
  rng: np.random.Generator, kind: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Target entries per content rank: one (names and numbers are copied) or two (synonyms).

  Returns the count of each rank's entries, the rank of each entry and each rank's first entry.
  """
  count = 1 + ((rng.random(len(kind)) < _P_SYNONYM) & (kind >= 2))
  owner = np.repeat(np.arange(len(kind)), count)
  return count, owner, np.cumsum(count) - count


def _german_lexicon(rng: np.random.Generator, ranks: np.ndarray, kind: np.ndarray,
                    en: np.ndarray) -> _Lexicon:
  """The German side; `rng` continues the English side's stream."""
  name, number = kind == 0, kind == 1
  count, owner, start = _synonym_entries(rng, kind)
  de = np.empty(len(owner), object)
  de_parts = (_DE_ONSETS, _DE_NUCLEI, _DE_CODAS)
  taken = {w for _, ws in _FUNCTION_WORDS for w in ws} | set(_GERMAN_PARTICLES)
  de[kind[owner] >= 2] = _syllable_words(
    rng, ranks[owner[kind[owner] >= 2]], de_parts, _DE_SUFFIXES, 0.45, 0.05, taken
  )
  de[start[name]] = en[name]
  de[start[number]] = [_decimal_comma(w) for w in en[number]]

  variants = [ws for _, ws in _FUNCTION_WORDS]
  nv = sum(map(len, variants))
  de_lower = [w for ws in variants for w in ws] + de.tolist() + list(_GERMAN_PARTICLES)
  de_noun = np.zeros(len(de_lower), bool)
  de_noun[nv : nv + len(de)] = kind[owner] == 2
  de_count = np.concatenate([[len(ws) for ws in variants], count])
  lower = Pieces.of(de_lower)
  return _Lexicon(
    **_english_side(kind, en),
    tgt=Pieces.concat(lower.capitalised(de_noun), lower.capitalised(), lower,
                      Pieces.of(_SUFFIXES)),
    tgt_start=np.cumsum(de_count) - de_count,
    tgt_count=de_count,
    tgt_particles=np.arange(len(de_lower) - len(_GERMAN_PARTICLES), len(de_lower)),
    rules=_GermanRules(noun=de_noun),
    num_tgt=len(de_lower),
  )


def _french_lexicon(rng: np.random.Generator, ranks: np.ndarray, kind: np.ndarray,
                    en: np.ndarray) -> _Lexicon:
  """The French side, from its own stream `rng`."""
  name, number = kind == 0, kind == 1
  count, owner, start = _synonym_entries(rng, kind)
  fr = np.empty(len(owner), object)
  variants = [_FRENCH_FUNCTION_WORDS[w] for w, _ in _FUNCTION_WORDS]
  extra = ["ne", *dict.fromkeys(_FRENCH_ELISIONS.values()), *_FRENCH_CONTRACTIONS.values()]
  taken = {w for ws in variants for w in ws} | set(_FRENCH_PARTICLES) | set(extra)
  fr_parts = (_FR_ONSETS, _FR_NUCLEI, _FR_CODAS)
  fr[kind[owner] >= 2] = _syllable_words(
    rng, ranks[owner[kind[owner] >= 2]], fr_parts, _FR_SUFFIXES, 0.35, 0.05, taken
  )
  fr[start[name]] = en[name]
  fr[start[number]] = [_decimal_comma(w) for w in en[number]]

  entries = [w for ws in variants for w in ws] + fr.tolist() + list(_FRENCH_PARTICLES) + extra
  first = {}
  for i, w in enumerate(entries):
    first.setdefault(w, i)

  def lookup(table: dict[str, Any]) -> np.ndarray:
    return np.array([table.get(w, -1) for w in entries], np.int64)

  fr_count = np.concatenate([[len(ws) for ws in variants], count])
  nf = len(_FUNCTION_WORDS)
  function_words = [w for w, _ in _FUNCTION_WORDS]
  adjective = np.zeros(VOCAB_SIZE, bool)
  adjective[nf:] = (kind == 3) & (rng.random(len(kind)) < _P_ADJECTIVE)
  agreeing = np.zeros(VOCAB_SIZE, bool)
  agreeing[[function_words.index(w) for w in _FRENCH_AGREEING]] = True
  determiner = np.zeros(VOCAB_SIZE, bool)
  determiner[[function_words.index(w) for w in _ENGLISH_DETERMINERS]] = True
  contracted = np.array([[first[_FRENCH_CONTRACTIONS[p, a]] for a in ("le", "les")]
                         for p in ("de", "à")])
  rules = _FrenchRules(
    adjective=adjective,
    agreeing=agreeing,
    determiner=determiner,
    gender=rng.integers(0, 2, len(entries)),
    articles=np.array([first[w] for w in ("le", "la", "les")]),
    elided=lookup({w: first[x] for w, x in _FRENCH_ELISIONS.items()}),
    vowel=np.array([w[:1].lower() in _FRENCH_VOWELS for w in entries]),
    preposition=lookup({"de": 0, "à": 1}),
    article=lookup({"le": 0, "les": 1}),
    contracted=contracted,
    ne=first["ne"],
    de=first["de"],
    not_rank=function_words.index("not"),
  )
  lower = Pieces.of(entries)
  return _Lexicon(
    **_english_side(kind, en),
    tgt=Pieces.concat(lower, lower.capitalised(), Pieces.of(_SUFFIXES)),
    tgt_start=np.cumsum(fr_count) - fr_count,
    tgt_count=fr_count,
    tgt_particles=np.array([first[w] for w in _FRENCH_PARTICLES]),
    rules=rules,
    num_tgt=len(entries),
  )


def check_pair(pair: str) -> str:
  """`pair` if it is one of PAIRS, else ValueError."""
  if pair not in SPLIT_SIZES:
    raise ValueError(f"pair must be one of {PAIRS}, got {pair!r}")
  return pair


def dataset_name(pair: str = "de-en") -> str:
  """The TFDS name of a pair's dataset, e.g. 'wmt14_translate/fr-en'."""
  return f"wmt14_translate/{check_pair(pair)}"


@functools.lru_cache(maxsize=4)
def _lexicon(seed: int, pair: str = "de-en") -> _Lexicon:
  ranks, kind, en = _english_words(rng := np.random.default_rng([seed, 0]))
  if pair == "de-en":
    return _german_lexicon(rng, ranks, kind, en)
  return _french_lexicon(np.random.default_rng([seed, 0, *_PAIR_TAGS[pair]]), ranks, kind, en)


def _first_of_runs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """For runs of the given lengths: start of each run, run id and position of each element."""
  starts = np.cumsum(counts) - counts
  run = np.repeat(np.arange(len(counts)), counts)
  return starts, run, np.arange(int(counts.sum())) - starts[run]


@dataclasses.dataclass(frozen=True)
class _EnglishChunk:
  """A chunk's English sentences and their tokens (T tokens in S = CHUNK_SIZE sentences)."""

  sentences: list[str]
  e: np.ndarray  # int64 [T]: English rank of each token
  sid: np.ndarray  # int64 [T]: sentence of each token
  pos: np.ndarray  # int64 [T]: position of each token in its sentence
  starts: np.ndarray  # int64 [S]: first token of each sentence
  end_kind: np.ndarray  # int64 [S]: sentence end (index into _END_P)


def _english_chunk(lex: _Lexicon, rng: np.random.Generator, split: str) -> _EnglishChunk:
  """Zipfian ranks, a capital first word, mid-sentence punctuation, a sentence end."""
  size = CHUNK_SIZE
  median, sigma = LENGTHS[split]
  n = np.clip(np.rint(rng.lognormal(np.log(median), sigma, size)), 1, MAX_WORDS).astype(np.int64)
  starts, sid, pos = _first_of_runs(n)
  ends = starts + n - 1
  total = len(sid)
  end_kind = np.searchsorted(np.cumsum(_END_P)[:-1], rng.random(size), side="right")
  e = np.minimum(np.searchsorted(lex.cdf, rng.random(total), side="right"), lex.num_en - 1)
  words = e.copy()
  words[starts] += lex.num_en
  mid = np.searchsorted(np.cumsum(_MID_P_EN)[:-1], rng.random(total), side="right")
  mid[ends] = _END0 + end_kind
  sentences = lex.en.render(words, mid, 2 * lex.num_en)
  return _EnglishChunk(sentences, e, sid, pos, starts, end_kind)


def _german(lex: _Lexicon, rng: np.random.Generator, eng: _EnglishChunk) -> list[str]:
  """Map words (one variant per token), drop/insert some, reorder, compound nouns."""
  e, sid, size = eng.e, eng.sid, CHUNK_SIZE
  total = len(e)
  d = lex.tgt_start[e] + (rng.random(total) * lex.tgt_count[e]).astype(np.int64)
  keep = ~(lex.en_function[e] & (rng.random(total) < _P_DROP_FUNCTION))
  keep[eng.starts] = True
  count = keep.astype(np.int64) + (rng.random(total) < _P_INSERT)
  _, src, rank = _first_of_runs(count)
  particle = lex.tgt_particles[rng.integers(0, len(lex.tgt_particles), len(src))]
  g = np.where(rank >= keep[src], particle, d[src])
  gsid = sid[src]
  m = np.bincount(gsid, minlength=size)
  gstarts = np.cumsum(m) - m
  gpos = np.arange(len(g)) - gstarts[gsid]
  key = 2 * gpos
  move = (rng.random(size) < _P_VERB_FINAL) & (m >= 4)
  at = gstarts + 1 + (rng.random(size) * np.minimum(3, m - 2)).astype(np.int64)
  key[at[move]] = 2 * m[move]
  g = g[np.argsort(gsid * (4 * MAX_WORDS + 8) + key, kind="stable")]
  noun = lex.rules.noun[g]
  join = np.zeros(len(g), bool)
  join[:-1] = noun[:-1] & noun[1:] & (gsid[:-1] == gsid[1:])
  join[:-1] &= rng.random(len(g) - 1) < _P_COMPOUND
  words = g.copy()
  words[1:][join[:-1]] += 2 * lex.num_tgt  # lowercase compound tail
  words[gstarts] += lex.num_tgt  # sentence-initial capital
  mid = np.searchsorted(np.cumsum(_MID_P_DE)[:-1], rng.random(len(g)), side="right")
  mid[join] = _JOIN
  mid[gstarts + m - 1] = _END0 + eng.end_kind
  return lex.tgt.render(words, mid, 3 * lex.num_tgt)


def _french(lex: _Lexicon, rng: np.random.Generator, eng: _EnglishChunk) -> list[str]:
  """Map words, agree articles, drop/insert some, reorder, then contract and elide.

  Each English token becomes its French word, kept or dropped, and at most one word before it
  (in order of precedence: "ne" for "pas", "de" of a turned compound, an article, a particle).
  The order within a sentence comes from sort keys: token at English position p has the slot
  8 * (p + 1); its prefix sorts at +2 and its word at +4; an adjective moved after the next
  noun at +14, a turned compound's "de" and noun at +14 and +15, "ne" at -7 (before the
  previous word).
  """
  fr = lex.rules
  e, sid, pos, size = eng.e, eng.sid, eng.pos, CHUNK_SIZE
  total = len(e)
  same = np.zeros(total, bool)  # the next token is in the same sentence
  same[:-1] = sid[:-1] == sid[1:]
  noun = lex.en_noun[e]
  next_noun = same & np.roll(noun, -1)
  d = lex.tgt_start[e] + (rng.random(total) * lex.tgt_count[e]).astype(np.int64)
  gender = fr.gender[d]
  plural = rng.random(total) < _P_PLURAL
  # le/la/les, un/une agree with the next noun (les: the only third variant).
  variant = np.where(plural & (lex.tgt_count[e] == 3), 2, np.roll(gender, -1))
  d = np.where(fr.agreeing[e] & next_noun, lex.tgt_start[e] + variant, d)
  negation = e == fr.not_rank
  keep = ~(lex.en_function[e] & (rng.random(total) < _P_DROP_FUNCTION_FR)) | negation
  keep[eng.starts] = True

  adjective = fr.adjective[e]
  bare = np.ones(total, bool)  # no determiner or adjective just before
  bare[1:] = ~((fr.determiner[e[:-1]] | adjective[:-1]) & same[:-1])
  article = noun & bare & (rng.random(total) < _P_ARTICLE)
  after = adjective & next_noun & (rng.random(total) < _P_ADJECTIVE_AFTER)
  turned = noun & next_noun & (rng.random(total) < _P_NOUN_DE)
  turned[:-1] &= ~turned[1:]  # in a run of nouns, only the last two turn
  particle = rng.random(total) < _P_INSERT_FR
  particles = lex.tgt_particles[rng.integers(0, len(lex.tgt_particles), total)]
  prefix = np.where(particle, particles, -1)
  prefix = np.where(article, fr.articles[np.where(plural, 2, gender)], prefix)
  prefix = np.where(turned, fr.de, prefix)
  prefix = np.where(negation, fr.ne, prefix)
  has = (prefix >= 0) & keep

  count = keep.astype(np.int64) + has
  _, src, rank = _first_of_runs(count)
  first = has[src] & (rank == 0)
  g = np.where(first, prefix[src], d[src])
  slot = 8 * (pos[src] + 1)
  key = slot + np.where(first, 2, 4)
  key = np.where(after[src] & ~first, slot + 14, key)
  key = np.where(turned[src], slot + np.where(first, 14, 15), key)
  key = np.where(negation[src] & first, slot - 7, key)
  gsid = sid[src]
  order = np.argsort(gsid * (8 * MAX_WORDS + 32) + key, kind="stable")
  g, gsid = g[order], gsid[order]

  # Elision before a vowel, then de/à + le/les (not elided) -> du, des, au, aux.
  gsame = np.zeros(len(g), bool)
  gsame[:-1] = gsid[:-1] == gsid[1:]
  nxt = np.roll(g, -1)
  elide = gsame & (fr.elided[g] >= 0) & fr.vowel[nxt]
  prep, art = fr.preposition[g], fr.article[nxt]
  contract = gsame & (prep >= 0) & (art >= 0) & ~np.roll(elide, -1)
  g = np.where(elide, fr.elided[g], g)
  g = np.where(contract, fr.contracted[prep, art], g)
  kept = ~np.roll(contract, 1)
  g, gsid, elide = g[kept], gsid[kept], elide[kept]

  m = np.bincount(gsid, minlength=size)
  gstarts = np.cumsum(m) - m
  words = g.copy()
  words[gstarts] += lex.num_tgt  # sentence-initial capital
  mid = np.searchsorted(np.cumsum(_MID_P_FR)[:-1], rng.random(len(g)), side="right")
  mid[elide] = _JOIN
  mid[gstarts + m - 1] = _END0 + eng.end_kind
  return lex.tgt.render(words, mid, 2 * lex.num_tgt)


def _chunk(split: str, seed: int, index: int, pair: str = "de-en") -> tuple[list[str], list[str]]:
  """Chunk `index` (CHUNK_SIZE pairs) of a split: (target sentences, English sentences)."""
  lex = _lexicon(seed, pair)
  rng = np.random.default_rng([seed, _SPLIT_TAGS[split], index, *_PAIR_TAGS[pair]])
  eng = _english_chunk(lex, rng, split)
  target = _german if pair == "de-en" else _french
  return target(lex, rng, eng), eng.sentences


def generate_chunks(
  split: str, size: int, seed: int = 0, pair: str = "de-en"
) -> Iterator[tuple[list[str], list[str]]]:
  """The first `size` pairs of a split as chunks of (target sentences, English sentences).

  The target language is the pair's first: German for 'de-en', French for 'fr-en'. Each chunk
  holds at most CHUNK_SIZE pairs. Pair i of a split is the same for any `size` > i.
  """
  if split not in _SPLIT_TAGS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  check_pair(pair)
  for index in range(-(-size // CHUNK_SIZE)):
    tgt, en = _chunk(split, seed, index, pair)
    yield tgt[: size - index * CHUNK_SIZE], en[: size - index * CHUNK_SIZE]


def generate_pairs(
  split: str, size: int, seed: int = 0, pair: str = "de-en"
) -> Iterator[tuple[str, str]]:
  """The first `size` (target, English) pairs of a split ('train', 'validation' or 'test')."""
  for tgt, en in generate_chunks(split, size, seed, pair):
    yield from zip(tgt, en, strict=True)


# Chunks of a split are generated in a child Python process (one core) while this one runs the
# TFDS writer; the child writes pickled chunks to a pipe, which blocks it when it is ahead.
_CHILD = (
  "import pickle, sys\n"
  "from benchmarks.synthetic_wmt import generate_chunks\n"
  "split, size, seed, pair = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]\n"
  "for chunk in generate_chunks(split, size, seed, pair):\n"
  "  pickle.dump(chunk, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)\n"
  "sys.stdout.buffer.flush()\n"
)
_CHILD_MIN_SIZE = 4 * CHUNK_SIZE  # smaller splits are generated in this process


def child_chunks(
  split: str, size: int, seed: int, pair: str = "de-en"
) -> Iterator[tuple[list[str], list[str]]]:
  """As `generate_chunks`, but computed in a child process, one chunk ahead."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
  args = [sys.executable, "-c", _CHILD, split, str(size), str(seed), check_pair(pair)]
  with subprocess.Popen(args, stdout=subprocess.PIPE, env=env) as child:
    try:
      for _ in range(-(-size // CHUNK_SIZE)):
        try:
          yield pickle.load(child.stdout)
        except EOFError:
          raise RuntimeError(
            f"the generator process for {split!r} exited with {child.wait()}"
          ) from None
    finally:
      child.kill()  # a no-op once it has finished


def _examples(
  split: str, size: int, seed: int, pair: str
) -> Iterator[tuple[str, dict[str, str]]]:
  """TFDS (key, example) pairs; keys look like the real builder's "<subset>/<line>"."""
  chunks = child_chunks if size >= _CHILD_MIN_SIZE and (os.cpu_count() or 1) > 1 else None
  lang = pair.split("-")[0]
  i = itertools.count()
  for tgt, en in (chunks or generate_chunks)(split, size, seed, pair):
    for t, e in zip(tgt, en, strict=True):
      yield f"synthetic/{next(i)}", {lang: t, "en": e}


def build_synthetic_wmt14(
  data_dir: str,
  *,
  pair: str = "de-en",
  train_size: int | None = None,
  validation_size: int | None = None,
  test_size: int | None = None,
  seed: int = 0,
) -> None:
  """Writes the synthetic corpus as `wmt14_translate/<pair>` into the TFDS `data_dir`.

  A size left at None is the pair's TFDS size (SPLIT_SIZES). Does nothing if the dataset is
  already prepared there (whatever its sizes). Splits of `_CHILD_MIN_SIZE` pairs or more are
  generated in a child process while this one runs the TFDS writer.
  """
  given = {"train": train_size, "validation": validation_size, "test": test_size}
  sizes = {k: SPLIT_SIZES[check_pair(pair)][k] if v is None else v for k, v in given.items()}
  if min(sizes.values()) < 1:
    raise ValueError(f"every split needs at least one example, got {sizes}")
  from transformer.data.tfds_io import import_tensorflow

  import_tensorflow()
  import tensorflow_datasets as tfds

  builder = tfds.builder(dataset_name(pair), data_dir=os.path.expanduser(data_dir))
  # (is_prepared() logs a warning when the dir is missing.)
  if (builder.data_path / "dataset_info.json").exists() and builder.is_prepared():
    return

  def split_generators(dl_manager: Any) -> dict[str, Iterator[tuple[str, dict[str, str]]]]:
    del dl_manager  # nothing to download
    return {split: _examples(split, sizes[split], seed, pair) for split in SPLITS}

  # An instance attribute shadows the class's method: TFDS calls `self._split_generators`.
  builder._split_generators = split_generators
  config = tfds.download.DownloadConfig(
    try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
  )
  # The download manager makes (empty) dirs in its download dir: keep them out of data_dir.
  with tempfile.TemporaryDirectory(prefix="synthetic_wmt_") as download_dir:
    builder.download_and_prepare(download_dir=download_dir, download_config=config)


def _dir_bytes(path: str) -> int:
  return sum(
    os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
  )


if __name__ == "__main__":
  from absl import app, flags

  _DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir to write into.", required=True)
  _PAIR = flags.DEFINE_enum("pair", "de-en", PAIRS,
                            "Language pair: the TFDS config of wmt14_translate.")
  _TRAIN_SIZE = flags.DEFINE_integer(
    "train_size", None, "Training pairs (default: the pair's TFDS size, 4,508,785 or 40,836,876)."
  )
  _VALIDATION_SIZE = flags.DEFINE_integer("validation_size", None, "Validation pairs (3000).")
  _TEST_SIZE = flags.DEFINE_integer("test_size", None, "Test pairs (3003).")
  _SEED = flags.DEFINE_integer("seed", 0, "Seed of the lexicon and of every sentence.")

  def main(argv: list[str]) -> None:
    del argv
    import tensorflow_datasets as tfds

    for flag in (_TRAIN_SIZE, _VALIDATION_SIZE, _TEST_SIZE):
      if flag.value is not None and flag.value < 1:
        fail(f"--{flag.name}={flag.value}: every split needs at least one example")
    data_dir = os.path.expanduser(_DATA_DIR.value)
    name = dataset_name(_PAIR.value)
    builder = tfds.builder(name, data_dir=data_dir)
    if (builder.data_path / "dataset_info.json").exists():
      print(f"already there, nothing written: {builder.data_dir}")
    else:
      start = time.perf_counter()
      build_synthetic_wmt14(
        data_dir,
        pair=_PAIR.value,
        train_size=_TRAIN_SIZE.value,
        validation_size=_VALIDATION_SIZE.value,
        test_size=_TEST_SIZE.value,
        seed=_SEED.value,
      )
      print(f"built in {time.perf_counter() - start:.1f} s: {builder.data_dir}")
    builder = tfds.builder(name, data_dir=data_dir)
    for split_name, split in builder.info.splits.items():
      print(f"  {split_name}: {split.num_examples} examples, {split.num_shards} shards")
    size = _dir_bytes(os.fspath(builder.data_dir))
    print(f"on disk: {size / 2**20:.1f} MiB ({size} bytes)")

  app.run(main, flags_parser=flags_parser())
