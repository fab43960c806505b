"""The layers of the `Transformer` (flax linen): norms, attention with its
KV cache, the MLP, the pre-norm block, the CMLM length head and the
self-conditioning input.

Parameters carry logical axis names ('vocab', 'embed', 'heads', 'kv_heads',
'kv', 'mlp'; `param_init`) so sharding only adds rules (see
`lm_decoding.parallel`); every dense layer runs on the B x L positions
flattened (`flat_positions`) and has an int8 twin (`dense`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_decoding.models import int8
from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.kv_cache import (Int8KV, as_cached, write_rows,
                                         write_start)
from lm_decoding.models.rope import rotary

_NEG = -1e30  # finite mask value for float32 attention scores


def param_init(init_fn, *axes):
  """`init_fn` with the logical axis names `axes` of its parameter."""
  return nn.with_logical_partitioning(init_fn, axes)


def dense(cfg: TransformerConfig, features, axes, name, axis=-1,
           use_bias=None):
  """An `nn.DenseGeneral` with logical kernel `axes` (inputs then features),
  or its weight-only int8 twin (`int8.Int8Dense`) when cfg.quantization ==
  'int8_weights'. A bias (float, over the feature axes) when `use_bias`,
  which defaults to cfg.use_bias."""
  use_bias = cfg.use_bias if use_bias is None else use_bias
  bias_axes = axes[1 if isinstance(axis, int) else len(axis):]
  if cfg.quantization == "int8_weights":
    return int8.Int8Dense(features, axis=axis, kernel_axes=axes,
                          use_bias=use_bias, bias_axes=bias_axes,
                          dtype=cfg.compute_dtype, name=name)
  return nn.DenseGeneral(
      features, axis=axis, use_bias=use_bias, dtype=cfg.compute_dtype,
      param_dtype=cfg.weight_dtype, name=name,
      kernel_init=param_init(nn.initializers.lecun_normal(), *axes),
      bias_init=param_init(nn.initializers.zeros, *bias_axes))


def flat_positions(x_BxLxD: jax.Array) -> jax.Array:
  """x [B, L, D] as [T = B L, D], the shape every dense layer runs on.

  A weight gradient then contracts one axis (T), which XLA CPU's dot reads
  in place; contracting B and L apart, it first writes the activation
  gradient transposed, a strided copy per matmul (1.1 s of a 2.8 s base AR
  train step; benchmarks/training_speed/flatten/). A reshape: no copy.
  """
  return x_BxLxD.reshape(-1, x_BxLxD.shape[-1])


def _per_key(scale_BxHkvxS: jax.Array) -> jax.Array:
  """int8 cache scales [B, Hkv, S] broadcast against the attention scores
  [B, Hkv, Hg, L, S]."""
  return scale_BxHkvxS[:, :, None, None, :]


class Norm(nn.Module):
  """RMSNorm (Zhang & Sennrich 2019) or LayerNorm over the last axis.

  The epsilon is `config.norm_eps`. The last axis is the model width D
  (`axis` 'embed'), or a head's Dh features (`axis` 'kv': Qwen3's per-head
  query/key norm, `config.qk_norm`).
  """

  config: TransformerConfig
  axis: str = "embed"  # the normalised axis: 'embed' (D) or 'kv' (Dh)

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    x = x_BxLxD.astype(jnp.float32)
    scale = self.param("scale", param_init(nn.initializers.ones, self.axis),
                       (x.shape[-1],), cfg.weight_dtype)
    if cfg.norm == "layernorm":
      x = x - x.mean(-1, keepdims=True)
      bias = self.param("bias", param_init(nn.initializers.zeros, self.axis),
                        (x.shape[-1],), cfg.weight_dtype)
    else:
      bias = 0.0
    x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps)
    return (x * scale + bias).astype(cfg.compute_dtype)


def _attend(cfg: TransformerConfig, q_BxLxHkvxHgxDh: jax.Array,
            parts) -> jax.Array:
  """Softmax attention over the keys of every part at once.

  Args:
    cfg: the model config (compute dtype, head dim).
    q_BxLxHkvxHgxDh: queries, KV head k's Hg = H / Hkv query heads grouped.
    parts: (keys, values, mask bool[B, L, S_i]) triples, keys and values
      [B, Hkv, S_i, Dh] or `Int8KV`s; masked keys get weight 0.
  Returns:
    [B, Hkv, Hg, L, Dh] in the compute dtype.
  """
  scores = []
  for keys, _, mask in parts:
    key_scale = None
    if isinstance(keys, Int8KV):
      keys, key_scale = keys.values, keys.scale
    s = jnp.einsum("blkgd,bksd->bkgls", q_BxLxHkvxHgxDh,
                   keys.astype(cfg.compute_dtype),
                   preferred_element_type=jnp.float32)
    if key_scale is not None:
      s = s * _per_key(key_scale)
    s = s * (cfg.head_dim ** -0.5)
    scores.append(jnp.where(mask[:, None, None], s, _NEG))
  probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
  out, first = 0, 0
  for _, values, _ in parts:
    size = values.shape[2]
    p = probs[..., first:first + size]
    first += size
    if isinstance(values, Int8KV):
      p = p * _per_key(values.scale)
      values = values.values
    # Output [B, Hkv, Hg, L, Dh]: with L last in the result XLA CPU copies
    # the values into a transposed layout for the dot at batch 1.
    out = out + jnp.einsum("bkgls,bksd->bkgld", p.astype(cfg.compute_dtype),
                           values.astype(cfg.compute_dtype))
  return out


def _after(new, out_BxHkvxHgxLxDh: jax.Array):
  """`new` (the L new keys or values as cached: [B, Hkv, L, Dh] or an
  `Int8KV`) plus 0 * (row b's sum of the attention output) in every leaf:
  the same values (for a finite output), written to the cache only after the
  attention has read the old cache. Without this data dependency XLA CPU
  cannot order the in-place write after the read and copies every layer's
  cache every step at batch 1 (2.0 ms of a 110M model's 16.0 ms step;
  benchmarks/ar_decode/profile/)."""
  zero_B = 0 * out_BxHkvxHgxLxDh.astype(jnp.float32).sum(
      axis=tuple(range(1, out_BxHkvxHgxLxDh.ndim)))
  return jax.tree.map(
      lambda a: a + zero_B.reshape((-1,) + (1,) * (a.ndim - 1)).astype(a.dtype),
      new)


class Attention(nn.Module):
  """Multi-head / grouped-query / multi-query self-attention.

  Query head h reads key/value head h // (num_heads // num_kv_heads).
  Keys and values are attended heads-major, [B, Hkv, S, Dh], the cache's
  layout, so the dots (batched over row and KV head) read the cache in place;
  the L new keys/values are moved to that layout once. With a cache, the
  queries attend to the cache as it was (the slots being written masked
  out) and to the L new keys and values as the cache stores them, in one
  softmax: the keys of the cache after the write, which is done last
  (`_after`). With an int8 cache (`Int8KV`), keys and values are read as
  int8 and their per-(row, KV head, slot) scales are folded in: into the
  scores (q . k_q * k_scale[s]) and into the probabilities (sum_s p[s] *
  v_scale[s] * v_q[s]), which equals attending over the dequantised cache
  without writing it. The projections run on the B x L positions flattened
  (`flat_positions`).
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, mask_BxLxS, k_cache, v_cache,
               index_B):
    cfg = self.config
    b, l = positions_BxL.shape
    x_BLxD = flat_positions(x_BxLxD)

    def project(heads, axes, name):  # [T, D] -> [B, L, heads, Dh]
      return dense(cfg, (heads, cfg.head_dim), axes, name,
                    use_bias=cfg.use_bias or cfg.qkv_bias)(x_BLxD).reshape(
                        b, l, heads, cfg.head_dim)

    q = project(cfg.num_heads, ("embed", "heads", "kv"), "query")
    k = project(cfg.num_kv_heads, ("embed", "kv_heads", "kv"), "key")
    v = project(cfg.num_kv_heads, ("embed", "kv_heads", "kv"), "value")
    if cfg.qk_norm:
      q = Norm(cfg, axis="kv", name="query_norm")(q)
      k = Norm(cfg, axis="kv", name="key_norm")(k)
    if cfg.positional == "rope":
      q = rotary(q, positions_BxL, cfg.rope_base, cfg.rope_scaling)
      k = rotary(k, positions_BxL, cfg.rope_base, cfg.rope_scaling)
    k = jnp.swapaxes(k, 1, 2)  # [B, Hkv, L, Dh]
    v = jnp.swapaxes(v, 1, 2)
    groups = cfg.num_heads // cfg.num_kv_heads
    q_BxLxHkvxHgxDh = q.reshape(b, l, cfg.num_kv_heads, groups, cfg.head_dim)
    if k_cache is None:
      out = _attend(cfg, q_BxLxHkvxHgxDh, [(k, v, mask_BxLxS)])
    else:
      # The old cache without the slots this call writes, plus the L new
      # keys and values as the cache will hold them: the same keys as the
      # cache after the write, read before it.
      start_B = write_start(k_cache, l, index_B)
      slot_S = jnp.arange(k_cache.shape[2])
      written_BxS = ((slot_S >= start_B[:, None])
                     & (slot_S < start_B[:, None] + l))
      new_mask = jnp.take_along_axis(
          mask_BxLxS, (start_B[:, None] + jnp.arange(l))[:, None, :], axis=2)
      k_new, v_new = as_cached(k_cache, k), as_cached(v_cache, v)
      out = _attend(cfg, q_BxLxHkvxHgxDh, [
          (k_cache, v_cache, mask_BxLxS & ~written_BxS[:, None]),
          (k_new, v_new, new_mask)])
      k_cache = write_rows(k_cache, _after(k_new, out), index_B)
      v_cache = write_rows(v_cache, _after(v_new, out), index_B)
    out_BLxHxDh = jnp.moveaxis(out, 3, 1).reshape(b * l, cfg.num_heads,
                                                cfg.head_dim)
    y_BLxD = dense(cfg, cfg.d_model, ("heads", "kv", "embed"), "out",
                    axis=(-2, -1))(out_BLxHxDh)
    return y_BLxD.reshape(b, l, cfg.d_model), k_cache, v_cache


