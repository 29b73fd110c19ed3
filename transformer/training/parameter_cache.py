"""Restored parameters kept for the next inference process.

Translating, scoring or exporting restores the parameters with Orbax: importing it, opening the
checkpoints, reading them and, for an average, reading several and averaging them in float32.
On a small model that is most of a one-sentence command's start (benchmarks/startup.py). The
restored parameters are kept as one safetensors file in `<persistent compilation
cache>/parameters` (the compiled programs, `compilation.Executables`, lie beside it), named by
a key of everything they came from:

- the checkpoint choice (`workdir.Choice`), whether the moving average was read, and the run's
  metadata the checkpoints were checked against (`run_meta.run_meta`: model, vocabulary);
- every file under the workdir's `checkpoints/` and `best/`: its path, size and modification
  time, so that a new, deleted or damaged checkpoint, or a run trained again in the same place,
  is another key;
- the parameters' names, shapes and dtypes.

A later process with the same key reads the file with NumPy and places the arrays on the
layout's shardings, importing no Orbax. A kept file that cannot be read is a warning and the
checkpoints are restored again; one that cannot be written costs only the next start its time.
A local workdir in a single-process run only (a remote workdir's listing costs requests; the
parameters of several processes are each process's part). The `KEEP` newest files are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import jax
import numpy as np
from absl import logging

from transformer import compilation, safetensors_file, storage
from transformer import workdir as workdir_lib

PARAMETERS_DIR = "parameters"
# Files kept: the last few models translated (a 7.6M-parameter model's file is 30 MB).
KEEP = 8


def _names(tree: Any) -> tuple[list[str], Any]:
  """The leaves' names ('encoder/layers_0/...') in flattening order, and the tree's structure."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
  names = ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
           for path, _ in leaves]
  return names, treedef


def _listing(directory: str) -> list[tuple[str, int, int]]:
  """(relative path, size, modification time in ns) of every file under `directory`, sorted."""
  out = []
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      stat = os.stat(path)
      out.append((os.path.relpath(path, directory), stat.st_size, stat.st_mtime_ns))
  return sorted(out)


class ParameterCache:
  """Restored parameters by key in `directory` (None: nothing kept, every call restores)."""

  def __init__(self, directory: str | None):
    self.directory = directory

  @classmethod
  def beside_persistent_cache(cls) -> ParameterCache:
    """In `<persistent compilation cache>/parameters` when that cache is in use and this is a
    single-process run."""
    return cls(compilation.beside_persistent_cache(PARAMETERS_DIR))

  def key(self, workdir: str, choice: workdir_lib.Choice, meta: dict[str, Any], ema: bool,
          abstract_params: Any) -> str | None:
    """The key of the parameters `choice` names in `workdir` (module docstring); None where
    nothing is kept (no directory, or a remote workdir)."""
    if self.directory is None or storage.is_remote(workdir):
      return None
    files = workdir_lib.paths(workdir)
    names, _ = _names(abstract_params)
    text = json.dumps({
      "workdir": os.path.abspath(workdir),
      "choice": [choice.checkpoint, choice.average], "ema": ema, "meta": meta,
      "files": [_listing(os.fspath(files.checkpoints)), _listing(os.fspath(files.best))],
      "params": [(n, list(a.shape), str(a.dtype)) for n, a in
                 zip(names, jax.tree.leaves(abstract_params), strict=True)],
    }, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]

  def _path(self, key: str) -> str:
    return os.path.join(self.directory, f"{key}.safetensors")

  def load(self, key: str | None, abstract_params: Any) -> tuple[Any, str, int] | None:
    """(params on `abstract_params`' shardings, label, step) kept under `key`, or None."""
    if key is None or not os.path.exists(self._path(key)):
      return None
    path = self._path(key)
    try:
      tensors, info = safetensors_file.read_with_metadata(path)
      names, treedef = _names(abstract_params)
      targets = jax.tree.leaves(abstract_params)
      arrays = []
      for name, target in zip(names, targets, strict=True):
        array = tensors[name]
        # The dtype is the restored one's (an average is float32 whatever the checkpoints').
        if array.shape != target.shape:
          raise ValueError(f"{name} has shape {list(array.shape)}, expected "
                           f"{list(target.shape)}")
        arrays.append(array)
      leaves = jax.device_put(arrays, [t.sharding for t in targets])
      label, step = info["label"], int(info["step"])
      os.utime(path)  # the newest used are the ones kept
      return jax.tree.unflatten(treedef, leaves), label, step
    except Exception as e:  # noqa: BLE001 - any unreadable file is restored again
      logging.warning("restoring the checkpoints again: the kept parameters %s cannot be "
                      "read: %s", path, str(e).splitlines()[0] if str(e) else type(e).__name__)
      return None

  def keep(self, key: str | None, params: Any, label: str, step: int) -> None:
    """Keeps `params` (restored as `label`, of `step`) under `key`, then only the `KEEP`
    newest files."""
    if key is None:
      return
    names, _ = _names(params)
    try:
      tensors = {n: np.asarray(jax.device_get(x)) for n, x in
                 zip(names, jax.tree.leaves(params), strict=True)}
      safetensors_file.write(self._path(key), tensors, {"label": label, "step": str(step)})
      kept = sorted((e for e in os.scandir(self.directory) if e.name.endswith(".safetensors")),
                    key=lambda e: e.stat().st_mtime_ns, reverse=True)
      for entry in kept[KEEP:]:
        os.remove(entry.path)
    except Exception as e:  # noqa: BLE001 - parameters not kept are restored next time
      logging.warning("could not keep the restored parameters in %s: %s", self.directory, e)
