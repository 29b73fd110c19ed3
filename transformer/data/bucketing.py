"""Length buckets: bucket lengths (given, or derived from the corpus's lengths) and the
token-budget training batches of bucketed rows (packed rows are transformer/data/packing.py).

Batches are dicts of int32 arrays `inputs` and `targets`, both `[rows, L]`, where `L` is one of
`config.data.bucket_lengths` (the smallest that holds both sides of every example in the batch)
and padding is 0. Padding rows (to keep shapes fixed) are all zeros, so a loss that ignores
token 0 ignores them. Training batch `step` is a pure function of `(config.seed, step)`,
independent of the number of devices. The bucket lengths a run resolved are kept in its
workdir (`save_buckets`), so that evaluation, averaging and translation pad to them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer import storage
from transformer import workdir as workdir_lib
from transformer.data import plan_cache
from transformer.data.batch_rows import check_process, padded_rows, process_rows
from transformer.data.errors import DataError
from transformer.data.plan_cache import AUTO
from transformer.data.token_cache import TokenizedSplit

Batch = dict[str, np.ndarray]


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


def save_buckets(workdir: str | os.PathLike, buckets: Sequence[int]) -> None:
  """Records the run's bucket lengths in `<workdir>/buckets.json` (once resolved, the same for
  training, evaluation, averaging and translation)."""
  path = workdir_lib.paths(workdir).buckets
  text = json.dumps([int(b) for b in buckets])
  if not path.exists() or path.read_text() != text:
    storage.write_atomic(path, text)


def workdir_buckets(config: Any, workdir: str | os.PathLike) -> list[int]:
  """The bucket lengths the workdir's run trained with (`save_buckets`), or for a workdir
  without them the config's (for 'auto', powers of two up to the length limits)."""
  path = workdir_lib.paths(workdir).buckets
  if path.exists():
    return [int(b) for b in json.loads(path.read_text())]
  return default_buckets(config)


def default_buckets(config: Any) -> list[int]:
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
