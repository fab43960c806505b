"""The explicit key/value cache pytree threaded through cached decoding.

The cache is passed into and returned from `Transformer.apply` (no mutable
collections), so it can be the carry of `lax.scan`, sharded and donated.

Layout, for a batch of B rows and a cache of S slots (heads-major):
  k[l], v[l]: [B, Hkv, S, Dh] for layer l, in the model's compute dtype; with
              `config.kv_cache_dtype == 'int8'` an `Int8KV` instead: int8
              values [B, Hkv, S, Dh] and a float32 absmax scale [B, Hkv, S]
              per (row, KV head, slot) (`lm_decoding.models.int8`), written
              by `write_rows` (which quantises) and read by the attention,
              which folds the scales into the scores (keys) and the
              probabilities (values) instead of dequantising the cache.
  index:      int32[B], per-row write index: slots [0, index[b]) hold row b's
              tokens, in order; the next call writes at index[b].
The attention dots batch over (row, KV head) and contract over Dh (scores) or
S (values), so with (B, Hkv) leading they read each layer's cache in place;
a [B, S, Hkv, Dh] cache was copied whole into this layout by XLA in every
layer of every decode step (experiments/results/benchmark_ar/NOTES.md). The
L new keys/values of a call arrive from the projection as [B, L, Hkv, Dh];
the attention moves them heads-major once (L slots, not S) before
`write_rows`.

Worked example (S = 6, two rows, prompts of 3 and 2 tokens right-padded to 3):
  prefill  tokens [[5,6,7],[8,9,PAD]], index [0,0] -> writes k[l][b, :, 0:3]
           of both rows, index [3,3]; the decoder then sets index to the
           prompt lengths [3,2], so row 1's PAD slot 2 is overwritten next.
  step 1   tokens [[a],[b]] -> a lands in k[l][0, :, 3], b in k[l][1, :, 2]
           (every KV head); index [4,3]. A query sees only slots < its own
           write slot + 1.
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
'cache_kv_heads', 'cache_length', 'cache_head_dim'), distinct from the
parameters' 'heads', so a mesh can shard the cache by batch and KV heads
independently of the weights (as MaxText does); int8 scales carry the first
three (`SCALE_LOGICAL_AXES`).
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding.models import int8
from lm_decoding.models.config import TransformerConfig


@flax.struct.dataclass
class Int8KV:
  """One layer's int8 keys (or values): x[b, h, s, :] ~ values * scale[b, h, s].

  Attributes:
    values: int8[B, Hkv, S, Dh].
    scale: float32[B, Hkv, S], absmax / 127 of each cached head vector.
  """

  values: jax.Array
  scale: jax.Array

  @property
  def shape(self) -> tuple[int, ...]:
    return self.values.shape

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    """[B, Hkv, S, Dh] values * scale in `dtype`."""
    return int8.dequantize(self.values, self.scale, -1, dtype)


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values plus a per-row write index.

  Attributes:
    k: tuple of num_layers arrays [B, Hkv, S, Dh] (or `Int8KV`s).
    v: tuple of num_layers arrays [B, Hkv, S, Dh] (or `Int8KV`s).
    index: int32[B], number of slots already written in each row.
  """

  k: tuple[jax.Array | Int8KV, ...]
  v: tuple[jax.Array | Int8KV, ...]
  index: jax.Array

  LOGICAL_AXES = ("cache_batch", "cache_kv_heads", "cache_length",
                  "cache_head_dim")
  SCALE_LOGICAL_AXES = LOGICAL_AXES[:3]

  @property
  def length(self) -> int:
    """Number of slots S (static)."""
    return self.k[0].shape[2]

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
    shape = (batch_size, config.num_kv_heads, length, config.head_dim)
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
    Raises:
      AssertionError (chex) when `rows_B` is not a vector.
    """
    chex.assert_rank(rows_B, 1)
    return jax.tree.map(lambda a: jnp.take(a, rows_B, axis=0), self)

  def where(self, rows_B: jax.Array, other: "KVCache") -> "KVCache":
    """Row b from this cache where rows[b], else from `other` (same shapes).

    Args:
      rows_B: bool[B].
    """
    pick = lambda a, b: jnp.where(
        rows_B.reshape(rows_B.shape + (1,) * (a.ndim - 1)), a, b)
    return jax.tree.map(pick, self, other)

  def bytes_per_slot(self) -> int:
    """Bytes of keys and values (and int8 scales) one token occupies across
    all layers: each array's size without its batch and slot axes."""
    return sum(a.size // (a.shape[0] * a.shape[2]) * a.dtype.itemsize
               for a in jax.tree.leaves((self.k, self.v)))


