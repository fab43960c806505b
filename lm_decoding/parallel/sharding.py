"""Meshes and logical-axis sharding rules.

Parameters carry logical axis names ('batch', 'length', 'embed', 'heads',
'kv_heads', 'kv', 'mlp', 'vocab') and KV caches their own ('cache_batch',
'cache_kv_heads', 'cache_length', 'cache_head_dim'); a rule table maps them to
mesh axes ('data', 'fsdp', 'tensor'). A name missing from the rules is an
error, not a silently replicated dimension, and a sharded dimension its
mesh axes do not divide is an error naming it (`check_divisible`), except KV
heads: `rules_for_model` replicates them when the tensor axis is wider than
a GQA/MQA model's KV heads. The mesh and the rules come from a config's
`mesh` section (`mesh_from_config`, `rules_from_config`). The same code runs
on one CPU device, on 8 fake CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`) and on pods: only the
mesh shape changes. Running decoders sharded:
`lm_decoding.decoding.sharded`; the train step: `lm_decoding.training.train`.
"""

from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
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
    ("cache_kv_heads", "tensor"),
    ("cache_length", None),
    ("cache_head_dim", None),
)

# Logical axes of one layer's cached keys/values [B, Hkv, S, Dh].
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


def _axis_size(mesh: Mesh, mesh_axes) -> int:
  """Devices a dimension mapped to `mesh_axes` (None, a name or a tuple of
  names) is split over."""
  if mesh_axes is None:
    return 1
  names = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
  return math.prod(mesh.shape[name] for name in names)


def _slice_shape(shape: tuple[int, ...], per_slice: int) -> tuple[int, ...]:
  """`mesh.shape` with its derived axis (-1 or 0) filled in from the
  `per_slice` devices of a slice.

  Raises:
    ValueError: as `mesh_from_config` says of shape.
  """
  derived = [i for i, n in enumerate(shape) if n in (-1, 0)]
  if (len(shape) != 3 or len(derived) > 1
      or any(n < -1 for n in shape)):
    raise ValueError(
        f"mesh.shape={shape} must be three sizes (data, fsdp, tensor), each "
        f">= 1, at most one of them -1 or 0 (derived from the device count)")
  if not derived:
    return shape
  fixed = math.prod(n for n in shape if n > 0)
  if per_slice % fixed:
    raise ValueError(
        f"mesh.shape={shape}: the fixed axes ({fixed} devices) must divide "
        f"the {per_slice} devices per slice")
  return tuple(per_slice // fixed if i in derived else n
               for i, n in enumerate(shape))


