"""A synthetic stand-in for WMT14 en-de, written through the real TFDS `wmt14_translate/de-en`.

For offline work (tests, benchmarks, machines without the 1.6 GB download): the corpus has WMT14
en-de's split sizes and roughly its sentence-length distribution, and it is written by the real
TFDS builder (`tensorflow_datasets.translate.wmt14.Wmt14Translate`, config `de-en`, version
1.0.0), so the data dir holds what `tfds build wmt14_translate/de-en` writes:

    DIR/wmt14_translate/.config/metadata.json
    DIR/wmt14_translate/de-en/1.0.0/{dataset_info.json, features.json,
                                     wmt14_translate-{train,validation,test}.tfrecord-*-of-*}

and `tfds.builder("wmt14_translate/de-en", data_dir=DIR)` reads it as usual (features
`{"de": Text, "en": Text}`). Only the builder instance's `_split_generators` is replaced (its
class, module, name, version, features and info stay TFDS's), so nothing is downloaded. What
tells the data apart: the text is nonsense, and `dataset_info.json` has no `downloadSize`.

Text. A lexicon of `VOCAB_SIZE` English word types: 58 real English function words at the
top ranks, then words built from syllables (so shared subword units exist), about 6% of them
capitalised names and 1% numbers. Tokens are drawn with Zipf-Mandelbrot frequencies
p(rank) ~ (rank + ZIPF_SHIFT) ** -ZIPF_EXPONENT. The German side is a deterministic function
of the English words plus noise: each English type has a German counterpart (real German
function words, with case variants for articles; syllable words with umlauts and ß for the
rest; names and numbers copied, decimal point -> comma), a few types have two German synonyms,
and per token: function words dropped now and then, particles ("sich", "noch", ...) inserted,
a word near the start moved to the end in a quarter of the sentences (verb-final), adjacent
German nouns (capitalised) merged into compounds. Sentences start with a capital letter,
commas and a few semicolons/colons follow words, and most end in '.', some in '?', '!' or
nothing (headline-like). German's words-per-sentence ratio to English comes out near 0.95.

Length model (words = whitespace-separated tokens of the raw, untokenised sentence, as in the
TFDS text): English length ~ round(LogNormal(log(median), sigma)) clipped to [1, 250], with
median 20 and sigma 0.57 for train (mean ~23.5, ~0.7% over 80 words) and median 19, sigma
0.50 for validation/test (newstest: mean ~21.5). Source, approximate and from memory, not
fitted to the data here: Luong et al. 2015 ("Effective Approaches to Attention-based Neural
Machine Translation", Sec. 4) give WMT'14 en-de training as 4.5M pairs with 116M English and
110M German (tokenised) words, i.e. ~25.7 tokens per English sentence, ~23.5 whitespace words
once ~2 punctuation tokens per sentence are removed, and a German/English ratio of ~0.95;
the median and the tail are the usual right-skewed shape of sentence lengths. The split sizes
are TFDS's (4,508,785 train; 3,000 validation = newstest2013; 3,003 test = newstest2014).

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
from collections.abc import Iterator
from typing import Any

import numpy as np

DATASET = "wmt14_translate/de-en"
SPLITS = ("train", "validation", "test")
DEFAULT_SIZES = {"train": 4_508_785, "validation": 3000, "test": 3003}

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
_P_SYNONYM = 0.04  # content types with a second German word
# Per-token noise on the German side.
_P_DROP_FUNCTION = 0.12
_P_INSERT = 0.03
_P_VERB_FINAL = 0.25
_P_COMPOUND = 0.6
# Mid-sentence suffixes: " ", ", ", "; ", ": " (probabilities per word, English then German).
_MID_P_EN = (0.942, 0.052, 0.003, 0.003)
_MID_P_DE = (0.932, 0.062, 0.003, 0.003)
# Sentence ends: ".", "?", "!", ":", nothing.
_END_P = (0.87, 0.025, 0.01, 0.005, 0.09)
_SUFFIXES = (" ", ", ", "; ", ": ", "", ".\n", "?\n", "!\n", ":\n", "\n")
_JOIN = 4  # index of "" (compound join) in _SUFFIXES
_END0 = 5  # index of the first sentence end in _SUFFIXES
_SPLIT_TAGS = {"train": 1, "validation": 2, "test": 3}

# Top English ranks and their German counterparts ("en:de1/de2/..."; one is picked per token).
_FUNCTION_WORDS = tuple(
  (en, tuple(de.split("/")))
  for en, de in (
    pair.split(":")
    for pair in """
    the:der/die/das/den/dem/des of:von/der and:und to:zu/nach a:ein/eine/einen/einem in:in/im
    is:ist that:dass/das for:für it:es on:auf/am with:mit as:als/wie be:sein/werden
    this:dies/diese/dieser are:sind by:durch/von we:wir not:nicht have:haben at:bei/an
    from:aus/von which:die/der/welche will:wird/werden has:hat an:ein/eine or:oder but:aber
    was:war/wurde they:sie also:auch all:alle their:ihre/ihrer there:dort been:worden/gewesen
    more:mehr would:würde can:kann/können should:sollte its:seine/ihre our:unsere these:diese
    other:andere very:sehr must:muss/müssen who:der/die if:wenn/ob only:nur you:Sie/du
    about:über/etwa one:eins what:was new:neue/neuen when:wenn/als up:auf out:aus so:so/also
    no:kein/keine
    """.split()
  )
)
_GERMAN_PARTICLES = ("sich", "noch", "doch", "ja", "schon", "dann", "es", "zu", "ganz", "eben")

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
    """The same pieces with a capital first letter (where `mask`): a-z and ä, ö, ü only."""
    buf = self.buf.copy()
    first = self.off[self.len > 0] if mask is None else self.off[mask & (self.len > 0)]
    lower = (buf[first] >= ord("a")) & (buf[first] <= ord("z"))
    buf[first[lower]] -= 32
    umlaut = first[buf[first] == 0xC3] + 1  # second bytes of U+00C0..U+00FF
    buf[umlaut[np.isin(buf[umlaut], (0xA4, 0xB6, 0xBC))]] -= 32  # ä ö ü -> Ä Ö Ü
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
class _Lexicon:
  """Both vocabularies and the English -> German word map, as arrays."""

  cdf: np.ndarray  # cumulative Zipf probabilities of the English ranks
  en: Pieces  # [natural forms (V), sentence-initial forms (V), _SUFFIXES]
  de: Pieces  # [natural (W), sentence-initial (W), lowercase (W), _SUFFIXES]
  en_function: np.ndarray  # bool [V]: a function word
  de_start: np.ndarray  # int64 [V]: first German entry of each English type
  de_count: np.ndarray  # int64 [V]: number of German entries (variants) of each English type
  de_noun: np.ndarray  # bool [W]: a German noun (may be compounded)
  de_particles: np.ndarray  # int64: German entries that may be inserted
  num_en: int
  num_de: int


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


def _german_number(s: str) -> str:
  """German digit grouping and decimal separators: 1,250 -> 1.250 and 3.5 -> 3,5."""
  return s.translate(str.maketrans(",.", ".,"))


@functools.lru_cache(maxsize=4)
def _lexicon(seed: int) -> _Lexicon:
  rng = np.random.default_rng([seed, 0])
  nf = len(_FUNCTION_WORDS)
  ranks = np.arange(nf, VOCAB_SIZE)
  kind = np.searchsorted(
    np.cumsum([_P_NAME, _P_NUMBER, _P_NOUN]), rng.random(len(ranks)), side="right"
  )  # of each content rank: 0 name, 1 number, 2 noun, 3 other
  name, number = kind == 0, kind == 1
  en_parts = (_EN_ONSETS, _EN_NUCLEI, _EN_CODAS)
  taken = {w for w, _ in _FUNCTION_WORDS}
  en = np.array(_syllable_words(rng, ranks, en_parts, _EN_SUFFIXES, 0.3, 0.0, taken), object)
  en[name] = [w[:1].upper() + w[1:] for w in en[name]]
  en[number] = _number_words(rng, int(number.sum()))

  # German entries of each content rank: one (a name or number is copied), or two (synonyms).
  count = 1 + ((rng.random(len(ranks)) < _P_SYNONYM) & (kind >= 2))
  owner = np.repeat(np.arange(len(ranks)), count)
  start = np.cumsum(count) - count
  de = np.empty(len(owner), object)
  de_parts = (_DE_ONSETS, _DE_NUCLEI, _DE_CODAS)
  taken = {w for _, ws in _FUNCTION_WORDS for w in ws} | set(_GERMAN_PARTICLES)
  de[kind[owner] >= 2] = _syllable_words(
    rng, ranks[owner[kind[owner] >= 2]], de_parts, _DE_SUFFIXES, 0.45, 0.05, taken
  )
  de[start[name]] = en[name]
  de[start[number]] = [_german_number(w) for w in en[number]]

  variants = [ws for _, ws in _FUNCTION_WORDS]
  nv = sum(map(len, variants))
  de_lower = [w for ws in variants for w in ws] + de.tolist() + list(_GERMAN_PARTICLES)
  de_noun = np.zeros(len(de_lower), bool)
  de_noun[nv : nv + len(de)] = kind[owner] == 2
  de_count = np.concatenate([[len(ws) for ws in variants], count])
  lower = Pieces.of(de_lower)
  en_pieces = Pieces.of([w for w, _ in _FUNCTION_WORDS] + en.tolist())
  suffixes = Pieces.of(_SUFFIXES)
  zipf = (np.arange(1, VOCAB_SIZE + 1) + ZIPF_SHIFT) ** -ZIPF_EXPONENT
  return _Lexicon(
    cdf=np.cumsum(zipf) / zipf.sum(),
    en=Pieces.concat(en_pieces, en_pieces.capitalised(), suffixes),
    de=Pieces.concat(lower.capitalised(de_noun), lower.capitalised(), lower, suffixes),
    en_function=np.arange(VOCAB_SIZE) < nf,
    de_start=np.cumsum(de_count) - de_count,
    de_count=de_count,
    de_noun=de_noun,
    de_particles=np.arange(len(de_lower) - len(_GERMAN_PARTICLES), len(de_lower)),
    num_en=VOCAB_SIZE,
    num_de=len(de_lower),
  )


def _first_of_runs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """For runs of the given lengths: start of each run, run id and position of each element."""
  starts = np.cumsum(counts) - counts
  run = np.repeat(np.arange(len(counts)), counts)
  return starts, run, np.arange(int(counts.sum())) - starts[run]


def _chunk(split: str, seed: int, index: int) -> tuple[list[str], list[str]]:
  """Chunk `index` (CHUNK_SIZE pairs) of a split: (German sentences, English sentences)."""
  lex = _lexicon(seed)
  rng = np.random.default_rng([seed, _SPLIT_TAGS[split], index])
  size = CHUNK_SIZE
  median, sigma = LENGTHS[split]
  n = np.clip(np.rint(rng.lognormal(np.log(median), sigma, size)), 1, MAX_WORDS).astype(np.int64)
  starts, sid, _ = _first_of_runs(n)
  ends = starts + n - 1
  total = len(sid)
  end_kind = np.searchsorted(np.cumsum(_END_P)[:-1], rng.random(size), side="right")

  # English: Zipfian ranks, a capital first word, mid-sentence punctuation, a sentence end.
  e = np.minimum(np.searchsorted(lex.cdf, rng.random(total), side="right"), lex.num_en - 1)
  words = e.copy()
  words[starts] += lex.num_en
  mid = np.searchsorted(np.cumsum(_MID_P_EN)[:-1], rng.random(total), side="right")
  mid[ends] = _END0 + end_kind
  en = lex.en.render(words, mid, 2 * lex.num_en)

  # German: map words (one variant per token), drop/insert some, reorder, compound nouns.
  d = lex.de_start[e] + (rng.random(total) * lex.de_count[e]).astype(np.int64)
  keep = ~(lex.en_function[e] & (rng.random(total) < _P_DROP_FUNCTION))
  keep[starts] = True
  count = keep.astype(np.int64) + (rng.random(total) < _P_INSERT)
  _, src, rank = _first_of_runs(count)
  particle = lex.de_particles[rng.integers(0, len(lex.de_particles), len(src))]
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
  noun = lex.de_noun[g]
  join = np.zeros(len(g), bool)
  join[:-1] = noun[:-1] & noun[1:] & (gsid[:-1] == gsid[1:])
  join[:-1] &= rng.random(len(g) - 1) < _P_COMPOUND
  words = g.copy()
  words[1:][join[:-1]] += 2 * lex.num_de  # lowercase compound tail
  words[gstarts] += lex.num_de  # sentence-initial capital
  mid = np.searchsorted(np.cumsum(_MID_P_DE)[:-1], rng.random(len(g)), side="right")
  mid[join] = _JOIN
  mid[gstarts + m - 1] = _END0 + end_kind
  de = lex.de.render(words, mid, 3 * lex.num_de)
  return de, en


def generate_chunks(split: str, size: int, seed: int = 0) -> Iterator[tuple[list[str], list[str]]]:
  """The first `size` pairs of a split as chunks of (German sentences, English sentences).

  Each chunk holds at most CHUNK_SIZE pairs. Pair i of a split is the same for any `size` > i.
  """
  if split not in _SPLIT_TAGS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  for index in range(-(-size // CHUNK_SIZE)):
    de, en = _chunk(split, seed, index)
    yield de[: size - index * CHUNK_SIZE], en[: size - index * CHUNK_SIZE]


def generate_pairs(split: str, size: int, seed: int = 0) -> Iterator[tuple[str, str]]:
  """The first `size` (German, English) pairs of a split ('train', 'validation' or 'test')."""
  for de, en in generate_chunks(split, size, seed):
    yield from zip(de, en, strict=True)


# Chunks of a split are generated in a child Python process (one core) while this one runs the
# TFDS writer; the child writes pickled chunks to a pipe, which blocks it when it is ahead.
_CHILD = (
  "import pickle, sys\n"
  "from transformer.data.synthetic_wmt import generate_chunks\n"
  "split, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
  "for chunk in generate_chunks(split, size, seed):\n"
  "  pickle.dump(chunk, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)\n"
  "sys.stdout.buffer.flush()\n"
)
_CHILD_MIN_SIZE = 4 * CHUNK_SIZE  # smaller splits are generated in this process


def child_chunks(split: str, size: int, seed: int) -> Iterator[tuple[list[str], list[str]]]:
  """As `generate_chunks`, but computed in a child process, one chunk ahead."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
  args = [sys.executable, "-c", _CHILD, split, str(size), str(seed)]
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


