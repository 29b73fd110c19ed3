"""Packed training batches: several sentence pairs per row, so that few positions are padding.

With `config.data.packing`, every training batch is R rows of `packed_source_len` source and
`packed_target_len` target positions (one shape, one compile), R = max(1, tokens_per_batch //
max(packed_source_len, packed_target_len)), rounded up to the data-parallel size with all-zero
rows. Each row holds whole examples back to back; the k-th example of a row is segment k (from
1) on both sides, and padding is segment 0. Batch keys (int32, [rows, length] per side):

  inputs, targets                        token ids, 0 = padding, as unpacked batches
  inputs_segment_ids, targets_segment_ids
                                         segment of each position, 0 for padding
  inputs_position, targets_position      position inside its segment (0 at each segment start;
                                         0 for padding)

The model keeps attention inside a segment and restarts positions there (`Transformer.__call__`
takes these keys as keyword arguments); the loss ignores token 0 as before.

The plan is a pure function of (seed, step). Epoch e draws the permutation
`np.random.default_rng([seed, e])` of the kept examples and walks it step by step: a step's
candidates are the examples left over from the step before, then the next examples of the
permutation until the candidates would fill all R rows; they are placed first-fit decreasing
(longest first, ties in permuted order) into the rows where both sides fit, and those that fit
nowhere are carried to the next step. Every epoch has the steps that packing epoch 0 to its end
took; a later epoch that packs its permutation in fewer steps continues from its start again
(a few examples twice), one that needs more leaves its last examples (random ones) to the next
epoch's draw. An epoch's plan is built once, sequentially, when its first batch is asked for:
about 1 ms per step of WMT size, 4 to 12 s for the 5,900 steps of a 4.5M-pair epoch on 2 shared
CPU cores (benchmarks/results/packing.md). With a token cache, it is written beside the cache
(`plan_cache`) and memory-mapped by every later start, so a restart does not plan again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from transformer.data import plan_cache
from transformer.data.batch_rows import check_process, padded_rows, process_rows
from transformer.data.errors import DataError
from transformer.data.plan_cache import AUTO
from transformer.data.token_cache import TokenizedSplit

PACKING_KEYS = ("inputs_segment_ids", "inputs_position", "targets_segment_ids",
                "targets_position")

Batch = dict[str, np.ndarray]

# A step's candidates may hold this many times the tokens its rows can, per side: the choice
# lets first-fit fill the rows' ends, and what does not fit waits for the next step.
OVERFILL = 1.05


def packing_kwargs(batch: dict[str, Any]) -> dict[str, Any]:
  """The packing keys of `batch` (none for an unpacked batch), to pass to the model."""
  return {k: batch[k] for k in PACKING_KEYS if k in batch}


LENGTH_MULTIPLE = 8


def packed_target_len(config: Any, src_len: np.ndarray, tgt_len: np.ndarray) -> int:
  """`data.packed_target_len`, or for 'auto' the source rows' length scaled by the corpus's
  target/source token ratio (over the pairs within the length limits), rounded up to a multiple
  of 8 and at most `model.max_len`: rows whose two sides fill at the same pace, so that a
  corpus whose target runs longer or shorter than its source is not padded on one side.

  Args:
    src_len, tgt_len: [n] token lengths of the training pairs.
  """
  value = config.data.packed_target_len
  if value != AUTO:
    return int(value)
  keep = (src_len <= config.data.max_source_len) & (tgt_len <= config.data.max_target_len)
  ratio = float(tgt_len[keep].sum()) / max(float(src_len[keep].sum()), 1.0)
  length = -(-int(np.ceil(int(config.data.packed_source_len) * ratio)) // LENGTH_MULTIPLE)
  return int(min(max(length * LENGTH_MULTIPLE, LENGTH_MULTIPLE), config.model.max_len))


def first_fit_decreasing(src_len: np.ndarray, tgt_len: np.ndarray, rows: int, source_len: int,
                         target_len: int) -> np.ndarray:
  """Places items into `rows` rows of (source_len, target_len): the row of each item, or -1.

  Items go longest first (by the larger share of a row over both sides; a stable sort keeps
  the given order among equals), each into the first row where both sides still fit.
  """
  out = np.full(len(src_len), -1, np.int32)
  if not len(src_len):
    return out
  size = np.maximum(src_len / source_len, tgt_len / target_len)
  order = np.argsort(-size, kind="stable")
  free_s, free_t = [source_len] * rows, [target_len] * rows
  # Rows that could still take the shortest item, in row order: full rows leave the scan.
  open_rows = list(range(rows))
  min_s, min_t = int(src_len.min()), int(tgt_len.min())
  s_list, t_list = src_len.tolist(), tgt_len.tolist()
  for j in order.tolist():
    a, b = s_list[j], t_list[j]
    for i, r in enumerate(open_rows):
      if free_s[r] >= a and free_t[r] >= b:
        free_s[r] -= a
        free_t[r] -= b
        out[j] = r
        if free_s[r] < min_s or free_t[r] < min_t:
          del open_rows[i]
        break
  return out


@dataclasses.dataclass
class _EpochPlan:
  # [placed] example of every placement, step by step: an index into the lengths given to
  # `plan_epoch`, into `split` in `PackedBatches`' plans.
  example: np.ndarray
  row: np.ndarray  # [placed] its row
  bounds: np.ndarray  # [steps + 1] placements of step i: bounds[i]:bounds[i + 1]


def cumulative_lengths(lengths: np.ndarray, perm: np.ndarray, times: int) -> np.ndarray:
  """int64 [times * n]: the running sum of `lengths[perm]` over the permutation taken `times`
  times (1 or 2), without a copy of the permuted lengths."""
  n = len(perm)
  out = np.empty(times * n, np.int64)
  np.cumsum(lengths[perm], out=out[:n])
  if times == 2 and n:
    np.add(out[:n], out[n - 1], out=out[n:])
  return out


def plan_epoch(perm: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray, rows: int,
               source_len: int, target_len: int, steps: int | None = None) -> _EpochPlan:
  """Packs the examples `perm` (in that order) into steps of `rows` rows.

  `steps=None` packs until every example is placed; a number makes exactly that many steps,
  taking the permutation again from its start when it runs out.
  """
  n = len(perm)
  # Cumulative lengths over the permutation, taken twice for the wrap of later epochs (epoch 0
  # never wraps); with the plan, the corpus-sized arrays that a start holds in memory.
  cum_s, cum_t = (cumulative_lengths(x, perm, 1 if steps is None else 2)
                  for x in (src_len, tgt_len))
  # Integers: a float would make every search convert the whole int64 array.
  budget_s, budget_t = int(OVERFILL * rows * source_len), int(OVERFILL * rows * target_len)
  example, row, bounds = [], [], [0]
  pool = np.zeros(0, np.int64)  # positions into the doubled permutation, carried over
  pos = 0
  placed_total = 0
  while (steps is None and (pos < n or len(pool))) or (steps is not None
                                                      and len(bounds) <= steps):
    carried = perm[pool % n]
    pool_s, pool_t = src_len[carried].sum(), tgt_len[carried].sum()
    before_s, before_t = (cum_s[pos - 1], cum_t[pos - 1]) if pos else (0, 0)
    # The next examples, while neither side of the candidates exceeds its budget.
    end = min(int(np.searchsorted(cum_s, before_s + budget_s - pool_s, side="right")),
              int(np.searchsorted(cum_t, before_t + budget_t - pool_t, side="right")))
    # At least one new example when nothing is carried over; never back over taken ones.
    end = max(end, pos + 1) if not len(pool) else max(end, pos)
    # Within one permutation's length of the oldest candidate: no example twice in a step.
    end = min(end, n if steps is None else 2 * n, (int(pool.min()) if len(pool) else pos) + n)
    cand = np.concatenate([pool, np.arange(pos, end)])
    pos = end
    ids = perm[cand % n]
    where = first_fit_decreasing(src_len[ids], tgt_len[ids], rows, source_len, target_len)
    ok = where >= 0
    if steps is None and not ok.any():
      raise DataError("an example does not fit in an empty packed row")  # filtered before
    example.append(ids[ok])
    row.append(where[ok])
    placed_total += int(ok.sum())
    bounds.append(placed_total)
    pool = cand[~ok]
    if steps is not None and pos >= 2 * n and not len(pool):
      pos = n  # an epoch far longer than its permutation: go round again
  del cum_s, cum_t  # before the plan's arrays are joined
  return _EpochPlan(
    example=np.concatenate(example) if example else np.zeros(0, np.int64),
    row=np.concatenate(row) if row else np.zeros(0, np.int32),
    bounds=np.asarray(bounds, np.int64),
  )


def assemble(flat: np.ndarray, offsets: np.ndarray, examples: np.ndarray, row: np.ndarray,
             rows: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One side of a packed batch: ids, segment ids and positions, each int32 [rows, length].

  Example examples[j] goes into row row[j], after the examples placed in that row before it
  (in the order given); segments count from 1 per row.
  """
  ids = np.zeros((rows, length), np.int32)
  seg = np.zeros((rows, length), np.int32)
  pos = np.zeros((rows, length), np.int32)
  if not len(examples):
    return ids, seg, pos
  order = np.argsort(row, kind="stable")
  examples, row = examples[order], row[order]
  starts = np.asarray(offsets[examples], np.int64)
  lens = np.asarray(offsets[examples + 1], np.int64) - starts
  # Start of each example in its row, and its segment number: running sums within a row.
  first = np.r_[True, row[1:] != row[:-1]]
  group_start = np.maximum.accumulate(np.where(first, np.arange(len(row)), 0))
  cum = np.cumsum(lens) - lens
  col0 = cum - cum[group_start]
  segment = np.arange(len(row)) - group_start + 1
  r = np.repeat(row, lens)
  within = np.arange(int(lens.sum())) - np.repeat(cum, lens)
  c = np.repeat(col0, lens) + within
  ids[r, c] = flat[np.repeat(starts, lens) + within]
  seg[r, c] = np.repeat(segment, lens)
  pos[r, c] = within
  return ids, seg, pos


