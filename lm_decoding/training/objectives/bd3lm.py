"""BD3-LM's block NELBO (Arriola et al. 2025, arXiv:2503.09573): blocks
denoised left to right, each conditioned on the clean blocks before it; its
block-size schedule (LLaDA 2.0's warm-up / stable / decay)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import diffusion, masks
from lm_decoding.models.config import check_attention
from lm_decoding.models.config import token_shift as shifted
from lm_decoding.models.diffusion import EPS, log_linear_alpha, shift_logits
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training.objectives.common import (
    check_bound_inputs, check_tokens, complement, maskable, mdlm_nelbo_terms,
    sample_times, summarise, target_log_probs, token_positions)


def parse_block_schedule(text: str, seq_len: int,
                         block_length: int) -> tuple[tuple[int, int], ...]:
  """The block-size schedule "s0:W0,s1:W1,..." as ((s0, W0), (s1, W1), ...).

  From step s_i on (until s_{i+1}) BD3-LM trains with blocks of W_i: LLaDA
  2.0's warm-up / stable / decay of the block size when adapting an AR model
  (small blocks, growing to long ones, then back to the block length the
  model is decoded with). Example: "0:1,50:16,100:256,200:4" for L = 256.

  Args:
    text: comma-separated step:block_length pairs.
    seq_len: L; every W_i must divide it.
    block_length: the model's block length (`train.block_length`, the one
      its bound is evaluated and it is decoded with): the last W_i.
  Raises:
    ValueError: naming train.block_schedule, unless s0 = 0, the steps rise
      strictly, every W_i is an integer in [1, L] dividing L, and the last
      W_i is block_length.
  """
  allowed = (f"train.block_schedule={text!r} must be 'step:block_length' "
             "pairs joined by commas, steps rising from 0, each block length "
             f"dividing data.seq_len={seq_len}, the last equal to "
             f"train.block_length={block_length}")
  try:
    pairs = tuple(tuple(int(x) for x in item.split(":"))
                  for item in str(text).split(","))
  except ValueError:
    raise ValueError(allowed) from None
  steps = [pair[0] for pair in pairs]
  if (any(len(pair) != 2 for pair in pairs) or steps[0] != 0
      or any(b <= a for a, b in zip(steps, steps[1:]))
      or any(not 1 <= w <= seq_len or seq_len % w for _, w in pairs)
      or pairs[-1][1] != block_length):
    raise ValueError(allowed)
  return pairs


def block_length_at(schedule: tuple[tuple[int, int], ...], step: int) -> int:
  """W at training `step` (an int) under a `parse_block_schedule` schedule."""
  return [w for start, w in schedule if start <= step][-1]


def check_block_length(block_length, length: int) -> None:
  if (isinstance(block_length, bool) or not isinstance(block_length, int)
      or not 1 <= block_length <= length or length % block_length):
    raise ValueError(f"block_length={block_length!r} must be an integer in "
                     f"[1, {length}] dividing the sequence length L={length}")


def bd3lm_noise(key: jax.Array, x0_BxL: jax.Array, block_length: int, *,
                mask_id: int = MASK_ID, eps: float = EPS):
  """BD3-LM's forward process (Arriola et al. 2025): one time per block.

  The B * N blocks (N = L / block_length) get antithetic times
  `sample_times(.., B * N, t_min=eps)` in row-major order (row b, block n is
  stratum b N + n), as the reference samples t "along blocks and batches";
  each non-PAD token is then masked with probability 1 - alpha_t of its
  block's t (log-linear schedule, alpha_1 = eps). With block_length = L
  this draws exactly `mdlm_loss`'s t and x_t from the same key.

  Args:
    key: PRNG key (times and masks).
    x0_BxL: int32[B, L] clean tokens.
    block_length: W, dividing L.
    mask_id: the MASK token id.
    eps: smallest time drawn and alpha_1.
  Returns:
    (t float32[B, L], each position's block time; x_t int32[B, L]).
  """
  batch, length = x0_BxL.shape
  num_blocks = length // block_length
  key_t, key_mask = jax.random.split(key)
  t_BxN = sample_times(key_t, batch * num_blocks, t_min=eps).reshape(
      batch, num_blocks)
  t_BxL = jnp.repeat(t_BxN, block_length, axis=1)
  return t_BxL, diffusion.mask_tokens(key_mask, x0_BxL,
                                      log_linear_alpha(t_BxL, eps), mask_id)


def bd3lm_logits(logits_fn, params, x0_BxL, x_t_BxL, block_length):
  """float32[B, L, V] denoising logits of x_t, index i predicting token i.

  One pass over [x_t ; x_0]: both halves sit at positions 0..L-1 (the
  reference rotates both with the same positions);
  `masks.bd3lm_training_mask` lets noisy block i see itself and clean blocks
  < i, clean block i see clean blocks <= i; PAD keys are hidden in both
  halves. A token-shifted model predicts the first token of each block from
  the clean half's position before it, the others from the noisy half's
  (module docstring). With one block (block_length = L) the clean half is
  seen by no scored prediction, and the pass is over x_t alone.
  """
  batch, length = x0_BxL.shape
  positions_BxL = token_positions(x0_BxL)
  if block_length == length:
    logits = logits_fn(params, x_t_BxL, positions_BxL,
                       attention_mask=masks.key_padding_mask(
                           x0_BxL != PAD_ID, length)).logits
    return shift_logits(logits) if shifted(logits_fn) else logits
  valid_Bx2L = jnp.tile(x0_BxL != PAD_ID, (1, 2))
  mask = (masks.bd3lm_training_mask(batch, length, block_length)
          & masks.key_padding_mask(valid_Bx2L, 2 * length))
  logits = logits_fn(params, jnp.concatenate([x_t_BxL, x0_BxL], axis=1),
                     jnp.concatenate([positions_BxL, positions_BxL], axis=1),
                     attention_mask=mask).logits
  if not shifted(logits_fn):
    return logits[:, :length]
  block_start_L = jnp.arange(length) % block_length == 0
  return jnp.where(block_start_L[None, :, None],
                   shift_logits(logits[:, length:]),
                   shift_logits(logits[:, :length]))


def _noised(key: jax.Array, tokens_BxL: jax.Array, keep_BxL: jax.Array,
            block_length: int, mask_id: int, eps: float, complementary: bool
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(x_0, x_t int32[B', L], t float32[B', L]) of `bd3lm_loss`: every block
  noised at its time (`bd3lm_noise`) where `keep_BxL`, clean elsewhere; with
  `complementary` the complementary masks appended (B' = 2B)."""
  t_BxL, x_t_BxL = bd3lm_noise(key, tokens_BxL, block_length, mask_id=mask_id,
                               eps=eps)
  x0_BxL, x_t_BxL = tokens_BxL, jnp.where(keep_BxL, x_t_BxL, tokens_BxL)
  if complementary:
    x0_BxL, x_t_BxL, t_BxL = complement(x0_BxL, x_t_BxL, t_BxL, keep_BxL,
                                        mask_id=mask_id, eps=eps)
  return x0_BxL, x_t_BxL, t_BxL


def bd3lm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
               block_length: int, mask_id: int = MASK_ID, eps: float = EPS,
               complementary: bool = False):
  """BD3-LM training loss (Arriola et al. 2025): block diffusion NELBO/token.

  The sequence is cut into N = L / block_length blocks; block n is denoised
  conditioned on the clean blocks before it, so the NELBO is the sum over
  blocks of an MDLM NELBO. Per block: a time t (`bd3lm_noise`: antithetic
  over the B * N blocks), x_t of the block masked at alpha_t; one forward
  pass over [x_t ; x_0] (2L inputs, `bd3lm_logits`) gives every block's
  denoising logits; `mdlm_nelbo_terms` scores the masked positions with SUBS
  and the weight -alpha'_t / (1 - alpha_t) = 1 / t of their block's t. As
  in the reference (kuleshov-group/bd3lms, `algo=bd3lm`): no time input to
  the model, t in [eps, 1); its learned clipped schedule ("var_min", which
  narrows t's range to lower the gradient variance) is not implemented.

  Limits: block_length = L is exactly `mdlm_loss` (the same key draws the
  same t and masks; the noisy half sees no clean token). block_length 1:
  noisy token l sees only itself (MASK when masked) and x_0[:l], so the
  model is a causal LM that reads [x_0[:l], MASK] and predicts x_l at the
  MASK's position, MASK excluded from the softmax; a one-token block's
  NELBO is exact, int P(masked at t) w(t) dt = alpha_0 - alpha_1 = 1 - eps,
  so E[loss] = (1 - eps) x that AR model's NLL per token (and
  `bd3lm_bound` equals its NLL exactly). With a token shift and blocks of 1
  each token is predicted by the clean causal pass at the position before
  it: the model is its AR parent, and `bd3lm_bound` equals `ar_eval`.

  Args:
    logits_fn: the denoiser (see the module docstring); non-causal attention
      (the masks are passed explicitly).
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and masks).
    block_length: W, dividing L (static).
    mask_id: the MASK token id (static).
    eps: smallest time drawn and alpha_1, in (0, 1) (static).
    complementary: also score every row's complementary mask (`complement`;
      twice the forward rows).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], block_length not dividing L, eps
      outside (0, 1), or a causal model.
  """
  check_tokens(tokens_BxL, min_length=1)
  check_block_length(block_length, tokens_BxL.shape[1])
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  check_attention(logits_fn, causal=False, user="bd3lm_loss")
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  x0_BxL, x_t_BxL, t_BxL = _noised(key, tokens_BxL, keep_BxL, block_length,
                                   mask_id, eps, complementary)
  copies = 2 if complementary else 1
  logits = bd3lm_logits(logits_fn, params, x0_BxL, x_t_BxL, block_length)
  nll = mdlm_nelbo_terms(logits, x0_BxL, x_t_BxL, t_BxL, mask_id, eps).sum()
  return summarise(nll, copies * keep_BxL.sum())


