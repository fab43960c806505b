"""A pure decoder-only Transformer (flax linen) with an explicit KV cache.

`Transformer(config).apply({'params': p}, tokens, positions, cache=None,
attention_mask=None)` returns a `ModelOutput` (logits float32[B, L, V], cache,
hidden). The same module serves as a causal LM, a bidirectional masked-
diffusion denoiser, a block-causal BD3-LM or a prefix LM: the attention mask
is an input (`lm_decoding.models.masks`), `config.attention` only its default.
Parameters carry logical axis names ('vocab', 'embed', 'heads', 'kv_heads',
'kv', 'mlp') so sharding only adds rules (see `lm_decoding.parallel`).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.models import int8
from lm_decoding.models import masks
from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.kv_cache import (Int8KV, KVCache, as_cached,
                                         write_rows, write_start)
from lm_decoding.models.output import ModelOutput
from lm_decoding.models.rope import rotary

_NEG = -1e30  # finite mask value for float32 attention scores


def _init(init_fn, *axes):
  return nn.with_logical_partitioning(init_fn, axes)


def _dense(cfg: TransformerConfig, features, axes, name, axis=-1,
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
      kernel_init=_init(nn.initializers.lecun_normal(), *axes),
      bias_init=_init(nn.initializers.zeros, *bias_axes))


def _flat_positions(x_BxLxD: jax.Array) -> jax.Array:
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
    scale = self.param("scale", _init(nn.initializers.ones, self.axis),
                       (x.shape[-1],), cfg.weight_dtype)
    if cfg.norm == "layernorm":
      x = x - x.mean(-1, keepdims=True)
      bias = self.param("bias", _init(nn.initializers.zeros, self.axis),
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
  (`_flat_positions`).
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, mask_BxLxS, k_cache, v_cache,
               index_B):
    cfg = self.config
    b, l = positions_BxL.shape
    x_BLxD = _flat_positions(x_BxLxD)

    def project(heads, axes, name):  # [T, D] -> [B, L, heads, Dh]
      return _dense(cfg, (heads, cfg.head_dim), axes, name,
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
    y_BLxD = _dense(cfg, cfg.d_model, ("heads", "kv", "embed"), "out",
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
    dense = lambda feats, axes, name: _dense(cfg, feats, axes, name)
    x_BLxD = _flat_positions(x_BxLxD)
    h = dense(cfg.mlp_dim, ("embed", "mlp"), "wi")(x_BLxD)
    if cfg.mlp_activation == "swiglu":
      h = nn.silu(dense(cfg.mlp_dim, ("embed", "mlp"), "wi_gate")(x_BLxD)) * h
    else:
      h = nn.gelu(h, approximate=True)
    return dense(cfg.d_model, ("mlp", "embed"), "wo")(h).reshape(
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
        kernel_init=_init(nn.initializers.lecun_normal(), "embed", None),
        bias_init=_init(nn.initializers.zeros, None))(pooled_BxD)


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


class Transformer(nn.Module):
  """Decoder-only Transformer: tokens -> float32 logits, threading a KV cache.

  Call: `apply({'params': p}, tokens, positions, cache=None,
  attention_mask=None, self_conditioning=None)`.
    tokens: int32[B, L] token ids.
    positions: int32[B, L] per-row positions (RoPE angle or learned row).
    cache: a `KVCache` to read and extend (cached decoding), or None for a
      full forward pass over `tokens` alone.
    attention_mask: bool[B, L, S] which keys each query sees (S = L without
      a cache, the cache length with one); build it with
      `lm_decoding.models.masks`. None is `masks.default_mask` of
      `config.attention` (causal, block-causal, or every written slot).
      With `config.sliding_window` W, keys W or more slots from the query
      are masked out too (`masks.sliding_window_mask`).
    self_conditioning: float32[B, L, V] the previous prediction's
      probabilities at the L positions, or None (zeros: no previous
      prediction); only with `config.self_conditioning` (`SelfConditioning`).
  Returns:
    `ModelOutput`: logits float32[B, L, vocab_size]; the cache with the L new
    keys/values written at each row's index and index advanced by L (None
    without a cache); hidden [B, L, D], the final-norm hidden states.
  Raises:
    ValueError: a position >= `config.max_len`, when the positions are
      known (an eager call; under `jax.jit` they are traced, and the
      callers check their lengths: decoders, `gen_ppl`, the trainer's
      config). A learned position table has no row past it, and an imported
      model's RoPE scaling (e.g. dynamic NTK) changes past it: Hugging Face
      refuses or rescales where this model would silently differ. Not the
      token count: BD3-LM's training input is 2L tokens at positions
      0..L-1 twice. attention_mask not of shape [B, L, S];
      self_conditioning not of shape [B, L, V], or given to a model without
      the input.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens_BxL, positions_BxL, cache=None,
               attention_mask=None, self_conditioning=None):
    cfg = self.config
    b, l = tokens_BxL.shape
    if not isinstance(positions_BxL, jax.core.Tracer):  # known: checked
      top = int(np.max(np.asarray(positions_BxL), initial=-1))
      if top >= cfg.max_len:
        raise ValueError(f"positions reach {top}; the model's max_len="
                         f"{cfg.max_len} allows 0..{cfg.max_len - 1}")
    if self_conditioning is not None and (
        not cfg.self_conditioning
        or self_conditioning.shape != (b, l, cfg.vocab_size)):
      raise ValueError(
          f"self_conditioning of shape {self_conditioning.shape} needs "
          f"config.self_conditioning (it is {cfg.self_conditioning}) and "
          f"the shape [B, L, V] = {(b, l, cfg.vocab_size)}")
    if attention_mask is None:
      attention_mask = masks.default_mask(
          cfg.attention, b, l, None if cache is None else cache.index,
          None if cache is None else cache.length, cfg.block_length)
    s = l if cache is None else cache.length
    if attention_mask.shape != (b, l, s):
      raise ValueError(f"attention_mask has shape {attention_mask.shape}; "
                       f"expected [B, L, S] = {(b, l, s)}")
    embedding_init = nn.initializers.normal(cfg.d_model ** -0.5)
    if cfg.quantization == "int8_weights":  # one scale per row (token)
      embedding, embedding_scale = int8.int8_param(
          self, "embedding", (cfg.vocab_size, cfg.d_model), ("vocab", "embed"),
          (1,), embedding_init)
      x = int8.dequantize(jnp.take(embedding, tokens_BxL, axis=0),
                          jnp.take(embedding_scale, tokens_BxL, axis=0), -1,
                          cfg.compute_dtype)
    else:
      embedding = self.param(
          "embedding", _init(embedding_init, "vocab", "embed"),
          (cfg.vocab_size, cfg.d_model), cfg.weight_dtype)
      x = jnp.take(embedding, tokens_BxL, axis=0).astype(cfg.compute_dtype)
    scaled = cfg.tie_embeddings and cfg.scale_embeddings
    if scaled:
      x = x * jnp.asarray(cfg.d_model ** 0.5, cfg.compute_dtype)
    if cfg.self_conditioning:
      x = SelfConditioning(cfg, name="self_conditioning")(
          x, self._soft_embedding(self_conditioning, embedding,
                                  embedding_scale if cfg.quantization
                                  == "int8_weights" else None, scaled,
                                  x.shape))
    if cfg.positional == "learned":
      pos_embedding = self.param(
          "pos_embedding", _init(nn.initializers.normal(0.02), None, "embed"),
          (cfg.max_len, cfg.d_model), cfg.weight_dtype)
      x = x + jnp.take(pos_embedding, positions_BxL, axis=0).astype(cfg.compute_dtype)
    mask = attention_mask.astype(bool)
    if cfg.sliding_window:
      query_slots_BxL = jnp.broadcast_to(jnp.arange(l), (b, l))
      if cache is not None:
        query_slots_BxL = query_slots_BxL + cache.index[:, None]
      mask &= masks.sliding_window_mask(query_slots_BxL, s,
                                        cfg.sliding_window)
    new_k, new_v = [], []
    for i in range(cfg.num_layers):
      kc = vc = None
      if cache is not None:
        kc, vc = cache.k[i], cache.v[i]
      x, kc, vc = Block(cfg, name=f"block_{i}")(
          x, positions_BxL, mask, kc, vc, None if cache is None else cache.index)
      new_k.append(kc)
      new_v.append(vc)
    x = hidden = Norm(cfg, name="final_norm")(x)
    x = _flat_positions(x)
    if cfg.length_classes and self.is_initializing():
      # Creates the head's parameters; `length_logits` applies them.
      LengthHead(cfg, name="length_head")(hidden, tokens_BxL >= 0)
    if cfg.tie_embeddings:
      logits = jnp.einsum("td,vd->tv", x, embedding.astype(cfg.compute_dtype),
                          preferred_element_type=jnp.float32)
      if cfg.quantization == "int8_weights":
        logits = logits * embedding_scale
      if scaled:
        logits = logits * (cfg.d_model ** -0.5)
    else:
      logits = _dense(cfg, cfg.vocab_size, ("embed", "vocab"), "lm_head",
                      use_bias=False)(x)
    logits = logits.astype(jnp.float32).reshape(b, l, cfg.vocab_size)
    if cache is not None:
      cache = cache.replace(k=tuple(new_k), v=tuple(new_v),
                            index=cache.index + l)
    return ModelOutput(logits, cache, hidden)


  def _soft_embedding(self, probs_BxLxV, embedding_VxD, scale_V, scaled,
                      shape):
    """[B, L, D] probs @ the (dequantised) embedding table, scaled as the
    token embedding; zeros when probs is None."""
    cfg = self.config
    if probs_BxLxV is None:
      return jnp.zeros(shape, cfg.compute_dtype)
    table = embedding_VxD.astype(jnp.float32)
    if scale_V is not None:  # int8 rows
      table = table * scale_V[:, None]
    soft = jnp.einsum("blv,vd->bld", probs_BxLxV.astype(jnp.float32), table)
    if scaled:
      soft = soft * cfg.d_model ** 0.5
    return soft.astype(cfg.compute_dtype)


