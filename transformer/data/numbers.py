"""The embedded corpus: English-to-German (and English-to-French) translation of numbers
written as words.

A sentence is one to four numbers in 0..999,999 joined by "and then" ("und dann"), e.g.

  en: "three hundred and forty-seven and then twelve"
  de: "dreihundertsiebenundvierzig und dann zwölf"

The German side is compositional (compound words) and the English side is not, so the corpus
needs real subword modelling and reordering-free but non-trivial alignment, and it is
generated locally with num2words in seconds, with no download.

The splits use disjoint numbers: every integer is assigned to exactly one split by a fixed
hash (1 in 10 only in test, 1 in 10 only in validation), so test BLEU measures generalisation to
numbers never seen in training. Generation is deterministic (fixed seeds); two builds give
identical examples.

French (`fr`, "trois cent quarante-sept et puis douze") is the same sentences' numbers in
French words, for multilingual runs (one model, English to German and to French): its files
are written when a config first asks for the language, beside the English and German ones,
which stay as they were.

`write_corpus` writes the three splits as line-aligned text files (one per language) into the
data dir, once; `dataset='numbers'` reads them as any corpus of text files is read
(`text_io.TextReader`), so the offline default needs neither TensorFlow nor TFDS. The same
corpus as a TFDS dataset (`numbers_translate/<variant>`) is in data/numbers_tfds.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
from collections.abc import Iterator

import numpy as np

from transformer import storage

# The corpus's version: a change of what `generate` yields is a new version (a new directory,
# so a data dir never mixes two).
VERSION = "1.1.0"
LANGUAGES = ("en", "de", "fr")
# The languages of the corpus's first version; others are written on demand (`write_corpus`).
BASE_LANGUAGES = ("en", "de")
SPLITS = ("train", "validation", "test")
MAX_NUMBER = 999_999
MAX_NUMBERS_PER_SENTENCE = 4
EN_JOINER = " and then "
DE_JOINER = " und dann "
FR_JOINER = " et puis "
# Hash bucket (mod 10) of the numbers reserved for each held-out split; the rest is train.
# Numbers below ALWAYS_TRAIN are all in train: their words ("zero", "eleven", "forty") are
# the atoms every other number is built from, so a held-out split can only test how they
# compose, not words the model never saw ("zero" exists only as the number 0).
ALWAYS_TRAIN = 100
_TEST_BUCKET = 0
_VALIDATION_BUCKET = 1
_SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}


@dataclasses.dataclass(frozen=True)
class Variant:
  """Sizes (in sentences) and seed of one variant of the corpus."""

  train_size: int = 200_000
  validation_size: int = 1_000
  test_size: int = 1_000
  seed: int = 0

  def size(self, split: str) -> int:
    return {"train": self.train_size, "validation": self.validation_size,
            "test": self.test_size}[split]


# `data.numbers_variant`: the default corpus, and a small one for tests.
VARIANTS = {
  "default": Variant(),
  "tiny": Variant(train_size=2_000, validation_size=200, test_size=200),
}


def split_of(numbers: np.ndarray) -> np.ndarray:
  """Split id (0 train, 1 validation, 2 test) of each integer, by a fixed hash.

  Args:
    numbers: int array of any shape, values in 0..MAX_NUMBER.

  Returns:
    int array of the same shape.
  """
  # Fibonacci hashing: multiply mod 2**64 and keep high bits, so neighbours scatter.
  h = (np.asarray(numbers, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
  bucket = (h % np.uint64(10)).astype(np.int64)
  out = np.zeros(bucket.shape, np.int64)
  held_out = np.asarray(numbers) >= ALWAYS_TRAIN
  out[held_out & (bucket == _VALIDATION_BUCKET)] = _SPLIT_IDS["validation"]
  out[held_out & (bucket == _TEST_BUCKET)] = _SPLIT_IDS["test"]
  return out


@functools.cache
def _small_words(lang: str) -> tuple[str, ...]:
  # Imported here: only building the corpus spells numbers, not translating or training.
  from num2words import num2words

  return tuple(num2words(n, lang=lang) for n in range(1000))


def english(n: int) -> str:
  """English words for 0 <= n <= 999,999, identical to `num2words(n)`.

  num2words takes ~0.1 ms a call, too slow for ~500k numbers per build, so numbers >= 1000 are
  composed from its words for the two three-digit groups (checked against num2words on all
  numbers once, and on a sample in the tests).
  """
  small = _small_words("en")
  high, low = divmod(n, 1000)
  if high == 0:
    return small[low]
  head = small[high] + " thousand"
  if low == 0:
    return head
  return head + (" and " if low < 100 else ", ") + small[low]


def german(n: int) -> str:
  """German words for 0 <= n <= 999,999, as `num2words(n, lang='de')` writes them.

  One deliberate difference: num2words 0.5.14 writes 101,000 as "einhunderteinstausend";
  the correct German, produced here, is "einhunderteintausend" (likewise 201,000, ...).
  """
  small = _small_words("de")
  high, low = divmod(n, 1000)
  if high == 0:
    return small[low]
  head = small[high]
  if head.endswith("eins"):  # "einhunderteins" + "tausend" -> "einhunderteintausend"
    head = head[:-1]
  return head + "tausend" + (small[low] if low else "")


def french(n: int) -> str:
  """French words for 0 <= n <= 999,999, identical to `num2words(n, lang='fr')` (checked on
  every seventh number from 1,000 and on a sample in the tests): thousands as 'mille' after
  the count's words, whose plural 's' ('quatre-vingts', 'deux cents') French drops there."""
  small = _small_words("fr")
  high, low = divmod(n, 1000)
  if high == 0:
    return small[low]
  if high == 1:
    head = "mille"
  else:
    count = small[high]
    if count.endswith(("quatre-vingts", "cents")):
      count = count[:-1]
    head = count + " mille"
  return head + (" " + small[low] if low else "")


