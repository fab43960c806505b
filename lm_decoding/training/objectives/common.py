"""What the objective families share: token checks, the target
log-probabilities, the (loss, metrics) summary, the masked-diffusion forward
process and NELBO integrand (MDLM and BD3-LM), complementary masks, the
self-conditioned denoiser (MDLM and uniform-state) and the binned bounds
(MDLM and uniform-state). See the package docstring for the contracts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import diffusion
from lm_decoding.models.config import check_attention, self_conditioned
from lm_decoding.models.config import token_shift as shifted
from lm_decoding.models.diffusion import (
    EPS, log_linear_alpha, log_linear_alpha_prime)
from lm_decoding.special_tokens import MASK_ID, PAD_ID


def check_tokens(tokens_BxL, min_length: int) -> None:
  if tokens_BxL.ndim != 2 or not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
    raise ValueError(f"tokens must be int[B, L]; got {tokens_BxL.dtype}"
                     f"{list(tokens_BxL.shape)}")
  if tokens_BxL.shape[1] < min_length:
    raise ValueError(f"tokens length L={tokens_BxL.shape[1]} must be >= "
                     f"{min_length}")


def token_positions(tokens_BxL):
  return jnp.broadcast_to(
      jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)


def gather(log_probs_BxLxV, ids_BxL):
  return jnp.take_along_axis(log_probs_BxLxV, ids_BxL[..., None], axis=-1)[..., 0]


def target_log_probs(logits_BxLxV: jax.Array, targets_BxL: jax.Array,
                     excluded: int | None = None) -> jax.Array:
  """float32[B, L]: log softmax(logits)[b, l, targets[b, l]], as
  logits[target] - logsumexp(logits), the log-probabilities [B, L, V] never
  materialised.

  Equal to `gather(jax.nn.log_softmax(logits), targets)` up to float32
  rounding; with `excluded` (SUBS's MASK id) that id gets probability 0 as
  in `diffusion.subs_log_probs`, whose value this is at a masked position.
  The target's logit is picked by comparing ids (a select, fused into the
  reductions), not gathered: a gather's gradient is a scatter into a zero
  [B, L, V] buffer, and excluding an id with `.at[].set` copies the logits
  (together 0.4 s of a 9 s base MDLM train step on a busy 2-core CPU;
  benchmarks/training_speed/loss/).

  Args:
    logits_BxLxV: float[B, L, V] logits (any float dtype).
    targets_BxL: int[B, L] ids in [0, V).
    excluded: an id given probability 0, or None.
  """
  logits = logits_BxLxV.astype(jnp.float32)
  ids_BxLxV = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
  if excluded is not None:
    logits = jnp.where(ids_BxLxV == excluded,
                       jnp.finfo(jnp.float32).min / 2, logits)
  target_BxL = jnp.sum(jnp.where(ids_BxLxV == targets_BxL[..., None], logits,
                                 0.0), axis=-1)
  return target_BxL - jax.nn.logsumexp(logits, axis=-1)


def summarise(nll, tokens):
  nll = nll.astype(jnp.float32)
  tokens = tokens.astype(jnp.float32)
  loss = nll / jnp.maximum(tokens, 1.0)
  return loss, {"loss": loss, "nll": nll, "tokens": tokens}


def sample_times(key: jax.Array, batch_size: int,
                 t_min: float = EPS) -> jax.Array:
  """Antithetic diffusion times of MDLM (Sahoo et al. 2024), float32[B].

  t_i = t_min + (1 - t_min) * ((u + i / B) mod 1) for one u ~ U[0, 1): one
  time in each of B equal strata of [t_min, 1), which lowers the variance of
  the batch NELBO estimate. t_min > 0 keeps the 1/t loss weight bounded.
  """
  u = jax.random.uniform(key, (), jnp.float32)
  return t_min + (1.0 - t_min) * jnp.mod(
      u + jnp.arange(batch_size, dtype=jnp.float32) / batch_size, 1.0)


def mask_at_time(key: jax.Array, x0_BxL: jax.Array, t_B: jax.Array,
                mask_id: int = MASK_ID, eps: float = EPS) -> jax.Array:
  """Samples the absorbing forward process q(x_t | x_0) of masked diffusion.

  Each non-PAD token independently becomes `mask_id` with probability
  1 - alpha_t (log-linear schedule, `diffusion.log_linear_alpha(t, eps)`);
  PAD is never masked.

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] clean tokens.
    t_B: float32[B] diffusion times in [0, 1].
    mask_id: the MASK token id.
    eps: schedule parameter, alpha_1 = eps.
  Returns:
    int32[B, L] x_t.
  """
  return diffusion.mask_tokens(key, x0_BxL, log_linear_alpha(t_B, eps),
                               mask_id)


def maskable(x0_BxL: jax.Array, token_shift: bool) -> jax.Array:
  """bool[B, L]: the tokens the forward process may mask and the NELBO
  scores: every non-PAD token, less token 0 under a token shift."""
  keep_BxL = x0_BxL != PAD_ID
  if token_shift:
    keep_BxL &= (jnp.arange(x0_BxL.shape[1]) >= 1)[None, :]
  return keep_BxL


def complement(x0_BxL: jax.Array, x_t_BxL: jax.Array, t: jax.Array,
               maskable_BxL: jax.Array, *, mask_id: int = MASK_ID,
               eps: float = EPS):
  """Complementary masks (Fast-dLLM v2, Wu et al. 2025): rows [x_t ; x_t'].

  x_t' masks exactly the maskable tokens x_t leaves visible, so each
  maskable token is masked in exactly one row of the pair. Under the
  log-linear schedule a token is masked at time t with probability
  (1 - eps) t; x_t' is the masking at t' = 1 / (1 - eps) - t, whose
  probability is 1 - (1 - eps) t, so both rows are draws of the forward
  process and weigh their terms by 1 / t and 1 / t'.

  Args:
    x0_BxL: int32[B, L] clean tokens.
    x_t_BxL: int32[B, L] their masking at t.
    t: float32[B] or float32[B, L] times.
    maskable_BxL: bool[B, L] (`maskable`).
  Returns:
    (x0 int32[2B, L], x_t int32[2B, L], t float32[2B] or [2B, L]).
  """
  flipped_BxL = jnp.where(maskable_BxL & (x_t_BxL != mask_id), mask_id,
                          x0_BxL)
  t_prime = 1.0 / (1.0 - eps) - t
  return (jnp.concatenate([x0_BxL, x0_BxL]),
          jnp.concatenate([x_t_BxL, flipped_BxL]),
          jnp.concatenate([t, t_prime]))


def mdlm_nelbo_terms(logits_BxLxV: jax.Array, x0_BxL: jax.Array,
                     x_t_BxL: jax.Array, t_B: jax.Array,
                     mask_id: int = MASK_ID, eps: float = EPS) -> jax.Array:
  """Per-position integrand of MDLM's continuous-time NELBO at time t.

  term[b, l] = -alpha'_t / (1 - alpha_t) * -log p_theta(x0[b, l] | x_t[b])
  where x_t[b, l] is MASK (and x0[b, l] is not PAD), 0 elsewhere; p_theta is
  the SUBS parameterisation (`diffusion.subs_log_probs`: MASK never predicted,
  unmasked positions carried over). With the log-linear schedule the weight
  is 1 / t. Sahoo et al. 2024, "Simple and Effective Masked Diffusion
  Language Models", eq. 10: NELBO = E_{t ~ U(0,1], x_t} sum_l term[l].

  Args:
    logits_BxLxV: float[B, L, V] denoiser logits (any float dtype).
    x0_BxL: int32[B, L] clean tokens.
    x_t_BxL: int32[B, L] masked tokens.
    t_B: float32[B] times in (0, 1] (t = 0 gives an infinite weight), or
      float32[B, L], one time per position (BD3-LM: one per block).
    mask_id: the MASK token id.
    eps: schedule parameter, alpha_1 = eps.
  Returns:
    float32[B, L] terms, in nats.
  """
  t_BxL = jnp.asarray(t_B, jnp.float32)
  if t_BxL.ndim == 1:
    t_BxL = t_BxL[:, None]
  weight_BxL = -log_linear_alpha_prime(t_BxL, eps) / (
      1.0 - log_linear_alpha(t_BxL, eps))
  scored_BxL = (x_t_BxL == mask_id) & (x0_BxL != PAD_ID)
  log_probs_BxL = target_log_probs(logits_BxLxV, x0_BxL, excluded=mask_id)
  return jnp.where(scored_BxL, weight_BxL * -log_probs_BxL, 0.0)


SELF_CONDITIONING_RATE = 0.5  # the training rows self-conditioned
SELF_CONDITIONING_KEY = 2**31 - 2  # fold_in of the loss key for the rows


def self_conditioning_rows(key: jax.Array, batch: int,
                           rate: float = SELF_CONDITIONING_RATE) -> jax.Array:
  """bool[B]: the training rows given the first pass's prediction (each
  with probability `rate`, as Chen et al. 2022 and DiffusionGemma's
  training); the others get zeros."""
  return jax.random.uniform(key, (batch,)) < rate


def denoiser_logits(logits_fn, params, x_t_BxL: jax.Array,
                    attention_mask: jax.Array, rows_B: jax.Array | None
                    ) -> jax.Array:
  """float32[B, L, V] logits of the denoiser at x_t (positions 0..L-1).

  A model without self-conditioning (`self_conditioned`) runs once, as
  always. One with it runs twice: first without a previous prediction,
  then with that pass's probabilities (softmax of its logits, gradient
  stopped) as its input in the rows of `rows_B` (all rows when None) and
  zeros elsewhere.
  """
  positions = token_positions(x_t_BxL)
  logits = logits_fn(params, x_t_BxL, positions,
                     attention_mask=attention_mask).logits
  if not self_conditioned(logits_fn):
    return logits
  probs = jax.lax.stop_gradient(jax.nn.softmax(logits.astype(jnp.float32)))
  if rows_B is not None:
    probs = jnp.where(rows_B[:, None, None], probs, 0.0)
  return logits_fn(params, x_t_BxL, positions, attention_mask=attention_mask,
                   self_conditioning=probs).logits


def self_conditioning_mask(logits_fn, key, batch):
  """The training rows of `self_conditioning_rows` from the loss key (a
  fold_in, so the other draws of a loss are those of a model without
  self-conditioning); None for such a model."""
  if not self_conditioned(logits_fn):
    return None
  return self_conditioning_rows(
      jax.random.fold_in(key, SELF_CONDITIONING_KEY), batch)


def check_bound_inputs(logits_fn, tokens_BxL, num_timesteps: int,
                       user: str) -> None:
  """Raises ValueError unless num_timesteps is an int >= 1, the tokens are
  int[B, L] and the model is not causal (the bounds' common inputs)."""
  if not isinstance(num_timesteps, int) or num_timesteps < 1:
    raise ValueError(f"num_timesteps={num_timesteps!r} must be an int >= 1")
  check_tokens(tokens_BxL, min_length=1)
  check_attention(logits_fn, causal=False, user=user)


def binned_bound(nelbo_at, logits_fn, tokens_BxL: jax.Array, key: jax.Array,
                  num_timesteps: int, user: str):
  """The midpoint rule over K = num_timesteps time bins shared by the bounds:
  bin k at t = (k + 1/2) / K, its noise from fold_in(key, k); `nelbo_at(t_B,
  keep_BxL, key)` gives the bin's summed NELBO. Returns (loss, metrics).

  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], or a causal model.
  """
  check_bound_inputs(logits_fn, tokens_BxL, num_timesteps, user)
  batch = tokens_BxL.shape[0]
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))

  def bin_at(step):
    t_B = jnp.full((batch,), (step + 0.5) / num_timesteps, jnp.float32)
    return nelbo_at(t_B, keep_BxL, jax.random.fold_in(key, step))

  nll_K = jax.lax.map(bin_at, jnp.arange(num_timesteps, dtype=jnp.int32))
  return summarise(nll_K.mean(), keep_BxL.sum())
