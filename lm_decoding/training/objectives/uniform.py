"""Uniform-state diffusion's NELBO (UDLM, Schiff et al. 2024,
arXiv:2412.10193; Duo, Sahoo et al. 2025, arXiv:2506.10892)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import diffusion, masks
from lm_decoding.models.config import check_attention
from lm_decoding.models.config import token_shift as shifted
from lm_decoding.models.diffusion import EPS, shift_logits
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training.objectives.common import (
    binned_bound, check_tokens, denoiser_logits, maskable, sample_times,
    self_conditioning_mask, summarise, token_positions)


def uniform_noise(key: jax.Array, x0_BxL: jax.Array, alpha_B: jax.Array,
                  keep_BxL: jax.Array, vocab: int) -> jax.Array:
  """Samples uniform-state diffusion's forward process q(z_t | x_0).

  Each kept token is replaced, with probability 1 - alpha_t, by a token
  drawn uniformly from the whole vocabulary [0, V) (possibly itself, as
  DiffusionGemma's canvas is drawn), so q(z_t = y | x) = alpha_t [y = x] +
  (1 - alpha_t) / V; the other tokens stay clean.

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] clean tokens.
    alpha_B: float32[B] signal levels in [0, 1].
    keep_BxL: bool[B, L] the tokens the process may replace.
    vocab: V.
  Returns:
    int32[B, L] z_t.
  """
  key_flip, key_token = jax.random.split(key)
  u_BxL = jax.random.uniform(key_flip, x0_BxL.shape, jnp.float32)
  noise_BxL = jax.random.randint(key_token, x0_BxL.shape, 0, vocab,
                                 x0_BxL.dtype)
  replaced_BxL = keep_BxL & (u_BxL < 1.0 - jnp.asarray(alpha_B)[:, None])
  return jnp.where(replaced_BxL, noise_BxL, x0_BxL)


def uniform_nelbo_terms(logits_BxLxV: jax.Array, x0_BxL: jax.Array,
                        z_t_BxL: jax.Array, alpha_B: jax.Array,
                        alpha_prime_B: jax.Array,
                        scored_BxL: jax.Array) -> jax.Array:
  """Per-position integrand of the uniform-state continuous-time NELBO.

  With N = V, x-bar = N alpha_t onehot(x) + (1 - alpha_t) and x-bar_theta
  = N alpha_t softmax(logits) + (1 - alpha_t) (the marginals q(z_t | x) and
  q(z_t | x_theta), times N), the term of a position with noisy token z is

    -alpha'_t / (N alpha_t) * sum_{y != z} [ s_y - r_y log s_y
                                             + r_y log r_y - r_y ],
    r_y = x-bar_y / x-bar_z,  s_y = x-bar_theta_y / x-bar_theta_z,

  the denoising score entropy (Lou et al. 2023) of the uniform rate
  -alpha'_t / (N alpha_t) with the score of the denoiser's marginal; summed
  over y it equals UDLM's closed form N / x-bar_theta_z - N / x-bar_z +
  sum_{y != z} r_y log(r_y / s_y). Computed term-wise as
  r_y (expm1(u) - u), u = log(s_y / r_y), each >= 0 (no cancellation of
  the two large 1/x-bar terms at small t).

  Args:
    logits_BxLxV: float[B, L, V] denoiser logits at z_t (any float dtype).
    x0_BxL: int32[B, L] clean tokens; z_t_BxL: int32[B, L] noisy tokens.
    alpha_B, alpha_prime_B: float32[B] alpha_t in (0, 1] and d alpha/dt.
    scored_BxL: bool[B, L] positions scored.
  Returns:
    float32[B, L] terms (nats per unit time); 0 where not scored.
  """
  logits = logits_BxLxV.astype(jnp.float32)
  vocab = logits.shape[-1]
  a = jnp.asarray(alpha_B, jnp.float32)[:, None, None]
  ids_BxLxV = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
  log_x_theta = jnp.logaddexp(jnp.log(vocab * a) + jax.nn.log_softmax(logits),
                              jnp.log1p(-a))
  log_x_bar = jnp.where(ids_BxLxV == x0_BxL[..., None],
                        jnp.log(vocab * a + 1.0 - a), jnp.log1p(-a))
  at_z = ids_BxLxV == z_t_BxL[..., None]
  pick = lambda v: jnp.sum(jnp.where(at_z, v, 0.0), -1, keepdims=True)
  log_r = log_x_bar - pick(log_x_bar)
  u = log_x_theta - pick(log_x_theta) - log_r
  entropy_BxL = jnp.sum(jnp.exp(log_r) * (jnp.expm1(u) - u), -1)
  weight_B = -jnp.asarray(alpha_prime_B, jnp.float32) / (
      vocab * jnp.asarray(alpha_B, jnp.float32))
  return jnp.where(scored_BxL, weight_B[:, None] * entropy_BxL, 0.0)


def _uniform_nelbo(logits_fn, params, x0_BxL, t_B, keep_BxL, key, schedule,
                   eps, rows_B=None):
  """Summed NELBO terms of one (t, z_t) draw per row (bidirectional, PAD
  keys hidden; a token-shifted model's logits realigned; `rows_B`: the
  self-conditioned rows, `denoiser_logits`)."""
  a_B = diffusion.alpha(schedule, t_B, eps)
  length = x0_BxL.shape[1]
  vocab = jax.eval_shape(
      lambda t: logits_fn(params, t, token_positions(t)).logits,
      x0_BxL[:1, :1]).shape[-1]
  z_t_BxL = uniform_noise(key, x0_BxL, a_B, keep_BxL, vocab)
  logits = denoiser_logits(
      logits_fn, params, z_t_BxL,
      masks.key_padding_mask(x0_BxL != PAD_ID, length), rows_B)
  if shifted(logits_fn):
    logits = shift_logits(logits)
  return uniform_nelbo_terms(logits, x0_BxL, z_t_BxL, a_B,
                             diffusion.alpha_prime(schedule, t_B, eps),
                             keep_BxL).sum()


def uniform_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                 *, schedule: str = "log_linear", eps: float = EPS):
  """Uniform-state diffusion training loss: one-sample NELBO per token.

  UDLM (Schiff et al. 2024) / Duo (Sahoo et al. 2025): the forward process
  replaces tokens by uniformly random ones (`uniform_noise`), the denoiser
  predicts x_0 from the whole noisy sequence with no time input, and the
  loss is the continuous-time NELBO (`uniform_nelbo_terms`) at one
  antithetic time t in [eps, 1) per row (`sample_times`), summed over the
  scored tokens and divided by their count. As in `mdlm_loss`, t < eps is
  never drawn and the prior term at t = 1 (alpha_1 = eps > 0 for the
  log-linear and cosine schedules) is left out, each O(eps); `uniform_bound`
  is the exact bound. Every token, noised or not, is scored (unlike MDLM's
  masked positions only). A self-conditioned model gets its first pass's
  prediction in a random half of the rows, zeros in the others (module
  docstring); the times and noise are those of a model without it.

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and noise).
    schedule: one of `diffusion.SCHEDULES` (static).
    eps: smallest time drawn, in (0, 1) (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], eps outside (0, 1), an unknown
      schedule, or a causal model.
  """
  check_tokens(tokens_BxL, min_length=1)
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  if schedule not in diffusion.SCHEDULES:
    raise ValueError(f"schedule={schedule!r}; allowed: {diffusion.SCHEDULES}")
  check_attention(logits_fn, causal=False, user="uniform_loss")
  key_t, key_noise = jax.random.split(key)
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  t_B = sample_times(key_t, tokens_BxL.shape[0], t_min=eps)
  nll = _uniform_nelbo(logits_fn, params, tokens_BxL, t_B, keep_BxL,
                       key_noise, schedule, eps,
                       self_conditioning_mask(logits_fn, key,
                                               tokens_BxL.shape[0]))
  return summarise(nll, keep_BxL.sum())


def uniform_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                  num_timesteps: int):
  """Deterministic uniform-state NELBO per token: the perplexity bound.

  The continuous-time NELBO with alpha_t = 1 - t (z_1 exactly uniform, the
  prior, so no prior term), integrated over (0, 1) by the midpoint rule on
  `num_timesteps` bins with one noise draw per row and bin from
  `fold_in(key, k)`, as `mdlm_bound`. K forward passes; 2K for a
  self-conditioned model, scored with its first pass's prediction in every
  row (the two-pass denoiser `uniform_eb` runs from its second step on;
  module docstring).

  Takes `mdlm_bound`'s arguments but `mask_id` (the key draws the noise;
  keep it fixed across evaluations) and returns (loss float32[] nats per
  token, metrics) as in the module docstring.

  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], or a causal model.
  """
  def nelbo_at(t_B, keep_BxL, key):
    return _uniform_nelbo(logits_fn, params, tokens_BxL, t_B, keep_BxL, key,
                          "linear", 0.0)

  return binned_bound(nelbo_at, logits_fn, tokens_BxL, key, num_timesteps,
                       "uniform_bound")