def _examples(split: str, size: int, seed: int) -> Iterator[tuple[str, dict[str, str]]]:
  """TFDS (key, example) pairs; keys look like the real builder's "<subset>/<line>"."""
  chunks = child_chunks if size >= _CHILD_MIN_SIZE and (os.cpu_count() or 1) > 1 else None
  i = itertools.count()
  for de, en in (chunks or generate_chunks)(split, size, seed):
    for d, e in zip(de, en, strict=True):
      yield f"synthetic/{next(i)}", {"de": d, "en": e}


def build_synthetic_wmt14(
  data_dir: str,
  *,
  train_size: int = DEFAULT_SIZES["train"],
  validation_size: int = DEFAULT_SIZES["validation"],
  test_size: int = DEFAULT_SIZES["test"],
  seed: int = 0,
) -> None:
  """Writes the synthetic corpus as `wmt14_translate/de-en` into the TFDS `data_dir`.

  Does nothing if the dataset is already prepared there (whatever its sizes). Splits of
  `_CHILD_MIN_SIZE` pairs or more are generated in a child process while this one runs the
  TFDS writer.
  """
  sizes = {"train": train_size, "validation": validation_size, "test": test_size}
  if min(sizes.values()) < 1:
    raise ValueError(f"every split needs at least one example, got {sizes}")
  from transformer.data.tfds_io import import_tensorflow

  import_tensorflow()
  import tensorflow_datasets as tfds

  builder = tfds.builder(DATASET, data_dir=os.path.expanduser(data_dir))
  # (is_prepared() logs a warning when the dir is missing.)
  if (builder.data_path / "dataset_info.json").exists() and builder.is_prepared():
    return

  def split_generators(dl_manager: Any) -> dict[str, Iterator[tuple[str, dict[str, str]]]]:
    del dl_manager  # nothing to download
    return {split: _examples(split, sizes[split], seed) for split in SPLITS}

  # An instance attribute shadows the class's method: TFDS calls `self._split_generators`.
  builder._split_generators = split_generators
  config = tfds.download.DownloadConfig(
    try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
  )
  # The download manager makes (empty) dirs in its download dir: keep them out of data_dir.
  with tempfile.TemporaryDirectory(prefix="synthetic_wmt_") as download_dir:
    builder.download_and_prepare(download_dir=download_dir, download_config=config)
