"""Restoring a trained workdir for inference: the one public entry point.

    from transformer import infer
    model = infer.restore(config, "runs/numbers")            # newest checkpoint
    model = infer.restore(config, "gs://b/run", average=5)   # mean of the last 5
    model = infer.restore(config, "runs/numbers", checkpoint="best")
    ids = model.translator.translate_ids(model.params, [model.tokenizer.encode("seven")])

Used by the translate and average modes of the main program and by the experiments. The
checkpoints are checked against the config (model fields, vocabulary) as in training.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from transformer import compilation
from transformer import sharding as sharding_lib
from transformer.best_checkpoint import best_step_or_error
from transformer.checkpoint import Checkpointer, average_params, check_meta, run_meta
from transformer.data import input_pipeline
from transformer.data.input_pipeline import stored_tokenizer, vocab_path
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.data.tokenizer import Tokenizer
from transformer.errors import CheckpointError, UserError
from transformer.train import Trainer
from transformer.train_state import optimizer_value
from transformer.translate import Translator
from transformer.validate import validate


def parse_checkpoint(value: str) -> int | str | None:
  """`--checkpoint`: 'latest' -> None, 'best' -> 'best', a step number -> that int; anything
  else: UserError."""
  if value == "latest":
    return None
  if value == "best":
    return value
  if not value.isdigit():
    raise UserError(f"--checkpoint={value}: must be 'best', 'latest' or a step number")
  return int(value)


@dataclasses.dataclass
class Restored:
  """A trained model ready to translate.

  Attributes:
    tokenizer: the workdir's vocabulary (an imported OPUS-MT model's: a MarianTokenizer).
    trainer: model, mesh and jitted steps (its `eval_step` scores batches).
    translator: cached greedy / beam search over the mesh.
    params: the parameters (newest checkpoint or an average), sharded like training's; of a
      run with `optimizer.ema_decay` > 0, their exponential moving average.
    label: which parameters, e.g. 'step 2500', 'average of steps [1500, 2000, 2500]' or
      'step 2500 (EMA)'.
  """

  tokenizer: Tokenizer | MarianTokenizer
  trainer: Trainer
  translator: Translator
  params: Any
  label: str


def restore(config: Any, workdir: str, average: int | None = None,
            checkpoint: str | None = None) -> Restored:
  """Loads the newest checkpoint of `workdir` (local or gs://), or the mean of the last N: its
  parameters, or their exponential moving average when the run kept one (`optimizer.ema_decay`
  > 0; the checkpoints are refused if the config says otherwise).

  Args:
    config: the config the workdir was trained with (model fields must match; the workdir's
      own, `workdir_config.load(workdir)`, is the simplest).
    workdir: the training run's workdir.
    average: N > 1 averages the last N checkpoints; None takes
      `config.average_last_checkpoints`; 0 or 1 take the newest checkpoint.
    checkpoint: 'latest' (or None) for the newest checkpoint, 'best' for the best one
      (`<workdir>/best`, kept when `config.best_checkpoint.metric` is set), or a step number:
      that step's checkpoint (no averaging).

  Raises:
    CheckpointError: no vocabulary or checkpoint, or one that does not fit the config.
  """
  model_config = validate(config, jax.device_count())
  # Beam search compiles one program per source length: keep them across runs.
  compilation.use_persistent_cache(config.compilation_cache_dir)
  tokenizer = stored_tokenizer(workdir)
  if tokenizer is None:
    raise CheckpointError(f"{vocab_path(workdir)} not found: train first with --mode=train "
                          f"--workdir={workdir} (or import a model, --mode=import)")
  mesh = sharding_lib.make_mesh(config.mesh)
  trainer = Trainer(config, mesh, model_config)
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), None, async_save=False)
  meta = run_meta(config, model_config, tokenizer.sha256)
  n = config.average_last_checkpoints if average is None else average
  if checkpoint == "best":
    best, step = best_step_or_error(workdir)
    saved = best.read_meta(step)
    check_meta(meta)(saved, best.path / str(step))
    record = saved["best"]
    params = best.restore(step, trainer.abstract_state).eval_params
    label = f"best checkpoint, step {step} ({record['metric']} {record['value']:.4f})"
    best.close()
  elif checkpoint not in (None, "latest"):
    step = parse_checkpoint(checkpoint)
    if step not in checkpointer.all_steps():
      raise CheckpointError(f"--checkpoint={checkpoint}: no such step in "
                            f"{checkpointer.directory} (steps {checkpointer.all_steps()})")
    check_meta(meta)(checkpointer.read_meta(step), checkpointer.path / str(step))
    params = checkpointer.restore(step, trainer.abstract_state).eval_params
    label = f"step {step}"
  elif n > 1:
    steps = checkpointer.all_steps()[-n:]
    for step in steps:
      check_meta(meta)(checkpointer.read_meta(step), checkpointer.path / str(step))
    params = average_params(checkpointer, steps, trainer.abstract_state)
    label = f"average of steps {steps}"
  else:
    restored = checkpointer.restore_latest(trainer.abstract_state, check_meta(meta))
    if restored is None:
      raise CheckpointError(f"no checkpoint in {checkpointer.directory}: train first")
    state, step = restored
    params, label = state.eval_params, f"step {step}"
  if optimizer_value(config, "ema_decay") > 0:
    label += " (EMA)"
  # The training run's buckets, so translation pads to the lengths training compiled.
  translator = Translator(model_config, config.decode, mesh, trainer.state_shardings.params,
                          input_pipeline.workdir_buckets(config, workdir))
  return Restored(tokenizer, trainer, translator, params, label)
