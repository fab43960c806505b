"""Attention masks, built outside the model and passed to it.

Every builder is a pure function returning bool[B, L, S]: mask[b, i, j] is
True when query i of row b may attend to key slot j. Without a cache the keys
are the inputs themselves (S = L); with a KV cache they are the cache slots
(S = cache length). Combine masks with `&`. `Transformer.__call__` takes one
as `attention_mask`; its `config.attention` only picks the default
(`default_mask`), as gemma's sampler builds the masks it hands to the model.

Worked example, L = 4:

    causal_mask(1, 4)[0]        block_causal_mask(1, 4, 2)[0]
      1 0 0 0                     1 1 0 0
      1 1 0 0                     1 1 0 0
      1 1 1 0                     1 1 1 1
      1 1 1 1                     1 1 1 1

`prefix_lm_mask` with prefix length 2 is bidirectional over the prefix and
causal after it (T5's prefix-LM): rows 0 and 1 read `1 1 0 0`, rows 2 and 3
as the causal mask.

`bd3lm_training_mask(L, block)` is the [x_t ; x_0] layout of BD3-LM (Arriola
et al. 2025) on 2L inputs: noisy block i attends to itself bidirectionally
and to the clean blocks before it; clean block i attends to clean blocks
0..i (block-causal). One forward pass then gives every block's denoising
logits conditioned on its clean prefix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _broadcast(mask_LxS: jax.Array, batch: int) -> jax.Array:
  return jnp.broadcast_to(mask_LxS[None], (batch, *mask_LxS.shape))


def full_mask(batch: int, length: int) -> jax.Array:
  """bool[B, L, L] all True: bidirectional attention."""
  return jnp.ones((batch, length, length), bool)


def causal_mask(batch: int, length: int) -> jax.Array:
  """bool[B, L, L]: query i sees keys 0..i."""
  i = jnp.arange(length)
  return _broadcast(i[None, :] <= i[:, None], batch)


def key_padding_mask(valid_BxS: jax.Array, length: int) -> jax.Array:
  """bool[B, L, S]: every query sees exactly the valid keys of its row.

  Args:
    valid_BxS: bool[B, S] False on keys never to be attended (e.g. PAD).
    length: L, number of queries.
  """
  valid_BxS = jnp.asarray(valid_BxS, bool)
  return jnp.broadcast_to(valid_BxS[:, None, :],
                          (valid_BxS.shape[0], length, valid_BxS.shape[1]))


def prefix_lm_mask(prefix_lengths_B: jax.Array, length: int) -> jax.Array:
  """bool[B, L, L]: bidirectional over each row's prefix, causal after it.

  Query i of row b sees key j when j <= i or j < prefix_lengths[b] (Raffel
  et al. 2020, T5's prefix LM; a source sentence as the prefix of its
  translation).

  Args:
    prefix_lengths_B: int32[B] prefix length of each row, in [0, L].
    length: L.
  """
  i = jnp.arange(length)
  prefix_Bx1x1 = jnp.asarray(prefix_lengths_B, jnp.int32)[:, None, None]
  return (i[None, None, :] <= i[None, :, None]) | (i[None, None, :] <
                                                    prefix_Bx1x1)


def source_target_mask(prefix_lengths_B: jax.Array,
                       valid_BxL: jax.Array) -> jax.Array:
  """bool[B, L, L]: an encoder-decoder in one stack (CMLM, CTC NAT).

  Query i of row b in the prefix (i < prefix_lengths[b]: the source) sees
  the prefix keys only, bidirectionally; a query after it (the target) sees
  every valid key, prefix and target, bidirectionally. The source's hidden
  states then do not depend on the target, so a length head reads them
  before the target length is known (Ghazvininejad et al. 2019).

  Args:
    prefix_lengths_B: int32[B] prefix length of each row, in [0, L].
    valid_BxL: bool[B, L] False on keys never attended (PAD).
  """
  i = jnp.arange(valid_BxL.shape[1])
  prefix_Bx1 = jnp.asarray(prefix_lengths_B, jnp.int32)[:, None]
  in_prefix_BxL = i[None] < prefix_Bx1
  key_BxLxS = key_padding_mask(valid_BxL, valid_BxL.shape[1])
  return key_BxLxS & (~in_prefix_BxL[:, :, None] | in_prefix_BxL[:, None, :])


def block_causal_mask(batch: int, length: int, block_length: int) -> jax.Array:
  """bool[B, L, L]: query in block i sees every key in blocks 0..i.

  Blocks are [k * block_length, (k + 1) * block_length); block_length 1 is
  the causal mask, block_length >= L the full mask.

  Raises:
    ValueError: block_length < 1.
  """
  if block_length < 1:
    raise ValueError(f"block_length={block_length} must be >= 1")
  block = jnp.arange(length) // block_length
  return _broadcast(block[None, :] <= block[:, None], batch)


def bd3lm_training_mask(batch: int, length: int,
                        block_length: int) -> jax.Array:
  """bool[B, 2L, 2L] for inputs [x_t ; x_0] (BD3-LM, Arriola et al. 2025).

  Queries and keys 0..L-1 are the noisy tokens x_t, L..2L-1 the clean x_0.
  Noisy block i sees noisy block i (bidirectional) and clean blocks < i;
  clean block i sees clean blocks <= i; clean tokens never see noisy ones.
  With block_length 1 the noisy token l sees itself and x_0[:l]; with
  block_length L it sees all of x_t and nothing clean (MDLM).

  Raises:
    ValueError: block_length < 1.
  """
  if block_length < 1:
    raise ValueError(f"block_length={block_length} must be >= 1")
  block = jnp.arange(length) // block_length
  same = block[:, None] == block[None, :]
  before = block[None, :] < block[:, None]
  noisy = jnp.concatenate([same, before], axis=1)
  clean = jnp.concatenate([jnp.zeros((length, length), bool),
                           block[None, :] <= block[:, None]], axis=1)
  return _broadcast(jnp.concatenate([noisy, clean], axis=0), batch)


def sliding_window_mask(query_slots_BxL: jax.Array, key_length: int,
                        window: int) -> jax.Array:
  """bool[B, L, S]: query i of row b sees key slot j when |q - j| < window,
  q = query_slots[b, i] (Beltagy et al. 2020; Mistral's sliding window, on
  the causal side the same rule as `transformers`' q - j < W).

  AND it with another mask: `Transformer` does so for
  `config.sliding_window`.

  Args:
    query_slots_BxL: int32[B, L] each query's slot (its index without a
      cache; cache index + i with one).
    key_length: S, number of key slots.
    window: W >= 1.
  Raises:
    ValueError: window < 1.
  """
  if window < 1:
    raise ValueError(f"window={window} must be >= 1")
  slot_S = jnp.arange(key_length)
  distance = jnp.asarray(query_slots_BxL)[:, :, None] - slot_S[None, None]
  return jnp.abs(distance) < window


def cache_query_mask(index_B: jax.Array, length: int, cache_length: int,
                     causal: bool, block_length: int = 1) -> jax.Array:
  """bool[B, L, S]: L queries written at slots index..index+L-1 of a cache.

  Slots [0, index[b] + L) of row b hold keys (those written before and the L
  new ones); later slots are stale or empty and never seen. With `causal`,
  query i also sees no slot after its own block's last slot: blocks of
  `block_length` slots (1: no slot after its own, index[b] + i).

  Args:
    index_B: int32[B] write slot of each row's first query.
    length: L queries.
    cache_length: S slots.
    causal: causal (True) or bidirectional over the written slots (False).
    block_length: the block of block-causal attention (1: causal).
  """
  index_B = jnp.asarray(index_B, jnp.int32)
  slot_S = jnp.arange(cache_length)
  written_BxS = slot_S[None, :] < (index_B[:, None] + length)
  mask = jnp.broadcast_to(written_BxS[:, None, :],
                          (index_B.shape[0], length, cache_length))
  if causal:
    query_slot_BxL = index_B[:, None] + jnp.arange(length)[None, :]
    mask &= (slot_S[None, None, :] // block_length
             <= query_slot_BxL[:, :, None] // block_length)
  return mask


def default_mask(attention: str, batch: int, length: int,
                 cache_index_B: jax.Array | None = None,
                 cache_length: int | None = None,
                 block_length: int = 0) -> jax.Array:
  """The mask a model of kind `attention` uses when given none.

  'causal' is `causal_mask`, 'block_causal' `block_causal_mask` of
  `block_length` (with a cache: `cache_query_mask(.., causal=True)` of
  blocks 1 or `block_length`); 'bidirectional' attends everywhere (to the
  written slots with a cache).
  """
  block = block_length if attention == "block_causal" else 1
  causal = attention in ("causal", "block_causal")
  if cache_index_B is not None:
    return cache_query_mask(cache_index_B, length, cache_length, causal,
                            block)
  if not causal:
    return full_mask(batch, length)
  return block_causal_mask(batch, length, block)
