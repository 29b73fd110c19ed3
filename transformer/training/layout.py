"""The model's state layout, apart from any optimizer: what inference and training share.

A `ModelLayout` is the model (Transformer or LSTM, `model_family.build_model`), the mesh and the
logical-axis rules that place it, the abstract parameters with their shardings (from
`jax.eval_shape`, nothing allocated), and the jitted evaluation step (the teacher-forced loss).
Translating, scoring, exporting and evaluating a workdir need nothing more: they restore the
parameters onto `abstract_params` (transformer/training/parameters.py) and never build an
optimizer. `trainer.Trainer` adds the optimizer, the train state and the training step on top of
a layout (t5x keeps its `TrainStateInitializer` apart from the trainer in the same way).

The abstract parameters come from tracing the model's `init` (about a quarter of a second on
CPU, as much as the rest of a one-sentence translation's restore): where the persistent
compilation cache is in use, they are kept in `<cache>/layouts` as JSON (each parameter's
shape, dtype and logical axes), named by a hash of the model's fields, the project's code and
the JAX and Flax versions, and the next process with the same key reads them instead
(`kept_parameter_layout`). A kept file that cannot be read is traced again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from transformer import compilation, storage
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
    path = kept_parameter_layout(model_config)
    layout = read_parameter_layout(path) if path else None
    if layout is None:
      with self.context():
        boxed = jax.eval_shape(self.init_boxed, jax.random.key(0))
      layout = nn.unbox(boxed), nn.get_partition_spec(boxed)
      if path:
        write_parameter_layout(path, *layout)
    shapes, logical_specs = layout
    self.param_shardings = nn.logical_to_mesh_sharding(logical_specs, mesh, self.rules)
    self.abstract_params = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      shapes, self.param_shardings,
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


LAYOUTS_DIR = "layouts"


def kept_parameter_layout(model_config: ModelConfig, cache: str | None = None) -> str | None:
  """The file that keeps the parameter layout of `model_config` beside the persistent
  compilation cache `cache` (default: JAX's, where in use; module docstring); None without a
  cache, on a remote cache, or in a run of several processes."""
  directory = compilation.beside_persistent_cache(LAYOUTS_DIR, cache)
  if directory is None:
    return None
  text = json.dumps({"model": dataclasses.asdict(model_config), "code": compilation.code_version(),
                     "versions": [jax.__version__, flax.__version__]}, sort_keys=True, default=str)
  return os.path.join(directory, hashlib.sha256(text.encode()).hexdigest()[:32] + ".json")


def _entries(tree: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
  for name in sorted(tree):
    if isinstance(tree[name], dict):
      yield from _entries(tree[name], (*prefix, name))
    else:
      yield (*prefix, name), tree[name]


def write_parameter_layout(path: str, shapes: Any, logical_specs: Any) -> None:
  """Keeps `shapes` (nested dicts of `jax.ShapeDtypeStruct`) and their logical
  `PartitionSpec`s (the same structure) as JSON at `path`; a failure is only a warning."""
  specs = dict(_entries(logical_specs))
  entries = [["/".join(names), list(a.shape), str(a.dtype), list(specs[names])]
             for names, a in _entries(shapes)]
  try:
    storage.write_atomic(path, json.dumps(entries))
  except OSError as e:
    logging.warning("could not keep the parameter layout in %s: %s", path, e)


def read_parameter_layout(path: str) -> tuple[Any, Any] | None:
  """(shapes, logical specs) as `write_parameter_layout` kept them at `path`; None if there is
  no such file or it cannot be read (a warning)."""
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      entries = json.load(f)
    shapes: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    for name, shape, dtype, axes in entries:
      *parents, leaf = name.split("/")
      shape_node, spec_node = shapes, specs
      for parent in parents:
        shape_node, spec_node = shape_node.setdefault(parent, {}), spec_node.setdefault(parent, {})
      shape_node[leaf] = jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))
      spec_node[leaf] = jax.sharding.PartitionSpec(
        *(tuple(a) if isinstance(a, list) else a for a in axes))
    return shapes, specs
  except (OSError, ValueError, TypeError) as e:
    logging.warning("tracing the model again: the kept parameter layout %s cannot be read: %s",
                    path, e)
    return None
