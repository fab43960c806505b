"""Training objectives: next-token cross-entropy and the MDLM NELBO.

Each objective is a pure function of (params, tokens, key) once the model is
bound, so it can be jitted and differentiated:

    loss_fn = functools.partial(mdlm_loss, make_logits_fn(config))
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens, key)

The model enters as a `logits_fn`, the decoder boundary of
`lm_decoding.decoding.base`: (params, tokens, positions, cache=None,
attention_mask=None) -> `ModelOutput` (float32 logits, cache, hidden).
`make_logits_fn(config)` is hashable (usable as a static jit argument) and
tests pass stub logits instead. When `logits_fn` has a `config`, its attention kind is checked:
a causal model for `ar_*`, a non-causal one for `mdlm_*`.

Every objective returns `(loss, metrics)`:
  metrics['nll']:    float32[] negative log-likelihood (for MDLM, its upper
                     bound, the NELBO) summed over the batch, in nats.
  metrics['tokens']: float32[] number of scored tokens.
  metrics['loss']:   nll / tokens, the returned loss (nats per token).
Validation sums 'nll' and 'tokens' over batches and reports
exp(sum nll / sum tokens) as perplexity (an upper bound of it for MDLM).

PAD (id 0) marks positions outside a sequence: never a target, never masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import diffusion, masks
from lm_decoding.models.diffusion import (
    EPS, log_linear_alpha, log_linear_alpha_prime, subs_log_probs)
from lm_decoding.special_tokens import MASK_ID, PAD_ID


def _check_tokens(tokens_BxL, min_length: int) -> None:
  if tokens_BxL.ndim != 2 or not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
    raise ValueError(f"tokens must be int[B, L]; got {tokens_BxL.dtype}"
                     f"{list(tokens_BxL.shape)}")
  if tokens_BxL.shape[1] < min_length:
    raise ValueError(f"tokens length L={tokens_BxL.shape[1]} must be >= "
                     f"{min_length}")


def _check_attention(logits_fn, causal: bool, objective: str) -> None:
  config = getattr(logits_fn, "config", None)
  if config is not None and (config.attention == "causal") != causal:
    wanted = "'causal'" if causal else "non-causal (e.g. 'bidirectional')"
    raise ValueError(f"{objective} needs {wanted} attention; "
                     f"logits_fn.config.attention={config.attention!r}")


def _positions(tokens_BxL):
  return jnp.broadcast_to(
      jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)


def _gather(log_probs_BxLxV, ids_BxL):
  return jnp.take_along_axis(log_probs_BxLxV, ids_BxL[..., None], axis=-1)[..., 0]


def _summarise(nll, tokens):
  nll = nll.astype(jnp.float32)
  tokens = tokens.astype(jnp.float32)
  loss = nll / jnp.maximum(tokens, 1.0)
  return loss, {"loss": loss, "nll": nll, "tokens": tokens}


def ar_eval(logits_fn, params, tokens_BxL: jax.Array):
  """Next-token cross-entropy with teacher forcing (a causal LM); deterministic.

  Predicts tokens[:, 1:] from tokens[:, :-1] in one causal forward pass;
  targets that are PAD carry no loss.

  Args:
    logits_fn: the model (see the module docstring); causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] sequences (L >= 2), right-padded with PAD.
  Returns:
    (loss float32[] nats per scored token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L] with L >= 2, or a non-causal model.
  """
  _check_tokens(tokens_BxL, min_length=2)
  _check_attention(logits_fn, causal=True, objective="ar_eval")
  inputs_BxT, targets_BxT = tokens_BxL[:, :-1], tokens_BxL[:, 1:]
  logits_BxTxV = logits_fn(params, inputs_BxT, _positions(inputs_BxT)).logits
  log_probs = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
  scored_BxT = targets_BxT != PAD_ID
  nll_BxT = jnp.where(scored_BxT, -_gather(log_probs, targets_BxT), 0.0)
  return _summarise(nll_BxT.sum(), scored_BxT.sum())


def ar_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array):
  """`ar_eval` with the training signature; `key` is unused (no noise)."""
  del key
  return ar_eval(logits_fn, params, tokens_BxL)


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


def mask_tokens(key: jax.Array, x0_BxL: jax.Array, t_B: jax.Array,
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
    t_B: float32[B] times in (0, 1] (t = 0 gives an infinite weight).
    mask_id: the MASK token id.
    eps: schedule parameter, alpha_1 = eps.
  Returns:
    float32[B, L] terms, in nats.
  """
  log_probs = subs_log_probs(logits_BxLxV, x_t_BxL, mask_id)
  weight_B = -log_linear_alpha_prime(t_B, eps) / (
      1.0 - log_linear_alpha(t_B, eps))
  scored_BxL = (x_t_BxL == mask_id) & (x0_BxL != PAD_ID)
  return jnp.where(scored_BxL, weight_B[:, None] * -_gather(log_probs, x0_BxL),
                   0.0)


