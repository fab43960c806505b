"""The record a model call returns."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class ModelOutput(NamedTuple):
  """What `Transformer.__call__` (and every `logits_fn`) returns.

  A NamedTuple, so it is a pytree and unpacks as (logits, cache, hidden).

  Attributes:
    logits: float32[B, L, V] next-token (causal) or denoising logits.
    cache: the KV cache with the L new keys/values written, or None when the
      call had no cache.
    hidden: [B, L, D] final hidden states (after the final norm, before the
      LM head), in the compute dtype, for extra heads (e.g. a length head).
  """

  logits: jax.Array
  cache: Any = None
  hidden: jax.Array | None = None
