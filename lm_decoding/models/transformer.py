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
from lm_decoding.models.kv_cache import KVCache
from lm_decoding.models.layers import (Block, LengthHead, Norm,
                                       SelfConditioning, dense,
                                       flat_positions, param_init)
from lm_decoding.models.output import ModelOutput

def _checked_mask(cfg: TransformerConfig, positions_BxL, cache, attention_mask,
                  self_conditioning, b: int, l: int) -> jax.Array:
  """bool[B, L, S]: the keys each query sees (`attention_mask`, or the
  config's default), narrowed to the sliding window; the inputs checked as
  `Transformer` says (Raises)."""
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
  mask = attention_mask.astype(bool)
  if cfg.sliding_window:
    query_slots_BxL = jnp.broadcast_to(jnp.arange(l), (b, l))
    if cache is not None:
      query_slots_BxL = query_slots_BxL + cache.index[:, None]
    mask &= masks.sliding_window_mask(query_slots_BxL, s, cfg.sliding_window)
  return mask


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
    mask = _checked_mask(cfg, positions_BxL, cache, attention_mask,
                         self_conditioning, b, l)
    x, embedding, embedding_scale = self._embed(tokens_BxL, positions_BxL,
                                                self_conditioning)
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
    if cfg.length_classes and self.is_initializing():
      # Creates the head's parameters; `length_logits` applies them.
      LengthHead(cfg, name="length_head")(hidden, tokens_BxL >= 0)
    logits = self._logits(flat_positions(x), embedding, embedding_scale)
    logits = logits.astype(jnp.float32).reshape(b, l, cfg.vocab_size)
    if cache is not None:
      cache = cache.replace(k=tuple(new_k), v=tuple(new_v),
                            index=cache.index + l)
    return ModelOutput(logits, cache, hidden)

  def _scaled(self) -> bool:
    """Whether the tied embedding is scaled by sqrt(D) (and the head by its
    inverse)."""
    return self.config.tie_embeddings and self.config.scale_embeddings

  def _embed(self, tokens_BxL, positions_BxL, self_conditioning):
    """(x [B, L, D] in the compute dtype, the embedding table, its int8 row
    scales or None): the token embedding, plus the self-conditioning input
    and the learned positions when the config has them."""
    cfg = self.config
    embedding_init = nn.initializers.normal(cfg.d_model ** -0.5)
    embedding_scale = None
    if cfg.quantization == "int8_weights":  # one scale per row (token)
      embedding, embedding_scale = int8.int8_param(
          self, "embedding", (cfg.vocab_size, cfg.d_model), ("vocab", "embed"),
          (1,), embedding_init)
      x = int8.dequantize(jnp.take(embedding, tokens_BxL, axis=0),
                          jnp.take(embedding_scale, tokens_BxL, axis=0), -1,
                          cfg.compute_dtype)
    else:
      embedding = self.param(
          "embedding", param_init(embedding_init, "vocab", "embed"),
          (cfg.vocab_size, cfg.d_model), cfg.weight_dtype)
      x = jnp.take(embedding, tokens_BxL, axis=0).astype(cfg.compute_dtype)
    if self._scaled():
      x = x * jnp.asarray(cfg.d_model ** 0.5, cfg.compute_dtype)
    if cfg.self_conditioning:
      x = SelfConditioning(cfg, name="self_conditioning")(
          x, self._soft_embedding(self_conditioning, embedding,
                                  embedding_scale, x.shape))
    if cfg.positional == "learned":
      pos_embedding = self.param(
          "pos_embedding",
          param_init(nn.initializers.normal(0.02), None, "embed"),
          (cfg.max_len, cfg.d_model), cfg.weight_dtype)
      x = x + jnp.take(pos_embedding, positions_BxL, axis=0).astype(
          cfg.compute_dtype)
    return x, embedding, embedding_scale

  def _logits(self, x_TxD, embedding_VxD, scale_V):
    """float[T, V] logits of the final hidden states on the flattened
    positions: the tied (dequantised, unscaled) embedding or the head."""
    cfg = self.config
    if not cfg.tie_embeddings:
      return dense(cfg, cfg.vocab_size, ("embed", "vocab"), "lm_head",
                   use_bias=False)(x_TxD)
    logits = jnp.einsum("td,vd->tv", x_TxD,
                        embedding_VxD.astype(cfg.compute_dtype),
                        preferred_element_type=jnp.float32)
    if scale_V is not None:
      logits = logits * scale_V
    if self._scaled():
      logits = logits * (cfg.d_model ** -0.5)
    return logits

  def _soft_embedding(self, probs_BxLxV, embedding_VxD, scale_V, shape):
    """[B, L, D] probs @ the (dequantised) embedding table, scaled as the
    token embedding; zeros when probs is None."""
    cfg = self.config
    if probs_BxLxV is None:
      return jnp.zeros(shape, cfg.compute_dtype)
    table = embedding_VxD.astype(jnp.float32)
    if scale_V is not None:  # int8 rows
      table = table * scale_V[:, None]
    soft = jnp.einsum("blv,vd->bld", probs_BxLxV.astype(jnp.float32), table)
    if self._scaled():
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


class ConfigDims:
  """`max_len` and `vocab_size` of a logits_fn, read from its `config` (a
  `TransformerConfig`): the one place a Transformer's logits_fn, and any
  wrapper of it (`decoding.sharded.ShardedLogitsFn`), derives them."""

  config: TransformerConfig

  @property
  def max_len(self) -> int:
    return self.config.max_len

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size


@dataclasses.dataclass(frozen=True)
class ModelLogitsFn(ConfigDims):
  """The decoder boundary for a `Transformer` (see `lm_decoding.decoding.base`).

  Hashable, so decoders can take it as a static jit argument.
  """

  config: TransformerConfig

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
