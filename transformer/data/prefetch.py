"""Training batches built ahead of the step in a background thread.

Building a batch (gathering ids from the memory-mapped cache, padding, the transfer to the
devices) runs on the host while the accelerator computes the previous step. The order is
unchanged: batch i is still `make(i)`, delivered in increasing i.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_DONE = object()


class Prefetcher:
  """Calls `make(i)` for i in [start, stop) in a thread, at most `depth` batches ahead.

  `next()` returns `make(start)`, then `make(start + 1)`, ...; an exception raised by `make`
  is raised again by the `next()` that would have returned its batch. `close()` stops the
  thread (also mid-way, e.g. on a signal); it is safe to call twice.
  """

  def __init__(self, make: Callable[[int], Any], start: int, stop: int, depth: int = 2):
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._closed = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(make, start, stop),
                                    name="prefetch", daemon=True)
    self._thread.start()

  def _put(self, item: Any) -> bool:
    while not self._closed.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self, make: Callable[[int], Any], start: int, stop: int) -> None:
    for i in range(start, stop):
      try:
        item = make(i)
      except BaseException as e:  # noqa: BLE001 - handed to the consumer
        self._put(_Failure(e))
        return
      if not self._put(item):
        return
    self._put(_DONE)

  def next(self) -> Any:
    item = self._queue.get()
    if isinstance(item, _Failure):
      raise item.error
    if item is _DONE:
      raise StopIteration("no more batches")
    return item

  def close(self) -> None:
    self._closed.set()
    self._thread.join()


class _Failure:
  def __init__(self, error: BaseException):
    self.error = error
