"""The explicit key/value cache pytree threaded through cached decoding.

The cache is passed into and returned from `Transformer.apply` (no mutable
collections), so it can be the carry of `lax.scan`, sharded and donated.

Layout, for a batch of B rows and a cache of S slots:
  k[l], v[l]: [B, S, Hkv, Dh] for layer l, in the model's compute dtype.
  index:      int32[B], per-row write index: slots [0, index[b]) hold row b's
              tokens, in order; the next call writes at index[b].

Worked example (S = 6, two rows, prompts of 3 and 2 tokens right-padded to 3):
  prefill  tokens [[5,6,7],[8,9,PAD]], index [0,0] -> writes slots 0..2 of both
           rows, index [3,3]; the decoder then sets index to the prompt
           lengths [3,2], so row 1's PAD slot 2 is overwritten next.
  step 1   tokens [[a],[b]] -> a lands in slot 3 of row 0, b in slot 2 of row 1;
           index [4,3]. A query sees only slots < its own write slot + 1.
Writes past S would be clamped by `dynamic_update_slice`; callers must check
`prompt_len + output_length <= S` before compiling (see
`lm_decoding.decoding.autoregressive`).

Operations decoders need, all per row and pure:
  `at(index)`        the next call writes at these slots (e.g. a dual cache
                     rewrites one block in the middle of the sequence);
  `rollback(length)` forgets slots >= length (speculative rejection: a row
                     keeps only its accepted tokens); stale slots are never
                     attended because masks only reach slots < index + L;
  `reorder(rows)`    gathers rows (beam search follows each beam's parent).

The arrays carry their own logical axes, `LOGICAL_AXES` = ('cache_batch',
'cache_length', 'cache_kv_heads', 'cache_head_dim'), distinct from the
parameters' 'heads', so a mesh can shard the cache by batch and KV heads
independently of the weights (as MaxText does).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding.models.config import TransformerConfig


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values plus a per-row write index.

  Attributes:
    k: tuple of num_layers arrays [B, S, Hkv, Dh].
    v: tuple of num_layers arrays [B, S, Hkv, Dh].
    index: int32[B], number of slots already written in each row.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  index: jax.Array

  LOGICAL_AXES = ("cache_batch", "cache_length", "cache_kv_heads",
                  "cache_head_dim")

  @property
  def length(self) -> int:
    """Number of slots S (static)."""
    return self.k[0].shape[1]

  @classmethod
  def init(cls, config: TransformerConfig, batch_size: int,
           length: int | None = None) -> "KVCache":
    """An empty cache of `length` slots (default `config.max_len`).

    Raises:
      ValueError: if length is outside [1, config.max_len].
    """
    length = config.max_len if length is None else length
    if not 1 <= length <= config.max_len:
      raise ValueError(
          f"cache length={length} must be in [1, max_len={config.max_len}]")
    shape = (batch_size, length, config.num_kv_heads, config.head_dim)
    zeros = lambda: jnp.zeros(shape, config.compute_dtype)
    return cls(k=tuple(zeros() for _ in range(config.num_layers)),
               v=tuple(zeros() for _ in range(config.num_layers)),
               index=jnp.zeros((batch_size,), jnp.int32))

  def at(self, index_B: jax.Array) -> "KVCache":
    """The same cache with the next write at slot index[b] of row b.

    Args:
      index_B: int32[B] (or a scalar, for every row) write slots.
    """
    index_B = jnp.broadcast_to(jnp.asarray(index_B, jnp.int32),
                               self.index.shape)
    return self.replace(index=index_B)

  def rollback(self, length_B: jax.Array) -> "KVCache":
    """Keeps the first min(index[b], length[b]) slots of each row.

    Args:
      length_B: int32[B] slots to keep per row (e.g. the accepted prefix).
    """
    return self.at(jnp.minimum(self.index, jnp.asarray(length_B, jnp.int32)))

  def reorder(self, rows_B: jax.Array) -> "KVCache":
    """Row b of the result is row rows[b] of this cache (keys, values, index).

    Args:
      rows_B: int32[B'] source rows (B' may differ from B).
    """
    take = lambda a: jnp.take(a, rows_B, axis=0)
    return KVCache(k=tuple(map(take, self.k)), v=tuple(map(take, self.v)),
                   index=take(self.index))

  def bytes_per_slot(self) -> int:
    """Bytes of keys and values one token occupies across all layers."""
    return sum(a.shape[2] * a.shape[3] * a.dtype.itemsize
               for a in self.k + self.v)


def write_rows(buffer_BxSxHxD: jax.Array, new_BxLxHxD: jax.Array,
               index_B: jax.Array) -> jax.Array:
  """Writes `new[b]` into `buffer[b]` at slot `index[b]`, per row."""
  def one(buf, new, i):
    return jax.lax.dynamic_update_slice(buf, new, (i, 0, 0))
  return jax.vmap(one)(buffer_BxSxHxD, new_BxLxHxD.astype(buffer_BxSxHxD.dtype),
                       index_B)
