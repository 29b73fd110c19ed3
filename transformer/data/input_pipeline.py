"""Input pipeline: TFDS translation pairs -> SentencePiece ids -> fixed-shape batches.

Reading uses TFDS/tf.data on the host only (TensorFlow never sees a GPU); everything after
that is NumPy. The training set is tokenized once and kept in memory as flat int32 arrays, and
training batch `step` is a pure function of `(config.seed, step)`, so that resuming from a
checkpoint at step `s` continues with exactly the batches an uninterrupted run would see.

Batches are dicts of int32 arrays `inputs` and `targets`, both `[rows, L]`, where `L` is one of
`config.data.bucket_lengths` (the smallest that holds both sides of every example in the batch)
and padding is 0. Padding rows (to keep shapes fixed) are all zeros, so a loss that ignores
token 0 ignores them. Every sequence ends with EOS (1).

Lengths (in tokens, EOS included):
  * training examples longer than `max_source_len` / `max_target_len`, or with a side longer
    than the largest bucket, are dropped;
  * evaluation examples are never dropped: a side longer than its limit (or than the largest
    bucket) is truncated, keeping EOS as its last token. Score BLEU against the untruncated
    reference strings (see `eval_batches`'s `indices`).

Config fields read: `dataset`, `data_dir`, `seed`, and in `data`: `source_lang`, `target_lang`,
`download` (optional, default False), `numbers_variant` (optional, 'default' or 'tiny'),
`vocab_size`, `spm_train_sentences`, `max_source_len`,
`max_target_len`, `tokens_per_batch`, `bucket_lengths`, `eval_batch_size`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer.data.errors import DataError
from transformer.data.tokenizer import EOS_ID, Tokenizer, VocabSizeError

SPLITS = ("train", "validation", "test")
WMT14_NAME = "wmt14_translate/de-en"
_LANGS = ("en", "de")
_READ_BATCH = 4096

Batch = dict[str, np.ndarray]


def import_tensorflow() -> Any:
  """Imports TensorFlow for tf.data on the host, hiding every GPU from it first."""
  import tensorflow as tf

  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:
    pass  # TF is already initialised; the first call of this function hid the GPUs.
  return tf


def data_dir_of(config: Any) -> str:
  """The TFDS data directory: `config.data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  d = config.get("data_dir") or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
  return os.path.expanduser(d)


def _language_pair(config: Any) -> tuple[str, str]:
  src, tgt = config.data.source_lang, config.data.target_lang
  if sorted((src, tgt)) != sorted(_LANGS):
    raise DataError(
      "config.data.source_lang and config.data.target_lang must be 'en' and 'de' "
      f"(either order), got {src!r} and {tgt!r}"
    )
  return src, tgt


def read_pairs(ds: Any, source_key: str, target_key: str) -> list[tuple[str, str]]:
  """Reads a tf.data dataset of text dicts into (source, target) strings, in order."""
  import tensorflow_datasets as tfds

  pairs: list[tuple[str, str]] = []
  for ex in tfds.as_numpy(ds.batch(_READ_BATCH)):
    src = [s.decode("utf-8") for s in ex[source_key]]
    tgt = [s.decode("utf-8") for s in ex[target_key]]
    pairs.extend(zip(src, tgt, strict=True))
  return pairs


def read_split(builder: Any, split: str, source_key: str, target_key: str) -> list[tuple[str, str]]:
  """Reads one split of a TFDS text builder as (source, target) strings, deterministically.

  Prepared TFRecord data is read directly, parsing whole batches of records at once: TFDS
  parses one example at a time (~10k/s here), which takes minutes for WMT's 4.5M pairs.
  Anything else (other file formats, `tfds.testing.mock_data`) goes through `as_dataset`.
  """
  import tensorflow_datasets as tfds

  tf = import_tensorflow()
  info = builder.info
  serialized = info.features.get_serialized_info()
  fast = (
    builder.is_prepared()
    and info.file_format == tfds.core.FileFormat.TFRECORD
    and all(
      k in serialized and getattr(serialized[k], "dtype", None) == tf.string
      for k in (source_key, target_key)
    )
  )
  if not fast:
    return read_pairs(builder.as_dataset(split=split, shuffle_files=False), source_key, target_key)
  files = [os.fspath(f) for f in info.splits[split].filepaths]
  spec = {k: tf.io.FixedLenFeature([], tf.string) for k in (source_key, target_key)}
  ds = tf.data.TFRecordDataset(files).batch(_READ_BATCH)
  ds = ds.map(lambda records: tf.io.parse_example(records, spec))
  pairs: list[tuple[str, str]] = []
  for ex in ds.as_numpy_iterator():
    src = [s.decode("utf-8") for s in ex[source_key]]
    tgt = [s.decode("utf-8") for s in ex[target_key]]
    pairs.extend(zip(src, tgt, strict=True))
  return pairs


def _load_wmt14(config: Any, src: str, tgt: str) -> dict[str, list[tuple[str, str]]]:
  import_tensorflow()
  import tensorflow_datasets as tfds

  data_dir = data_dir_of(config)
  builder = tfds.builder(WMT14_NAME, data_dir=data_dir)
  # Offline, a download retries for minutes: only try it when the user asks.
  if config.data.get("download", False) and not builder.is_prepared():
    builder.download_and_prepare()
  if not builder.is_prepared():
    try:
      builder.as_dataset(split="validation")  # Checks for data (and works under mock_data).
    except AssertionError:  # TFDS: "could not find data in <dir>".
      raise DataError(
        f"{WMT14_NAME} is not prepared in {data_dir}: run `tfds build {WMT14_NAME} "
        f"--data_dir={data_dir}` on a machine with internet, then pass "
        f"--config.data_dir={data_dir}"
      ) from None
  # validation is newstest2013, test is newstest2014. The files hold (de, en): the keys pick
  # the direction.
  return {split: read_split(builder, split, src, tgt) for split in SPLITS}