WORDS = {"en": (english, EN_JOINER), "de": (german, DE_JOINER), "fr": (french, FR_JOINER)}


def sentences(split: str, size: int, lang: str, seed: int = 0) -> list[str]:
  """The `size` sentences of `split` in `lang`, in `generate`'s order."""
  words, joiner = WORDS[lang]
  return [joiner.join(map(words, group)) for group in sentence_numbers(split, size, seed)]


def _draw_numbers(rng: np.random.Generator, count: int, split_id: int) -> np.ndarray:
  """`count` numbers of one split, biased to small ones: digit count uniform in 1..6."""
  out: list[np.ndarray] = []
  have = 0
  while have < count:
    n = 2 * (count - have) + 64
    digits = rng.integers(1, 7, size=n)
    low = np.where(digits == 1, 0, 10 ** (digits - 1))
    cand = rng.integers(low, 10**digits)
    cand = cand[split_of(cand) == split_id]
    out.append(cand)
    have += len(cand)
  return np.concatenate(out)[:count]


def sentence_numbers(split: str, size: int, seed: int = 0) -> list[list[int]]:
  """The numbers of each of the `size` sentences of `split`, deterministically.

  Each sentence has 1..MAX_NUMBERS_PER_SENTENCE numbers, all from `split`'s share of integers.
  """
  split_id = _SPLIT_IDS[split]
  rng = np.random.default_rng([seed, split_id])
  counts = rng.integers(1, MAX_NUMBERS_PER_SENTENCE + 1, size=size)
  numbers = _draw_numbers(rng, int(counts.sum()), split_id).tolist()
  bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
  return [numbers[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def generate(split: str, size: int, seed: int = 0) -> Iterator[tuple[str, str]]:
  """Yields `size` (english, german) sentence pairs of `split`, deterministically."""
  for group in sentence_numbers(split, size, seed):
    yield EN_JOINER.join(map(english, group)), DE_JOINER.join(map(german, group))


def stored_order(split: str, size: int) -> list[int]:
  """The order in which the files hold `generate`'s pairs: by the MD5 of the split's name and
  the pair's index, a fixed shuffle, and the order in which TFDS stores the same examples
  (data/numbers_tfds.py keys them by index), so both forms of the corpus read alike."""
  salt = hashlib.md5(split.encode(), usedforsecurity=False)

  def key(i: int) -> bytes:
    h = salt.copy()
    h.update(str(i).encode())
    return h.digest()

  return sorted(range(size), key=key)


def expand_data_dir(data_dir: str | None) -> str:
  """`data_dir` with `~` expanded; None: `~/tensorflow_datasets`. A gs:// path as it is."""
  d = data_dir or "~/tensorflow_datasets"
  return d if "://" in d else os.path.expanduser(d)


def corpus_dir(data_dir: str | None, variant: str = "default") -> str:
  """`<data_dir>/numbers/<variant>/<VERSION>`, where `write_corpus` puts the files."""
  return os.path.join(expand_data_dir(data_dir), "numbers", variant, VERSION)


def corpus_files(data_dir: str | None, variant: str = "default") -> dict[str, dict[str, str]]:
  """split -> language -> path of the text files of `write_corpus`."""
  d = corpus_dir(data_dir, variant)
  return {split: {lang: os.path.join(d, f"{split}.{lang}") for lang in LANGUAGES}
          for split in SPLITS}


def write_corpus(data_dir: str | None, variant: str = "default",
                 languages: tuple[str, ...] = BASE_LANGUAGES) -> dict[str, dict[str, str]]:
  """Writes the variant's splits as text files into `data_dir`, unless already there: English
  and German always, another of `languages` (French) when asked for, its files complete once
  `<corpus_dir>/COMPLETE.<lang>` exists.

  Needs no network; `data_dir=None` means `~/tensorflow_datasets` (the data dir TFDS corpora
  share). The files are complete once `<corpus_dir>/COMPLETE` exists, which is written last, so
  an interrupted build is redone. Processes that start together on an empty local data dir
  build it once: the build holds an `flock` on `<data_dir>/numbers.lock`, and whoever gets it
  second finds the corpus written.

  Returns:
    `corpus_files(data_dir, variant)`.
  """
  if variant not in VARIANTS:
    raise ValueError(f"no numbers variant {variant!r}; variants: {', '.join(VARIANTS)}")
  files = corpus_files(data_dir, variant)
  _write_languages(data_dir, variant, files, BASE_LANGUAGES, "COMPLETE")
  for lang in languages:
    if lang not in BASE_LANGUAGES:
      _write_languages(data_dir, variant, files, (lang,), f"COMPLETE.{lang}")
  return files


def _write_languages(data_dir: str | None, variant: str, files: dict[str, dict[str, str]],
                     languages: tuple[str, ...], marker: str) -> None:
  done = storage.as_path(corpus_dir(data_dir, variant)) / marker
  if done.exists():
    return
  root = expand_data_dir(data_dir)
  lock = (contextlib.nullcontext() if storage.is_remote(root)
          else storage.local_file_lock(os.path.join(root, "numbers.lock")))
  with lock:
    if done.exists():  # whoever held the lock before built it
      return
    sizes = VARIANTS[variant]
    for split in SPLITS:
      order = stored_order(split, sizes.size(split))
      for lang in languages:
        generated = sentences(split, sizes.size(split), lang, sizes.seed)
        storage.write_atomic(files[split][lang], "".join(generated[i] + "\n" for i in order))
    storage.write_atomic(done, VERSION + "\n")


def load_numbers(split: str, data_dir: str | None,
                 variant: str = "default") -> list[tuple[str, str]]:
  """One split as (english, german) pairs in file order, written first if needed."""
  files = write_corpus(data_dir, variant)[split]
  en, de = (storage.as_path(files[lang]).read_text(encoding="utf-8").splitlines()
            for lang in BASE_LANGUAGES)
  return list(zip(en, de, strict=True))
