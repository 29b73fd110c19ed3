"""The trainer: the optimiser and the train state on a model's layout, and the jitted, sharded
steps (training, evaluation), compiled ahead of time for the batch shapes a run will meet.

The layout it builds on (transformer/training/layout.py) is all that inference needs; the
trainer is for training, and for writing a complete train state (an import).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import compilation
from transformer import sharding as sharding_lib
from transformer.nn.model import ModelConfig
from transformer.schedules import learning_rate_schedule
from transformer.training.layout import ModelLayout
from transformer.training.train_state import (
  TrainState,
  create_train_state,
  make_optimizer,
  make_train_step,
  optimizer_value,
)


class Trainer:
  """The optimiser, the train state and the jitted, sharded init / train / eval functions, on
  a `ModelLayout` (the model, mesh and parameter shardings: `layout`)."""

  def __init__(self, config: Any, mesh: jax.sharding.Mesh, model_config: ModelConfig):
    self.layout = ModelLayout(config, mesh, model_config)
    self.config = config
    self.mesh = mesh
    self.model_config = model_config
    self.model = self.layout.model
    self.rules = self.layout.rules
    # The schedule, built once: the optimiser follows it and the metrics log it.
    self.learning_rate_fn = learning_rate_schedule(config)
    self.tx = make_optimizer(config, self.learning_rate_fn)
    ema_decay = optimizer_value(config, "ema_decay")

    def init_boxed(rng):
      # Boxed parameters: the optimiser state and the average get their logical axes too.
      return create_train_state(self.layout.init_boxed(rng), self.tx, ema=ema_decay > 0)

    with self.context():
      abstract = jax.eval_shape(init_boxed, jax.random.key(0))
      self.state_shardings = sharding_lib.logical_shardings(abstract, mesh, self.rules)
    self.abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      nn.unbox(abstract), self.state_shardings,
    )
    replicated = sharding_lib.replicated(mesh)
    batch = sharding_lib.batch_sharding(mesh)
    self._init = jax.jit(lambda rng: nn.unbox(init_boxed(rng)),
                         out_shardings=self.state_shardings)
    self._train_step = jax.jit(
      make_train_step(self.model, self.tx, config.label_smoothing, config.grad_accum_steps,
                      ema_decay),
      in_shardings=(self.state_shardings, batch, replicated),
      out_shardings=(self.state_shardings, replicated),
      donate_argnums=0,
    )
    # Programs compiled ahead of time (`precompile`), by `shape_key` of their batch.
    self._compiled_train: dict[tuple, Any] = {}
    self._compiled_eval: dict[tuple, Any] = {}

  def context(self):
    """Mesh and logical-axis rules, so the model's sharding constraints resolve."""
    return self.layout.context()

  def init_state(self, seed: int) -> TrainState:
    with self.context():
      return self._init(jax.random.key(seed))

  def train_step(self, state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
    """One step: the program `precompile` made for this batch shape, else the jitted step."""
    compiled = self._compiled_train.get(shape_key(batch))
    if compiled is not None:
      return compiled(state, batch, rng)
    with self.context():
      return self._train_step(state, batch, rng)

  def eval_step(self, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    compiled = self._compiled_eval.get(shape_key(batch))
    if compiled is not None:
      return compiled(params, batch)
    return self.layout.eval_step(params, batch)

  def lower_train_step(self, batch_shapes: dict[str, jax.ShapeDtypeStruct]):
    """The lowered step for given batch shapes (for compile time and memory analysis)."""
    with self.context():
      return self._train_step.lower(self.abstract_state, batch_shapes,
                                    jax.ShapeDtypeStruct((), jax.random.key(0).dtype))

  def lower_eval_step(self, batch_shapes: dict[str, jax.ShapeDtypeStruct]):
    return self.layout.lower_eval_step(batch_shapes)

  def batch_spec(self, shape: Sequence[int]) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch of a `TrainBatches.shapes()` entry, as sharded int32 shapes.

    shape: (rows, length) of bucketed rows: 'inputs' and 'targets' [rows, length]; or (rows,
    source length, target length) of packed rows, with the segment and position keys
    (`data.packing.PACKING_KEYS`) of each side.
    """
    rows, *lengths = shape
    source, target = (lengths * 2)[:2]
    keys = {"inputs": source, "targets": target}
    if len(lengths) == 2:
      keys.update({f"{side}_{what}": keys[side] for side in ("inputs", "targets")
                   for what in ("segment_ids", "position")})
    sharding = sharding_lib.batch_sharding(self.mesh)
    return {k: jax.ShapeDtypeStruct((rows, n), jnp.int32, sharding=sharding)
            for k, n in keys.items()}

  def precompile(self, train_shapes: Iterable[Sequence[int]],
                 eval_shapes: Iterable[Sequence[int]] = (),
                 threads: int | None = None) -> dict[tuple, Any]:
    """Compiles the training step for every batch shape in `train_shapes` and the evaluation
    step for every (rows, length) in `eval_shapes` (global rows), before the first step, in
    `threads` threads (default: `compilation.compile_threads`); the steps then run these
    programs (see `train_step`). Returns the training step's programs by `shape_key` (e.g. for
    their memory analysis)."""
    train = {shape_key(spec): spec for spec in map(self.batch_spec, train_shapes)}
    evals = {shape_key(spec): spec for spec in map(self.batch_spec, eval_shapes)}
    lowered = {f"training step, {_shape_label(spec)}": (lambda s=spec: self.lower_train_step(s))
               for spec in train.values()}
    lowered.update({f"evaluation step, {_shape_label(spec)}":
                    (lambda s=spec: self.lower_eval_step(s)) for spec in evals.values()})
    compiled = compilation.compile_all(lowered, threads)
    for key, spec in train.items():
      self._compiled_train[key] = compiled[f"training step, {_shape_label(spec)}"]
    for key, spec in evals.items():
      self._compiled_eval[key] = compiled[f"evaluation step, {_shape_label(spec)}"]
    return {key: self._compiled_train[key] for key in train}

  def learning_rate(self, step: int) -> float:
    """The learning rate of the update after `step` updates (`learning_rate_fn`)."""
    return float(self.learning_rate_fn(step))


def shape_key(batch: dict[str, Any]) -> tuple:
  """What a compiled step depends on in a batch: its keys, global shapes and dtypes."""
  return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))


def _shape_label(spec: dict[str, jax.ShapeDtypeStruct]) -> str:
  """'batch ROWS x LENGTH' (packed: 'ROWS x SOURCE / TARGET') of a batch spec, for the log."""
  rows, source = spec["inputs"].shape
  target = spec["targets"].shape[1]
  return f"batch {rows} x {source}" + (f" / {target}" if "inputs_position" in spec else "")


def eval_shapes(batches: Iterable[dict[str, np.ndarray]]) -> list[tuple[int, int]]:
  """The global (rows, length) of this process's evaluation batches, each once."""
  return sorted({(b["inputs"].shape[0] * jax.process_count(), b["inputs"].shape[1])
                 for b in batches})