def load_splits(config: Any) -> dict[str, list[tuple[str, str]]]:
  """Reads the train, validation and test splits as (source, target) strings.

  `config.dataset` 'numbers' generates the embedded corpus into the data dir if it is not
  there yet (offline; ~20 s for the default 200k pairs, ~1 s for the optional
  `config.data.numbers_variant='tiny'`).

  'wmt14' reads prepared `wmt14_translate/de-en` (validation is newstest2013, test
  newstest2014) and raises `DataError` at once if it is not prepared, unless
  `config.data.download` allows TFDS to download and prepare it.

  Returns:
    {'train': [...], 'validation': [...], 'test': [...]}, each a list of (source, target) in
    the direction `config.data.source_lang` -> `config.data.target_lang`, in file order.
  """
  src, tgt = _language_pair(config)
  if config.dataset == "numbers":
    from transformer.data import numbers

    data_dir = data_dir_of(config)
    variant = config.data.get("numbers_variant", "default")
    if variant not in numbers.NumbersTranslate.builder_configs:
      raise DataError(
        f"config.data.numbers_variant must be one of "
        f"{sorted(numbers.NumbersTranslate.builder_configs)}, got {variant!r}"
      )
    numbers.build_numbers(data_dir, variant)
    out = {}
    for split in SPLITS:
      pairs = numbers.load_numbers(split, data_dir, variant)  # (en, de)
      out[split] = pairs if src == "en" else [(d, e) for e, d in pairs]
    return out
  if config.dataset == "wmt14":
    return _load_wmt14(config, src, tgt)
  raise DataError(f"config.dataset must be 'numbers' or 'wmt14', got {config.dataset!r}")