def _stratum_masks(key: jax.Array, k: jax.Array, valid_BxNxW: jax.Array,
                   strata: int
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(masked bool[B, N, W], stratum size int32[B, N], mask count m
  int32[B, N]) of `bd3lm_bound`'s pass k: per row and block one count m
  drawn in the stratum (floor(k w / K'), floor((k+1) w / K')] of its w real
  tokens, and one subset of m of them (PAD never masked)."""
  key_count, key_subset = jax.random.split(key)
  real_BxN = valid_BxNxW.sum(-1, dtype=jnp.int32)
  low_BxN = k * real_BxN // strata
  size_BxN = (k + 1) * real_BxN // strata - low_BxN
  offset_BxN = jnp.floor(jax.random.uniform(key_count, real_BxN.shape)
                         * size_BxN).astype(jnp.int32)
  count_BxN = low_BxN + 1 + jnp.minimum(offset_BxN,
                                        jnp.maximum(size_BxN - 1, 0))
  order_BxNxW = jnp.where(valid_BxNxW, jax.random.uniform(
      key_subset, valid_BxNxW.shape), 2.0)  # PAD ranks last
  rank_BxNxW = jnp.argsort(jnp.argsort(order_BxNxW, axis=-1), axis=-1)
  masked_BxNxW = (valid_BxNxW & (rank_BxNxW < count_BxN[..., None])
                  & (size_BxN > 0)[..., None])
  return masked_BxNxW, size_BxN, count_BxN


def bd3lm_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                num_timesteps: int, *, block_length: int,
                mask_id: int = MASK_ID):
  """Deterministic BD3-LM NELBO per token: the validation perplexity bound.

  Each block's NELBO is taken in its number-of-masks form: with alpha_t =
  1 - t (x_1 fully masked, no prior term), P(a given set S of m of the
  block's w real tokens is masked) integrates against the weight 1/t to
  int t^(m-1) (1-t)^(w-m) dt = 1 / (m C(w, m)), so

    NELBO(block) = sum_{m=1..w} (1/m) E_{|S|=m} sum_{l in S}
                   -log p(x_l | x_block\\S, x_<block),

  S uniform over the subsets of size m. K' = min(num_timesteps, W) forward
  passes estimate it: pass k covers the counts m in the stratum
  (floor(k w / K'), floor((k+1) w / K')] of each row and block, draws one m
  in it and one S of that size (keys from `fold_in(key, k)`), and weighs each
  masked token by |stratum| / m: unbiased, and the same key gives the same
  value. With block_length 1 it is one pass with every token masked and
  weight 1: exactly the NLL of the AR model described in `bd3lm_loss` (with
  a token shift, `ar_eval` of the same parameters). With block_length L it
  estimates the same NELBO as `mdlm_bound` (with other draws, so not the same
  number). A token-shifted model is scored on tokens 1..L-1.

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key of the draws; keep it fixed across evaluations.
    num_timesteps: K >= 1 (static), the number of strata (passes), at most
      block_length of them used.
    block_length: W, dividing L (static).
    mask_id: the MASK token id (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], block_length not
      dividing L, or a causal model.
  """
  check_bound_inputs(logits_fn, tokens_BxL, num_timesteps, "bd3lm_bound")
  check_block_length(block_length, tokens_BxL.shape[1])
  batch, length = tokens_BxL.shape
  strata = min(num_timesteps, block_length)
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  valid_BxNxW = keep_BxL.reshape(batch, -1, block_length)

  def nelbo_of_stratum(k):
    masked_BxNxW, size_BxN, count_BxN = _stratum_masks(
        jax.random.fold_in(key, k), k, valid_BxNxW, strata)
    masked_BxL = masked_BxNxW.reshape(batch, length)
    x_t_BxL = jnp.where(masked_BxL, mask_id, tokens_BxL)
    logits = bd3lm_logits(logits_fn, params, tokens_BxL, x_t_BxL,
                           block_length)
    nll_BxL = -target_log_probs(logits, tokens_BxL, excluded=mask_id)
    weight_BxL = jnp.repeat(size_BxN / count_BxN, block_length, axis=1)
    return jnp.sum(jnp.where(masked_BxL, weight_BxL * nll_BxL, 0.0))

  nll_per_stratum = jax.lax.map(nelbo_of_stratum,
                                jnp.arange(strata, dtype=jnp.int32))
  return summarise(nll_per_stratum.sum(), keep_BxL.sum())
