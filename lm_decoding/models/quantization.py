"""Converts a float checkpoint into the weight-only int8 layout and back.

The shipped float32 models decode with `quantization='int8_weights'` without
retraining: `quantize_params` quantises each parameter the int8 model stores
as int8 (`lm_decoding.models.int8`, symmetric absmax), keeping the rest.
`dequantize_params` turns such a tree back into float parameters (a shipped
member stored as int8 is loaded that way: `pretrained.store.export`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_decoding.models import int8
from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.transformer import abstract_params


def _layout(config: TransformerConfig):
  return nn.meta.unbox(abstract_params(config))


def _reduced_axes(name: str, values, scale) -> tuple[int, ...]:
  """Axes of int8 parameter `name` that share one scale: a kernel keeps its
  trailing output axes, the embedding its rows."""
  if name == "kernel":
    return tuple(range(values.ndim - scale.ndim))
  return tuple(range(scale.ndim, values.ndim))


def _is_scale(name: str, tree: dict) -> bool:
  return name.endswith("_scale") and name[:-len("_scale")] in tree


def _convert(float_tree: dict, int8_tree: dict) -> dict:
  out = {}
  for name, target in int8_tree.items():
    if isinstance(target, dict):
      out[name] = _convert(float_tree[name], target)
    elif _is_scale(name, int8_tree):
      continue  # made with its int8 values below
    elif target.dtype == jnp.int8:
      axes = _reduced_axes(name, target, int8_tree[f"{name}_scale"])
      out[name], out[f"{name}_scale"] = int8.quantize(float_tree[name], axes)
    else:  # in the int8 model's dtype (Int8Dense keeps float32 biases)
      out[name] = float_tree[name].astype(target.dtype)
  return out


def quantize_params(params: Any, config: TransformerConfig) -> Any:
  """The int8-weights parameters of a float checkpoint.

  Every matmul kernel becomes int8 'kernel' plus float32 'kernel_scale' (one
  scale per output channel), the token embedding int8 'embedding' plus
  float32 'embedding_scale' (one per row); norms, learned positions and the
  length head are kept as they are.

  Args:
    params: unboxed float parameters of `config` with quantization 'none'
      (e.g. a shipped checkpoint).
    config: the model's config; its `quantization` is ignored.
  Returns:
    Parameters of `config.replace(quantization='int8_weights')`.
  Raises:
    ValueError: `params` is not the float parameter tree of `config` (names
      the first parameter whose path, shape or dtype differs).
  """
  expected = _layout(config.replace(quantization="none"))
  got = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  flat_expected = dict(jax.tree_util.tree_leaves_with_path(expected))
  flat_got = dict(jax.tree_util.tree_leaves_with_path(got))
  for path in sorted(flat_expected.keys() | flat_got.keys(), key=str):
    want, have = flat_expected.get(path), flat_got.get(path)
    if (want is None or have is None or want.shape != have.shape
        or want.dtype != have.dtype):
      show = lambda x: "absent" if x is None else f"{x.dtype}{list(x.shape)}"
      raise ValueError(
          f"params{jax.tree_util.keystr(path)} is {show(have)}; the float "
          f"parameters of this config have {show(want)}")
  return _convert(params, _layout(config.replace(quantization="int8_weights")))


def dequantize_params(params: Any, dtype: Any = jnp.float32) -> Any:
  """The float parameters an int8-weights tree stands for.

  Each int8 parameter times its '{name}_scale' (which is dropped); every
  parameter in `dtype`. Inverts `quantize_params` up to its rounding: each
  weight within half its channel's scale.

  Args:
    params: parameters of a config with quantization 'int8_weights' (e.g.
      `quantize_params`'s output).
    dtype: the float dtype of the dequantised parameters.
  Returns:
    Parameters of the same config with quantization 'none'.
  """
  def convert(tree: dict) -> dict:
    out = {}
    for name, value in tree.items():
      if isinstance(value, dict):
        out[name] = convert(value)
      elif _is_scale(name, tree):
        continue
      elif value.dtype == jnp.int8:
        scale = tree[f"{name}_scale"]
        out[name] = int8.dequantize(value, scale,
                                    _reduced_axes(name, value, scale), dtype)
      else:
        out[name] = value.astype(dtype)
    return out
  return convert(params)