def get_tokenizer(config: Any, workdir: str, train_pairs: Sequence[tuple[str, str]]) -> Tokenizer:
  """Loads `<workdir>/vocab/spm.model`, or trains it on a sample of the training pairs.

  The vocabulary has exactly `config.data.vocab_size` ids (else `DataError`: a stored one of
  another size, or a training text too small for that many pieces).

  The sample is `config.data.spm_train_sentences` pairs (both sides) drawn with
  `config.seed`, so training is deterministic: processes sharing a workdir write identical
  files (atomically), and a resumed run reuses the stored vocabulary.
  """
  path = os.path.join(workdir, "vocab", "spm.model")
  if os.path.exists(path):
    tok = Tokenizer.load(path)
  else:
    if not train_pairs:
      raise DataError("cannot train a vocabulary: the training split is empty")
    n = min(int(config.data.spm_train_sentences), len(train_pairs))
    rng = np.random.default_rng([config.seed, 1])
    idx = np.sort(rng.choice(len(train_pairs), size=n, replace=False))
    texts = (s for i in idx.tolist() for s in train_pairs[i])
    try:
      tok = Tokenizer.train(
        texts,
        os.path.join(workdir, "vocab", "spm"),
        config.data.vocab_size,
        seed=config.seed,
      )
    except VocabSizeError as e:
      raise DataError(
        f"config.data.vocab_size={config.data.vocab_size} is too large for the "
        f"{config.dataset} training sample: SentencePiece can make at most {e.max_size} pieces"
      ) from None
  if tok.vocab_size != config.data.vocab_size:
    raise DataError(
      f"{path} has {tok.vocab_size} ids but config.data.vocab_size is "
      f"{config.data.vocab_size}: use a new workdir or a matching vocab_size"
    )
  return tok


def tokenize_pairs(
  tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]], chunk: int = 65536
) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Encodes (source, target) strings into two lists of int32 id arrays ending in EOS."""
  src: list[np.ndarray] = []
  tgt: list[np.ndarray] = []
  for start in range(0, len(pairs), chunk):  # Chunks bound the Python lists alive at once.
    part = pairs[start : start + chunk]
    for out, side in ((src, 0), (tgt, 1)):
      ids = tokenizer.encode_batch([p[side] for p in part])
      out.extend(np.asarray(x, np.int32) for x in ids)
  return src, tgt


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Concatenated int32 tokens [total] and int64 offsets [n + 1] of a list of sequences."""
  lengths = np.fromiter((len(s) for s in seqs), np.int64, count=len(seqs))
  offsets = np.zeros(len(seqs) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  if seqs and all(isinstance(s, np.ndarray) for s in seqs):
    flat = np.concatenate(seqs).astype(np.int32, copy=False)
  else:
    flat = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, count=int(offsets[-1]))
  return flat, offsets


def _buckets(config: Any) -> list[int]:
  buckets = [int(b) for b in config.data.bucket_lengths]
  if not buckets or buckets != sorted(set(buckets)) or buckets[0] < 1:
    raise ValueError(f"config.data.bucket_lengths must be increasing positive ints, got {buckets}")
  return buckets


