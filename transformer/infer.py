"""Restoring a trained workdir for inference: the one public entry point.

    from transformer import infer
    model = infer.restore(config, "runs/numbers")            # newest checkpoint
    model = infer.restore(config, "gs://b/run", average=5)   # mean of the last 5
    model = infer.restore(config, "runs/numbers", checkpoint="best")
    ids = model.translator.translate_ids(model.params, [model.tokenizer.encode("seven")])

Used by the translate, score, average and export modes of the main program and by the
experiments. Only the parameters are read (or their moving average), onto the model's layout:
no optimizer is built and its moments are never read (transformer/training/parameters.py).
The checkpoints are checked against the config (model fields, vocabulary) as in training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from transformer import compilation
from transformer import workdir as workdir_lib
from transformer.data import bucketing
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.data.tokenizer import Tokenizer
from transformer.decoding.translate import Translator
from transformer.errors import UserError
from transformer.training import parameters
from transformer.training.layout import ModelLayout

parse_checkpoint = workdir_lib.parse_checkpoint


@dataclasses.dataclass
class Restored:
  """A trained model ready to translate.

  Attributes:
    tokenizer: the workdir's vocabulary (an imported OPUS-MT model's: a MarianTokenizer).
    layout: model, mesh, parameter shardings and the jitted evaluation step (`eval_step`
      scores batches).
    translator: cached greedy / beam search over the mesh.
    params: the parameters (newest checkpoint, a step, the best or an average), sharded like
      training's; of a run with `optimizer.ema_decay` > 0, their exponential moving average.
    label: which parameters, e.g. 'step 2500', 'average of steps [1500, 2000, 2500]' or
      'step 2500 (EMA)'.
    step: the step of the parameters (of an average: the newest averaged).
  """

  tokenizer: Tokenizer | MarianTokenizer
  layout: ModelLayout
  translator: Translator
  params: Any
  label: str
  step: int


def restore(config: Any, workdir: str, average: int | None = None,
            checkpoint: str | int | None = None,
            mesh: jax.sharding.Mesh | None = None) -> Restored:
  """Loads the parameters `checkpoint` and `average` choose (`workdir.choose`) of `workdir`
  (local or gs://): their exponential moving average when the run kept one
  (`optimizer.ema_decay` > 0; the checkpoints are refused if the config says otherwise).

  Args:
    config: the config the workdir was trained with (model fields must match; the workdir's
      own, `workdir.load(workdir)`, is the simplest).
    workdir: the training run's workdir.
    average: N > 1 averages the last N checkpoints; None takes
      `config.average_last_checkpoints`; 0 or 1 take the newest checkpoint.
    checkpoint: 'latest' (or None) for the newest checkpoint, 'best' for the best one
      (`<workdir>/best`, kept when `config.best_checkpoint.metric` is set), or a step number:
      that step's checkpoint, in `checkpoints/` or kept as the best (no averaging).
    mesh: the device mesh (default: the config's).

  Raises:
    CheckpointError: no vocabulary or checkpoint, or one that does not fit the config.
  """
  # Beam search compiles one program per source length: keep them across runs.
  compilation.use_persistent_cache(config.compilation_cache_dir)
  choice = workdir_lib.choose(checkpoint, average,
                              default_average=config.average_last_checkpoints)
  model = parameters.restore_model(config, workdir, choice, mesh)
  layout = model.layout
  # The training run's buckets, so translation pads to the lengths training compiled.
  translator = Translator(layout.model_config, config.decode, layout.mesh,
                          layout.param_shardings, bucketing.workdir_buckets(config, workdir),
                          detokenize=model.tokenizer.decode)
  return Restored(model.tokenizer, layout, translator, model.params, model.label, model.step)


def check_ensemble(members: Sequence[str], weights: Sequence[float] | None) -> None:
  """Before any work: every member (`WORKDIR[@CHECKPOINT]`) is a workdir with a saved config
  and a valid checkpoint choice, and `weights` (if given) are one positive number per model
  of the ensemble: the first model and each member."""
  parameters.check_members(members)
  if weights:
    if len(weights) != len(members) + 1:
      raise UserError(f"--ensemble_weights: {len(weights)} weights for {len(members) + 1} "
                      "models (--workdir and each --ensemble member)")
    if any(not w > 0 for w in weights):
      raise UserError(f"--ensemble_weights={','.join(map(str, weights))}: each must be > 0")


def restore_ensemble(config: Any, workdir: str, members: Sequence[str],
                     weights: Sequence[float] | None = None, average: int | None = None,
                     checkpoint: str | int | None = None) -> Restored:
  """The model of `workdir` (its `checkpoint` or `average`, as `restore`) and the `members`
  (`WORKDIR[@CHECKPOINT]`: other runs, seeds, or other checkpoints of the same run, each with
  its own saved config) as one model: at every step the search averages their log
  probabilities with `weights` (default equal; `translate.decode_hypotheses`).

  The members share the first model's mesh and decoding settings. A member whose vocabulary or
  language pair differs from the first model's, or that cannot be restored, is a UserError
  naming it (`parameters.restore_members`). The returned `params` and `translator` are the
  ensemble's (`tokenizer` and `layout` the first model's).
  """
  check_ensemble(members, weights)
  first = restore(config, workdir, average, checkpoint)
  others = parameters.restore_members(config, first.tokenizer, members, first.layout.mesh)
  translator = first.translator.with_members(
    [m.layout.model_config for m in others], [m.layout.param_shardings for m in others],
    weights)
  shares = translator.weights or (1.0,) * (len(others) + 1)
  total = sum(shares)
  label = "ensemble of " + ", ".join(
    f"{spec} ({label}, weight {w / total:.3g})" for spec, label, w in
    zip([workdir, *members], [first.label, *(m.label for m in others)], shares, strict=True))
  return Restored(first.tokenizer, first.layout, translator,
                  (first.params, *(m.params for m in others)), label, first.step)
