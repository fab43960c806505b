"""Meshes and logical-axis sharding rules.

Parameters carry logical axis names ('batch', 'length', 'embed', 'heads',
'kv_heads', 'kv', 'mlp', 'vocab') and KV caches their own ('cache_batch',
'cache_length', 'cache_kv_heads', 'cache_head_dim'); a rule table maps them to
mesh axes ('data', 'fsdp', 'tensor'). A name missing from the rules is an
error, not a silently replicated dimension. The same code runs on one CPU
device, on 8 fake CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`) and on pods: only the
mesh shape changes.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lm_decoding.models import KVCache, TransformerConfig, abstract_params

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or axes). FSDP shards the embedding dimension of
# every weight; tensor parallelism shards heads (query and KV), MLP width and
# vocabulary. A cache is sharded by batch and KV heads like the activations
# that fill it; its length and head dimension stay whole on each device.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("cache_batch", ("data", "fsdp")),
    ("cache_length", None),
    ("cache_kv_heads", "tensor"),
    ("cache_head_dim", None),
)

# Logical axes of one layer's cached keys/values [B, S, Hkv, Dh].
KV_CACHE_AXES = KVCache.LOGICAL_AXES


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh with automatic (GSPMD) axis types.

  Raises:
    ValueError: data * fsdp * tensor differs from the number of devices.
  """
  devices = jax.devices() if devices is None else list(devices)
  if data * fsdp * tensor != len(devices):
    raise ValueError(
        f"mesh data={data} x fsdp={fsdp} x tensor={tensor} must equal the "
        f"number of devices ({len(devices)})")
  auto = (jax.sharding.AxisType.Auto,) * 3
  return jax.make_mesh((data, fsdp, tensor), MESH_AXES, axis_types=auto,
                       devices=devices)


def check_known_axes(axes: Sequence[str | None], rules=DEFAULT_RULES,
                     what: str = "axes") -> None:
  """Raises unless every logical axis name in `axes` has a rule.

  Args:
    axes: logical axis names, None for a dimension that is never sharded.
    rules: (logical axis, mesh axes) pairs.
    what: how the message names `axes` (e.g. a parameter's path).
  Raises:
    ValueError: a name without a rule (e.g. the typo 'embedd'); the message
      names it and lists the known logical axes.
  """
  known = tuple(name for name, _ in rules)
  for name in axes:
    if name is not None and name not in known:
      raise ValueError(
          f"unknown logical axis {name!r} in {what}={tuple(axes)}; known "
          f"logical axes: {known}")


def logical_sharding(mesh: Mesh, axes: Sequence[str | None],
                     rules=DEFAULT_RULES) -> NamedSharding:
  """The NamedSharding of an array whose dimensions have logical `axes`.

  Raises:
    ValueError: a name in `axes` has no rule (see `check_known_axes`).
  """
  check_known_axes(axes, rules)
  return nn.logical_to_mesh_sharding(PartitionSpec(*axes), mesh, rules)


def param_shardings(config: TransformerConfig, mesh: Mesh,
                    rules=DEFAULT_RULES):
  """NamedShardings for the (unboxed) parameter tree of `config`.

  Raises:
    ValueError: a parameter's logical axis has no rule; the message names
      the parameter, the axis and the known logical axes.
  """
  specs = nn.get_partition_spec(abstract_params(config))
  is_spec = lambda x: isinstance(x, PartitionSpec)
  for path, spec in jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=is_spec)[0]:
    check_known_axes(tuple(spec), rules,
                     what=f"parameter {jax.tree_util.keystr(path)}")
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def shard_params(params, config: TransformerConfig, mesh: Mesh,
                 rules=DEFAULT_RULES):
  """Places `params` on `mesh` according to their logical axes."""
  return jax.device_put(params, param_shardings(config, mesh, rules))


def shard_cache(cache, mesh: Mesh, rules=DEFAULT_RULES):
  """Places a `KVCache` on `mesh`: keys/values by KV_CACHE_AXES, int8 scales
  [B, S, Hkv] by KVCache.SCALE_LOGICAL_AXES, index by 'cache_batch'."""
  kv = logical_sharding(mesh, KV_CACHE_AXES, rules)
  scale = logical_sharding(mesh, KVCache.SCALE_LOGICAL_AXES, rules)
  put = lambda a: jax.device_put(a, kv if a.ndim == 4 else scale)
  index = logical_sharding(mesh, ("cache_batch",), rules)
  return cache.replace(k=jax.tree.map(put, cache.k),
                       v=jax.tree.map(put, cache.v),
                       index=jax.device_put(cache.index, index))


def shard_batch(array: np.ndarray | jax.Array, mesh: Mesh,
                rules=DEFAULT_RULES) -> jax.Array:
  """Places an array whose leading dimension is the batch on `mesh`."""
  axes = ("batch",) + (None,) * (np.ndim(array) - 1)
  return jax.device_put(array, logical_sharding(mesh, axes, rules))
