"""The device mesh (axes data, fsdp, tensor) and the map from logical axes to shardings.

Model code names logical axes only (`batch`, `length`, `embed`, `heads`, `kv`, `mlp`, `vocab`,
`layers`); the config's `logical_axis_rules` map them to mesh axes, so the same model runs
data-parallel, fully sharded (fsdp) or tensor-parallel by changing the config alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from transformer.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
# The batch dimension of every input is split over these mesh axes.
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config: Any, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 entries of config.mesh against the device count; ConfigError if it can't."""
  sizes = [int(mesh_config[name]) for name in MESH_AXES]
  for name, size in zip(MESH_AXES, sizes, strict=True):
    if size == 0 or size < -1:
      raise ConfigError(f"mesh.{name}={size}: use a positive size or -1 (the remaining devices)")
  if sizes.count(-1) > 1:
    raise ConfigError("mesh: at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(
        f"mesh: the fixed axes ({' x '.join(str(s) for s in sizes if s != -1)} = {known}) "
        f"do not divide the {num_devices} devices; choose sizes whose product divides "
        f"{num_devices}"
      )
    sizes[sizes.index(-1)] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise ConfigError(
      f"mesh: data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {int(np.prod(sizes))} "
      f"devices, but {num_devices} are available; make the product {num_devices} "
      "(or set one axis to -1)"
    )
  return tuple(sizes)


def make_mesh(mesh_config: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh with axes (data, fsdp, tensor) over `devices` (default: all devices)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  # Classic (auto) axis types: the code shards with jit shardings and constraints.
  return jax.make_mesh(
    shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
  )


def rules(config: Any) -> tuple[tuple[str, Any], ...]:
  """The config's logical axis rules as a tuple of (logical, mesh axes) pairs."""
  return tuple(
    (name, tuple(axes) if isinstance(axes, list | tuple) else axes)
    for name, axes in config.logical_axis_rules
  )


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways the batch dimension is split."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of an input batch [batch, length]: rows over data and fsdp."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def logical_shardings(boxed_tree: Any, mesh: Mesh, axis_rules) -> Any:
  """Shardings for a tree whose leaves may be `nn.Partitioned` boxes (abstract or concrete).

  The result has the structure of the unboxed tree: one NamedSharding per array.
  """
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, axis_rules)


def local_batch_to_global(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each process's rows into global arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()
  }


def bytes_per_device(tree: Any) -> dict[int, int]:
  """Bytes of `tree`'s arrays held by each device id (to check that sharding splits them)."""
  out: dict[int, int] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
  return out
