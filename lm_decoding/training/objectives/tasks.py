"""Objectives of the exact-answer tasks: the answer scored, the prompt given.

Rows are `data.tasks.layout` rows [prompt (P) | answer (T)], no PAD. Each
objective is its LM counterpart in `objectives` conditioned on the prompt:
the prompt is never masked and never scored, so the loss is the answer's
NLL (AR) or its NELBO (MDLM, BD3-LM) given the prompt, per answer token.

  task_ar_loss     teacher forcing, causal: the answer left to right.
  task_mdlm_loss   MDLM (Sahoo et al. 2024) over the answer's T tokens, the
                   prompt visible (bidirectional attention).
  task_bd3lm_loss  BD3-LM (Arriola et al. 2025) with blocks of W from
                   position 0; W must divide P, so that the answer's blocks
                   start at P, where `decoding.bd3lm` starts them.

Same signature and `(loss, metrics)` return as `objectives`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models.config import check_attention
from lm_decoding.models.diffusion import EPS
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training.objectives.ar import next_token_nll
from lm_decoding.training.objectives.bd3lm import (
    bd3lm_logits, bd3lm_noise, check_block_length)
from lm_decoding.training.objectives.common import (
    check_tokens, mdlm_nelbo_terms, sample_times, summarise)
from lm_decoding.training.objectives.mdlm import mdlm_nelbo, noise_kept


def _answer(tokens_BxL: jax.Array, prompt_length: int) -> jax.Array:
  """bool[B, L]: the answer positions (index >= prompt_length)."""
  check_tokens(tokens_BxL, min_length=2)
  if not 1 <= prompt_length < tokens_BxL.shape[1]:
    raise ValueError(f"prompt_length={prompt_length} must be in [1, "
                     f"{tokens_BxL.shape[1] - 1}] (L={tokens_BxL.shape[1]})")
  return jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1]) >= prompt_length,
                          tokens_BxL.shape)


def task_ar_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                 *, prompt_length: int):
  """Causal next-token NLL of the answer tokens; `key` unused.

  Args:
    logits_fn, params: a causal model.
    tokens_BxL: int32[B, L] rows [prompt | answer].
    key: unused (no noise).
    prompt_length: P, in [1, L - 1] (static).
  Returns:
    (nats per answer token, metrics) as in `objectives`.
  Raises:
    ValueError: tokens not int[B, L], P out of range, a non-causal model.
  """
  del key
  answer_BxL = _answer(tokens_BxL, prompt_length)
  check_attention(logits_fn, causal=True, user="task_ar_loss")
  targets = jnp.where(answer_BxL, tokens_BxL, PAD_ID)[:, 1:]
  return next_token_nll(logits_fn, params, tokens_BxL[:, :-1], targets)


def task_mdlm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                   *, prompt_length: int, mask_id: int = MASK_ID,
                   eps: float = EPS):
  """MDLM NELBO of the answer given the prompt, per answer token.

  Args:
    logits_fn, params: a bidirectional denoiser.
    tokens_BxL: int32[B, L] rows [prompt | answer].
    key: PRNG key (antithetic times, masks).
    prompt_length: P, in [1, L - 1] (static).
    mask_id, eps: as `objectives.mdlm_loss`.
  Returns:
    (nats per answer token, metrics).
  Raises:
    ValueError: as `task_ar_loss`, but for a causal model.
  """
  answer_BxL = _answer(tokens_BxL, prompt_length)
  check_attention(logits_fn, causal=False, user="task_mdlm_loss")
  key_t, key_mask = jax.random.split(key)
  t_B = sample_times(key_t, tokens_BxL.shape[0], t_min=eps)
  x_t_BxL = noise_kept(key_mask, tokens_BxL, t_B, answer_BxL, mask_id, eps)
  nll = mdlm_nelbo(logits_fn, params, tokens_BxL, x_t_BxL, t_B, mask_id, eps)
  return summarise(nll, answer_BxL.sum())


def task_bd3lm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                    *, prompt_length: int, block_length: int,
                    mask_id: int = MASK_ID, eps: float = EPS):
  """BD3-LM NELBO of the answer blocks given the prompt, per answer token.

  Args:
    logits_fn, params: a denoiser (the block masks are passed).
    tokens_BxL: int32[B, L] rows [prompt | answer].
    key: PRNG key (one time per block, masks).
    prompt_length: P, a multiple of block_length (static).
    block_length: W, dividing L (static).
    mask_id, eps: as `objectives.bd3lm_loss`.
  Returns:
    (nats per answer token, metrics).
  Raises:
    ValueError: as `task_mdlm_loss`, W not dividing L, or P not a multiple
      of W.
  """
  answer_BxL = _answer(tokens_BxL, prompt_length)
  check_block_length(block_length, tokens_BxL.shape[1])
  if prompt_length % block_length:
    raise ValueError(f"block_length={block_length} must divide "
                     f"prompt_length={prompt_length} (answer blocks start "
                     "at P)")
  check_attention(logits_fn, causal=False, user="task_bd3lm_loss")
  t_BxL, x_t_BxL = bd3lm_noise(key, tokens_BxL, block_length,
                               mask_id=mask_id, eps=eps)
  x_t_BxL = jnp.where(answer_BxL, x_t_BxL, tokens_BxL)
  logits = bd3lm_logits(logits_fn, params, tokens_BxL, x_t_BxL, block_length)
  nll = mdlm_nelbo_terms(logits, tokens_BxL, x_t_BxL, t_BxL, mask_id,
                         eps).sum()
  return summarise(nll, answer_BxL.sum())


TASK_LOSSES = {"ar": task_ar_loss, "mdlm": task_mdlm_loss,
               "bd3lm": task_bd3lm_loss}
