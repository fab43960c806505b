"""The explicit key/value cache pytree threaded through cached decoding.

The cache is passed into and returned from `Transformer.apply` (no mutable
collections), so it can be the carry of `lax.scan`, sharded and donated.

Layout, for a batch of B rows and a cache of S slots:
  k[l], v[l]: [B, S, Hkv, Dh] for layer l, in the model's compute dtype; with
              `config.kv_cache_dtype == 'int8'` an `Int8KV` instead: int8
              values [B, S, Hkv, Dh] and a float32 absmax scale [B, S, Hkv]
              per (row, slot, KV head) (`lm_decoding.models.int8`), written
              by `write_rows` (which quantises) and read by the attention,
              which folds the scales into the scores (keys) and the
              probabilities (values) instead of dequantising the cache.
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
  `reorder(rows)`    gathers rows (beam search follows each beam's parent);
                     int8 scales are gathered with their values.

The arrays carry their own logical axes, `LOGICAL_AXES` = ('cache_batch',
'cache_length', 'cache_kv_heads', 'cache_head_dim'), distinct from the
parameters' 'heads', so a mesh can shard the cache by batch and KV heads
independently of the weights (as MaxText does); int8 scales carry the first
three (`SCALE_LOGICAL_AXES`).
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding.models import int8
from lm_decoding.models.config import TransformerConfig


@flax.struct.dataclass
class Int8KV:
  """One layer's int8 keys (or values): x[b, s, h, :] ~ values * scale[b, s, h].

  Attributes:
    values: int8[B, S, Hkv, Dh].
    scale: float32[B, S, Hkv], absmax / 127 of each cached head vector.
  """

  values: jax.Array
  scale: jax.Array

  @property
  def shape(self) -> tuple[int, ...]:
    return self.values.shape

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    """[B, S, Hkv, Dh] values * scale in `dtype`."""
    return int8.dequantize(self.values, self.scale, -1, dtype)


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values plus a per-row write index.

  Attributes:
    k: tuple of num_layers arrays [B, S, Hkv, Dh] (or `Int8KV`s).
    v: tuple of num_layers arrays [B, S, Hkv, Dh] (or `Int8KV`s).
    index: int32[B], number of slots already written in each row.
  """

  k: tuple[jax.Array | Int8KV, ...]
  v: tuple[jax.Array | Int8KV, ...]
  index: jax.Array

  LOGICAL_AXES = ("cache_batch", "cache_length", "cache_kv_heads",
                  "cache_head_dim")
  SCALE_LOGICAL_AXES = LOGICAL_AXES[:3]

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
    if config.kv_cache_dtype == "int8":
      zeros = lambda: Int8KV(values=jnp.zeros(shape, jnp.int8),
                             scale=jnp.zeros(shape[:3], jnp.float32))
    else:
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
    """Row b of the result is row rows[b] of this cache (keys, values and
    int8 scales, index).

    Args:
      rows_B: int32[B'] source rows (B' may differ from B).
    """
    return jax.tree.map(lambda a: jnp.take(a, rows_B, axis=0), self)

  def bytes_per_slot(self) -> int:
    """Bytes of keys and values (and int8 scales) one token occupies across
    all layers."""
    return sum(math.prod(a.shape[2:]) * a.dtype.itemsize
               for a in jax.tree.leaves((self.k, self.v)))


def _write(buffer_BxSx: jax.Array, new_BxLx: jax.Array,
           index_B: jax.Array) -> jax.Array:
  def one(buf, new, i):
    return jax.lax.dynamic_update_slice(
        buf, new, (i,) + (0,) * (buf.ndim - 1))
  return jax.vmap(one)(buffer_BxSx, new_BxLx.astype(buffer_BxSx.dtype),
                       index_B)


def write_rows(buffer_BxSxHxD: jax.Array | Int8KV, new_BxLxHxD: jax.Array,
               index_B: jax.Array) -> jax.Array | Int8KV:
  """Writes `new[b]` into `buffer[b]` at slot `index[b]`, per row.

  An `Int8KV` buffer receives `new` quantised per head vector
  (`int8.quantize` over Dh) and its scales.
  """
  if isinstance(buffer_BxSxHxD, Int8KV):
    q_BxLxHxD, scale_BxLxH = int8.quantize(new_BxLxHxD, -1)
    return Int8KV(values=_write(buffer_BxSxHxD.values, q_BxLxHxD, index_B),
                  scale=_write(buffer_BxSxHxD.scale, scale_BxLxH, index_B))
  return _write(buffer_BxSxHxD, new_BxLxHxD, index_B)
