"""Which parameters a mode uses, found and restored: the one resolver of a workdir's checkpoints.

`select` turns a `workdir.Choice` (the newest checkpoint, the best one, a step, or the average
of the newest N) into the checkpoints it names: their directory (`checkpoints/` or `best/`)
and steps, checked to exist, with a label for the logs. `restore` reads their parameters (or,
for a run that kept one, the parameters' moving average) onto a `ModelLayout`'s shardings,
averaging several in float32. Only that part of the train state is read: never the optimizer's
moments, which are twice the parameters' bytes under Adam. Translate, score, export, the
evaluators, `--mode=average`, the final evaluation of training and fine-tuning's `init_from`
all go through here.

    choice = workdir.choose(checkpoint="best")            # or "latest", "2500", average=5
    selected = parameters.select("runs/numbers", choice)
    params = parameters.restore(layout, selected, meta, ema=False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from transformer import sharding as sharding_lib
from transformer import workdir as workdir_lib
from transformer.data import vocabulary
from transformer.errors import CheckpointError, UserError
from transformer.training.layout import ModelLayout
from transformer.training.parameter_cache import ParameterCache
from transformer.training.run_meta import check_meta, run_meta
from transformer.training.train_state import optimizer_value
from transformer.training.validate import validate

if TYPE_CHECKING:
  from transformer.training.checkpoint import Checkpointer

# Orbax (transformer/training/checkpoint.py) is imported where checkpoints are read, not here: a
# command whose parameters were kept (`parameter_cache`) never pays for importing it.

# The part of a checkpoint's train state that holds what inference uses.
PARAMS, EMA_PARAMS = "params", "ema_params"


@dataclasses.dataclass(frozen=True)
class Selected:
  """Checkpoints of a workdir: `steps` (one, or the N to average) in `directory`.

  `latest` marks the newest checkpoint, chosen as such: if it does not restore (damaged
  files), `restore` falls back to the next older one, as training's resume does.
  """

  directory: epath.Path
  steps: tuple[int, ...]
  label: str
  latest: bool = False

  def checkpointer(self) -> Checkpointer:
    from transformer.training.checkpoint import Checkpointer

    return Checkpointer(self.directory, None, async_save=False)


def has_best(workdir: str) -> bool:
  """Whether the workdir keeps a best checkpoint (`config.best_checkpoint`)."""
  return workdir_lib.paths(workdir).best.is_dir()


def _steps(directory: epath.Path) -> list[int]:
  if not directory.is_dir():
    return []
  from transformer.training.checkpoint import Checkpointer

  checkpointer = Checkpointer(directory, None, async_save=False)
  try:
    return checkpointer.all_steps()
  finally:
    checkpointer.close()


def select(workdir: str, choice: workdir_lib.Choice) -> Selected:
  """The checkpoints of `workdir` that `choice` names; CheckpointError if there are none.

  A step number is looked for in `checkpoints/`, then in `best/` (a best step that rotation
  has deleted from `checkpoints/` is kept there).
  """
  files = workdir_lib.paths(workdir)
  which = choice.checkpoint
  if which == workdir_lib.BEST:
    if not has_best(workdir):
      raise CheckpointError(
        f"--checkpoint=best: no best checkpoint in {files.best}; training keeps one when "
        "config.best_checkpoint.metric is set (e.g. 'eval/bleu')")
    from transformer.training.best_checkpoint import BestCheckpoint

    best = BestCheckpoint(workdir)
    try:
      step = best.step()
      if step is None:
        raise CheckpointError(f"--checkpoint=best: no best checkpoint in {files.best}")
      record = best.record(step)
    finally:
      best.close()
    return Selected(files.best, (step,), f"best checkpoint, step {step} ({record['metric']} "
                    f"{record['value']:.4f})")
  regular = _steps(files.checkpoints)
  if isinstance(which, int):
    if which in regular:
      return Selected(files.checkpoints, (which,), f"step {which}")
    kept = _steps(files.best)
    if which in kept:
      return Selected(files.best, (which,), f"step {which} (the best checkpoint)")
    raise CheckpointError(f"--checkpoint={which}: no such step in {files.checkpoints} (steps "
                          f"{regular})" + (f" or {files.best} (steps {kept})" if kept else ""))
  if not regular:
    raise CheckpointError(f"no checkpoint in {files.checkpoints}: train first")
  if choice.average > 1 and len(regular) > 1:
    steps = tuple(regular[-choice.average:])
    return Selected(files.checkpoints, steps, f"average of steps {list(steps)}")
  return Selected(files.checkpoints, (regular[-1],), f"step {regular[-1]}", latest=True)


def restore(layout: ModelLayout, selected: Selected, meta: dict[str, Any], *,
            ema: bool) -> Any:
  """The parameters of `selected` (their mean in float32 if several) on `layout`'s shardings.

  Args:
    layout: the model's layout (its abstract parameters are the restore target).
    selected: from `select`.
    meta: what the checkpoints must agree on (`run_meta.run_meta` of this config and
      vocabulary); checked before anything is read.
    ema: read the parameters' moving average (`optimizer.ema_decay` > 0) instead of the
      parameters; a checkpoint kept with the other setting is refused.
  """
  key = EMA_PARAMS if ema else PARAMS
  # The parameters alone are read: whether the optimizer had a clipping or weight-decay stage
  # does not matter here, only whether the state has the average.
  check = check_meta(meta, parts=("ema_decay",))
  checkpointer = selected.checkpointer()
  try:
    if selected.latest:
      return _restore_newest_usable(checkpointer, selected.steps[0], key, layout, check)
    for step in selected.steps:
      check(checkpointer.read_meta(step), checkpointer.path / str(step))
    total = None
    for step in selected.steps:
      params = checkpointer.restore_part(step, {key: layout.abstract_params})[key]
      if len(selected.steps) == 1:
        return params
      total = _to_float32(params) if total is None else _add_float32(total, params)
    # The mean's shardings as the layout declares them (the jitted sum may pick equivalent
    # ones), so that programs compiled for these parameters are found again by their key.
    return jax.device_put(_divide(total, np.float32(len(selected.steps))), layout.param_shardings)
  finally:
    checkpointer.close()


# Whole parameter trees in one program each (leaf by leaf, eager operations cost a dispatch, and
# a compile, per leaf: most of a small model's restore).
@jax.jit
def _to_float32(params: Any) -> Any:
  return jax.tree.map(lambda x: x.astype(jnp.float32), params)


@jax.jit
def _add_float32(total: Any, params: Any) -> Any:
  return jax.tree.map(lambda t, x: t + x.astype(jnp.float32), total, params)


@jax.jit
def _divide(total: Any, n: jax.Array) -> Any:
  return jax.tree.map(lambda t: t / n, total)


@jax.jit
def _all_finite(params: Any) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)]))


def _restore_newest_usable(checkpointer: Checkpointer, newest: int, key: str,
                           layout: ModelLayout, check: Any) -> Any:
  """The parameters of the newest checkpoint that restores, from `newest` down; a damaged one
  is reported and skipped (nothing is moved: inference leaves the workdir as it is)."""
  for step in reversed([s for s in checkpointer.all_steps() if s <= newest]):
    path = checkpointer.path / str(step)
    meta = checkpointer.read_meta_or_none(step)
    if meta is None:
      logging.error("checkpoint %s is damaged (unreadable metadata); trying an older one", path)
      continue
    check(meta, path)
    try:
      params = checkpointer.restore_part(step, {key: layout.abstract_params})[key]
      if bool(_all_finite(params)):
        return params
      logging.error("checkpoint %s has non-finite parameters; trying an older one", path)
    except Exception as e:  # noqa: BLE001 - damaged files show up as many error types
      logging.error("checkpoint %s is damaged (%s); trying an older one", path,
                    str(e).strip().splitlines()[:1])
  raise CheckpointError(f"no usable checkpoint in {checkpointer.directory}: every step is "
                        "damaged")


@dataclasses.dataclass
class Model:
  """A workdir's model restored for inference: its vocabulary, layout and parameters."""

  tokenizer: Any
  layout: ModelLayout
  params: Any
  label: str
  step: int


