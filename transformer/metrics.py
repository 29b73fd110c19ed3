"""Metric writers: `metrics.jsonl` (one JSON object per line) and TensorBoard event files.

Keys are `split/metric` (`train/loss`, `eval/accuracy`, `test/bleu`, ...), every record has
`step`. Only process 0 writes. On resume, records past the restored step are dropped so the
file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any

import jax
import numpy as np

from transformer import storage
from transformer import workdir as workdir_lib


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
  """Writes records to `<workdir>/metrics.jsonl` and TensorBoard events to `<workdir>/tb`.

  The workdir may be remote: object stores cannot append, so the writer keeps the file's
  lines and rewrites it whole, atomically, on every write (a few hundred KB for a long run).
  TensorBoard events of a remote workdir are written to a local directory and copied up
  after each flush.
  """

  def __init__(self, workdir: str | os.PathLike, tensorboard: bool = True):
    self.active = jax.process_index() == 0
    self.path = workdir_lib.paths(workdir).metrics
    self._tb_dir = workdir_lib.paths(workdir).tensorboard
    self._tensorboard = tensorboard
    self._tb = None
    self._tb_local: str | None = None
    self._lines: list[str] | None = None

  def _load(self) -> list[str]:
    if self._lines is None:
      text = self.path.read_text() if self.path.exists() else ""
      self._lines = [ln + "\n" for ln in text.splitlines() if ln.strip()]
    return self._lines

  def truncate_after(self, step: int) -> None:
    """Drops records with a step beyond `step` (written after the checkpoint we resume)."""
    if not self.active or not self.path.exists():
      return
    kept = []
    for ln in self._load():
      try:
        if json.loads(ln).get("step", 0) <= step:
          kept.append(ln)
      except json.JSONDecodeError:
        continue  # a line cut short by a kill
    self._lines = kept
    storage.write_atomic(self.path, "".join(kept))

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.active:
      return
    record = {"step": int(step)}
    for k, v in metrics.items():
      v = np.asarray(v).item() if not isinstance(v, str) else v
      record[k] = v
    lines = self._load()
    lines.append(json.dumps(record) + "\n")
    storage.write_atomic(self.path, "".join(lines))
    self._write_tensorboard(step, record)

  def _write_tensorboard(self, step: int, record: dict[str, Any]) -> None:
    if not self._tensorboard:
      return
    if self._tb is None:
      from tensorboardX import SummaryWriter

      remote = storage.is_remote(self._tb_dir)
      self._tb_local = tempfile.mkdtemp(prefix="tb-") if remote else os.fspath(self._tb_dir)
      self._tb = SummaryWriter(self._tb_local)
    for k, v in record.items():
      if k != "step" and isinstance(v, int | float):
        self._tb.add_scalar(k, v, global_step=step)
    self._tb.flush()
    if storage.is_remote(self._tb_dir):
      for name in os.listdir(self._tb_local):
        with open(os.path.join(self._tb_local, name), "rb") as f:
          storage.write_atomic(self._tb_dir / name, f.read())

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """All records of `<workdir>/metrics.jsonl`."""
  path = workdir_lib.paths(workdir).metrics
  if not path.exists():
    return []
  return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def format_duration(seconds: float) -> str:
  """H:MM:SS, as the progress lines of training and of corpus translation print an ETA."""
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
