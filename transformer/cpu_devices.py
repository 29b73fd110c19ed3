"""Several JAX devices on one CPU for translating: the one CPU-specific setting of decoding.

A decoding step of a small model is many small operations, and XLA:CPU runs one program's
operations one after another, most of them on one core. With one device, a 2-core CPU
translating a file leaves its second core mostly idle. With a JAX CPU device per core, the
mesh's `data` axis splits each batch into one part per device and the devices search their
parts at once: the same search over the same rows, so the same hypotheses (their scores, sums
over other batch shapes, may move in their last bits: tests/test_corpus.py). One device per
core, not more: on 2 cores, 4 devices were slower than 1. The figures, on 2 cores, are in
docs/decoding.md (`benchmarks.corpus_translation --cpu_devices=1` against the default).

`--mode=translate` and `--mode=score` take `translation_devices` CPU devices unless the command
says otherwise (`--cpu_devices=N`, or XLA_FLAGS=--xla_force_host_platform_device_count=N as the
tests do); training keeps one device per CPU, its batches being large enough to use the cores.
On a GPU or TPU the setting only shapes JAX's CPU backend, which the mesh does not use.
"""

from __future__ import annotations

import os
from typing import Any

from transformer.errors import UserError

# A device keeps at least this many sentences of a full batch (`decode.batch_size`): fewer
# would make each part's steps as costly per sentence as a sentence alone.
SENTENCES_PER_DEVICE = 8
FORCE_FLAG = "--xla_force_host_platform_device_count"


def cores() -> int:
  """The cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def translation_devices(cores: int, batch_size: int, mesh_config: Any) -> int:
  """CPU devices for translating: one per core, each with at least `SENTENCES_PER_DEVICE`
  sentences of a full batch; 1 unless the mesh gives the devices to `data` alone
  (`mesh.data=-1`, fsdp and tensor 1: a parameter split over CPU devices would only be
  gathered again)."""
  if (int(mesh_config.data), int(mesh_config.fsdp), int(mesh_config.tensor)) != (-1, 1, 1):
    return 1
  return max(1, min(cores, int(batch_size) // SENTENCES_PER_DEVICE))


def use(requested: int | None, config: Any, translating: bool) -> int | None:
  """Sets JAX's CPU device count before its CPU backend starts; returns the count it set, or
  None where it left JAX's default.

  Args:
    requested: `--cpu_devices` (None: decided here).
    config: the command's config (`decode.batch_size`, `mesh`), None for a mode without one.
    translating: whether the mode translates or scores (`--mode=translate`, `score`).

  Raises:
    UserError: `requested` is below 1, or XLA_FLAGS sets a device count too.
  """
  forced = FORCE_FLAG in os.environ.get("XLA_FLAGS", "")
  if requested is not None:
    if requested < 1:
      raise UserError(f"--cpu_devices={requested}: must be at least 1")
    if forced:
      raise UserError(f"--cpu_devices={requested} and XLA_FLAGS={FORCE_FLAG} both set the CPU "
                      "devices: keep one")
    count = requested
  else:
    if forced or not translating or config is None or os.environ.get("JAX_NUM_CPU_DEVICES"):
      return None
    count = translation_devices(cores(), config.decode.batch_size, config.mesh)
    if count == 1:
      return None
  import jax

  jax.config.update("jax_num_cpu_devices", count)
  return count
