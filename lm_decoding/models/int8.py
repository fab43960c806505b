"""Symmetric absmax int8 quantisation and the weight-only int8 Dense layer.

A float tensor x is stored as int8 values q and float32 scales s, one scale
per index of the kept axes, the reduced axes sharing it:

    s = max |x| / 127 over the reduced axes,   q = round(x / s) in [-127, 127],
    x ~ q * s,   |x - q * s| <= s / 2 elementwise (round to nearest).

An all-zero slice gets s = 0 and q = 0 (exact). This is the weight-only int8
scheme of LLM.int8() (Dettmers et al. 2022) without its outlier split, and
the per-channel absmax of Jacob et al. (2018) made symmetric: a matmul kernel
keeps its output axes (one scale per output channel), an embedding keeps
its rows (one scale per token, which is also the tied LM head's output
channel), cached keys/values keep (row, KV head, slot) (one scale per head
vector, `lm_decoding.models.kv_cache`).

The matmul of `Int8Dense` is (x @ float(q)) * s, the scale applied to the
[..., out] product rather than to the [in, out] kernel: XLA on CPU does not
fuse an int8->float convert into its dot (the optimised HLO holds a convert
fusion feeding the dot), so both forms materialise the converted kernel, one
layer at a time while it is hot in cache, and read only the int8 one from
memory; scaling the product costs B * out multiplies instead of in * out.
`experiments/quantization.py` times both forms against float32 (16 stacked
512x2048 kernels, medians of 21 interleaved runs on 2 busy cores): batch 1,
0.58x (x @ q) * s and 0.57x x @ (q * s) of the float32 time; batch 8, 0.70x
and 0.82x. In whole decodes the difference was within that machine's noise
(experiments/results/quantization/report.md): int8 weights save 4x memory,
not yet time, while the converted kernel is materialised.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

INT8_MAX = 127


def _axes(axes: int | Sequence[int], ndim: int) -> tuple[int, ...]:
  axes = (axes,) if isinstance(axes, int) else tuple(axes)
  return tuple(sorted(a % ndim for a in axes))


def quantize(x: jax.Array, axes: int | Sequence[int]
             ) -> tuple[jax.Array, jax.Array]:
  """Symmetric absmax int8 quantisation of `x` over the reduced `axes`.

  Args:
    x: a float array.
    axes: the reduced axes (sharing one scale), e.g. 0 for a [in, out]
      kernel (per output channel) or -1 for [B, Hkv, S, Dh] keys (per head).
  Returns:
    (q, scale): q int8 of x's shape, values in [-127, 127]; scale float32 of
    x's shape without `axes`, max |x| / 127 over them (0 for an all-zero
    slice).
  """
  axes = _axes(axes, x.ndim)
  x = x.astype(jnp.float32)
  scale = jnp.max(jnp.abs(x), axis=axes) / INT8_MAX
  safe = jnp.expand_dims(jnp.where(scale > 0, scale, 1.0), axes)
  q = jnp.clip(jnp.round(x / safe), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return q, scale


def dequantize(q: jax.Array, scale: jax.Array, axes: int | Sequence[int],
               dtype: Any = jnp.float32) -> jax.Array:
  """q * scale in `dtype`, `scale` broadcast over the reduced `axes` of q."""
  axes = _axes(axes, q.ndim)
  return (q.astype(jnp.float32) * jnp.expand_dims(scale, axes)).astype(dtype)


def int8_param(module: nn.Module, name: str, shape: tuple[int, ...],
               logical_axes: tuple[str | None, ...], axes: Sequence[int],
               init: Callable[..., jax.Array]
               ) -> tuple[jax.Array, jax.Array]:
  """Declares int8 parameter `name` and its float32 scale `{name}_scale`.

  At initialisation a float tensor is drawn with `init` and quantised over
  `axes` (so a fresh int8 model is the quantisation of a fresh float one of
  the same distribution); afterwards the stored values are returned.

  Args:
    module: the module declaring them (inside its compact `__call__`).
    name: parameter name of the int8 values.
    shape: their shape.
    logical_axes: their logical axis names; the scale keeps those of the
      axes not in `axes`.
    axes: the reduced axes (see `quantize`).
    init: a flax initializer (key, shape, dtype) -> float array.
  Returns:
    (q int8[shape], scale float32[shape without axes]).
  """
  axes = _axes(axes, len(shape))
  q = scale = None
  if module.is_initializing():
    q, scale = quantize(init(module.make_rng("params"), shape, jnp.float32),
                        axes)
  scale_axes = tuple(a for i, a in enumerate(logical_axes) if i not in axes)
  q = module.param(name, nn.with_logical_partitioning(
      lambda _: q, logical_axes))
  scale = module.param(f"{name}_scale", nn.with_logical_partitioning(
      lambda _: scale, scale_axes))
  return q, scale


class Int8Dense(nn.Module):
  """Weight-only int8 `nn.DenseGeneral`: (x @ q) * scale (+ bias).

  The product x @ q is accumulated in float32 and scaled before the cast to
  `dtype`, so float16 and bfloat16 compute stay finite wherever the float
  layer's output is.

  Parameters: 'kernel' int8[*in, *features] and 'kernel_scale'
  float32[*features], one scale per output channel (see module doc); with
  `use_bias`, a float32 'bias'[*features] kept unquantised.

  Attributes:
    features: output shape (an int or a tuple).
    axis: the input axes contracted (trailing), as `nn.DenseGeneral`.
    kernel_axes: logical axes of the kernel, inputs then features.
    use_bias: add a float bias over the features.
    bias_axes: logical axes of the bias (the kernel's feature axes).
    dtype: compute dtype of the matmul and the result.
  """

  features: int | tuple[int, ...]
  axis: int | tuple[int, ...] = -1
  kernel_axes: tuple[str | None, ...] = ()
  use_bias: bool = False
  bias_axes: tuple[str | None, ...] = ()
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = ((self.features,) if isinstance(self.features, int)
                else tuple(self.features))
    axis = _axes(self.axis, x.ndim)
    n_in = len(axis)
    inputs = tuple(range(n_in))
    outputs = tuple(range(n_in, n_in + len(features)))
    kernel, scale = int8_param(
        self, "kernel", tuple(x.shape[a] for a in axis) + features,
        self.kernel_axes, inputs,
        nn.initializers.lecun_normal(in_axis=inputs, out_axis=outputs))
    # Accumulated and scaled in float32, cast last: the raw int8 values (up
    # to 127) make the unscaled product up to 127 / max|w| times the true
    # one, which overflows float16 (max 65504) where the scaled product
    # does not.
    y = jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype),
                            ((axis, inputs), ((), ())),
                            preferred_element_type=jnp.float32)
    y = y * scale
    if self.use_bias:
      y = y + self.param("bias", nn.with_logical_partitioning(
          nn.initializers.zeros, self.bias_axes), features, jnp.float32)
    return y.astype(self.dtype)
