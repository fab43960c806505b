"""MDLM's continuous-time NELBO (Sahoo et al. 2024, arXiv:2406.07524),
with the adaptation options of the package docstring (token shift,
complementary masks, attention-mask annealing) and self-conditioning."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import masks
from lm_decoding.models.config import check_attention
from lm_decoding.models.config import token_shift as shifted
from lm_decoding.models.diffusion import EPS, shift_logits
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training.objectives.common import (
    binned_bound, check_tokens, complement, denoiser_logits, mask_at_time,
    maskable, mdlm_nelbo_terms, sample_times, self_conditioning_mask,
    summarise)


def visible_ahead(step, anneal_steps: int, length: int) -> jax.Array:
  """int32[]: how far ahead a query sees at `step` of mask annealing.

  DiffuLLaMA's attention-mask annealing (Gong et al. 2025) as a band that
  widens linearly: floor((L - 1) * min(1, step / anneal_steps)): 0 (the
  causal mask) at step 0, L - 1 (bidirectional) from step `anneal_steps`
  on (at once when anneal_steps is 0).
  """
  if not anneal_steps:
    return jnp.int32(length - 1)
  fraction = jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / anneal_steps)
  return jnp.floor((length - 1) * fraction).astype(jnp.int32)


def mdlm_nelbo(logits_fn, params, x0_BxL, x_t_BxL, t_B, mask_id, eps,
                ahead=None, rows_B=None):
  """Summed NELBO terms of one (t, x_t) draw per row; `ahead`: the
  annealing band (`visible_ahead`), None for bidirectional; `rows_B`: the
  self-conditioned rows (`denoiser_logits`)."""
  # PAD keys are hidden, as a diffusion decoder hides padding past a length.
  length = x_t_BxL.shape[1]
  mask = masks.key_padding_mask(x0_BxL != PAD_ID, length)
  if ahead is not None:
    offset_LxL = jnp.arange(length)[None, :] - jnp.arange(length)[:, None]
    mask &= (offset_LxL <= ahead)[None]
  logits = denoiser_logits(logits_fn, params, x_t_BxL, mask, rows_B)
  if shifted(logits_fn):
    logits = shift_logits(logits)
  return mdlm_nelbo_terms(logits, x0_BxL, x_t_BxL, t_B, mask_id, eps).sum()


def noise_kept(key, x0_BxL, t, keep_BxL, mask_id, eps):
  """x_t int32[B, L]: `mask_at_time` at t, the tokens outside keep unmasked."""
  return jnp.where(keep_BxL, mask_at_time(key, x0_BxL, t, mask_id, eps),
                   x0_BxL)


def mdlm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
              mask_id: int = MASK_ID, eps: float = EPS,
              complementary: bool = False, ahead=None):
  """MDLM training loss (Sahoo et al. 2024): one-sample NELBO per real token.

  Per row: an antithetic time t (`sample_times(.., t_min=eps)`), x_t from
  `mask_at_time` (log-linear schedule with alpha_1 = eps), one bidirectional
  forward pass, and the `mdlm_nelbo_terms` summed over masked positions. The
  loss is the batch NELBO divided by the number of maskable tokens: an
  unbiased estimate of the NELBO per token, except that as in MDLM t < eps is
  never drawn and a fraction eps of tokens stays unmasked at t = 1, each
  lowering the value by O(eps) relative (see `mdlm_bound` for the exact
  bound). A token-shifted model (module docstring) is scored on tokens
  1..L-1 of each row. A self-conditioned model gets its first pass's
  prediction in a random half of the rows (module docstring).

  Args:
    logits_fn: the denoiser (see the module docstring); non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and masks).
    mask_id: the MASK token id (static).
    eps: smallest time drawn and alpha_1, in (0, 1) (static); t = 0 would
      weigh a term by 1/0.
    complementary: also score every row's complementary mask (`complement`;
      twice the forward rows).
    ahead: int32[] attention band of mask annealing (`visible_ahead`; may
      be traced), None for bidirectional attention.
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], eps outside (0, 1), or a causal model.
  """
  check_tokens(tokens_BxL, min_length=1)
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  check_attention(logits_fn, causal=False, user="mdlm_loss")
  key_t, key_mask = jax.random.split(key)
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  t_B = sample_times(key_t, tokens_BxL.shape[0], t_min=eps)
  x0_BxL = tokens_BxL
  x_t_BxL = noise_kept(key_mask, tokens_BxL, t_B, keep_BxL, mask_id, eps)
  copies = 1
  if complementary:
    x0_BxL, x_t_BxL, t_B = complement(x0_BxL, x_t_BxL, t_B, keep_BxL,
                                      mask_id=mask_id, eps=eps)
    copies = 2
  nll = mdlm_nelbo(logits_fn, params, x0_BxL, x_t_BxL, t_B, mask_id, eps,
                    ahead, self_conditioning_mask(logits_fn, key,
                                                   x_t_BxL.shape[0]))
  return summarise(nll, copies * keep_BxL.sum())


def mdlm_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
               num_timesteps: int, *, mask_id: int = MASK_ID):
  """Deterministic MDLM NELBO per token: the validation perplexity bound.

  The continuous-time NELBO (Sahoo et al. 2024) with alpha_t = 1 - t (the
  log-linear schedule with eps = 0, so x_1 is fully masked and the NELBO
  bounds -log p(x0) with no prior term), integrated over t in (0, 1] by the
  midpoint rule on `num_timesteps` equal bins, t_k = (k + 1/2) / K, with one
  mask draw per row and timestep from `fold_in(key, k)`. The same key gives
  the same value; exp(loss) is the MDLM perplexity bound. Costs K forward
  passes (run sequentially with `lax.map`). A token-shifted model is scored
  on tokens 1..L-1 (module docstring). A self-conditioned model is scored
  with its first pass's prediction in every row (2K passes; module
  docstring).

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key of the masks; keep it fixed across evaluations.
    num_timesteps: K >= 1 (static).
    mask_id: the MASK token id (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], or a causal model.
  """
  def nelbo_at(t_B, keep_BxL, key):
    x_t_BxL = noise_kept(key, tokens_BxL, t_B, keep_BxL, mask_id, eps=0.0)
    return mdlm_nelbo(logits_fn, params, tokens_BxL, x_t_BxL, t_B, mask_id,
                       eps=0.0)

  return binned_bound(nelbo_at, logits_fn, tokens_BxL, key, num_timesteps,
                       "mdlm_bound")
