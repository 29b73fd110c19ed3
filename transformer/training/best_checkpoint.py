"""The best checkpoint and early stopping (`config.best_checkpoint`, `config.early_stopping`).

After each evaluation that reports `best_checkpoint.metric`, `Tracker.update` decides whether
the value improves on the best so far (by more than `early_stopping.min_delta`, in the
direction of `best_checkpoint.mode`). An improvement saves the state to `<workdir>/best/<step>`,
apart from the newest `keep_checkpoints` in `<workdir>/checkpoints`, so rotation never deletes
it; the checkpoint's metadata records the metric and its value. `early_stopping.patience`
evaluations in a row without an improvement end the run.

The tracker's state is saved in the metadata of every regular checkpoint, so a run resumed
from step S (after a `kill -9`, say) continues with the best-so-far and the patience count of
step S and stops where an uninterrupted run stops.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from absl import logging

from transformer import workdir as workdir_lib

MODES = ("max", "min")


@dataclasses.dataclass
class Tracker:
  """The best value of `metric` so far, its step, and the evaluations since it improved."""

  metric: str
  mode: str = "max"
  min_delta: float = 0.0
  patience: int = 0  # 0: no early stopping
  best_value: float | None = None
  best_step: int | None = None
  evaluations_without_improvement: int = 0

  @classmethod
  def from_config(cls, config: Any) -> Tracker | None:
    """The config's tracker, or None when `best_checkpoint.metric` is empty."""
    best = config.get("best_checkpoint") or {}
    stopping = config.get("early_stopping") or {}
    if not best.get("metric"):
      return None
    return cls(best["metric"], best.get("mode", "max"), float(stopping.get("min_delta", 0.0)),
               int(stopping.get("patience", 0)))

  def improves(self, value: float) -> bool:
    """Whether `value` beats the best so far by more than `min_delta` (NaN never does)."""
    if math.isnan(value):
      return False
    if self.best_value is None:
      return True
    if self.mode == "max":
      return value > self.best_value + self.min_delta
    return value < self.best_value - self.min_delta

  def update(self, step: int, value: float) -> bool:
    """Records the evaluation of `step`; returns whether it is the new best."""
    if self.improves(value):
      self.best_value, self.best_step = float(value), step
      self.evaluations_without_improvement = 0
      return True
    self.evaluations_without_improvement += 1
    return False

  def should_stop(self) -> bool:
    return bool(self.patience) and self.evaluations_without_improvement >= self.patience

  def state(self) -> dict[str, Any]:
    """What a checkpoint's metadata keeps (`restore_state` reads it back)."""
    return {"metric": self.metric, "best_value": self.best_value, "best_step": self.best_step,
            "evaluations_without_improvement": self.evaluations_without_improvement}

  def restore_state(self, state: dict[str, Any] | None) -> None:
    """The state saved with a checkpoint (`state`); None or another metric's: a fresh start."""
    if not state or state.get("metric") != self.metric:
      return
    self.best_value = state["best_value"]
    self.best_step = state["best_step"]
    self.evaluations_without_improvement = int(state["evaluations_without_improvement"])


class BestCheckpoint:
  """`<workdir>/best/<step>`: the state of the best evaluation so far, with its metadata.

  A new best is written (synchronously) before the previous one is deleted, so a kill at any
  moment leaves at least one complete best checkpoint; if two are left, `step` picks the
  better value.
  """

  def __init__(self, workdir: str):
    # Imported here: the config's validation reads this module's MODES, and must not import
    # Orbax (a translation whose parameters were kept never needs it: `parameter_cache`).
    from transformer.training.checkpoint import Checkpointer

    self.checkpointer = Checkpointer(workdir_lib.paths(workdir).best, None, async_save=False)

  def save(self, step: int, state: Any, meta: dict[str, Any], tracker: Tracker) -> None:
    record = {"metric": tracker.metric, "mode": tracker.mode, "value": tracker.best_value}
    self.checkpointer.save(step, state, {**meta, "best": record})
    self.checkpointer.wait()
    for old in self.checkpointer.all_steps():
      if old != step:
        self.checkpointer.manager.delete(old)

  def step(self) -> int | None:
    """The step of the best checkpoint, or None if there is none."""
    best, best_key = None, None
    for step in self.checkpointer.all_steps():
      record = (self.checkpointer.read_meta_or_none(step) or {}).get("best")
      if not record or record.get("value") is None:
        continue
      sign = 1.0 if record.get("mode", "max") == "max" else -1.0
      key = (sign * record["value"], step)
      if best_key is None or key > best_key:
        best, best_key = step, key
    return best

  def record(self, step: int) -> dict[str, Any]:
    """The metric, mode and value saved with the best checkpoint of `step`."""
    return self.checkpointer.read_meta(step)["best"]

  def close(self) -> None:
    self.checkpointer.close()


def log_improvement(tracker: Tracker, step: int) -> None:
  logging.info("new best %s %.4f at step %d: saved in %s/", tracker.metric, tracker.best_value,
               step, workdir_lib.BEST)