def length_logits(config: TransformerConfig, params, hidden_BxLxD: jax.Array,
                  source_BxL: jax.Array) -> jax.Array:
  """float32[B, C] length logits of the `LengthHead` in `params`.

  Args:
    config: a config with length_classes C > 0.
    params: the Transformer's parameters (holding 'length_head').
    hidden_BxLxD: `ModelOutput.hidden` of a call.
    source_BxL: bool[B, L] the positions to pool (the source).
  Raises:
    ValueError: config.length_classes == 0 (the model has no length head).
  """
  if not config.length_classes:
    raise ValueError("the model has no length head: set "
                     "model.length_classes > 0 (the longest target length)")
  return LengthHead(config).apply({"params": params["length_head"]},
                                  hidden_BxLxD, source_BxL)


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

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None, self_conditioning=None) -> ModelOutput:
    """`Transformer`'s call; `self_conditioning` only with
    config.self_conditioning (`models.config.self_conditioned`)."""
    return Transformer(self.config).apply(
        {"params": params}, tokens, positions, cache=cache,
        attention_mask=attention_mask, self_conditioning=self_conditioning)

  def init_cache(self, batch_size: int, length: int) -> KVCache:
    return KVCache.init(self.config, batch_size, length)

  def length_logits(self, params, hidden_BxLxD, source_BxL) -> jax.Array:
    """float32[B, C]: see `length_logits` (module level)."""
    return length_logits(self.config, params, hidden_BxLxD, source_BxL)


def make_logits_fn(config: TransformerConfig) -> ModelLogitsFn:
  """(params, tokens, positions, cache, attention_mask[, self_conditioning])
  -> ModelOutput."""
  return ModelLogitsFn(config)
