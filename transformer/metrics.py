"""Metric writers: `metrics.jsonl` (one JSON object per line) and TensorBoard event files.

Keys are `split/metric` (`train/loss`, `eval/accuracy`, `test/bleu`, ...), every record has
`step`. Only process 0 writes. On resume, records past the restored step are dropped so the
file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import numpy as np


def summarize(sums: dict[str, float], prefix: str) -> dict[str, float]:
  """Token sums (loss, nll, correct, tokens) -> per-token means and perplexity."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll"]) / tokens
  return {
    f"{prefix}/loss": float(sums["loss"]) / tokens,
    f"{prefix}/nll": nll,
    f"{prefix}/perplexity": math.exp(min(nll, 50.0)),
    f"{prefix}/accuracy": float(sums["correct"]) / tokens,
  }


class MetricWriter:
  """Appends records to `<workdir>/metrics.jsonl` and TensorBoard events in `<workdir>/tb`."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    self.active = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb_dir = os.path.join(workdir, "tb")
    self._tensorboard = tensorboard
    self._tb = None

  def truncate_after(self, step: int) -> None:
    """Drops records with a step beyond `step` (written after the checkpoint we resume)."""
    if not self.active or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = [ln for ln in f if ln.strip()]
    kept = []
    for ln in lines:
      try:
        if json.loads(ln).get("step", 0) <= step:
          kept.append(ln)
      except json.JSONDecodeError:
        continue  # a line cut short by a kill
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(kept)
    os.replace(tmp, self.path)

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.active:
      return
    record = {"step": int(step)}
    for k, v in metrics.items():
      v = np.asarray(v).item() if not isinstance(v, str) else v
      record[k] = v
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    self._write_tensorboard(step, record)

  def _write_tensorboard(self, step: int, record: dict[str, Any]) -> None:
    if not self._tensorboard:
      return
    if self._tb is None:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(self._tb_dir)
    for k, v in record.items():
      if k != "step" and isinstance(v, int | float):
        self._tb.add_scalar(k, v, global_step=step)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of `<workdir>/metrics.jsonl`."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(ln) for ln in f if ln.strip()]
