"""The maths of absorbing-state (masked) diffusion, shared by training and decoding.

A clean token survives to time t in [0, 1] with probability alpha_t (the
signal level) and is otherwise replaced by MASK; alpha_0 = 1 and alpha_1 = eps
(almost everything masked). Three schedules are provided, all with a
closed-form derivative:

  log-linear  alpha_t = 1 - (1 - eps) t             (MDLM, Sahoo et al. 2024;
                                                      SEDD, Lou et al. 2023)
  linear      the same line with eps = 0: alpha_t = 1 - t
  cosine      alpha_t = eps + (1 - eps) cos(pi t / 2)  (MaskGIT's schedule,
                                                      Chang et al. 2022)

`subs_log_probs` is MDLM's SUBS output parameterisation and `mask_tokens` the
forward process q(x_t | x_0). The objectives (`training.objectives`) and the
decoders (`decoding.mdlm`, ...) both import this module, so the schedule a
model was trained with is the one it is decoded with.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lm_decoding.special_tokens import MASK_ID, PAD_ID

EPS = 1e-3  # smallest masking fraction alpha avoids; MDLM samples t in [0, 1]
SCHEDULES = ("log_linear", "linear", "cosine")


def alpha(schedule: str, t: jax.Array, eps: float = EPS) -> jax.Array:
  """float32 signal level alpha_t of `schedule` at times t in [0, 1].

  Raises:
    ValueError: unknown schedule (allowed: SCHEDULES).
  """
  t = jnp.asarray(t, jnp.float32)
  if schedule == "log_linear":
    return 1.0 - (1.0 - eps) * t
  if schedule == "linear":
    return 1.0 - t
  if schedule == "cosine":
    return eps + (1.0 - eps) * jnp.cos(0.5 * math.pi * t)
  raise ValueError(f"schedule={schedule!r}; allowed: {SCHEDULES}")


def alpha_prime(schedule: str, t: jax.Array, eps: float = EPS) -> jax.Array:
  """float32 d alpha_t / dt of `schedule` (see `alpha`)."""
  t = jnp.asarray(t, jnp.float32)
  if schedule == "log_linear":
    return jnp.full_like(t, -(1.0 - eps))
  if schedule == "linear":
    return jnp.full_like(t, -1.0)
  if schedule == "cosine":
    return -(1.0 - eps) * 0.5 * math.pi * jnp.sin(0.5 * math.pi * t)
  raise ValueError(f"schedule={schedule!r}; allowed: {SCHEDULES}")


def log_linear_alpha(t: jax.Array, eps: float = EPS) -> jax.Array:
  """alpha_t = 1 - (1 - eps) t of the log-linear schedule (MDLM's default)."""
  return alpha("log_linear", t, eps)


def log_linear_alpha_prime(t: jax.Array, eps: float = EPS) -> jax.Array:
  """d alpha_t / dt = -(1 - eps) (constant)."""
  return alpha_prime("log_linear", t, eps)


def unmask_probability(schedule: str, t: jax.Array, s: jax.Array,
                       eps: float = EPS) -> jax.Array:
  """P(a position masked at time t is unmasked by the earlier time s < t).

  (alpha_s - alpha_t) / (1 - alpha_t): the reverse step of MDLM's ancestral
  sampler (Sahoo et al. 2024, eq. 7).
  """
  a_t, a_s = alpha(schedule, t, eps), alpha(schedule, s, eps)
  return (a_s - a_t) / (1.0 - a_t)


def subs_log_probs(logits_BxLxV: jax.Array, x_t_BxL: jax.Array,
                   mask_id: int = MASK_ID) -> jax.Array:
  """MDLM's SUBS parameterisation (Sahoo et al. 2024), in float32.

  The MASK token gets probability 0 (zero masking probabilities), and a
  position that is not masked in `x_t` is one-hot on its own token (carry-over
  unmasking). The "minus infinity" used is a finite float32 value, so the
  result stays finite whatever the model's compute dtype.

  Args:
    logits_BxLxV: float[..., L, V] denoiser logits (any float dtype).
    x_t_BxL: int32[..., L] partially masked tokens.
    mask_id: id of the MASK token.
  Returns:
    float32[..., L, V] log-probabilities; rows sum to 1 in probability space.
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


def mask_tokens(key: jax.Array, x0_BxL: jax.Array, alpha_B: jax.Array,
                mask_id: int = MASK_ID) -> jax.Array:
  """Samples the forward process q(x_t | x_0) at signal level alpha_t.

  Each non-PAD token independently becomes `mask_id` with probability
  1 - alpha_t; PAD is never masked.

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] clean tokens.
    alpha_B: float32[B] (or float32[B, L], e.g. one level per block) signal
      levels in [0, 1].
    mask_id: the MASK token id.
  Returns:
    int32[B, L] x_t.
  """
  alpha_B = jnp.asarray(alpha_B, jnp.float32)
  if alpha_B.ndim == 1:
    alpha_B = alpha_B[:, None]
  u_BxL = jax.random.uniform(key, x0_BxL.shape, jnp.float32)
  masked_BxL = (u_BxL < 1.0 - alpha_B) & (x0_BxL != PAD_ID)
  return jnp.where(masked_BxL, mask_id, x0_BxL).astype(x0_BxL.dtype)


def shift_logits(logits_BxLxV: jax.Array) -> jax.Array:
  """Logits of a token-shifted model realigned with the tokens they predict.

  A model with `TransformerConfig.token_shift` predicts token i + 1 at
  position i (as an AR model does); out[:, i] = logits[:, i - 1] for i >= 1
  puts each prediction at the index of its token, so the unshifted maths
  (SUBS, the NELBO terms, the decoders' proposals) applies unchanged.
  out[:, 0] repeats logits[:, 0]: nothing predicts token 0, which is never
  masked nor scored (DiffuLLaMA, Gong et al. 2025; Fast-dLLM v2, Wu et al.
  2025).

  Args:
    logits_BxLxV: float[B, L, V] logits of a shifted model.
  Returns:
    float[B, L, V], same dtype.
  """
  return jnp.concatenate([logits_BxLxV[:, :1], logits_BxLxV[:, :-1]], axis=1)
