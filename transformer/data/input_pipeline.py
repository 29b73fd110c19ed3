"""Input pipeline: TFDS translation pairs -> SentencePiece ids -> fixed-shape batches.

Reading uses TFDS/tf.data on the host only (TensorFlow never sees a GPU); everything after
that is NumPy. The training split is streamed once to sample the vocabulary's training text,
once more to tokenize it into a cache of flat arrays (`token_cache`), and on every later start
the cache is memory-mapped: no training sentence is held as a Python string. Training batch
`step` is a pure function of `(config.seed, step)`, the same whether the ids come from the cache
or from a fresh tokenization, and independent of the number of devices.

Batches are dicts of int32 arrays `inputs` and `targets`, both `[rows, L]`, where `L` is one of
`config.data.bucket_lengths` (the smallest that holds both sides of every example in the batch)
and padding is 0. Padding rows (to keep shapes fixed) are all zeros, so a loss that ignores
token 0 ignores them. Every sequence ends with EOS (1).

With `config.data.packing`, training batches are packed instead (`packing.PackedBatches`):
rows of fixed lengths `packed_source_len` / `packed_target_len` that hold several pairs each,
with segment and position keys; see transformer/data/packing.py. Evaluation batches are never
packed.

Lengths (in tokens, EOS included):
  * training examples longer than `max_source_len` / `max_target_len`, or with a side longer
    than the largest bucket, are dropped;
  * evaluation examples are never dropped: a side longer than its limit (or than the largest
    bucket) is truncated, keeping EOS as its last token. Score BLEU against the untruncated
    reference strings (see `eval_batches`'s `indices`).

Config fields read: `dataset`, `data_dir`, `seed`, and in `data`: `source_lang`, `target_lang`,
`download` (optional, default False), `numbers_variant` (optional, 'default' or 'tiny'),
`vocab_size`, `spm_train_sentences`, `max_source_len`, `max_target_len`, `tokens_per_batch`,
`bucket_lengths`, `eval_batch_size`, `cache_dir` (optional), `packing` (optional, default
False), `packed_source_len` and `packed_target_len` (when packing).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer import storage
from transformer.data import corpora, plan_cache, token_cache
from transformer.data.batch_rows import check_process, padded_rows, process_rows
from transformer.data.corpora import Reader
from transformer.data.errors import DataError
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.data.packing import PackedBatches
from transformer.data.token_cache import TokenizedSplit
from transformer.data.tokenizer import SOURCE, TARGET, Tokenizer, VocabSizeError, truncate

SPLITS = ("train", "validation", "test")

Batch = dict[str, np.ndarray]


def open_reader(config: Any) -> Reader:
  """The corpus of `config.dataset`, checked before any work (see `corpora.open_corpus`)."""
  return corpora.open_corpus(config)


def load_splits(config: Any) -> dict[str, list[tuple[str, str]]]:
  """All three splits as (source, target) strings, in file order: for small corpora only.

  Training reads the training split through `build_pipeline`, which never holds it as strings.
  """
  reader = open_reader(config)
  return {split: reader.read_pairs(split) for split in SPLITS}


def vocabulary_sample(reader: Reader, n: int, seed: int) -> Iterator[bytes]:
  """Both sides of `n` training pairs drawn without replacement with `seed`, in file order.

  The pairs are chosen by index and picked out of the stream, so the corpus is never held in
  memory.
  """
  total = reader.num_examples("train")
  n = min(n, total)
  rng = np.random.default_rng([seed, 1])
  chosen = np.sort(rng.choice(total, size=n, replace=False))
  base = 0
  for src, tgt in reader.chunks("train"):
    lo, hi = np.searchsorted(chosen, [base, base + len(src)])
    for i in (chosen[lo:hi] - base).tolist():
      yield src[i]
      yield tgt[i]
    base += len(src)
    if hi == n:
      return


def vocab_path(workdir: str | os.PathLike) -> str:
  """`<workdir>/vocab/spm.model`: the SentencePiece model training makes."""
  return os.fspath(storage.as_path(workdir) / "vocab" / "spm.model")


def marian_vocab_path(workdir: str | os.PathLike) -> str:
  """`<workdir>/vocab/marian/`: an imported OPUS-MT model's vocabulary (source.spm,
  target.spm, vocab.json; data/marian_tokenizer.py)."""
  return os.fspath(storage.as_path(workdir) / "vocab" / "marian")


def stored_tokenizer(workdir: str | os.PathLike) -> Tokenizer | MarianTokenizer | None:
  """The workdir's vocabulary, of the kind its location says (`marian_vocab_path` or
  `vocab_path`); None if it has neither."""
  marian = storage.as_path(marian_vocab_path(workdir))
  if (marian / "vocab.json").exists():
    return MarianTokenizer.load(marian)
  if storage.as_path(vocab_path(workdir)).exists():
    return Tokenizer.load(vocab_path(workdir))
  return None


def get_tokenizer(config: Any, workdir: str, reader: Reader | None, *,
                  builder: bool = True, wait_timeout: float = 4 * 3600
                  ) -> Tokenizer | MarianTokenizer:
  """Loads `<workdir>/vocab/spm.model`, or trains it on a sample of the training pairs; an
  imported OPUS-MT vocabulary (`marian_vocab_path`) is loaded instead where there is one.

  The vocabulary has exactly `config.data.vocab_size` ids (else `DataError`: a stored one of
  another size, or a training text too small for that many pieces).

  The sample is `config.data.spm_train_sentences` pairs (both sides) drawn with
  `config.seed` (`vocabulary_sample`), so training is deterministic and a resumed run reuses
  the stored vocabulary. Only a `builder` process (process 0) trains; the others wait for
  its file. An imported vocabulary was not trained on the corpus, so it is not keyed by it.

  The vocabulary is keyed by the corpus: `<workdir>/vocab/corpus.sha256` holds the reader's
  fingerprint (the files' contents for a text corpus), and a stored vocabulary of another
  corpus (e.g. an edited file) is a `DataError`, never silently reused.
  """
  if (storage.as_path(marian_vocab_path(workdir)) / "vocab.json").exists():
    tok = MarianTokenizer.load(marian_vocab_path(workdir))
    if tok.vocab_size != config.data.vocab_size:
      raise DataError(f"{tok.path} has {tok.vocab_size} ids but config.data.vocab_size is "
                      f"{config.data.vocab_size}: use the workdir's config")
    return tok
  path = storage.as_path(vocab_path(workdir))
  corpus = path.parent / "corpus.sha256"
  if not builder:
    storage.wait_for(path, wait_timeout, "the vocabulary")
  fingerprint = reader.fingerprint() if reader is not None and builder else None
  if path.exists():
    tok = Tokenizer.load(path)
    if fingerprint is not None:
      if not corpus.exists():  # a workdir from before the key was kept: adopt it
        storage.write_atomic(corpus, fingerprint)
      elif corpus.read_text().strip() != fingerprint:
        raise DataError(
          f"{path} was trained on other data than {config.dataset!r} is now (a changed file or "
          "split): use a new --workdir, or delete its vocab/, cache/ and checkpoints/"
        )
  else:
    if reader is None or reader.num_examples("train") == 0:
      raise DataError("cannot train a vocabulary: the training split is empty")
    texts = vocabulary_sample(reader, int(config.data.spm_train_sentences), config.seed)
    try:
      tok = Tokenizer.train(texts, os.fspath(path)[: -len(".model")], config.data.vocab_size,
                            seed=config.seed)
    except VocabSizeError as e:
      raise DataError(
        f"config.data.vocab_size={config.data.vocab_size} is too large for the "
        f"{config.dataset} training sample: SentencePiece can make at most {e.max_size} pieces"
      ) from None
    if fingerprint is not None:
      storage.write_atomic(corpus, fingerprint)
  if tok.vocab_size != config.data.vocab_size:
    raise DataError(
      f"{path} has {tok.vocab_size} ids but config.data.vocab_size is "
      f"{config.data.vocab_size}: use a new workdir or a matching vocab_size"
    )
  return tok


def tokenize_pairs(
  tokenizer: Tokenizer | MarianTokenizer, pairs: Sequence[tuple[str, str]], chunk: int = 65536
) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Encodes (source, target) strings into two lists of int32 id arrays ending in EOS."""
  src: list[np.ndarray] = []
  tgt: list[np.ndarray] = []
  for start in range(0, len(pairs), chunk):  # Chunks bound the Python lists alive at once.
    part = pairs[start : start + chunk]
    for out, index, side in ((src, 0, SOURCE), (tgt, 1, TARGET)):
      ids = tokenizer.encode_batch([p[index] for p in part], side=side)
      out.extend(np.asarray(x, np.int32) for x in ids)
  return src, tgt


AUTO = "auto"
AUTO_BUCKETS = 8  # bucket lengths derived for `data.bucket_lengths='auto'`
BUCKET_MULTIPLE = 8


def derive_buckets(longest: np.ndarray, count: int = AUTO_BUCKETS,
                   multiple: int = BUCKET_MULTIPLE) -> list[int]:
  """At most `count` bucket lengths, multiples of `multiple`, that pad a length distribution
  least: they minimise the padded positions sum_i b(longest[i]), b(l) the smallest bucket >= l,
  which is what every example costs in a token-budget batch of its bucket. The last bucket
  holds the longest example.

  Exact, by dynamic programming over the distinct lengths rounded up to `multiple` (M of them,
  O(n + count * M^2) time, O(count * M) memory). Quantiles (as many examples in each bucket)
  would put a long tail into one bucket of the longest length.

  Args:
    longest: [n] length of each example (the longer of its two sides), n >= 1.
  """
  if count < 1 or multiple < 1:
    raise ValueError(f"derive_buckets needs count >= 1 and multiple >= 1, got {count}, {multiple}")
  units = -(-np.asarray(longest, np.int64) // multiple)  # lengths in multiples, rounded up
  if units.size == 0 or units.min() < 1:
    raise ValueError("derive_buckets needs at least one example, every length >= 1")
  histogram = np.bincount(units)  # one pass over the n lengths, no sort
  lengths = np.flatnonzero(histogram) * multiple  # [M], ascending
  counts = histogram[histogram > 0]
  fewer = np.concatenate([[0], np.cumsum(counts)])  # fewer[j]: examples of the j shortest
  m = len(lengths)
  best = np.concatenate([[0.0], np.full(m, np.inf)])  # best[j]: least padding of the j shortest
  choices = []  # per bucket added: where the last bucket starts, for each j
  for _ in range(min(count, m)):
    new, start = np.full(m + 1, np.inf), np.zeros(m + 1, np.int64)
    for j in range(1, m + 1):  # the last bucket, of lengths[j - 1], holds lengths i .. j - 1
      total = best[:j] + (fewer[j] - fewer[:j]) * lengths[j - 1]
      start[j] = np.argmin(total)
      new[j] = total[start[j]]
    best = new
    choices.append(start)
  # Fewer buckets never pad less, so `count` of them (or all M) end at the longest length.
  buckets, end = [], m
  for start in reversed(choices):
    buckets.append(int(lengths[end - 1]))
    end = int(start[end])
    if end == 0:
      break
  return sorted(buckets)


def explicit_buckets(config: Any) -> list[int] | None:
  """`data.bucket_lengths` when the config lists them; None for 'auto'."""
  value = config.data.bucket_lengths
  if isinstance(value, str):
    if value != AUTO:
      raise ValueError(f"config.data.bucket_lengths must be {AUTO!r} or a list, got {value!r}")
    return None
  buckets = [int(b) for b in value]
  if not buckets or buckets != sorted(set(buckets)) or buckets[0] < 1:
    raise ValueError(f"config.data.bucket_lengths must be increasing positive ints, got {buckets}")
  return buckets


def resolve_buckets(config: Any, split: TokenizedSplit) -> list[int]:
  """The config's bucket lengths, or for 'auto' the ones `derive_buckets` finds in the training
  split's pairs within the length limits (read from the token cache's offsets once, and kept
  beside the cache)."""
  buckets = explicit_buckets(config)
  if buckets is not None:
    return buckets
  limits = (int(config.data.max_source_len), int(config.data.max_target_len))

  def derive() -> list[int]:
    src, tgt = split.source_lengths(), split.target_lengths()
    keep = (src <= limits[0]) & (tgt <= limits[1])
    if not keep.any():
      raise DataError("no training example fits config.data.max_source_len/max_target_len")
    return derive_buckets(np.maximum(src, tgt)[keep])

  # Kept beside the token cache: a restart does not pass over the corpus's lengths again.
  # `minpad` names the method, so that buckets an older rule derived are not taken for these.
  key = f"buckets-minpad-{limits[0]}-{limits[1]}-{AUTO_BUCKETS}-{BUCKET_MULTIPLE}"
  return [int(b) for b in plan_cache.remembered(split.directory, key, derive)]


BUCKETS_FILE = "buckets.json"


def save_buckets(workdir: str | os.PathLike, buckets: Sequence[int]) -> None:
  """Records the run's bucket lengths in `<workdir>/buckets.json` (once resolved, the same for
  training, evaluation, averaging and translation)."""
  import json

  path = storage.as_path(workdir) / BUCKETS_FILE
  text = json.dumps([int(b) for b in buckets])
  if not path.exists() or path.read_text() != text:
    storage.write_atomic(path, text)


def workdir_buckets(config: Any, workdir: str | os.PathLike) -> list[int]:
  """The bucket lengths the workdir's run trained with (`save_buckets`), or for a workdir
  without them the config's (for 'auto', powers of two up to the length limits)."""
  import json

  path = storage.as_path(workdir) / BUCKETS_FILE
  if path.exists():
    return [int(b) for b in json.loads(path.read_text())]
  return _buckets(config)


def _buckets(config: Any) -> list[int]:
  """Explicit bucket lengths, or for 'auto' (no training split at hand) powers of two up to the
  length limits."""
  buckets = explicit_buckets(config)
  if buckets is None:
    limit = max(int(config.data.max_source_len), int(config.data.max_target_len))
    buckets = [2**k for k in range(4, max(4, (limit - 1).bit_length()) + 1)]
  return buckets


@dataclasses.dataclass
class _EpochPlan:
  order: np.ndarray  # [num_examples] example ids, grouped by bucket.
  bucket: np.ndarray  # [steps] bucket of each batch, in the epoch's batch order.
  start: np.ndarray  # [steps] first position of each batch in `order`.
  end: np.ndarray  # [steps] one past its last position.


class TrainBatches:
  """Training batches as a pure function of (config.seed, step), from flat token ids.

  Epoch e draws a permutation of the examples from `np.random.default_rng([seed, e])`, groups
  the examples by length bucket (keeping the permuted order), cuts each bucket k into batches
  of B_k = max(1, tokens_per_batch // L_k) examples (the last may be partial), and shuffles the
  list of batches with the same generator. Every epoch has the same number of steps, because
  the number of examples in each bucket does not change.

  The plan does not depend on the devices: a batch's rows are padded with all-zero rows up to
  a multiple of `batch_multiple` (the data-parallel size), never cut, so 1 device and 8 train
  on the same examples, and a run can resume on another mesh.
  """

  def __init__(
    self,
    split: TokenizedSplit,
    config: Any,
    *,
    batch_multiple: int = 1,
    process_index: int = 0,
    process_count: int = 1,
    buckets: Sequence[int] | None = None,
  ):
    """Filters the examples by length; the ids stay where they are (e.g. memory-mapped).

    Args:
      split: the tokenized training pairs, ending in EOS (e.g. from `token_cache`).
      config: reads `seed` and `data.{tokens_per_batch, bucket_lengths, max_source_len,
        max_target_len}`.
      batch_multiple: every batch has a multiple of this many rows (the number of devices the
        batch is split over); it must be a multiple of `process_count`.
      process_index, process_count: this process returns rows
        [process_index * R / process_count, (process_index + 1) * R / process_count) of each
        global batch of R rows.
      buckets: the bucket lengths; default `resolve_buckets(config, split)`.
    """
    check_process(process_index, process_count)
    self.split = split
    self.seed = int(config.seed)
    self.process_index = process_index
    self.process_count = process_count
    self.buckets = list(buckets) if buckets else resolve_buckets(config, split)
    src_len, tgt_len = split.source_lengths(), split.target_lengths()
    longest = np.maximum(src_len, tgt_len)
    keep = (
      (src_len <= config.data.max_source_len)
      & (tgt_len <= config.data.max_target_len)
      & (longest <= self.buckets[-1])
    )
    self.example_ids = np.flatnonzero(keep)  # Kept example -> index in `split`.
    self.num_examples = len(self.example_ids)
    self.num_dropped = len(split) - self.num_examples
    if self.num_examples == 0:
      raise DataError(
        "no training example fits config.data.max_source_len/max_target_len/bucket_lengths"
      )
    self._bucket = np.searchsorted(self.buckets, longest[keep], side="left").astype(np.int32)
    tokens = int(config.data.tokens_per_batch)
    self.batch_sizes = [max(1, tokens // L) for L in self.buckets]  # examples per batch
    self.rows = [padded_rows(b, batch_multiple, process_count) for b in self.batch_sizes]
    self._bucket_count = np.bincount(self._bucket, minlength=len(self.buckets))
    self._batches_per_bucket = [
      math.ceil(n / b) for n, b in zip(self._bucket_count.tolist(), self.batch_sizes, strict=True)
    ]
    self.steps_per_epoch = sum(self._batches_per_bucket)
    self._plans: dict[int, _EpochPlan] = {}

  def shapes(self) -> list[tuple[int, int]]:
    """(global rows, length) of every batch shape that occurs, shortest first."""
    return [
      (r, L)
      for r, L, n in zip(self.rows, self.buckets, self._bucket_count.tolist(), strict=True)
      if n
    ]

  def real_token_fraction(self) -> float:
    """Fraction of the batches' positions (both sides, over an epoch) that are not padding."""
    src = self.split.source_lengths()[self.example_ids].sum()
    tgt = self.split.target_lengths()[self.example_ids].sum()
    positions = sum(n * r * L for n, r, L in zip(self._batches_per_bucket, self.rows,
                                                  self.buckets, strict=True))
    return float(src + tgt) / (2 * positions)

  def _plan(self, epoch: int) -> _EpochPlan:
    plan = self._plans.get(epoch)
    if plan is not None:
      return plan
    rng = np.random.default_rng([self.seed, epoch])
    perm = rng.permutation(self.num_examples)
    order = perm[np.argsort(self._bucket[perm], kind="stable")]
    bucket, start, end = [], [], []
    first = 0
    for k, (n, b) in enumerate(zip(self._bucket_count.tolist(), self.batch_sizes, strict=True)):
      starts = np.arange(first, first + n, b, dtype=np.int64)
      bucket.append(np.full(len(starts), k, np.int64))
      start.append(starts)
      end.append(np.minimum(starts + b, first + n))
      first += n
    shuffle = rng.permutation(self.steps_per_epoch)
    plan = _EpochPlan(
      order=order,
      bucket=np.concatenate(bucket)[shuffle],
      start=np.concatenate(start)[shuffle],
      end=np.concatenate(end)[shuffle],
    )
    if len(self._plans) >= 2:  # Training walks epochs in order: keep the current and next.
      self._plans.pop(min(self._plans))
    self._plans[epoch] = plan
    return plan

  def _rows(self, step: int) -> tuple[np.ndarray, int, int]:
    """Kept-example ids of this process's rows of batch `step`, its row count and length."""
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}")
    epoch, i = divmod(step, self.steps_per_epoch)
    plan = self._plan(epoch)
    k = int(plan.bucket[i])
    first, rows = process_rows(self.rows[k], self.process_index, self.process_count)
    lo = int(plan.start[i]) + first
    hi = min(lo + rows, int(plan.end[i]))
    return plan.order[lo:max(lo, hi)], rows, self.buckets[k]

  def indices(self, step: int) -> np.ndarray:
    """[rows] index (into `split`) of each of this process's rows; -1 = padding."""
    ids, rows, _ = self._rows(step)
    out = np.full(rows, -1, np.int64)
    out[: len(ids)] = self.example_ids[ids]
    return out

  def batch(self, step: int) -> Batch:
    """This process's share of global training batch `step`.

    Returns:
      {'inputs': [R_local, L] int32, 'targets': [R_local, L] int32} with
      R_local = rows_k / process_count and L = bucket_lengths[k] for the batch's bucket k.
    """
    ids, rows, length = self._rows(step)
    examples = self.example_ids[ids]
    out = {}
    for key, flat, offsets in (("inputs", self.split.source, self.split.source_offsets),
                               ("targets", self.split.target, self.split.target_offsets)):
      out[key] = _gather(flat, offsets, examples, rows, length)
    return out


def _gather(flat: np.ndarray, offsets: np.ndarray, examples: np.ndarray, rows: int,
            length: int) -> np.ndarray:
  """[rows, length] int32: example examples[r]'s ids in row r, zero-padded, zero rows after."""
  starts = np.asarray(offsets[examples], np.int64)
  lens = np.asarray(offsets[examples + 1], np.int64) - starts
  out = np.zeros((rows, length), np.int32)
  if len(examples):
    # One fancy-index read: positions [start, start + len) of every row, in row order.
    row = np.repeat(np.arange(len(examples)), lens)
    col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    out[row, col] = flat[np.repeat(starts, lens) + col]
  return out


def train_batches(split: TokenizedSplit, config: Any, *, batch_multiple: int = 1,
                  process_index: int = 0, process_count: int = 1,
                  buckets: Sequence[int] | None = None) -> TrainBatches | PackedBatches:
  """The training batches `config.data.packing` asks for: packed, or bucketed."""
  if config.data.get("packing", False):
    return PackedBatches(split, config, batch_multiple=batch_multiple,
                         process_index=process_index, process_count=process_count)
  return TrainBatches(split, config, batch_multiple=batch_multiple, process_index=process_index,
                      process_count=process_count, buckets=buckets)


def eval_batches(
  pairs_ids: Sequence[tuple[np.ndarray | Sequence[int], np.ndarray | Sequence[int]]],
  config: Any,
  batch_multiple: int,
  *,
  process_index: int = 0,
  process_count: int = 1,
  buckets: Sequence[int] | None = None,
) -> list[Batch]:
  """Fixed-shape evaluation batches covering every example exactly once.

  Examples are sorted by length (so batches are padded little), truncated to the length limits
  (EOS kept last), and cut into batches of B = eval_batch_size rounded up to a multiple of
  `batch_multiple`; the last batch is filled with all-zero rows.

  Args:
    pairs_ids: (source ids, target ids) per example, ending in EOS.
    config: reads `data.{eval_batch_size, bucket_lengths, max_source_len, max_target_len}`.
    batch_multiple: as for `TrainBatches`; a multiple of `process_count`.
    process_index, process_count: this process gets rows [i * B / P, (i + 1) * B / P).
    buckets: the bucket lengths (e.g. the training batches'); default: the config's, or for
      'auto' powers of two.

  Returns:
    A list of {'inputs': [B_local, L] int32, 'targets': [B_local, L] int32,
    'indices': [B_local] int32}, where `indices` is each row's position in `pairs_ids` (-1 for
    a padding row) and L is the smallest bucket length that holds the batch.
  """
  buckets = list(buckets) if buckets else _buckets(config)
  rows = padded_rows(int(config.data.eval_batch_size), batch_multiple, process_count)
  src_limit = min(int(config.data.max_source_len), buckets[-1])
  tgt_limit = min(int(config.data.max_target_len), buckets[-1])
  src = [truncate(np.asarray(s, np.int32), src_limit) for s, _ in pairs_ids]
  tgt = [truncate(np.asarray(t, np.int32), tgt_limit) for _, t in pairs_ids]
  longest = np.array([max(len(s), len(t)) for s, t in zip(src, tgt, strict=True)], np.int64)
  order = np.argsort(longest, kind="stable")
  first, local = process_rows(rows, process_index, process_count)
  out = []
  for start in range(0, len(order), rows):
    chunk = order[start : start + rows]
    length = buckets[int(np.searchsorted(buckets, longest[chunk].max(), side="left"))]
    mine = chunk[first : first + local]
    batch = {
      "inputs": np.zeros((local, length), np.int32),
      "targets": np.zeros((local, length), np.int32),
      "indices": np.full(local, -1, np.int32),
    }
    for r, e in enumerate(mine.tolist()):
      batch["inputs"][r, : len(src[e])] = src[e]
      batch["targets"][r, : len(tgt[e])] = tgt[e]
      batch["indices"][r] = e
    out.append(batch)
  return out


@dataclasses.dataclass
class Pipeline:
  """Everything training needs from the data layer (see `build_pipeline`)."""

  tokenizer: Tokenizer
  train: TrainBatches | PackedBatches
  # Bucket lengths of evaluation and decoding (and of bucketed training batches): the config's,
  # or derived from the training split for 'auto'.
  buckets: list[int]
  eval: dict[str, list[Batch]]  # 'validation' and 'test' batches (this process's rows).
  references: dict[str, list[tuple[str, str]]]  # 'validation' and 'test' (source, target).


def evaluation_data(config: Any, reader: Reader, tokenizer: Tokenizer, batch_multiple: int,
                    *, process_index: int = 0, process_count: int = 1,
                    buckets: Sequence[int] | None = None,
                    ) -> tuple[dict[str, list[Batch]], dict[str, list[tuple[str, str]]]]:
  """Batches (this process's rows) and reference pairs of 'validation' and 'test'."""
  evals, references = {}, {}
  for name in ("validation", "test"):
    references[name] = reader.read_pairs(name)
    s, t = tokenize_pairs(tokenizer, references[name])
    evals[name] = eval_batches(list(zip(s, t, strict=True)), config, batch_multiple,
                               process_index=process_index, process_count=process_count,
                               buckets=buckets)
  return evals, references


def build_pipeline(
  config: Any,
  workdir: str,
  *,
  batch_multiple: int,
  process_index: int = 0,
  process_count: int = 1,
  reader: Reader | None = None,
) -> Pipeline:
  """`open_reader` -> `get_tokenizer` -> cached tokenized training split -> batches.

  Process 0 trains the vocabulary and builds the token cache when they are missing; other
  processes wait for them. The evaluation splits are small and read into memory.
  """
  reader = reader or open_reader(config)
  builder = process_index == 0
  tok = get_tokenizer(config, workdir, reader, builder=builder)
  split = token_cache.load_or_build(reader, "train", tok, token_cache.cache_root(config, workdir),
                                    builder=builder)
  buckets = resolve_buckets(config, split)
  if explicit_buckets(config) is None:
    logging.info("bucket lengths derived from the training split: %s", buckets)
  train = train_batches(split, config, batch_multiple=batch_multiple,
                        process_index=process_index, process_count=process_count, buckets=buckets)
  evals, references = evaluation_data(config, reader, tok, batch_multiple,
                                      process_index=process_index, process_count=process_count,
                                      buckets=buckets)
  logging.info("training pairs: %s kept, %s longer than the limits; real tokens %.1f%% of the "
               "batches", f"{train.num_examples:,}", f"{train.num_dropped:,}",
               100 * train.real_token_fraction())
  return Pipeline(tokenizer=tok, train=train, buckets=buckets, eval=evals,
                  references=references)
