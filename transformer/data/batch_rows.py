"""Rows of a global batch: the plan's rows rounded up to the devices the batch is split over,
and each process's share of them.

Shared by the bucketed (bucketing.TrainBatches, evaluation batches) and the packed
(packing.PackedBatches) plans, which add the extra rows as all-zero padding rows.
"""


def check_process(process_index: int, process_count: int) -> None:
  """ValueError unless 0 <= process_index < process_count (the slice of rows a process gets)."""
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, {process_count})")


def process_rows(rows: int, process_index: int, process_count: int) -> tuple[int, int]:
  """(first row, number of rows) of a process's equal share of a global batch of `rows`."""
  local = rows // process_count
  return process_index * local, local


def padded_rows(rows: int, batch_multiple: int, process_count: int) -> int:
  """`rows` rounded up to a multiple of `batch_multiple` (the devices a batch is split over)."""
  if batch_multiple < 1 or batch_multiple % process_count:
    raise ValueError(
      f"batch_multiple={batch_multiple} must be a positive multiple of "
      f"process_count={process_count}"
    )
  return -(-rows // batch_multiple) * batch_multiple
