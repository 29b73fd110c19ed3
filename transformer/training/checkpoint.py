"""Orbax checkpoints: async saves, a bounded number kept, exact resume, averaging.

Each checkpoint `<workdir>/checkpoints/<step>/` holds the train state (`state`) and a JSON
`meta` item: the model fields and the vocabulary's SHA-256, checked on restore so that an
incompatible checkpoint is refused instead of overwritten. Orbax writes into a temporary
directory and renames it when complete, so a kill at any moment leaves only finished
checkpoints behind; a newest checkpoint that fails to restore is reported and the previous
one is used.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from transformer import storage
from transformer.errors import CheckpointError


class Checkpointer:
  """A CheckpointManager for TrainState + meta under `directory`."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int | None = 3,
               async_save: bool = True):
    self.path = storage.as_path(directory)  # local or remote (gs://...)
    self.directory = os.fspath(self.path)
    self._closed = False
    options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save,
      # Steps are chosen by the training loop, not by the manager.
      save_interval_steps=1,
    )
    self.manager = ocp.CheckpointManager(self.path, options=options,
                                         item_names=("state", "meta"))

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts an async save of `state` at `step` (waits for the previous save first)."""
    if step in self.manager.all_steps():
      return  # already written (e.g. at the end of a run that resumed at its last step)
    self.manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
    )

  def read_meta(self, step: int) -> dict[str, Any]:
    path = self.path / str(step)
    try:
      return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
        "meta"
      ]
    except Exception as e:  # noqa: BLE001 - any failure here means an unusable checkpoint
      raise CheckpointError(f"cannot read checkpoint metadata in {path}: {_short(e)}") from e

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores the state of `step` onto the shardings carried by `abstract_state`."""
    restored = self.manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
    )
    return restored["state"]

  def restore_part(self, step: int, abstract_part: dict[str, Any]) -> dict[str, Any]:
    """Some fields of the state of `step` (e.g. `{"params": abstract_params}`), onto the
    shardings of `abstract_part`: what fine-tuning takes from a run whose optimizer may differ
    from this one's."""
    args = ocp.args.PyTreeRestore(
      item=abstract_part, partial_restore=True,
      restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_part))
    return self.manager.restore(step, args=ocp.args.Composite(state=args))["state"]

  def restore_latest(self, abstract_state: Any, check_meta) -> tuple[Any, int] | None:
    """Newest checkpoint that restores and passes `check_meta(meta, path)`, or None if none.

    A checkpoint that fails to restore (truncated or corrupted files) is reported and skipped;
    `check_meta` raises CheckpointError for an incompatible one, which stops the run.
    """
    steps = self.all_steps()
    damaged = []
    for step in reversed(steps):
      path = self.path / str(step)
      meta = self.read_meta_or_none(step)
      if meta is None:
        logging.error("checkpoint %s is damaged (unreadable metadata); trying an older one", path)
        damaged.append(step)
        continue
      check_meta(meta, path)
      try:
        state = self.restore(step, abstract_state)
        _check_finite(state, path)
      except CheckpointError:
        raise
      except Exception as e:  # noqa: BLE001 - damaged files show up as many error types
        logging.error("checkpoint %s is damaged (%s); trying an older one", path, _short(e))
        damaged.append(step)
        continue
      self._quarantine(damaged)
      return state, step
    if steps:
      raise CheckpointError(
        f"no usable checkpoint in {self.directory}: all of steps {steps} are damaged; "
        "move the directory away to start afresh"
      )
    return None

  def _quarantine(self, steps: list[int]) -> None:
    """Moves damaged checkpoints aside (never deletes them), so their steps can be rewritten."""
    if not steps or jax.process_index() != 0:
      return
    aside = self.path.parent / (self.path.name + "_damaged")
    aside.mkdir(parents=True, exist_ok=True)
    for step in steps:
      target = aside / f"{step}-{int(time.time())}"
      (self.path / str(step)).rename(target)
      logging.warning("moved the damaged checkpoint of step %d to %s", step, target)
    self.manager.reload()

  def read_meta_or_none(self, step: int) -> dict[str, Any] | None:
    try:
      return self.read_meta(step)
    except CheckpointError:
      return None

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    """Waits for saves in flight and releases the manager; safe to call twice."""
    if self._closed:
      return
    self._closed = True
    self.manager.wait_until_finished()
    self.manager.close()


def _check_finite(state: Any, path: str) -> None:
  for leaf in jax.tree.leaves(state.params):
    if not bool(jnp.all(jnp.isfinite(leaf))):
      raise ValueError(f"non-finite parameters in {path}")


def _short(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def average_params(checkpointer: Checkpointer, steps: list[int], abstract_state: Any) -> Any:
  """Mean of the parameters of the checkpoints at `steps` (section 6.1: last 5 / last 20); of
  their exponential moving averages when the states carry them (`TrainState.eval_params`)."""
  if not steps:
    raise CheckpointError(f"no checkpoints to average in {checkpointer.directory}")
  total = None
  for step in steps:
    params = checkpointer.restore(step, abstract_state).eval_params
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    total = params if total is None else jax.tree.map(jnp.add, total, params)
  return jax.tree.map(lambda x: x / np.float32(len(steps)), total)