def restore_model(config: Any, workdir: str, choice: workdir_lib.Choice,
                  mesh: jax.sharding.Mesh | None = None) -> Model:
  """The parameters `choice` names of `workdir` on a layout of `config` (over `mesh`, default
  the config's): their moving average where the run kept one (`optimizer.ema_decay` > 0)."""
  model_config = validate(config, jax.device_count())
  tokenizer = vocabulary.stored_tokenizer(workdir)
  if tokenizer is None:
    raise CheckpointError(f"{workdir_lib.paths(workdir).vocab} not found: train first with "
                          f"--mode=train --workdir={workdir} (or import a model, --mode=import)")
  layout = ModelLayout(config, mesh or sharding_lib.make_mesh(config.mesh), model_config)
  ema = optimizer_value(config, "ema_decay") > 0
  meta = run_meta(config, model_config, tokenizer.sha256)
  # Kept by an earlier process from the same checkpoint files: read without Orbax.
  cache = ParameterCache.beside_persistent_cache()
  key = cache.key(workdir, choice, meta, ema, layout.abstract_params)
  kept = cache.load(key, layout.abstract_params)
  if kept is not None:
    params, label, step = kept
    logging.info("parameters (%s) read from %s, kept by an earlier process", label,
                 cache.directory)
    return Model(tokenizer, layout, params, label, step)
  selected = select(workdir, choice)
  params = restore(layout, selected, meta, ema=ema)
  label, step = selected.label + (" (EMA)" if ema else ""), max(selected.steps)
  cache.keep(key, params, label, step)
  return Model(tokenizer, layout, params, label, step)