class PackedBatches:
  """Packed training batches as a pure function of (config.seed, step); see the module doc.

  The same interface as `bucketing.TrainBatches` (`batch`, `steps_per_epoch`, `shapes`,
  `real_token_fraction`, `num_examples`, `num_dropped`), and the same device independence: the
  plan packs R rows whatever the devices, padding rows are added after.

  When the split is mapped from a token cache (`split.directory`), every epoch's plan is kept on
  disk beside it (`plan_cache`): a restart reads the summary and maps the plans, and computes
  nothing over the whole corpus.
  """

  def __init__(self, split: TokenizedSplit, config: Any, *, batch_multiple: int = 1,
               process_index: int = 0, process_count: int = 1):
    """Args as for `TrainBatches`; reads `seed`, `model.max_len` and `data.{tokens_per_batch,
    max_source_len, max_target_len, packed_source_len, packed_target_len}`."""
    check_process(process_index, process_count)
    self.split = split
    self.seed = int(config.seed)
    self.process_index = process_index
    self.process_count = process_count
    self.source_len = int(config.data.packed_source_len)
    self._tokens_per_batch = int(config.data.tokens_per_batch)
    self._limits = (int(config.data.max_source_len), int(config.data.max_target_len))
    fields = {"seed": self.seed, "tokens_per_batch": self._tokens_per_batch,
              "packed_source_len": self.source_len,
              "packed_target_len": config.data.packed_target_len, "limits": self._limits,
              "max_len": int(config.model.max_len), "overfill": OVERFILL}
    self._store = (plan_cache.PlanStore(split.directory, plan_cache.plan_key(fields))
                   if split.directory else None)
    self._plans: dict[int, _EpochPlan] = {}
    self._kept: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    meta = self._store.meta() if self._store else None
    if meta is None or meta.get("num_pairs") != len(split):
      meta = self._plan_first_epoch(config)
    self.target_len = int(meta["target_len"])
    self.num_examples = int(meta["num_examples"])
    self.num_dropped = len(split) - self.num_examples
    self.steps_per_epoch = int(meta["steps_per_epoch"])
    self._real_tokens = int(meta["real_tokens"])
    self.rows = padded_rows(self.plan_rows, batch_multiple, process_count)

  @property
  def plan_rows(self) -> int:
    """R, the rows the plan packs per step (before the devices' padding rows)."""
    return max(1, self._tokens_per_batch // max(self.source_len, self.target_len))

  def _plan_first_epoch(self, config: Any) -> dict[str, Any]:
    """Plans epoch 0 from the split's lengths; the summary every later start reads."""
    self.target_len = packed_target_len(config, self.split.source_lengths(),
                                        self.split.target_lengths())
    _, src_len, tgt_len = self._kept_lengths()
    self.num_examples = len(src_len)
    if self.num_examples == 0:
      raise DataError("no training example fits config.data.max_source_len/max_target_len/"
                      "packed_source_len/packed_target_len")
    plan = self._plan(0)
    # Epoch 0 places every kept example exactly once.
    meta = {"num_pairs": len(self.split), "target_len": self.target_len,
            "num_examples": self.num_examples, "steps_per_epoch": len(plan.bounds) - 1,
            "real_tokens": int(src_len.sum(dtype=np.int64) + tgt_len.sum(dtype=np.int64))}
    if self._store:
      self._store.write_meta(meta)
    return meta

  def _kept_lengths(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(index in `split`, source length, target length) of the kept examples: read from the
    split only when an epoch must be planned."""
    if self._kept is None:
      # int32: lengths are at most the packed lengths (sums and cumulative sums are int64).
      src_len, tgt_len = self.split.source_lengths(), self.split.target_lengths()
      keep = ((src_len <= min(self._limits[0], self.source_len))
              & (tgt_len <= min(self._limits[1], self.target_len)))
      self._kept = (np.flatnonzero(keep), src_len[keep].astype(np.int32),
                    tgt_len[keep].astype(np.int32))
    return self._kept

  def shapes(self) -> list[tuple[int, int, int]]:
    """[(global rows, source length, target length)]: the one shape of every batch."""
    return [(self.rows, self.source_len, self.target_len)]

  def real_token_fraction(self) -> float:
    """Fraction of the batches' positions (both sides, over epoch 0) that are not padding."""
    positions = self.steps_per_epoch * self.rows * (self.source_len + self.target_len)
    return self._real_tokens / positions

  def _plan(self, epoch: int) -> _EpochPlan:
    """Epoch `epoch`'s plan, with `example` indexing `split`: from memory, disk, or planned."""
    plan = self._plans.get(epoch)
    if plan is not None:
      return plan
    arrays = self._store.load(epoch) if self._store else None
    if arrays is not None and self._complete(epoch, arrays):
      plan = _EpochPlan(**arrays)
    else:
      example_ids, src_len, tgt_len = self._kept_lengths()
      perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
      steps = None if epoch == 0 else self.steps_per_epoch
      kept = plan_epoch(perm, src_len, tgt_len, self.plan_rows, self.source_len,
                        self.target_len, steps)
      index = np.int32 if len(self.split) <= np.iinfo(np.int32).max else np.int64
      plan = _EpochPlan(example=example_ids[kept.example].astype(index), row=kept.row,
                        bounds=kept.bounds)
      if self._store:
        self._store.save(epoch, dataclasses.asdict(plan))
    if len(self._plans) >= 2:  # Training walks epochs in order: keep the current and next.
      self._plans.pop(min(self._plans))
    self._plans[epoch] = plan
    return plan

  def _complete(self, epoch: int, arrays: dict[str, np.ndarray]) -> bool:
    """Whether arrays read from disk are a whole plan of this epoch's length."""
    if set(arrays) != {f.name for f in dataclasses.fields(_EpochPlan)}:
      return False
    bounds = arrays["bounds"]
    steps_ok = epoch == 0 or len(bounds) == self.steps_per_epoch + 1
    return bool(steps_ok and len(arrays["example"]) == len(arrays["row"]) == int(bounds[-1]))

  def placements(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(index into `split`, global row) of every example of global batch `step`, in the
    order they were placed: within a row, that is the order of its segments 1, 2, ..."""
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}")
    epoch, i = divmod(step, self.steps_per_epoch)
    plan = self._plan(epoch)
    lo, hi = plan.bounds[i], plan.bounds[i + 1]
    return np.asarray(plan.example[lo:hi], np.int64), np.asarray(plan.row[lo:hi])

  def batch(self, step: int) -> Batch:
    """This process's rows of packed batch `step` (keys in the module doc), int32
    [rows / process_count, packed_{source,target}_len]."""
    examples, row = self.placements(step)
    lo, local = process_rows(self.rows, self.process_index, self.process_count)
    mine = (row >= lo) & (row < lo + local)
    examples, row = examples[mine], row[mine] - lo
    out = {}
    for side, flat, offsets, length in (
      ("inputs", self.split.source, self.split.source_offsets, self.source_len),
      ("targets", self.split.target, self.split.target_offsets, self.target_len),
    ):
      ids, seg, pos = assemble(flat, offsets, examples, row, local, length)
      out[side] = ids
      out[f"{side}_segment_ids"] = seg
      out[f"{side}_position"] = pos
    return out
