"""Jacobi Forcing: consistency training of a causal LM on its own Jacobi
trajectories (CLLM, Kou et al. 2024, arXiv:2403.00835; Jacobi Forcing,
arXiv:2512.14681), so that Jacobi decoding (`jacobi`,
`decoding/self_drafting.py`) fixes more than one token per call.

A training row is a pair laid out in one row of 2 L tokens
(`jacobi_trajectories.forcing_pairs`):

  inputs  [row[:s] | g^j (n) | PAD ...]        (L)  a Jacobi state
  targets [PAD (s) | y*[s:s+n] | PAD ...]      (L)  the fixed point

The model runs causally on the inputs; target t (1 <= t < L) is predicted at
position t - 1 and scored against the CLEAN row:

  t < s          row[t] (= inputs[t])  weight 1: the ordinary AR loss;
  s <= t < s+n   y*_t                  weight w = consistency_weight: the
                                       consistency loss (y* given the noisy
                                       block tokens before t; t = s sees
                                       the clean prefix only);
  later, PAD     none.

loss = sum_t weight_t x CE_t / sum_t weight_t. CLLM's consistency loss
maps a state to the fixed point (its "global" form, with the target given
by the trajectory's end rather than by the model's own prediction on the
fixed point, which under greedy are the same tokens) and keeps an AR loss on
the clean text; here both are one cross-entropy on one causal pass. A row
with no block (targets all PAD; the validation rows) is scored as `ar_eval`
scores its inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.checks import is_number
from lm_decoding.models.config import check_attention
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training.objectives import ar
from lm_decoding.training.objectives.common import (
    check_tokens, target_log_probs, token_positions)

CONSISTENCY_WEIGHT = 1.0


def check_consistency_weight(weight) -> None:
  """Raises ValueError unless `weight` is a finite number >= 0."""
  if not is_number(weight) or not 0 <= weight < float("inf"):
    raise ValueError(f"consistency_weight={weight!r} must be a number in "
                     "[0, inf)")


def split_pairs(tokens_Bx2L: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(inputs int32[B, L], block targets int32[B, L]) of pair rows.

  Raises:
    ValueError: tokens not int[B, 2 L] with L >= 2.
  """
  check_tokens(tokens_Bx2L, min_length=4)
  width = tokens_Bx2L.shape[1]
  if width % 2:
    raise ValueError(f"jacobi_forcing rows must be [inputs | targets] of 2 L "
                     f"tokens; got {width}")
  return tokens_Bx2L[:, :width // 2], tokens_Bx2L[:, width // 2:]


def forcing_targets(inputs_BxL: jax.Array, block_BxL: jax.Array,
                    consistency_weight: float
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(targets int32[B, L-1], weights float32[B, L-1], in_block bool[B, L-1])
  of the predictions at positions 0 .. L-2 (module docstring): target t + 1
  is the block's y* where the block targets hold a token, else the input's
  token before the block start s (the first non-PAD block target; L when
  none), else PAD with weight 0."""
  length = inputs_BxL.shape[1]
  has_block_BxL = block_BxL != PAD_ID
  start_B = jnp.where(has_block_BxL.any(1), jnp.argmax(has_block_BxL, 1),
                      length)
  index_T = jnp.arange(1, length)
  in_block = has_block_BxL[:, 1:]
  before = ((index_T[None] < start_B[:, None])
            & (inputs_BxL[:, 1:] != PAD_ID))
  targets = jnp.where(in_block, block_BxL[:, 1:],
                      jnp.where(before, inputs_BxL[:, 1:], PAD_ID))
  weights = jnp.where(in_block, jnp.float32(consistency_weight),
                      before.astype(jnp.float32))
  return targets.astype(jnp.int32), weights, in_block


def jacobi_forcing_loss(logits_fn, params, tokens_Bx2L: jax.Array,
                        key: jax.Array, *,
                        consistency_weight: float = CONSISTENCY_WEIGHT):
  """The Jacobi Forcing loss of pair rows (module docstring); `key` unused.

  Args:
    logits_fn: the model (decoder boundary); causal attention.
    params: model parameters.
    tokens_Bx2L: int32[B, 2 L] rows [inputs | block targets].
    key: unused (no noise: the states are data).
    consistency_weight: w >= 0, the block positions' weight.
  Returns:
    (loss float32[] = weighted nats per weighted token, metrics): 'nll' the
    weighted sum, 'tokens' the sum of weights, 'loss'; 'ce' the mean
    cross-entropy of the block positions (nats), 'ar_ce' of the positions
    before the block.
  Raises:
    ValueError: rows not int[B, 2 L] (L >= 2), a non-causal model, or a
      weight outside [0, inf).
  """
  del key
  inputs_BxL, block_BxL = split_pairs(tokens_Bx2L)
  check_attention(logits_fn, causal=True, user="jacobi_forcing_loss")
  check_consistency_weight(consistency_weight)
  targets, weights, in_block = forcing_targets(inputs_BxL, block_BxL,
                                               consistency_weight)
  logits = logits_fn(params, inputs_BxL[:, :-1],
                     token_positions(inputs_BxL[:, :-1])).logits
  nll = -target_log_probs(logits, targets)
  total, count = (weights * nll).sum(), weights.sum()
  before = (weights > 0) & ~in_block
  loss = total / jnp.maximum(count, 1e-9)
  return loss, {
      "loss": loss, "nll": total, "tokens": count,
      "ce": jnp.where(in_block, nll, 0.0).sum() / jnp.maximum(
          in_block.sum(), 1),
      "ar_ce": jnp.where(before, nll, 0.0).sum() / jnp.maximum(
          before.sum(), 1)}


def jacobi_forcing_bound(logits_fn, params, tokens_Bx2L: jax.Array,
                         num_timesteps: int, **training_only):
  """The validation measure: `ar_eval` of the inputs half (the validation
  rows are the corpus's [row | PAD], so this is the AR perplexity `ar`'s
  validation reports). Returns its metrics ('nll', 'tokens')."""
  del num_timesteps, training_only  # consistency_weight: a training option
  inputs_BxL, _ = split_pairs(tokens_Bx2L)
  return ar.ar_eval(logits_fn, params, inputs_BxL)[1]