class Mlp(nn.Module):
  """SwiGLU or GELU feed-forward block.

  'gelu' is the tanh approximation (`nn.gelu`'s default; GPT-2's
  'gelu_new'), not the exact erf GELU.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    layer = lambda feats, axes, name: dense(cfg, feats, axes, name)
    x_BLxD = flat_positions(x_BxLxD)
    h = layer(cfg.mlp_dim, ("embed", "mlp"), "wi")(x_BLxD)
    if cfg.mlp_activation == "swiglu":
      h = nn.silu(layer(cfg.mlp_dim, ("embed", "mlp"), "wi_gate")(x_BLxD)) * h
    else:
      h = nn.gelu(h, approximate=True)
    return layer(cfg.d_model, ("mlp", "embed"), "wo")(h).reshape(
        x_BxLxD.shape)


class Block(nn.Module):
  """Pre-norm attention + MLP block."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x, positions, mask, k_cache, v_cache, index):
    a, k_cache, v_cache = Attention(self.config, name="attention")(
        Norm(self.config, name="attention_norm")(x), positions, mask,
        k_cache, v_cache, index)
    x = x + a
    x = x + Mlp(self.config, name="mlp")(Norm(self.config, name="mlp_norm")(x))
    return x, k_cache, v_cache


class LengthHead(nn.Module):
  """Target-length classifier over mean-pooled hidden states (CMLM).

  Ghazvininejad et al. (2019) predict the target length from the encoder;
  here from the mean of the final hidden states over the source positions.
  Class c is length c + 1.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, hidden_BxLxD, valid_BxL):
    cfg = self.config
    weight_BxLx1 = valid_BxL.astype(jnp.float32)[..., None]
    pooled_BxD = (hidden_BxLxD.astype(jnp.float32) * weight_BxLx1).sum(1) / (
        jnp.maximum(weight_BxLx1.sum(1), 1.0))
    return nn.Dense(
        cfg.length_classes, dtype=jnp.float32, param_dtype=cfg.weight_dtype,
        name="dense",
        kernel_init=param_init(nn.initializers.lecun_normal(), "embed", None),
        bias_init=param_init(nn.initializers.zeros, None))(pooled_BxD)


class SelfConditioning(nn.Module):
  """The self-conditioning input (DiffusionGemma's decoder; Chen et al.
  2022): x <- rms(x + Mlp(Norm(soft))), where soft [B, L, D] is the
  previous prediction's expected token embedding (its probabilities times
  the embedding table, scaled as the token embedding) and rms is an RMS
  normalisation without a scale. The MLP has the model's activation and
  width; a zero `soft` (no previous prediction) contributes Mlp(0), which
  is 0 without biases."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BxLxD, soft_BxLxD):
    cfg = self.config
    signal = Mlp(cfg, name="mlp")(Norm(cfg, name="norm")(soft_BxLxD))
    y = (x_BxLxD + signal).astype(jnp.float32)
    y = y * jax.lax.rsqrt((y * y).mean(-1, keepdims=True) + cfg.norm_eps)
    return y.astype(cfg.compute_dtype)
