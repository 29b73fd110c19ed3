"""A `jax.profiler` trace of a window of training steps (`config.profile_steps='200:205'`).

The trace starts before step 200 is dispatched and stops once step 205's results are ready
(steps numbered as the progress line numbers them, from 1), so it holds six whole steps and
whatever the host did between them (batch building, logging, an evaluation or checkpoint that
falls in the window). It goes to `<workdir>/profile/`:

    plugins/profile/<run>/<host>.xplane.pb          TensorBoard's profile plugin (and XProf)
    plugins/profile/<run>/perfetto_trace.json.gz    https://ui.perfetto.dev ("Open trace file")

`tensorboard --logdir <workdir>/profile` shows it in the Profile tab (with the
tensorboard-plugin-profile package). A gs:// workdir's trace is written to a local directory
first and then copied up. Profiling changes no result: the steps run the same programs.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import jax
from absl import logging

from transformer import storage
from transformer import workdir as workdir_lib


def parse_steps(text: str) -> tuple[int, int] | None:
  """'200:205' -> (200, 205); '' -> None (no profile).

  Raises:
    ValueError: not of the form 'FIRST:LAST' with integers 1 <= FIRST <= LAST.
  """
  if not text:
    return None
  first, sep, last = text.partition(":")
  if not sep or not first.strip().isdigit() or not last.strip().isdigit():
    raise ValueError("must be 'FIRST:LAST', two step numbers, e.g. '200:205' ('' for none)")
  first_step, last_step = int(first), int(last)
  if not 1 <= first_step <= last_step:
    raise ValueError("must have 1 <= FIRST <= LAST")
  return first_step, last_step


class Profiler:
  """Traces steps [first, last] of a training loop that calls `step` between steps.

  `step(done, outputs)` is called with the number of steps done so far (once before the loop,
  then before every dispatch), and `close(outputs)` after the loop; `outputs` are the newest
  step's outputs (the state), which the trace waits for before it stops.
  """

  def __init__(self, steps: str, workdir: str | os.PathLike):
    window = parse_steps(steps)
    self.first, self.last = window or (0, -1)
    self.directory = workdir_lib.paths(workdir).profile
    self._local: str | None = None  # where the running trace is written
    self._done = window is None

  @property
  def active(self) -> bool:
    return self._local is not None

  def step(self, done: int, outputs: Any = None) -> None:
    if self.active and done >= self.last:
      self.close(outputs)
    if not self.active and not self._done and self.first <= done + 1 <= self.last:
      self._start(done + 1)

  def _start(self, first: int) -> None:
    remote = storage.is_remote(self.directory)
    self._local = tempfile.mkdtemp(prefix="profile-") if remote else os.fspath(self.directory)
    os.makedirs(self._local, exist_ok=True)
    self._before = _files(self._local)
    logging.info("Profiling steps %d to %d", first, self.last)
    jax.profiler.start_trace(self._local, create_perfetto_trace=True)

  def close(self, outputs: Any = None) -> None:
    """Stops a running trace (after `outputs` are ready), writes it and logs where it is."""
    if not self.active:
      return
    if outputs is not None:
      jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    local, self._local, self._done = self._local, None, True
    written = sorted(_files(local) - self._before)
    if storage.is_remote(self.directory):
      for rel in written:
        with open(os.path.join(local, rel), "rb") as f:
          storage.write_atomic(self.directory / rel, f.read())
    perfetto = next((f for f in written if f.endswith("perfetto_trace.json.gz")), None)
    logging.info("Profile written to %s: `tensorboard --logdir %s` (Profile tab)%s", self.directory,
                 self.directory, f", or open {self.directory / perfetto} at "
                 "https://ui.perfetto.dev" if perfetto else "")


def _files(root: str) -> set[str]:
  """Paths of the files under `root`, relative to it."""
  return {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root)
          for f in files}