def mesh_from_config(mesh_config, devices: Sequence[jax.Device] | None = None
                     ) -> Mesh:
  """The ('data', 'fsdp', 'tensor') mesh a `config.mesh` section describes.

  Fields of `mesh_config` (see configs/tiny.py):
    shape: (data, fsdp, tensor) sizes within a slice; one of them may be -1
      or 0, "the devices left over" (e.g. (-1, 1, 1) is pure data
      parallelism over every device). (1, 1, 1), the default, is one device:
      the unsharded path.
    num_slices: slices joined over the data-centre network (DCN); > 1 builds
      a hybrid ICI/DCN mesh with
      `jax.experimental.mesh_utils.create_hybrid_device_mesh`, each axis
      `shape[i] * dcn_shape[i]` devices long (as MaxText's
      `dcn_data_parallelism`), so the collectives of `shape` stay on ICI.
    dcn_shape: (data, fsdp, tensor) sizes across slices, product
      num_slices (e.g. (num_slices, 1, 1): data parallel over DCN).

  A single-slice mesh takes the first prod(shape) devices (all of them when
  an axis is derived).

  Args:
    mesh_config: a ConfigDict (or any object) with the fields above.
    devices: the devices to use; default `jax.devices()`.
  Raises:
    ValueError: shape not three sizes >= 1 with at most one -1/0, more
      devices asked for than there are, a derived axis that does not divide
      the device count, num_slices < 1, or a dcn_shape whose product is not
      num_slices.
  """
  devices = jax.devices() if devices is None else list(devices)
  shape = tuple(int(n) for n in mesh_config.shape)
  num_slices = int(mesh_config.num_slices)
  if num_slices < 1:
    raise ValueError(f"mesh.num_slices={num_slices} must be >= 1")
  shape = _slice_shape(shape, len(devices) // num_slices)
  if num_slices == 1:
    if math.prod(shape) > len(devices):
      raise ValueError(
          f"mesh.shape={shape} needs {math.prod(shape)} devices; there are "
          f"{len(devices)}")
    return make_mesh(*shape, devices=devices[:math.prod(shape)])
  dcn_shape = tuple(int(n) for n in mesh_config.dcn_shape)
  if len(dcn_shape) != 3 or math.prod(dcn_shape) != num_slices:
    raise ValueError(
        f"mesh.dcn_shape={dcn_shape} must be three sizes whose product is "
        f"mesh.num_slices={num_slices}")
  array = mesh_utils.create_hybrid_device_mesh(shape, dcn_shape, devices)
  auto = (jax.sharding.AxisType.Auto,) * 3
  return Mesh(array, MESH_AXES, axis_types=auto)


def select_preset(mesh_config, presets: dict, name: str) -> None:
  """Sets `mesh_config.shape` (and `.preset`) to the preset `name`.

  Args:
    mesh_config: a `config.mesh` ConfigDict, changed in place.
    presets: {name: (data, fsdp, tensor)} of a config file (e.g. 'gpu8',
      'v5e8', 'v4_32').
    name: the preset chosen ('' keeps the config's shape).
  Raises:
    ValueError: an unknown name; the message lists the presets.
  """
  if not name:
    return
  if name not in presets:
    raise ValueError(f"mesh preset {name!r} unknown; presets: "
                     f"{sorted(presets)}")
  mesh_config.shape = tuple(presets[name])
  mesh_config.preset = name


def mesh_or_none(mesh_config) -> Mesh | None:
  """`mesh_from_config(mesh_config)`, or None for the one-device default
  (shape (1, 1, 1), one slice) or a missing section (None): the unsharded
  path, unchanged."""
  if mesh_config is None or (tuple(mesh_config.shape) == (1, 1, 1)
                             and mesh_config.num_slices == 1):
    return None
  return mesh_from_config(mesh_config)


def rules_from_config(mesh_config) -> tuple:
  """The logical-axis rules of a `config.mesh` section (`mesh.rules`), as
  hashable tuples; DEFAULT_RULES when the section has none."""
  rules = getattr(mesh_config, "rules", None) or DEFAULT_RULES
  as_axes = lambda a: tuple(a) if isinstance(a, (list, tuple)) else a
  return tuple((str(name), as_axes(axes)) for name, axes in rules)


def rules_for_model(config: TransformerConfig, mesh: Mesh,
                    rules=DEFAULT_RULES) -> tuple:
  """`rules` with KV heads replicated where the mesh cannot split them.

  With grouped- or multi-query attention the tensor axis is often wider than
  the KV heads (e.g. tensor=4, num_kv_heads=2). Then 'kv_heads' and
  'cache_kv_heads' map to no mesh axis: every device of a tensor group holds
  all KV heads (the key/value projections and the cache are replicated over
  it), while query heads, MLP and vocabulary stay split. Any other sharded
  dimension that does not divide is an error (`param_shardings`).

  Returns:
    A rules tuple (hashable: usable as a static jit argument).
  """
  def fit(name, axes):
    if (name in ("kv_heads", "cache_kv_heads")
        and config.num_kv_heads % _axis_size(mesh, axes)):
      return name, None
    return name, axes
  return tuple(fit(name, axes) for name, axes in rules)


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

  `rules` are fitted to the model first (`rules_for_model`: KV heads the
  tensor axis cannot split are replicated).

  Raises:
    ValueError: a parameter's logical axis has no rule (the message names
      the parameter, the axis and the known logical axes), or a sharded
      dimension its mesh axes do not divide (`check_divisible`).
  """
  rules = rules_for_model(config, mesh, rules)
  boxed = abstract_params(config)
  specs = nn.get_partition_spec(boxed)
  is_spec = lambda x: isinstance(x, PartitionSpec)
  for path, spec in jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=is_spec)[0]:
    check_known_axes(tuple(spec), rules,
                     what=f"parameter {jax.tree_util.keystr(path)}")
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  check_divisible(nn.meta.unbox(boxed), shardings, "parameter ")
  return shardings


def check_divisible(shapes, shardings, what: str) -> None:
  """Raises unless every sharded dimension divides by its mesh axes' size.

  Args:
    shapes: a tree of arrays or ShapeDtypeStructs.
    shardings: the matching tree of NamedShardings.
    what: the message's name of the tree (e.g. 'parameter ', followed by
      a leaf's path).
  Raises:
    ValueError: naming the leaf's path, the dimension, its size and the mesh
      axes with their sizes.
  """
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  for (path, leaf), sharding in zip(flat, jax.tree.leaves(shardings)):
    for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec)):
      if size % _axis_size(sharding.mesh, axes):
        sizes = {a: sharding.mesh.shape[a] for a in
                 ((axes,) if isinstance(axes, str) else axes)}
        raise ValueError(
            f"{what}{jax.tree_util.keystr(path)} of shape {leaf.shape}: "
            f"dimension {dim} ({size}) does not divide over mesh axes "
            f"{sizes}; change the mesh shape or the rules")


def shard_params(params, config: TransformerConfig, mesh: Mesh,
                 rules=DEFAULT_RULES):
  """Places `params` on `mesh` according to their logical axes."""
  return jax.device_put(params, param_shardings(config, mesh, rules))


def place_cache(cache, mesh: Mesh, place, rules=DEFAULT_RULES):
  """`cache` with every array passed through `place(array, sharding)`.

  Keys/values [B, Hkv, S, Dh] get KV_CACHE_AXES, int8 scales [B, Hkv, S]
  KVCache.SCALE_LOGICAL_AXES and the write index 'cache_batch'. `place` is
  `jax.device_put` (placing a cache, `shard_cache`) or
  `jax.lax.with_sharding_constraint` (inside a jitted step).
  """
  kv = logical_sharding(mesh, KV_CACHE_AXES, rules)
  scale = logical_sharding(mesh, KVCache.SCALE_LOGICAL_AXES, rules)
  index = logical_sharding(mesh, ("cache_batch",), rules)
  put = lambda a: place(a, kv if a.ndim == 4 else scale)
  return cache.replace(k=jax.tree.map(put, cache.k),
                       v=jax.tree.map(put, cache.v),
                       index=place(cache.index, index))


def shard_cache(cache, mesh: Mesh, rules=DEFAULT_RULES):
  """Places a `KVCache` on `mesh` by its logical axes (see `place_cache`)."""
  return place_cache(cache, mesh, jax.device_put, rules)


def shard_batch(array: np.ndarray | jax.Array, mesh: Mesh,
                rules=DEFAULT_RULES) -> jax.Array:
  """Places an array whose leading dimension is the batch on `mesh`."""
  return jax.device_put(array, batch_sharding(mesh, np.shape(array), rules))


def batch_sharding(mesh: Mesh, shape: Sequence[int],
                   rules=DEFAULT_RULES) -> NamedSharding:
  """The sharding of an array of `shape` whose leading dimension is 'batch'.

  Raises:
    ValueError: the batch size does not divide over the mesh axes 'batch'
      maps to (e.g. batch 1 on a data=8 mesh).
  """
  axes = ("batch",) + (None,) * (len(shape) - 1)
  sharding = logical_sharding(mesh, axes, rules)
  check_divisible(jax.ShapeDtypeStruct(tuple(shape), np.int32), sharding,
                  "batch")
  return sharding


def replicated(mesh: Mesh) -> NamedSharding:
  """A sharding that keeps a whole copy of an array on every device."""
  return NamedSharding(mesh, PartitionSpec())