def _round_batch(rows: int, batch_multiple: int, process_count: int) -> int:
  if batch_multiple < 1 or batch_multiple % process_count:
    raise ValueError(
      f"batch_multiple={batch_multiple} must be a positive multiple of "
      f"process_count={process_count}"
    )
  return max(batch_multiple, rows // batch_multiple * batch_multiple)


@dataclasses.dataclass
class _EpochPlan:
  order: np.ndarray  # [num_examples] example ids, grouped by bucket.
  bucket: np.ndarray  # [steps] bucket of each batch, in the epoch's batch order.
  start: np.ndarray  # [steps] first position of each batch in `order`.
  end: np.ndarray  # [steps] one past its last position.


class TrainBatches:
  """Training batches as a pure function of (config.seed, step), from in-memory ids.

  Epoch e draws a permutation of the examples from `np.random.default_rng([seed, e])`, groups
  the examples by length bucket (keeping the permuted order), cuts each bucket k into batches
  of B_k rows (the last may be partial and is padded with zero rows), and shuffles the list of
  batches with the same generator. B_k = tokens_per_batch // L_k rounded down to a multiple of
  `batch_multiple` (at least `batch_multiple`), so a batch has at most tokens_per_batch
  positions per side unless even `batch_multiple` rows exceed it. Every epoch has the same
  number of steps, because the number of examples in each bucket does not change.
  """

  def __init__(
    self,
    src_ids: Sequence[np.ndarray | Sequence[int]],
    tgt_ids: Sequence[np.ndarray | Sequence[int]],
    config: Any,
    *,
    batch_multiple: int,
    process_index: int = 0,
    process_count: int = 1,
  ):
    """Filters and stores the examples.

    Args:
      src_ids, tgt_ids: per example, the ids of each side (ending in EOS), e.g. from
        `tokenize_pairs`; only the kept examples are copied, so the caller may drop these.
      config: reads `seed` and `data.{tokens_per_batch, bucket_lengths, max_source_len,
        max_target_len}`.
      batch_multiple: every global batch size is a multiple of this (the number of devices the
        batch is split over); it must be a multiple of `process_count`.
      process_index, process_count: this process returns rows
        [process_index * B / process_count, (process_index + 1) * B / process_count).
    """
    if len(src_ids) != len(tgt_ids):
      raise ValueError(f"{len(src_ids)} source but {len(tgt_ids)} target sequences")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    self.seed = int(config.seed)
    self.process_index = process_index
    self.process_count = process_count
    self.buckets = _buckets(config)
    src_len = np.fromiter((len(s) for s in src_ids), np.int64, count=len(src_ids))
    tgt_len = np.fromiter((len(s) for s in tgt_ids), np.int64, count=len(tgt_ids))
    longest = np.maximum(src_len, tgt_len)
    keep = (
      (src_len <= config.data.max_source_len)
      & (tgt_len <= config.data.max_target_len)
      & (longest <= self.buckets[-1])
    )
    self.example_ids = np.flatnonzero(keep)  # Kept example -> index in the caller's lists.
    self.num_examples = len(self.example_ids)
    self.num_dropped = len(src_ids) - self.num_examples
    if self.num_examples == 0:
      raise DataError(
        "no training example fits config.data.max_source_len/max_target_len/bucket_lengths"
      )
    kept = self.example_ids.tolist()
    self._src, self._src_off = _flatten([src_ids[i] for i in kept])
    self._tgt, self._tgt_off = _flatten([tgt_ids[i] for i in kept])
    self._bucket = np.searchsorted(self.buckets, longest[keep], side="left")
    tokens = int(config.data.tokens_per_batch)
    self.batch_sizes = [
      _round_batch(tokens // L, batch_multiple, process_count) for L in self.buckets
    ]
    self._bucket_count = np.bincount(self._bucket, minlength=len(self.buckets))
    self._batches_per_bucket = [
      math.ceil(n / b) for n, b in zip(self._bucket_count.tolist(), self.batch_sizes, strict=True)
    ]
    self.steps_per_epoch = sum(self._batches_per_bucket)
    self._plans: dict[int, _EpochPlan] = {}

  def shapes(self) -> list[tuple[int, int]]:
    """(global batch size, length) of every batch shape that occurs, shortest first."""
    return [
      (b, L)
      for b, L, n in zip(self.batch_sizes, self.buckets, self._bucket_count.tolist(), strict=True)
      if n
    ]

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
      for s in range(first, first + n, b):
        bucket.append(k)
        start.append(s)
        end.append(min(s + b, first + n))
      first += n
    shuffle = rng.permutation(len(bucket))
    plan = _EpochPlan(
      order=order,
      bucket=np.asarray(bucket, np.int64)[shuffle],
      start=np.asarray(start, np.int64)[shuffle],
      end=np.asarray(end, np.int64)[shuffle],
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
    rows = self.batch_sizes[k] // self.process_count
    lo = int(plan.start[i]) + self.process_index * rows
    hi = min(lo + rows, int(plan.end[i]))
    return plan.order[lo:hi], rows, self.buckets[k]

  def indices(self, step: int) -> np.ndarray:
    """[rows] index (into the constructor's lists) of each of this process's rows; -1 = padding."""
    ids, rows, _ = self._rows(step)
    out = np.full(rows, -1, np.int64)
    out[: len(ids)] = self.example_ids[ids]
    return out

  def batch(self, step: int) -> Batch:
    """This process's share of global training batch `step`.

    Returns:
      {'inputs': [B_local, L] int32, 'targets': [B_local, L] int32} with
      B_local = B_k / process_count and L = bucket_lengths[k] for the batch's bucket k.
    """
    ids, rows, length = self._rows(step)
    inputs = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    for r, e in enumerate(ids.tolist()):
      a, b = self._src_off[e], self._src_off[e + 1]
      inputs[r, : b - a] = self._src[a:b]
      a, b = self._tgt_off[e], self._tgt_off[e + 1]
      targets[r, : b - a] = self._tgt[a:b]
    return {"inputs": inputs, "targets": targets}


def _truncate(ids: np.ndarray | Sequence[int], limit: int) -> np.ndarray:
  ids = np.asarray(ids, np.int32)
  if len(ids) <= limit:
    return ids
  return np.concatenate([ids[: limit - 1], np.array([EOS_ID], np.int32)])


def eval_batches(
  pairs_ids: Sequence[tuple[np.ndarray | Sequence[int], np.ndarray | Sequence[int]]],
  config: Any,
  batch_multiple: int,
  *,
  process_index: int = 0,
  process_count: int = 1,
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

  Returns:
    A list of {'inputs': [B_local, L] int32, 'targets': [B_local, L] int32,
    'indices': [B_local] int32}, where `indices` is each row's position in `pairs_ids` (-1 for
    a padding row) and L is the smallest bucket length that holds the batch.
  """
  buckets = _buckets(config)
  size = int(config.data.eval_batch_size)
  rows = _round_batch(-(-size // batch_multiple) * batch_multiple, batch_multiple, process_count)
  src_limit = min(int(config.data.max_source_len), buckets[-1])
  tgt_limit = min(int(config.data.max_target_len), buckets[-1])
  src = [_truncate(s, src_limit) for s, _ in pairs_ids]
  tgt = [_truncate(t, tgt_limit) for _, t in pairs_ids]
  longest = np.array([max(len(s), len(t)) for s, t in zip(src, tgt, strict=True)], np.int64)
  order = np.argsort(longest, kind="stable")
  local = rows // process_count
  out = []
  for start in range(0, len(order), rows):
    chunk = order[start : start + rows]
    length = buckets[int(np.searchsorted(buckets, longest[chunk].max(), side="left"))]
    mine = chunk[process_index * local : (process_index + 1) * local]
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
  train: TrainBatches
  eval: dict[str, list[Batch]]  # 'validation' and 'test' batches.
  references: dict[str, list[tuple[str, str]]]  # 'validation' and 'test' (source, target).


def build_pipeline(
  config: Any,
  workdir: str,
  *,
  batch_multiple: int,
  process_index: int = 0,
  process_count: int = 1,
) -> Pipeline:
  """`load_splits` -> `get_tokenizer` -> tokenize once -> `TrainBatches` and `eval_batches`."""
  splits = load_splits(config)
  tok = get_tokenizer(config, workdir, splits["train"])
  src, tgt = tokenize_pairs(tok, splits.pop("train"))
  train = TrainBatches(
    src,
    tgt,
    config,
    batch_multiple=batch_multiple,
    process_index=process_index,
    process_count=process_count,
  )
  del src, tgt
  evals = {}
  for split in ("validation", "test"):
    s, t = tokenize_pairs(tok, splits[split])
    evals[split] = eval_batches(
      list(zip(s, t, strict=True)),
      config,
      batch_multiple,
      process_index=process_index,
      process_count=process_count,
    )
  return Pipeline(tokenizer=tok, train=train, eval=evals, references=splits)
