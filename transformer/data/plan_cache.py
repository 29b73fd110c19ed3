"""Epoch plans on disk, beside the token cache: a restart maps them instead of planning again.

Packing an epoch is sequential (first-fit over every example, step by step, `packing`): about
30 s for 18M pairs on 2 cores. Done on every start, it made the restart grow with the corpus.
So each epoch's plan is written once, when it is first built, and memory-mapped by every later
start: a restart reads the small `meta.json` and the pages of the steps it trains on.

Layout, inside the token cache's local directory (the plan is a function of the tokenized split,
which that directory names, and of the config fields the caller hashes into `key`):

  plans/<key>/meta.json           what a start needs without planning (written with epoch 0)
  plans/<key>/epoch-<e>/<name>.npy
                                  the arrays of epoch e, written to a temporary directory that
                                  is renamed into place: a directory that exists is complete

Concurrent writers (processes of one run on one host, or runs sharing a cache) write the same
bytes; the first rename wins and the others drop their copy. A plan that cannot be read is
planned again. Only epoch 0 and the two latest epochs are kept on disk (training walks epochs in
order; an older one is planned again if asked for). Plans stay local: after a move to a new
machine, the token cache is copied from the bucket and the plans are made again once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import logging

from transformer import storage

# The config value of a length (`data.bucket_lengths`, `data.packed_source_len`, ...) that asks
# for lengths derived from the training split's, kept here beside the token cache.
AUTO = "auto"

FORMAT = 1
_EPOCH = re.compile(r"^epoch-(\d+)$")


def plan_key(fields: dict[str, Any]) -> str:
  """A short hash of everything a plan depends on besides the tokenized split."""
  text = json.dumps({"format": FORMAT, **fields}, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:20]


def read_json(path: str) -> Any:
  """The JSON value at `path`, or None when it is missing or cannot be read (with a warning)."""
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    logging.warning("ignoring the unreadable %s: %s", path, e)
    return None


def write_json(path: str, value: Any) -> None:
  """Writes `value` atomically; a cache that cannot be written only costs a later start time."""
  try:
    storage.write_atomic(path, json.dumps(value))
  except OSError as e:
    logging.warning("could not keep %s: %s", path, e)


def remembered(split_directory: str | None, name: str, compute: Callable[[], Any]) -> Any:
  """`compute()`, a JSON value derived from the split, kept in `<split directory>/<name>.json`
  so that later starts read it instead of passing over the corpus again (None: no directory,
  computed every time)."""
  if split_directory is None:
    return compute()
  path = os.path.join(split_directory, f"{name}.json")
  value = read_json(path)
  if value is None:
    value = compute()
    write_json(path, value)
  return value


class PlanStore:
  """Epoch plans of one (split, key) under `<split directory>/plans/<key>/`."""

  def __init__(self, split_directory: str, key: str):
    self.directory = os.path.join(split_directory, "plans", key)

  def meta(self) -> dict[str, Any] | None:
    """The recorded summary, or None when there is none (or it cannot be read)."""
    return read_json(os.path.join(self.directory, "meta.json"))

  def write_meta(self, meta: dict[str, Any]) -> None:
    write_json(os.path.join(self.directory, "meta.json"), meta)

  def load(self, epoch: int) -> dict[str, np.ndarray] | None:
    """Epoch `epoch`'s arrays, memory-mapped, or None when not on disk (or unreadable)."""
    path = os.path.join(self.directory, f"epoch-{epoch}")
    if not os.path.isdir(path):
      return None
    try:
      return {name[:-4]: np.load(os.path.join(path, name), mmap_mode="r")
              for name in os.listdir(path) if name.endswith(".npy")}
    except (OSError, ValueError) as e:
      logging.warning("planning epoch %d again: its plan in %s cannot be read: %s", epoch,
                      path, e)
      return None

  def save(self, epoch: int, arrays: dict[str, np.ndarray]) -> None:
    """Writes epoch `epoch`'s arrays (a no-op when another writer was first) and removes the
    epochs before the previous one, except epoch 0."""
    final = os.path.join(self.directory, f"epoch-{epoch}")
    tmp = None
    try:
      os.makedirs(self.directory, exist_ok=True)
      tmp = tempfile.mkdtemp(prefix=f".epoch-{epoch}-", dir=self.directory)
      for name, array in arrays.items():
        np.save(os.path.join(tmp, f"{name}.npy"), array)
      os.chmod(tmp, 0o755)  # mkdtemp makes it private
      os.rename(tmp, final)
    except OSError as e:
      if not os.path.isdir(final):  # not lost to a concurrent writer of the same plan
        logging.warning("could not write the plan of epoch %d to %s: %s", epoch, final, e)
        return
    finally:
      if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    for name in os.listdir(self.directory):
      m = _EPOCH.match(name)
      if m and 0 < int(m.group(1)) < epoch - 1:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

  def epochs(self) -> list[int]:
    """The epochs on disk, ascending."""
    if not os.path.isdir(self.directory):
      return []
    return sorted(int(m.group(1)) for m in map(_EPOCH.match, os.listdir(self.directory)) if m)
