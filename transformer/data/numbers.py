"""The embedded corpus: English-to-German translation of numbers written as words.

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

TFDS resolves a builder's files from its module, so the builder lives here in a package module;
importing this module registers `numbers_translate` with TFDS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds
from num2words import num2words

NAME = "numbers_translate"
MAX_NUMBER = 999_999
MAX_NUMBERS_PER_SENTENCE = 4
EN_JOINER = " and then "
DE_JOINER = " und dann "
# Hash bucket (mod 10) of the numbers reserved for each held-out split; the rest is train.
# Numbers below ALWAYS_TRAIN are all in train: their words ("zero", "eleven", "forty") are
# the atoms every other number is built from, so a held-out split can only test how they
# compose, not words the model never saw ("zero" exists only as the number 0).
ALWAYS_TRAIN = 100
_TEST_BUCKET = 0
_VALIDATION_BUCKET = 1
_SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}


@dataclasses.dataclass(eq=False)
class NumbersConfig(tfds.core.BuilderConfig):
  """Sizes (in sentences) and seed of one variant of the corpus."""

  train_size: int = 200_000
  validation_size: int = 1_000
  test_size: int = 1_000
  seed: int = 0


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


class NumbersTranslate(tfds.core.GeneratorBasedBuilder):
  """English-to-German translation of numbers written as words (generated, no download)."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
    "1.0.0": "Initial release.",
    "1.1.0": "Numbers below 100 (the atomic words) are always in train.",
  }
  BUILDER_CONFIGS = [
    NumbersConfig(name="default", description="200k train, 1k validation, 1k test."),
    NumbersConfig(
      name="tiny",
      description="For tests: 2k train, 200 validation, 200 test.",
      train_size=2_000,
      validation_size=200,
      test_size=200,
    ),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict({"en": tfds.features.Text(), "de": tfds.features.Text()}),
      supervised_keys=("en", "de"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Everything is generated locally.
    cfg = self.builder_config
    return {
      "train": self._generate_examples("train", cfg.train_size, cfg.seed),
      "validation": self._generate_examples("validation", cfg.validation_size, cfg.seed),
      "test": self._generate_examples("test", cfg.test_size, cfg.seed),
    }

  def _generate_examples(self, split: str, size: int, seed: int):
    for i, (en, de) in enumerate(generate(split, size, seed)):
      yield i, {"en": en, "de": de}


def _expand(data_dir: str | None) -> str:
  d = data_dir or "~/tensorflow_datasets"
  return d if "://" in d else os.path.expanduser(d)


def build_numbers(data_dir: str | None, config_name: str = "default") -> NumbersTranslate:
  """Generates and writes the corpus into `data_dir` (TFDS layout) unless already there.

  Needs no network. `data_dir=None` means `~/tensorflow_datasets`. Processes that start
  together on an empty data dir build it once: the build holds an `flock` on
  `<data_dir>/numbers_translate.lock`, and whoever gets it second finds the corpus prepared.

  Returns:
    The builder, prepared.
  """
  from transformer import storage
  from transformer.data.tfds_io import import_tensorflow

  import_tensorflow()  # Hides GPUs from TensorFlow before TFDS uses it.
  data_dir = _expand(data_dir)
  builder = NumbersTranslate(config=config_name, data_dir=data_dir)
  if builder.is_prepared():
    return builder
  lock = (contextlib.nullcontext() if storage.is_remote(data_dir)
          else storage.local_file_lock(os.path.join(data_dir, f"{NAME}.lock")))
  with lock:
    # Whoever held the lock before may have built it: look again, with a fresh builder.
    builder = NumbersTranslate(config=config_name, data_dir=data_dir)
    if not builder.is_prepared():
      # Statistics over text features are slow and unused here.
      download_config = tfds.download.DownloadConfig(
        compute_stats=tfds.download.ComputeStatsMode.SKIP, try_download_gcs=False
      )
      builder.download_and_prepare(download_config=download_config)
  return builder


def load_numbers(
  split: str, data_dir: str | None, config_name: str = "default"
) -> list[tuple[str, str]]:
  """Reads one split as (english, german) pairs in file order, building it first if needed."""
  from transformer.data.tfds_io import SplitReader

  return SplitReader(build_numbers(data_dir, config_name), "en", "de").read_pairs(split)