def _mdlm_nelbo(logits_fn, params, x0_BxL, x_t_BxL, t_B, mask_id, eps):
  """Summed NELBO terms of one (t, x_t) draw per row."""
  # PAD keys are hidden, as a diffusion decoder hides padding past a length.
  length = x_t_BxL.shape[1]
  logits = logits_fn(params, x_t_BxL, _positions(x_t_BxL),
                     attention_mask=masks.key_padding_mask(x0_BxL != PAD_ID,
                                                           length)).logits
  return mdlm_nelbo_terms(logits, x0_BxL, x_t_BxL, t_B, mask_id, eps).sum()


def mdlm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
              mask_id: int = MASK_ID, eps: float = EPS):
  """MDLM training loss (Sahoo et al. 2024): one-sample NELBO per real token.

  Per row: an antithetic time t (`sample_times(.., t_min=eps)`), x_t from
  `mask_tokens` (log-linear schedule with alpha_1 = eps), one bidirectional
  forward pass, and the `mdlm_nelbo_terms` summed over masked positions. The
  loss is the batch NELBO divided by the number of non-PAD tokens: an unbiased
  estimate of the NELBO per token, except that as in MDLM t < eps is never
  drawn and a fraction eps of tokens stays unmasked at t = 1, each lowering
  the value by O(eps) relative (see `mdlm_bound` for the exact bound).

  Args:
    logits_fn: the denoiser (see the module docstring); non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and masks).
    mask_id: the MASK token id (static).
    eps: smallest time drawn and alpha_1, in (0, 1) (static); t = 0 would
      weigh a term by 1/0.
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], eps outside (0, 1), or a causal model.
  """
  _check_tokens(tokens_BxL, min_length=1)
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  _check_attention(logits_fn, causal=False, objective="mdlm_loss")
  key_t, key_mask = jax.random.split(key)
  t_B = sample_times(key_t, tokens_BxL.shape[0], t_min=eps)
  x_t_BxL = mask_tokens(key_mask, tokens_BxL, t_B, mask_id, eps)
  nll = _mdlm_nelbo(logits_fn, params, tokens_BxL, x_t_BxL, t_B, mask_id, eps)
  return _summarise(nll, (tokens_BxL != PAD_ID).sum())


def mdlm_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
               num_timesteps: int, *, mask_id: int = MASK_ID):
  """Deterministic MDLM NELBO per token: the validation perplexity bound.

  The continuous-time NELBO (Sahoo et al. 2024) with alpha_t = 1 - t (the
  log-linear schedule with eps = 0, so x_1 is fully masked and the NELBO
  bounds -log p(x0) with no prior term), integrated over t in (0, 1] by the
  midpoint rule on `num_timesteps` equal bins, t_k = (k + 1/2) / K, with one
  mask draw per row and timestep from `fold_in(key, k)`. The same key gives
  the same value; exp(loss) is the MDLM perplexity bound. Costs K forward
  passes (run sequentially with `lax.map`).

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
  if not isinstance(num_timesteps, int) or num_timesteps < 1:
    raise ValueError(f"num_timesteps={num_timesteps!r} must be an int >= 1")
  _check_tokens(tokens_BxL, min_length=1)
  _check_attention(logits_fn, causal=False, objective="mdlm_bound")
  batch = tokens_BxL.shape[0]

  def nelbo_at(step):
    t_B = jnp.full((batch,), (step + 0.5) / num_timesteps, jnp.float32)
    x_t_BxL = mask_tokens(jax.random.fold_in(key, step), tokens_BxL, t_B,
                          mask_id, eps=0.0)
    return _mdlm_nelbo(logits_fn, params, tokens_BxL, x_t_BxL, t_B, mask_id,
                       eps=0.0)

  nll_K = jax.lax.map(nelbo_at, jnp.arange(num_timesteps, dtype=jnp.int32))
  return _summarise(nll_K.mean(), (tokens_BxL != PAD_ID).sum())
