"""Where a decoded row ends: the one EOS rule of every decoder.

Every decoder ends a row at its first token in `eos_ids` (kept; PAD after
it). The rule is written here once, below every decoder, so that no decoder
ends a row where another would not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def is_eos(tokens: jax.Array, eos_ids: tuple[int, ...]) -> jax.Array:
  """bool[...]: which tokens end a row (any id in `eos_ids`; none if empty).

  Args:
    tokens: int32[...] token ids of any shape.
    eos_ids: the ids that end a row.
  """
  tokens = jnp.asarray(tokens)
  if not eos_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32))


def finish_at_eos(tokens: jax.Array, eos_ids: tuple[int, ...], pad_id: int
                  ) -> tuple[jax.Array, jax.Array]:
  """Cuts rows after their first EOS.

  Args:
    tokens: int32[B, T] generated tokens.
    eos_ids: ids that end a row (empty: no row ends early).
    pad_id: id written after a row's first EOS.
  Returns:
    tokens: int32[B, T] with PAD after the first EOS (the EOS is kept);
    lengths: int32[B] tokens up to and including the first EOS (T if none).
  """
  ended_BxT = is_eos(tokens, eos_ids)
  t = tokens.shape[1]
  lengths = jnp.where(ended_BxT.any(1), jnp.argmax(ended_BxT, 1) + 1,
                      t).astype(jnp.int32)
  keep = jnp.arange(t)[None, :] < lengths[:, None]
  return jnp.where(keep, tokens, pad_id).astype(jnp.int32), lengths


def eos_counts(tokens: jax.Array, eos_ids: tuple[int, ...]
               ) -> tuple[jax.Array, jax.Array]:
  """Counts degenerate outputs of a decoder (for the quality report).

  Args:
    tokens: int32[B, T] raw generated tokens (before `finish_at_eos`, which
      turns an all-EOS row into an empty one).
    eos_ids: ids that end a row.
  Returns:
    (empty, all_eos): int32[] rows whose first token is EOS (empty outputs)
    and rows that are EOS at every position.
  """
  ended_BxT = is_eos(tokens, eos_ids)
  return (jnp.sum(ended_BxT[:, 0], dtype=jnp.int32),
          jnp.sum(ended_BxT.all(1), dtype=jnp.int32))
