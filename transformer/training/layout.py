"""The model's state layout, apart from any optimizer: what inference and training share.

A `ModelLayout` is the model (Transformer or LSTM, `model_family.build_model`), the mesh and the
logical-axis rules that place it, the abstract parameters with their shardings (from
`jax.eval_shape`, nothing allocated), and the jitted evaluation step (the teacher-forced loss).
Translating, scoring, exporting and evaluating a workdir need nothing more: they restore the
parameters onto `abstract_params` (transformer/training/parameters.py) and never build an
optimizer. `trainer.Trainer` adds the optimizer, the train state and the training step on top of
a layout (t5x keeps its `TrainStateInitializer` apart from the trainer in the same way).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import sharding as sharding_lib
from transformer.nn.model import ModelConfig
from transformer.nn.model_family import build_model
from transformer.training.train_state import make_eval_step


class ModelLayout:
  """Model, mesh, rules, abstract parameters and their shardings; the jitted evaluation step.

  Attributes:
    config: the run's config (its `mesh` and `sharding` fields placed the parameters).
    mesh: the device mesh.
    model_config: the model's fields.
    model: the Linen module.
    rules: logical axis -> mesh axes.
    param_shardings: the parameters' `NamedSharding`s, a tree like the parameters.
    abstract_params: `jax.ShapeDtypeStruct`s carrying those shardings (a restore target).
  """

  def __init__(self, config: Any, mesh: jax.sharding.Mesh, model_config: ModelConfig):
    self.config = config
    self.mesh = mesh
    self.model_config = model_config
    self.model = build_model(model_config)
    self.rules = sharding_lib.rules(config)
    with self.context():
      boxed = jax.eval_shape(self.init_boxed, jax.random.key(0))
      self.param_shardings = sharding_lib.logical_shardings(boxed, mesh, self.rules)
    self.abstract_params = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      nn.unbox(boxed), self.param_shardings,
    )

  def init_boxed(self, rng: jax.Array) -> Any:
    """Fresh parameters, boxed with their logical axes (so whatever is built from them, the
    optimizer's state and the average, gets the axes too)."""
    dummy = jnp.ones((1, 8), jnp.int32)
    return self.model.init({"params": rng}, dummy, dummy)["params"]

  @contextlib.contextmanager
  def context(self) -> Iterator[None]:
    """Mesh and logical-axis rules, so the model's sharding constraints resolve."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  @functools.cached_property
  def _jitted_eval_step(self) -> Callable:
    return jax.jit(make_eval_step(self.model, self.config.label_smoothing),
                   in_shardings=(self.param_shardings, sharding_lib.batch_sharding(self.mesh)),
                   out_shardings=sharding_lib.replicated(self.mesh))

  def eval_step(self, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The loss sums of a global batch (`train_state.make_eval_step`)."""
    with self.context():
      return self._jitted_eval_step(params, batch)

  def lower_eval_step(self, batch_shapes: dict[str, jax.ShapeDtypeStruct]) -> Any:
    with self.context():
      return self._jitted_eval_step.lower(self.abstract_params, batch_shapes)
