"""A pure decoder-only Transformer (flax linen) with an explicit KV cache.

`Transformer(config).apply({'params': p}, tokens, positions, cache=None)`
returns `(logits float32[B, L, V], cache)`. The same module serves as a causal
LM and as a bidirectional masked-diffusion denoiser (`config.attention`).
Parameters carry logical axis names ('vocab', 'embed', 'heads', 'kv', 'mlp')
so sharding only adds rules (see `lm_decoding.parallel`).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.kv_cache import KVCache, write_rows

_NEG = -1e30  # finite mask value for float32 attention scores


def _init(init_fn, *axes):
  return nn.with_logical_partitioning(init_fn, axes)


class Norm(nn.Module):
  """RMSNorm (Zhang & Sennrich 2019) or LayerNorm over the last axis."""

  config: TransformerConfig
  eps: float = 1e-6

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    x = x_BxLxD.astype(jnp.float32)
    scale = self.param("scale", _init(nn.initializers.ones, "embed"),
                       (cfg.d_model,), cfg.weight_dtype)
    if cfg.norm == "layernorm":
      x = x - x.mean(-1, keepdims=True)
      bias = self.param("bias", _init(nn.initializers.zeros, "embed"),
                        (cfg.d_model,), cfg.weight_dtype)
    else:
      bias = 0.0
    x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + self.eps)
    return (x * scale + bias).astype(cfg.compute_dtype)


def rotary(x_BxLxHxD: jax.Array, positions_BxL: jax.Array,
           base: float) -> jax.Array:
  """Rotary position embedding (Su et al. 2021), half-split convention."""
  half = x_BxLxHxD.shape[-1] // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_BxLx1xF = (positions_BxL[..., None].astype(jnp.float32) * freq)[:, :, None]
  sin, cos = jnp.sin(angle_BxLx1xF), jnp.cos(angle_BxLx1xF)
  x = x_BxLxHxD.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxD.dtype)


class Attention(nn.Module):
  """Multi-head / grouped-query / multi-query self-attention.

  Query head h reads key/value head h // (num_heads // num_kv_heads).
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, mask_BxLxS, k_cache, v_cache,
               index_B):
    cfg = self.config
    dense = lambda feats, axes, name: nn.DenseGeneral(
        feats, use_bias=False, dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype, name=name,
        kernel_init=_init(nn.initializers.lecun_normal(), *axes))
    q = dense((cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"), "query")(x_BxLxD)
    k = dense((cfg.num_kv_heads, cfg.head_dim), ("embed", "heads", "kv"), "key")(x_BxLxD)
    v = dense((cfg.num_kv_heads, cfg.head_dim), ("embed", "heads", "kv"), "value")(x_BxLxD)
    if cfg.positional == "rope":
      q = rotary(q, positions_BxL, cfg.rope_base)
      k = rotary(k, positions_BxL, cfg.rope_base)
    if k_cache is not None:
      k_cache = write_rows(k_cache, k, index_B)
      v_cache = write_rows(v_cache, v, index_B)
      k, v = k_cache, v_cache
    b, l = q.shape[:2]
    groups = cfg.num_heads // cfg.num_kv_heads
    q_BxLxKxGxD = q.reshape(b, l, cfg.num_kv_heads, groups, cfg.head_dim)
    scores = jnp.einsum("blkgd,bskd->bkgls", q_BxLxKxGxD, k,
                        preferred_element_type=jnp.float32)
    scores = scores * (cfg.head_dim ** -0.5)
    scores = jnp.where(mask_BxLxS[:, None, None], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(cfg.compute_dtype)
    out = jnp.einsum("bkgls,bskd->blkgd", probs, v)
    out_BxLxHxD = out.reshape(b, l, cfg.num_heads, cfg.head_dim)
    y = nn.DenseGeneral(
        cfg.d_model, axis=(-2, -1), use_bias=False, dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype, name="out",
        kernel_init=_init(nn.initializers.lecun_normal(), "heads", "kv", "embed"),
    )(out_BxLxHxD)
    return y, k_cache, v_cache


class Mlp(nn.Module):
  """SwiGLU or GELU feed-forward block."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    dense = lambda feats, axes, name: nn.Dense(
        feats, use_bias=False, dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype, name=name,
        kernel_init=_init(nn.initializers.lecun_normal(), *axes))
    h = dense(cfg.mlp_dim, ("embed", "mlp"), "wi")(x_BxLxD)
    if cfg.mlp_activation == "swiglu":
      h = nn.silu(dense(cfg.mlp_dim, ("embed", "mlp"), "wi_gate")(x_BxLxD)) * h
    else:
      h = nn.gelu(h)
    return dense(cfg.d_model, ("mlp", "embed"), "wo")(h)


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


def attention_mask(config: TransformerConfig, batch: int, length: int,
                   cache: KVCache | None,
                   input_mask_BxL: jax.Array | None) -> jax.Array:
  """bool[B, L, S]: which key slots each query may attend to.

  Without a cache, S = L and keys are the inputs themselves. With a cache,
  query i of row b sits in slot index[b] + i and sees the slots written so far.
  """
  q = jnp.arange(length)
  if cache is None:
    k = jnp.arange(length)
    mask = jnp.ones((batch, length, length), bool)
    if config.attention == "causal":
      mask &= (k[None, :] <= q[:, None])[None]
    if input_mask_BxL is not None:
      mask &= input_mask_BxL[:, None, :].astype(bool)
    return mask
  k = jnp.arange(cache.length)
  query_slot_BxL = cache.index[:, None] + q[None, :]
  written_BxS = k[None, :] < (cache.index[:, None] + length)
  mask = jnp.broadcast_to(written_BxS[:, None, :], (batch, length, cache.length))
  if config.attention == "causal":
    mask &= k[None, None, :] <= query_slot_BxL[:, :, None]
  return mask


class Transformer(nn.Module):
  """Decoder-only Transformer: tokens -> float32 logits, threading a KV cache.

  Call: `apply({'params': p}, tokens, positions, cache=None, input_mask=None)`.
    tokens: int32[B, L] token ids.
    positions: int32[B, L] per-row positions (RoPE angle or learned row).
    cache: a `KVCache` to read and extend (cached decoding), or None for a
      full forward pass over `tokens` alone.
    input_mask: optional bool[B, L] key validity (False keys are never
      attended to); only without a cache (e.g. padding in diffusion decoding).
  Returns:
    logits: float32[B, L, vocab_size].
    cache: the cache with the L new keys/values written at each row's index
      and index advanced by L, or None when no cache was given.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens_BxL, positions_BxL, cache=None, input_mask=None):
    cfg = self.config
    if cache is not None and input_mask is not None:
      raise ValueError("input_mask is only supported without a cache")
    b, l = tokens_BxL.shape
    embedding = self.param(
        "embedding", _init(nn.initializers.normal(1.0), "vocab", "embed"),
        (cfg.vocab_size, cfg.d_model), cfg.weight_dtype)
    x = jnp.take(embedding, tokens_BxL, axis=0).astype(cfg.compute_dtype)
    if cfg.tie_embeddings:
      x = x * jnp.asarray(cfg.d_model ** 0.5, cfg.compute_dtype)
    if cfg.positional == "learned":
      pos_embedding = self.param(
          "pos_embedding", _init(nn.initializers.normal(0.02), None, "embed"),
          (cfg.max_len, cfg.d_model), cfg.weight_dtype)
      x = x + jnp.take(pos_embedding, positions_BxL, axis=0).astype(cfg.compute_dtype)
    mask = attention_mask(cfg, b, l, cache, input_mask)
    new_k, new_v = [], []
    for i in range(cfg.num_layers):
      kc = vc = None
      if cache is not None:
        kc, vc = cache.k[i], cache.v[i]
      x, kc, vc = Block(cfg, name=f"block_{i}")(
          x, positions_BxL, mask, kc, vc, None if cache is None else cache.index)
      new_k.append(kc)
      new_v.append(vc)
    x = Norm(cfg, name="final_norm")(x)
    if cfg.tie_embeddings:
      logits = jnp.einsum("bld,vd->blv", x, embedding.astype(cfg.compute_dtype),
                          preferred_element_type=jnp.float32)
      logits = logits * (cfg.d_model ** -0.5)
    else:
      logits = nn.Dense(
          cfg.vocab_size, use_bias=False, dtype=cfg.compute_dtype,
          param_dtype=cfg.weight_dtype, name="lm_head",
          kernel_init=_init(nn.initializers.lecun_normal(), "embed", "vocab"),
      )(x)
    logits = logits.astype(jnp.float32)
    if cache is None:
      return logits, None
    return logits, cache.replace(k=tuple(new_k), v=tuple(new_v),
                                 index=cache.index + l)


def init_params(config: TransformerConfig, key: jax.Array, length: int = 8):
  """Unboxed float parameters of a fresh model (logical axes stripped)."""
  tokens = jnp.zeros((1, length), jnp.int32)
  variables = Transformer(config).init(key, tokens, tokens)
  return nn.meta.unbox(variables["params"])


def abstract_params(config: TransformerConfig):
  """Shape/dtype tree of the (boxed) parameters, without allocating them."""
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  return jax.eval_shape(
      lambda t: Transformer(config).init(jax.random.key(0), t, t)["params"],
      tokens)


def count_params(params) -> int:
  """Total number of scalar parameters in a (boxed or unboxed) tree."""
  leaves = jax.tree.leaves(nn.meta.unbox(params))
  return int(sum(x.size for x in leaves))


@dataclasses.dataclass(frozen=True)
class ModelLogitsFn:
  """The decoder boundary for a `Transformer` (see `lm_decoding.decoding.base`).

  Hashable, so decoders can take it as a static jit argument.
  """

  config: TransformerConfig

  @property
  def max_len(self) -> int:
    return self.config.max_len

  def __call__(self, params, tokens, positions, cache=None, input_mask=None):
    return Transformer(self.config).apply(
        {"params": params}, tokens, positions, cache=cache,
        input_mask=input_mask)

  def init_cache(self, batch_size: int, length: int) -> KVCache:
    return KVCache.init(self.config, batch_size, length)


def make_logits_fn(config: TransformerConfig) -> ModelLogitsFn:
  """(params, tokens, positions, cache, input_mask) -> (logits, cache)."""
  return ModelLogitsFn(config)
