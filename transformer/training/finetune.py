"""Fine-tuning: a run that starts from another model's parameters (`config.init_from`).

The source is a workdir, local or `gs://`: one trained here, or an imported model's. Its best
checkpoint is taken if it keeps one, else its newest. The new run takes its parameters only
(`config.init_from_optimizer=True`: its Adam moments too), starts at step 0 with a fresh
optimizer and this config's schedule, and uses the source's vocabulary, copied into the new
workdir before anything else would train one. The model must be the source's: a model field
that differs (other than how the computation is done: `run_meta.COMPATIBLE_FIELDS`, e.g.
dropout) or another `data.vocab_size` is one line naming the field.

Only the first start of a run reads the source; a restarted run resumes from its own
checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import optax
from absl import logging

from transformer import storage
from transformer import workdir as workdir_lib
from transformer.errors import CheckpointError, ConfigError, show
from transformer.nn.model import ModelConfig
from transformer.training import parameters
from transformer.training.checkpoint import Checkpointer
from transformer.training.run_meta import COMPATIBLE_FIELDS, check_meta
from transformer.training.train_state import EmaTrainState, optimizer_value

# The vocabulary's key to the corpus it was trained on (vocabulary.get_tokenizer): the new
# run's corpus is another, so the key is not copied and the new run writes its own.
NOT_COPIED = ("corpus.sha256",)


@dataclasses.dataclass(frozen=True)
class Source:
  """The model a run starts from: its workdir, and the checkpoint directory and step taken."""

  workdir: str
  checkpoints: str
  step: int


def check_source(config: Any, model_config: ModelConfig) -> Source:
  """Checks `config.init_from` before any work: a workdir with a saved config, a vocabulary
  and a checkpoint, whose model fields and vocabulary size are this config's."""
  source = config.init_from
  if not isinstance(source, str) or not source:
    raise ConfigError(f"init_from={show(source)}: must be a workdir path ('' for none)")
  path = storage.as_path(source)
  saved = workdir_lib.load(source) if path.is_dir() else None
  if saved is None:
    raise ConfigError(f"init_from={source}: no {workdir_lib.CONFIG} there; it must be a "
                      "workdir trained or imported by this program")
  if not workdir_lib.paths(source).vocab_dir.is_dir():
    raise ConfigError(f"init_from={source}: no {workdir_lib.VOCAB}/ directory (the source's "
                      "vocabulary)")
  if config.data.vocab_size != saved.data.vocab_size:
    raise ConfigError(
      f"data.vocab_size={config.data.vocab_size} but init_from={source} has "
      f"{saved.data.vocab_size}: fine-tuning keeps the source's vocabulary")
  # A field the source's config lacks (saved before the field existed) has its default.
  theirs = {**dataclasses.asdict(ModelConfig()), **dict(saved.model)}
  ours = dataclasses.asdict(model_config)
  for field in sorted(set(theirs) | set(ours)):
    if field in COMPATIBLE_FIELDS:
      continue
    if theirs.get(field) != ours.get(field):
      raise ConfigError(
        f"model.{field}={ours.get(field)!r} but init_from={source} has {theirs.get(field)!r}: "
        "fine-tuning keeps the source's model")
  if config.get("init_from_optimizer"):
    # The optimizer state's tree has a part for each of these that is on.
    for name in ("grad_clip_norm", "weight_decay"):
      theirs_on = optimizer_value(saved, name) > 0
      if theirs_on != (optimizer_value(config, name) > 0):
        raise ConfigError(
          f"init_from_optimizer=True but optimizer.{name} is "
          f"{'off' if theirs_on else 'on'} here and {'on' if theirs_on else 'off'} in "
          f"init_from={source}: the source's optimizer state fits only the same optimizer")
  # The source's best checkpoint where it keeps one, else its newest.
  selected = None
  if parameters.has_best(source):
    with contextlib.suppress(CheckpointError):
      selected = parameters.select(source, workdir_lib.choose(workdir_lib.BEST))
  if selected is None:
    try:
      selected = parameters.select(source, workdir_lib.choose())
    except CheckpointError:
      raise ConfigError(f"init_from={source}: no checkpoint in "
                        f"{workdir_lib.paths(source).checkpoints}") from None
  return Source(source, os.fspath(selected.directory), selected.steps[0])


def copy_vocabulary(source: Source, workdir: str) -> None:
  """Copies the source's vocabulary files into `<workdir>/vocab` (once: a workdir that has
  its vocabulary already keeps it, and the checkpoints' vocabulary check refuses a
  mismatch)."""
  target = workdir_lib.paths(workdir).vocab_dir
  if target.exists():
    return

  def copy(directory: Any, into: Any) -> None:
    for entry in sorted(directory.iterdir()):
      if entry.is_dir():
        copy(entry, into / entry.name)  # e.g. an imported model's vocab/marian/
      elif entry.name not in NOT_COPIED:
        storage.write_atomic(into / entry.name, entry.read_bytes())

  copy(workdir_lib.paths(source.workdir).vocab_dir, target)
  logging.info("Copied the vocabulary of %s into %s", source.workdir, target)


def initial_state(trainer: Any, config: Any, meta: dict[str, Any], source: Source) -> Any:
  """The state a fine-tuning run starts from: the parameters of `source` (`check_source`) at
  step 0, with a fresh optimizer state (or the source's, with `init_from_optimizer`)."""
  checkpointer = Checkpointer(source.checkpoints, None, async_save=False)
  try:
    path = checkpointer.path / str(source.step)
    saved = checkpointer.read_meta(source.step)
    check_meta(meta, parts=())(saved, path)  # the vocabulary and the model
    fresh = trainer.init_state(config.seed)
    # The parameters the source evaluates and translates with: its average, if it kept one.
    source_config = saved.get("config")
    averaged = source_config is not None and optimizer_value(source_config, "ema_decay") > 0
    key = "ema_params" if averaged else "params"
    part = {key: trainer.abstract_state.params}
    if config.get("init_from_optimizer"):
      part["opt_state"] = trainer.abstract_state.opt_state
    restored = checkpointer.restore_part(source.step, part)
  finally:
    checkpointer.close()
  logging.info("Starting from the parameters of %s (step %d)%s", path, source.step,
               ", with its optimizer state" if config.get("init_from_optimizer") else "")
  state = fresh.replace(params=restored[key])
  if isinstance(state, EmaTrainState):
    state = state.replace(ema_params=restored[key])  # the average starts at the parameters
  if config.get("init_from_optimizer"):
    # The schedule restarts; Adam's moments and their count (its bias correction) are kept.
    state = state.replace(opt_state=_schedule_restarted(restored["opt_state"]))
  return state


def _schedule_restarted(opt_state: Any) -> Any:
  """`opt_state` with the learning-rate schedule's step count at zero."""
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  return jax.tree.map(
    lambda x: x._replace(count=jnp.zeros_like(x.count)) if is_schedule(x) else x, opt_state,
    is_leaf=is_schedule)