def parse_member(spec: str) -> tuple[str, str | None]:
  """An ensemble member `WORKDIR[@CHECKPOINT]` -> (workdir, checkpoint or None)."""
  workdir, _, checkpoint = spec.partition("@")
  return workdir, checkpoint or None


def check_members(members: Sequence[str], what: str = "--ensemble") -> None:
  """UserError unless each member is a workdir with a saved config and a valid checkpoint."""
  for spec in members:
    workdir, checkpoint = parse_member(spec)
    if not workdir_lib.paths(workdir).config.exists():
      raise UserError(f"{what} member {spec}: no {workdir_lib.CONFIG} in {workdir}: not a "
                      "workdir of this program")
    workdir_lib.parse_checkpoint(checkpoint)


def restore_members(config: Any, tokenizer: Any, members: Sequence[str],
                    mesh: jax.sharding.Mesh, what: str = "--ensemble") -> list[Model]:
  """Ensemble members (`WORKDIR[@CHECKPOINT]`, each with its own saved config) on `mesh`,
  checked against the first model's `config` and `tokenizer`: the same language pair and the
  same vocabulary, else a UserError naming the member (`what` names the flag or field)."""
  check_members(members, what)
  pair = (config.data.get("source_lang"), config.data.get("target_lang"))
  out = []
  for spec in members:
    path, checkpoint = parse_member(spec)
    member_config = workdir_lib.load(path)
    theirs = (member_config.data.get("source_lang"), member_config.data.get("target_lang"))
    if theirs != pair:
      raise UserError(f"{what} member {spec}: it translates {theirs[0]}-{theirs[1]}, the first "
                      f"model {pair[0]}-{pair[1]}")
    try:
      member = restore_model(member_config, path, workdir_lib.choose(checkpoint), mesh)
    except UserError as e:
      raise UserError(f"{what} member {spec}: {e}") from None
    if member.tokenizer.sha256 != tokenizer.sha256:
      raise UserError(f"{what} member {spec}: its vocabulary ({member.tokenizer.path}) is not "
                      f"the first model's ({tokenizer.path}); an ensemble's members share one "
                      "vocabulary")
    out.append(member)
  return out
