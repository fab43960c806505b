"""Output parameterisations shared by training objectives and decoders."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def subs_log_probs(logits_BxLxV: jax.Array, x_t_BxL: jax.Array,
                   mask_id: int) -> jax.Array:
  """MDLM's SUBS parameterisation (Sahoo et al. 2024), in float32.

  The MASK token gets probability 0 (zero masking probabilities), and a
  position that is not masked in `x_t` is one-hot on its own token (carry-over
  unmasking). The "minus infinity" used is a finite float32 value, so the
  result stays finite whatever the model's compute dtype.

  Args:
    logits_BxLxV: float[B, L, V] denoiser logits (any float dtype).
    x_t_BxL: int32[B, L] partially masked tokens.
    mask_id: id of the MASK token.
  Returns:
    float32[B, L, V] log-probabilities; rows sum to 1 in probability space.
  """
  neg = jnp.finfo(jnp.float32).min / 2
  logits = logits_BxLxV.astype(jnp.float32)
  vocab = logits.shape[-1]
  logits = logits.at[..., mask_id].set(neg)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  one_hot = jax.nn.one_hot(x_t_BxL, vocab, dtype=bool)
  carry_BxLxV = jnp.where(one_hot, 0.0, neg)
  unmasked = (x_t_BxL != mask_id)[..., None]
  return jnp.where(unmasked, carry_BxLxV, log_probs)