def _write(buffer_BxHkvxS: jax.Array, new_BxHkvxL: jax.Array,
           index_B: jax.Array) -> jax.Array:
  """Row b of `new` written into row b of `buffer` at slot index[b] (axis 2)."""
  def one(buf, new, i):
    return jax.lax.dynamic_update_slice(
        buf, new, (0, i) + (0,) * (buf.ndim - 2))
  return jax.vmap(one)(buffer_BxHkvxS, new_BxHkvxL.astype(buffer_BxHkvxS.dtype),
                       index_B)


def as_cached(buffer: jax.Array | Int8KV,
              new_BxHkvxLxDh: jax.Array | Int8KV) -> jax.Array | Int8KV:
  """`new` as `buffer` stores it: in its dtype, or int8-quantised per head
  vector (`int8.quantize` over Dh) with its scales when it is an `Int8KV`.
  Idempotent: a `new` already in that form is returned as it is.

  Args:
    buffer: one layer's keys or values [B, Hkv, S, Dh] (or an `Int8KV`).
    new_BxHkvxLxDh: float [B, Hkv, L, Dh] (or already as cached).
  """
  if isinstance(new_BxHkvxLxDh, Int8KV):
    return new_BxHkvxLxDh
  if isinstance(buffer, Int8KV):
    values, scale = int8.quantize(new_BxHkvxLxDh, -1)
    return Int8KV(values=values, scale=scale)
  return new_BxHkvxLxDh.astype(buffer.dtype)


def write_start(buffer: jax.Array | Int8KV, length: int,
                index_B: jax.Array) -> jax.Array:
  """int32[B]: the first slot `write_rows` writes in each row: index[b],
  clamped to [0, S - length] as `dynamic_update_slice` clamps it."""
  return jnp.clip(index_B, 0, buffer.shape[2] - length)


def write_rows(buffer_BxHkvxSxDh: jax.Array | Int8KV,
               new_BxHkvxLxDh: jax.Array | Int8KV, index_B: jax.Array) -> jax.Array | Int8KV:
  """Writes `new[b]` into `buffer[b]` at slots index[b]..index[b] + L - 1,
  per row.

  Args:
    buffer_BxHkvxSxDh: one layer's keys or values [B, Hkv, S, Dh] (or an
      `Int8KV`).
    new_BxHkvxLxDh: the L new keys or values [B, Hkv, L, Dh], heads-major like
      the buffer (float, or already `as_cached`).
    index_B: int32[B] first slot written in each row (clamped as
      `write_start` says).
  Returns:
    The buffer with `as_cached(buffer, new)` written.
  Raises:
    AssertionError (chex) when the shapes disagree: an internal invariant
    (the attention builds all three), not a user input.
  """
  new = as_cached(buffer_BxHkvxSxDh, new_BxHkvxLxDh)
  b, h, s, d = buffer_BxHkvxSxDh.shape
  values_BxHkvxLxDh = new.values if isinstance(new, Int8KV) else new
  chex.assert_shape(values_BxHkvxLxDh, (b, h, None, d))
  chex.assert_axis_dimension_lteq(values_BxHkvxLxDh, 2, s)
  chex.assert_shape(index_B, (b,))
  if isinstance(new, Int8KV):
    chex.assert_shape(new.scale, values_BxHkvxLxDh.shape[:3])
  if isinstance(buffer_BxHkvxSxDh, Int8KV):
    return Int8KV(values=_write(buffer_BxHkvxSxDh.values, new.values, index_B),
                  scale=_write(buffer_BxHkvxSxDh.scale, new.scale, index_B))
  return _write(buffer_BxHkvxSxDh, new, index_B)
