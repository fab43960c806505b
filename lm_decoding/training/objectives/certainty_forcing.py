"""Certainty-forcing self-distillation of a block-diffusion model (dParallel):
the loss. The data set (the teacher's continuations) is
`training/self_distillation.py`'s.

dParallel (Chen et al. 2025, arXiv:2509.26488) fine-tunes a masked-diffusion
LM on its own (or its teacher's) continuations so that it commits several
tokens per forward pass at a confidence threshold of about 0.5. Two parts:

Data (`self_distillation.teacher_continuations`,
`self_distillation.write_distillation_set`): R prefixes of P
training tokens, each continued for T tokens by a registered decoder on the
teacher (the AR parent with the cached `ar` decoder is the cheapest; greedy
and sampled); rows [prefix (P) | continuation (T)], PAD after an EOS, saved
as `tokens.npy` int32[R, P + T] beside `manifest.json` (teacher, decoder,
prefixes, counts, seconds, command).

Loss (`certainty_forcing_loss`): semi-autoregressive masking mapped onto the
BD3-LM training layout (`bd3lm.bd3lm_logits`, one pass over
[x_t ; x_0]): every block of the continuation is "the current block" at
once, each of its tokens masked with probability `mask_rate` (0.5, the
reference's fixed ratio); the blocks before it are its clean copy, and the
blocks after it are hidden by the block-causal mask (dParallel masks them
fully; a block decoder never sees them either). The prefix is never masked
nor scored. The complementary row (Fast-dLLM v2's complementary masks, also
in the reference) masks exactly the continuation tokens the first row keeps,
so every token is scored once per pair. On the masked positions M, with
SUBS log-probabilities (MASK excluded):

  loss = mean_{i in M} -log p(x_i)
         + weight * mean_{i in C} H(softmax(logits_i / temperature)),

C = {i in M : argmax logits_i = x_i} (the positions the model already gets
right; the entropy is pushed down only there), weight 2.0 and temperature
0.5 (`CERTAINTY_WEIGHT`, `CERTAINTY_TEMPERATURE`). The student is then
decoded by `bd3lm` with remasking='threshold' at tau = 0.5.

With a `teacher` (a causal LM's `next_token_log_probs`, e.g. the AR parent's),
each block's first masked position before the row's end where the student
sees exactly the teacher's context, every earlier token and nothing after
(no later token of the block shown; `block_anchors`), is scored against
the teacher's whole next-token distribution instead of the row's token:
-sum_v p_teacher(v) log p(v). There the teacher's conditional is the
exact target, not one draw of it (the logit distillation of Hinton et al.
2015 at the positions where it is exact); those positions are left out of
C, whose entropy the term would push down. With mask_order 'left_to_right'
each block with a masked position before the row's end has one; with
'random' they are mostly a token-shifted model's masked block starts
(predicted from the clean pass).

With `teacher_target='causal_view'` the teacher is the target of the
student's causal view instead (block size 1, the same weights with causal
attention: `binding.causal_logits_fn`), at every token of the continuation
up to the row's EOS: the loss above gains

  mean_{i in continuation} -sum_v p_teacher(v | x_<i) log p_view(v | x_<i),

the logit distillation that holds the block-size-1 view, which
self-speculation verifies with (`decoding.self_speculative`) and which
decides each block's first committed token, at the teacher while the
masked positions learn to commit several tokens. The anchors then keep
the row's token.

With `teacher_target='masked'` the teacher's distribution given the row's
earlier tokens is the target at every masked position of the continuation
before the row's end, not at the anchors only. Away from the anchors it is
not the student's exact target (the student does not see the masked tokens
before it, the teacher does), but it carries the teacher's whole
distribution where the row gives one token of it (on temperature-1 rows its
mean over those hidden tokens is the exact target: a Rao-Blackwellised one-
draw target). Those positions stay in C: the certainty term is what makes
several tokens commit.

With `consistency_weight` > 0 (mask_order 'left_to_right' only) the student
is also held at itself along the trajectory (CDLM's consistency term, Kim et
al. 2025, arXiv:2511.19269): each block draws a later cut k' uniform in
[k + 1, W] (`later_states`), the student's distribution at that later state
(more of the block revealed; a constant of the gradient) is the target of
its distribution at the drawn state, at the positions still masked in both:

  + consistency_weight * mean_{i masked at k'} -sum_v p_later(v) log p(v),

so what it predicts for a position does not depend on whether the tokens
before it in the block are committed yet, which is what committing them in
one step assumes. One more pass a step, without a gradient.

`answer_certainty_forcing_loss` is the same loss for a model decoded in
one block (an exact-answer task's MDLM, `training.task_distillation`): the
answer masked at a rate drawn per row, no later blocks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lm_decoding.checks import is_count, is_number
from lm_decoding.models import masks
from lm_decoding.models.binding import causal_logits_fn
from lm_decoding.models.config import check_attention
from lm_decoding.models.diffusion import subs_log_probs
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID
from lm_decoding.models.config import token_shift as shifted
from lm_decoding.training.objectives.bd3lm import (
    bd3lm_logits, check_block_length)
from lm_decoding.training.objectives.common import (
    check_tokens, denoiser_logits, maskable, token_positions)
from lm_decoding.training.objectives.jacobi_forcing import (
    check_consistency_weight)

CERTAINTY_WEIGHT = 2.0  # beta of the entropy term (the recipe)
CERTAINTY_TEMPERATURE = 0.5  # the entropy is of softmax(logits / 0.5)
MASK_RATE = 0.5  # dParallel's fixed masking ratio of the current block


MASK_ORDERS = ("random", "left_to_right")
# Where a `teacher`'s distribution is the target (module docstring).
TEACHER_TARGETS = ("anchors", "causal_view", "masked")


def semi_ar_masks(key: jax.Array, x0_BxL: jax.Array, prompt_length: int,
                  token_shift: bool, mask_rate: float = MASK_RATE,
                  complementary: bool = True, order: str = "random",
                  block_length: int | None = None) -> jax.Array:
  """bool[C B, L]: the positions masked in each training row (C = 2 with
  `complementary`, the second B rows masking exactly the continuation tokens
  the first B keep; else C = 1).

  A position may be masked only if it is in the continuation (index >=
  `prompt_length`), not PAD, and not token 0 under a token shift
  (`common.maskable`). With order 'random' (dParallel's) each such position
  is masked independently with probability `mask_rate`. With order
  'left_to_right' each block of `block_length` (from index 0) of each row
  draws a cut k uniform over its maskable offsets ([0, W - 1], or from the
  prefix's end in the block the prefix ends inside) and masks its positions
  from k on:
  the states a decoder committing left to right passes through (d3LLM's
  pseudo-trajectory distillation, Qian et al. 2026, arXiv:2601.07568, with
  the AR parent's order as the trajectory); `mask_rate` is unused, and
  there is no complementary row (it would mask block prefixes, a state no
  such decoder is in). Blocks are not drawn here: in the BD3-LM layout every
  block is a current block (module docstring).

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] rows [prefix | continuation].
    prompt_length: P, the prefix never masked, in [0, L - 1].
    token_shift: whether the model predicts token i at position i - 1.
    mask_rate: probability in (0, 1) that a maskable token is masked.
    complementary: add the complementary rows (order 'random' only).
    order: one of `MASK_ORDERS`.
    block_length: W, dividing L (order 'left_to_right' only).
  Returns:
    bool[2B, L] (or [B, L]) masks.
  Raises:
    ValueError: an unknown order, or 'left_to_right' with complementary
      rows or without a block length dividing L.
  """
  batch, length = x0_BxL.shape
  keep_BxL = (maskable(x0_BxL, token_shift)
              & (jnp.arange(length) >= prompt_length)[None, :])
  check_mask_order(order, complementary)
  if order == "left_to_right":
    check_block_length(block_length, length)
    # A block that the prefix ends inside draws its cut over its
    # continuation offsets only, so each of its states is as likely.
    start_N = jnp.arange(0, length, block_length)
    lowest_N = jnp.clip(prompt_length - start_N, 0, block_length - 1)
    cut_BxN = jax.random.randint(key, (batch, length // block_length),
                                 lowest_N[None, :], block_length)
    offset_L = jnp.arange(length) % block_length
    return keep_BxL & (offset_L[None, :]
                       >= jnp.repeat(cut_BxN, block_length, axis=1))
  u_BxL = jax.random.uniform(key, x0_BxL.shape, jnp.float32)
  masked_BxL = keep_BxL & (u_BxL < mask_rate)
  if not complementary:
    return masked_BxL
  return jnp.concatenate([masked_BxL, keep_BxL & ~masked_BxL])


def later_states(key: jax.Array, masked_BxL: jax.Array,
                 block_length: int) -> jax.Array:
  """bool[B, L]: a later state of each row's left-to-right trajectory.

  In each block of `block_length` of `masked_BxL` (a 'left_to_right' mask of
  `semi_ar_masks`: each block masked from its cut k on, k its first masked
  offset, W if none), a cut k' uniform in [k + 1, W] keeps the positions
  masked from k' on; a block with no masked position stays so.

  Args:
    key: PRNG key.
    masked_BxL: bool[B, L] the drawn states.
    block_length: W, dividing L.
  Returns:
    bool[B, L], a subset of masked_BxL.
  """
  batch, length = masked_BxL.shape
  offset_L = jnp.arange(length) % block_length
  blocks_BxNxW = jnp.where(masked_BxL, offset_L, block_length).reshape(
      batch, length // block_length, block_length)
  cut_BxN = blocks_BxNxW.min(-1)
  later_BxN = jax.random.randint(key, cut_BxN.shape, cut_BxN + 1,
                                 block_length + 1)
  return masked_BxL & (offset_L[None, :]
                       >= jnp.repeat(later_BxN, block_length, axis=1))


def consistency_cross_entropy(logits_BxLxV: jax.Array, x_t_BxL: jax.Array,
                              later_logits_BxLxV: jax.Array,
                              later_BxL: jax.Array,
                              mask_id: int = MASK_ID) -> jax.Array:
  """float32[]: the mean over the positions of `later_BxL` (masked in both
  states) of -sum_v p_later(v) log p(v), SUBS log-probabilities of the
  student at the drawn state x_t (`logits_BxLxV`) and at the later state
  (`later_logits_BxLxV`, a constant of the gradient); 0 with no such
  position (module docstring)."""
  log_p = subs_log_probs(logits_BxLxV, x_t_BxL, mask_id)
  x_later_BxL = jnp.where(later_BxL, mask_id, x_t_BxL)
  target = jax.lax.stop_gradient(
      subs_log_probs(later_logits_BxLxV, x_later_BxL, mask_id))
  soft_BxL = _soft_cross_entropy(target, log_p)
  return (jnp.where(later_BxL, soft_BxL, 0.0).sum()
          / jnp.maximum(later_BxL.sum(), 1))


def check_mask_order(order, complementary: bool) -> None:
  """Raises ValueError for an `order` not in `MASK_ORDERS`, or order
  'left_to_right' with `complementary` rows (`semi_ar_masks`); a caller may
  check them before anything is traced."""
  if order not in MASK_ORDERS:
    raise ValueError(f"mask_order={order!r} must be one of {MASK_ORDERS}")
  if order == "left_to_right" and complementary:
    raise ValueError("mask_order='left_to_right' takes no complementary "
                     "rows (train.complementary_masks=False): they would "
                     "mask block prefixes")


def check_teacher_target(target, view_weight, teacher: bool,
                         token_shift: bool) -> None:
  """Raises ValueError for a `target` not in `TEACHER_TARGETS`, a
  `view_weight` outside [0, inf) or other than its default 1.0 under a
  target without the 'causal_view' term it weighs (it would be ignored),
  or 'causal_view' without a `teacher` or for a student without a
  `token_shift` (its logits at i predict token i: its block-size-1 view is
  no next-token model, as `decoding.self_speculative` requires); a caller
  may check them before anything is traced."""
  if target not in TEACHER_TARGETS:
    raise ValueError(f"teacher_target={target!r} must be one of "
                     f"{TEACHER_TARGETS}")
  if not (is_number(view_weight) and 0 <= view_weight < math.inf):
    raise ValueError(f"view_weight={view_weight!r} must be a number in "
                     "[0, inf)")
  if target != "causal_view" and view_weight != 1.0:
    raise ValueError(f"view_weight={view_weight!r} weighs the "
                     "'causal_view' term; teacher_target="
                     f"{target!r} has none (leave it at 1.0)")
  if target != "anchors" and not teacher:
    raise ValueError(f"teacher_target={target!r} needs a teacher (a causal "
                     "member of the pretrained set)")
  if target == "causal_view" and not token_shift:
    raise ValueError("teacher_target='causal_view' needs a student with a "
                     "token shift (logits at i predicting token i + 1: "
                     "model.token_shift=True)")


def block_anchors(masked_BxL: jax.Array, x0_BxL: jax.Array,
                  block_length: int, prompt_length: int, *,
                  token_shift: bool = False,
                  eos_id: int = EOS_ID) -> jax.Array:
  """bool[B, L]: the positions where the student's context on the BD3-LM
  layout (`bd3lm.bd3lm_logits`) is exactly a causal teacher's, every earlier
  token of the row and nothing after (the positions a `teacher` scores,
  module docstring).

  Position i is one when it is its block's first masked position, no later
  position of the block shows a token (each is masked or PAD, whose key is
  hidden), i >= 1 (index 0 has no context for a teacher to condition on),
  and the row has not ended before it (an `eos_id` at an index in
  [prompt_length, i)): what follows an EOS is fill, of which a teacher's
  next-token distribution says nothing. The noisy block is seen whole by
  each of its positions, so a later unmasked token of the block would be
  context the teacher lacks; with `token_shift` a block's first position is
  predicted from the clean pass at the position before it, which sees the
  earlier blocks only, so a masked block start qualifies whatever the rest
  of its block shows. With mask_order 'left_to_right' (a masked suffix per
  block) every block's first masked position qualifies; with 'random' few
  but the masked block starts of a token-shifted model do (a block of W
  has (W - 1) 2^-W others on average at mask rate 0.5).

  Args:
    masked_BxL: bool[B, L] masks (`semi_ar_masks`).
    x0_BxL: int32[B, L] the clean rows (PAD after their end).
    block_length: W, dividing L.
    prompt_length: P; an EOS before P does not end the row.
    token_shift: whether the student predicts token i at position i - 1.
    eos_id: the EOS id.
  Raises:
    ValueError: masks and rows of different shapes, or block_length not
      dividing L.
  """
  if masked_BxL.shape != x0_BxL.shape or masked_BxL.ndim != 2:
    raise ValueError(f"block_anchors: masked_BxL {list(masked_BxL.shape)} "
                     f"and x0_BxL {list(x0_BxL.shape)} must be one [B, L]")
  batch, length = masked_BxL.shape
  check_block_length(block_length, length)
  blocks = (batch, length // block_length, block_length)
  by_block = masked_BxL.reshape(blocks)
  first = by_block & (jnp.cumsum(by_block, -1) == 1)
  shown = (~masked_BxL & (x0_BxL != PAD_ID)).reshape(blocks)
  shown_after = jnp.cumsum(shown[..., ::-1], -1)[..., ::-1] - shown > 0
  unseen_after = ~shown_after
  if token_shift:
    unseen_after |= (jnp.arange(block_length) == 0)
  return ((first & unseen_after).reshape(batch, length)
          & _teacher_scorable(x0_BxL, prompt_length, eos_id))


def _teacher_scorable(x0_BxL: jax.Array, prompt_length: int,
                      eos_id: int) -> jax.Array:
  """bool[B, L]: the positions a teacher's next-token distribution can be the
  target of: index >= 1 (index 0 has no context) and not after the row's
  end (`_ended`)."""
  return (~_ended(x0_BxL, prompt_length, eos_id)
          & (jnp.arange(x0_BxL.shape[1]) >= 1)[None])


def _ended(x0_BxL: jax.Array, prompt_length: int, eos_id: int) -> jax.Array:
  """bool[B, L]: the positions after a row's first EOS at an index >=
  prompt_length (fill, of which a teacher says nothing)."""
  eos_BxL = ((x0_BxL == eos_id)
             & (jnp.arange(x0_BxL.shape[1]) >= prompt_length)[None])
  return (jnp.cumsum(eos_BxL, 1) - eos_BxL) > 0


def next_token_log_probs(logits_fn, params, tokens_BxL: jax.Array,
                         mask_id: int = MASK_ID) -> jax.Array:
  """float32[B, L, V]: a causal LM's log p(token i | tokens < i) at index i,
  MASK given probability 0 (`subs_log_probs`'s finite log 0); index 0, which has no
  context, is uniform. One causal pass over the rows; the `teacher` of
  `certainty_forcing_loss` is this with the teacher's logits_fn and params
  bound (`functools.partial`).

  Raises:
    ValueError: a non-causal model, or rows longer than its max_len (a
      learned position table has no row past it: NaN under jit).
  """
  check_attention(logits_fn, causal=True, user="next_token_log_probs")
  max_len = getattr(logits_fn, "max_len", None)
  if max_len is not None and tokens_BxL.shape[1] > max_len:
    raise ValueError(f"next_token_log_probs: rows of length "
                     f"{tokens_BxL.shape[1]} exceed the teacher's "
                     f"max_len={max_len}")
  logits = logits_fn(params, tokens_BxL, token_positions(tokens_BxL)).logits
  # SUBS of an all-MASK input: the softmax over V less MASK, whose
  # log-probability is a finite "minus infinity" (0 once exponentiated).
  masks_BxL = jnp.full(tokens_BxL.shape, mask_id)
  log_probs = subs_log_probs(logits, masks_BxL, mask_id)
  first = subs_log_probs(jnp.zeros_like(log_probs[:, :1]), masks_BxL[:, :1],
                         mask_id)
  return jnp.concatenate([first, log_probs[:, :-1]], axis=1)


def causal_view_cross_entropy(logits_fn, params, tokens_BxL: jax.Array,
                              teacher_log_probs_BxLxV: jax.Array,
                              prompt_length: int, mask_id: int = MASK_ID,
                              eos_id: int = EOS_ID) -> jax.Array:
  """float32[]: the mean over the continuation's tokens (index >=
  max(prompt_length, 1), not PAD, up to the row's first EOS there) of
  -sum_v p_teacher(v) log p_view(v), p_view the student's causal view
  (`binding.causal_logits_fn`: block size 1, the same parameters) of
  `next_token_log_probs`; 0 with no such token.

  Args:
    logits_fn, params: the student (a block-diffusion model; with a token
      shift its causal view is an AR model).
    tokens_BxL: int32[B, L] the rows.
    teacher_log_probs_BxLxV: float32[B, L, V] the teacher's
      `next_token_log_probs` of the same rows.
    prompt_length: P, the prefix left out.
    mask_id, eos_id: the MASK (probability 0) and EOS ids.
  Raises:
    ValueError: as `next_token_log_probs`, or teacher_log_probs_BxLxV not
      of the view's shape [B, L, V] (a teacher of another vocabulary).
  """
  log_p = next_token_log_probs(causal_logits_fn(logits_fn), params,
                               tokens_BxL, mask_id)
  if teacher_log_probs_BxLxV.shape != log_p.shape:
    raise ValueError(
        f"teacher_log_probs_BxLxV {list(teacher_log_probs_BxLxV.shape)} "
        f"must have the shape of the causal view's log-probabilities "
        f"{list(log_p.shape)} (a teacher of another vocabulary or rows?)")
  scored_BxL = ((jnp.arange(tokens_BxL.shape[1]) >= prompt_length)
                & (tokens_BxL != PAD_ID)
                & _teacher_scorable(tokens_BxL, prompt_length, eos_id))
  soft_BxL = _soft_cross_entropy(teacher_log_probs_BxLxV, log_p)
  return (jnp.where(scored_BxL, soft_BxL, 0.0).sum()
          / jnp.maximum(scored_BxL.sum(), 1))


def _check_teacher_inputs(logits_BxLxV, masked_BxL, teacher_log_probs_BxLxV,
                          anchors_BxL) -> None:
  """Raises ValueError unless the teacher's log-probabilities and anchors
  come together, shaped as the logits and the masks
  (`certainty_forcing_terms`)."""
  if (teacher_log_probs_BxLxV is None) != (anchors_BxL is None):
    raise ValueError("teacher_log_probs_BxLxV and anchors_BxL are given "
                     "together or not at all")
  if teacher_log_probs_BxLxV is not None and (
      teacher_log_probs_BxLxV.shape != logits_BxLxV.shape
      or anchors_BxL.shape != masked_BxL.shape):
    raise ValueError(
        f"teacher_log_probs_BxLxV {list(teacher_log_probs_BxLxV.shape)} "
        f"and anchors_BxL {list(anchors_BxL.shape)} must have the shapes "
        f"of the logits {list(logits_BxLxV.shape)} and masks "
        f"{list(masked_BxL.shape)} (a teacher of another vocabulary or "
        "rows?)")


def _soft_cross_entropy(teacher_log_probs_BxLxV, log_p_BxLxV) -> jax.Array:
  """float32[B, L]: -sum_v p_teacher(v) log p(v), a token the teacher gives
  probability 0 adding nothing (SUBS's log 0 is finite, not -inf)."""
  p_teacher = jnp.exp(teacher_log_probs_BxLxV)
  return -jnp.where(p_teacher > 0, p_teacher * log_p_BxLxV, 0.0).sum(-1)


def certainty_forcing_terms(logits_BxLxV: jax.Array, x0_BxL: jax.Array,
                            masked_BxL: jax.Array, *,
                            weight: float = CERTAINTY_WEIGHT,
                            temperature: float = CERTAINTY_TEMPERATURE,
                            mask_id: int = MASK_ID,
                            teacher_log_probs_BxLxV: jax.Array | None = None,
                            anchors_BxL: jax.Array | None = None,
                            anchors_in_certainty: bool = False):
  """The certainty-forcing loss on given logits (module docstring).

  Args:
    logits_BxLxV: float[B, L, V], index i predicting token i.
    x0_BxL: int32[B, L] targets.
    masked_BxL: bool[B, L] the masked (scored) positions M.
    weight, temperature: beta >= 0 of the entropy term, and > 0 the
      temperature of the softmax whose entropy it takes.
    mask_id: the MASK id, given probability 0 (SUBS).
    teacher_log_probs_BxLxV: float32[B, L, V] a teacher's log-probabilities
      of token i at index i (`next_token_log_probs`), or None.
    anchors_BxL: bool[B, L] the masked positions scored against the
      teacher instead of x0 (`block_anchors`); with the teacher only.
    anchors_in_certainty: keep the anchors in C (else they leave it).
  Returns:
    (loss float32[], metrics {'ce', 'entropy', 'correct' (the fraction of M
    in C), 'nll' (summed CE), 'tokens' (|M|)}, with a teacher 'teacher_ce'
    (its mean CE at the anchors) and 'anchors' (their count)); no masked
    position gives CE 0, no correct one an entropy term of 0.
  Raises:
    ValueError: only one of teacher_log_probs_BxLxV and anchors_BxL, or
      either of another shape than logits_BxLxV's (masked_BxL's).
  """
  _check_teacher_inputs(logits_BxLxV, masked_BxL, teacher_log_probs_BxLxV,
                        anchors_BxL)
  x_t_BxL = jnp.where(masked_BxL, mask_id, x0_BxL)
  log_p = subs_log_probs(logits_BxLxV, x_t_BxL, mask_id)
  nll_BxL = -jnp.take_along_axis(log_p, x0_BxL[..., None], -1)[..., 0]
  count = masked_BxL.sum()
  correct_BxL = masked_BxL & (jnp.argmax(log_p, -1) == x0_BxL)
  metrics = {}
  if teacher_log_probs_BxLxV is not None:
    anchors_BxL = anchors_BxL & masked_BxL
    soft_BxL = _soft_cross_entropy(teacher_log_probs_BxLxV, log_p)
    nll_BxL = jnp.where(anchors_BxL, soft_BxL, nll_BxL)
    if not anchors_in_certainty:
      correct_BxL = correct_BxL & ~anchors_BxL
    num_anchors = anchors_BxL.sum()
    metrics = {"teacher_ce": jnp.where(anchors_BxL, soft_BxL, 0.0).sum()
                             / jnp.maximum(num_anchors, 1),
               "anchors": num_anchors}
  nll = jnp.where(masked_BxL, nll_BxL, 0.0).sum()
  ce = nll / jnp.maximum(count, 1)
  log_q = subs_log_probs(logits_BxLxV / temperature, x_t_BxL, mask_id)
  entropy_BxL = -(jnp.exp(log_q) * log_q).sum(-1)
  num_correct = correct_BxL.sum()
  entropy = (jnp.where(correct_BxL, entropy_BxL, 0.0).sum()
             / jnp.maximum(num_correct, 1))
  metrics.update(ce=ce, entropy=entropy,
                 correct=num_correct / jnp.maximum(count, 1), nll=nll,
                 tokens=count)
  return ce + weight * entropy, metrics


def _check(logits_fn, tokens_BxL, prompt_length, weight, temperature,
           user: str) -> None:
  """The options both losses share; raises ValueError naming the one out
  of range (module docstring's ranges), or for a causal model."""
  check_tokens(tokens_BxL, min_length=1)
  check_prompt_length(prompt_length, tokens_BxL.shape[1])
  check_certainty_term(weight, temperature)
  check_attention(logits_fn, causal=False, user=user)


def check_prompt_length(prompt_length, length: int) -> None:
  """Raises ValueError unless `prompt_length` (P, never masked) is an
  integer in [0, length - 1]; a caller may check it before anything is
  traced."""
  if not is_count(prompt_length, minimum=0) or prompt_length >= length:
    raise ValueError(f"prompt_length={prompt_length!r} must be an integer in "
                     f"[0, {length - 1}]")


def check_certainty_term(weight, temperature) -> None:
  """Raises ValueError unless `weight` (beta of the entropy term) is a
  number in [0, inf) and `temperature` one in (0, inf), naming the one out
  of range; a caller may check them before anything is traced."""
  if not (is_number(weight) and 0 <= weight < math.inf):
    raise ValueError(f"weight={weight!r} must be a number in [0, inf)")
  if not (is_number(temperature) and 0 < temperature < math.inf):
    raise ValueError(f"temperature={temperature!r} must be a number in "
                     "(0, inf)")


def certainty_forcing_loss(logits_fn, params, tokens_BxL: jax.Array,
                           key: jax.Array, *, block_length: int,
                           prompt_length: int = 0, complementary: bool = True,
                           weight: float = CERTAINTY_WEIGHT,
                           temperature: float = CERTAINTY_TEMPERATURE,
                           mask_rate: float = MASK_RATE,
                           mask_order: str = "random", mask_id: int = MASK_ID,
                           teacher=None, teacher_target: str = "anchors",
                           view_weight: float = 1.0,
                           consistency_weight: float = 0.0):
  """dParallel's certainty-forcing loss on the BD3-LM layout.

  `semi_ar_masks` draws the masks (both rows of a complementary pair), one
  pass over [x_t ; x_0] per row gives every block's denoising logits
  (`bd3lm.bd3lm_logits`, token shift included), and
  `certainty_forcing_terms` scores them.

  Args:
    logits_fn, params: the block-diffusion model (non-causal attention).
    tokens_BxL: int32[B, L] rows [prefix | continuation], PAD-padded.
    key: PRNG key of the masks.
    block_length: W, dividing L; should divide `prompt_length` so that the
      continuation's blocks start where `decoding.bd3lm` starts them.
    prompt_length: P in [0, L - 1], never masked.
    complementary, weight, temperature, mask_rate, mask_id, mask_order: as
      `semi_ar_masks` (its `order`) and `certainty_forcing_terms`.
    teacher: None, or tokens int32[B, L] -> float32[B, L, V] a causal LM's
      log-probabilities of token i at index i (`next_token_log_probs`
      bound), a constant of the gradient.
    teacher_target, view_weight: where the teacher scores (`TEACHER_TARGETS`:
      the anchors, every masked position, or `causal_view_cross_entropy`
      times view_weight added).
    consistency_weight: >= 0, the weight of `_consistency` (the same masks;
      > 0 with mask_order 'left_to_right' only).
  Returns:
    (loss float32[], metrics) of `certainty_forcing_terms`, with 'view_ce'
    under 'causal_view' and 'consistency' at a positive consistency_weight.
  Raises:
    ValueError: tokens not int[B, L]; block_length not dividing L; P, weight,
      temperature or mask_rate outside its range; a causal model; a teacher
      not callable or not of the student's [B, L, V]; as `semi_ar_masks`,
      `check_teacher_target` and `check_consistency`.
  """
  _check(logits_fn, tokens_BxL, prompt_length, weight, temperature,
         "certainty_forcing_loss")
  _check_options(logits_fn, tokens_BxL, block_length, mask_rate, teacher,
                 teacher_target, view_weight, consistency_weight, mask_order)
  masked_CxL, x0_CxL, logits = _drawn(
      logits_fn, params, tokens_BxL, key, prompt_length, mask_rate,
      complementary, mask_order, block_length, mask_id)
  loss, metrics = _scored(
      logits_fn, params, tokens_BxL, logits, masked_CxL, x0_CxL, teacher,
      teacher_target, block_length, prompt_length, weight=weight,
      temperature=temperature, mask_id=mask_id, view_weight=view_weight)
  if consistency_weight > 0:  # weight 0: the loss of no term, bit for bit
    metrics["consistency"] = _consistency(
        logits_fn, params, key, logits, masked_CxL, x0_CxL, block_length,
        mask_id)
    loss = loss + consistency_weight * metrics["consistency"]
  return loss, metrics


def _drawn(logits_fn, params, tokens_BxL, key, prompt_length, mask_rate,
           complementary, order, block_length, mask_id):
  """(masked bool[C, L], x0 int32[C, L], logits float32[C, L, V]): the masks
  `semi_ar_masks` draws with `key` (C = 2 B with complementary rows, else
  B), the rows they mask, and the student's `bd3lm.bd3lm_logits` there."""
  masked_CxL = semi_ar_masks(key, tokens_BxL, prompt_length,
                             shifted(logits_fn), mask_rate, complementary,
                             order, block_length)
  x0_CxL = jnp.tile(tokens_BxL,
                    (masked_CxL.shape[0] // tokens_BxL.shape[0], 1))
  logits = bd3lm_logits(logits_fn, params, x0_CxL,
                        jnp.where(masked_CxL, mask_id, x0_CxL), block_length)
  return masked_CxL, x0_CxL, logits


def _consistency(logits_fn, params, key, logits_CxLxV, masked_CxL, x0_CxL,
                 block_length, mask_id) -> jax.Array:
  """float32[]: `consistency_cross_entropy` of the student's `logits_CxLxV`
  at the drawn states (masked_CxL of x0_CxL) against its own logits, without
  a gradient, at `later_states` drawn with fold_in(key, 1) (one more
  `bd3lm.bd3lm_logits` pass)."""
  later_CxL = later_states(jax.random.fold_in(key, 1), masked_CxL,
                           block_length)
  later_logits = jax.lax.stop_gradient(bd3lm_logits(
      logits_fn, params, x0_CxL, jnp.where(later_CxL, mask_id, x0_CxL),
      block_length))
  return consistency_cross_entropy(
      logits_CxLxV, jnp.where(masked_CxL, mask_id, x0_CxL), later_logits,
      later_CxL, mask_id)


def check_consistency(weight, mask_order) -> None:
  """Raises ValueError unless the consistency term's `weight` is a finite
  number >= 0, and 0 unless `mask_order` is 'left_to_right' (the later
  states are those of a left-to-right trajectory)."""
  check_consistency_weight(weight)
  if weight > 0 and mask_order != "left_to_right":
    raise ValueError(f"consistency_weight={weight!r} needs mask_order "
                     f"'left_to_right' (later states of a trajectory); got "
                     f"{mask_order!r}")


def _scored(logits_fn, params, tokens_BxL, logits, masked_CxL, x0_CxL,
            teacher, teacher_target, block_length, prompt_length, *, weight,
            temperature, mask_id, view_weight):
  """`certainty_forcing_loss`'s (loss, metrics): `certainty_forcing_terms`
  of the C = masked_CxL rows (copies of tokens_BxL), with the teacher's
  log-probabilities (a constant of the gradient) at `_teacher_positions`
  under teacher_target 'anchors' or 'masked', or the causal view's term
  times view_weight added under 'causal_view'."""
  copies = masked_CxL.shape[0] // tokens_BxL.shape[0]
  log_probs = None if teacher is None else _teacher_log_probs(
      teacher, tokens_BxL)
  at_masks = log_probs is not None and teacher_target != "causal_view"
  distillation = {} if not at_masks else {
      "teacher_log_probs_BxLxV": jnp.tile(log_probs, (copies, 1, 1)),
      "anchors_BxL": _teacher_positions(masked_CxL, x0_CxL, teacher_target,
                                        block_length, prompt_length,
                                        shifted(logits_fn)),
      "anchors_in_certainty": teacher_target == "masked"}
  loss, metrics = certainty_forcing_terms(
      logits, x0_CxL, masked_CxL, weight=weight, temperature=temperature,
      mask_id=mask_id, **distillation)
  if log_probs is not None and teacher_target == "causal_view":
    metrics["view_ce"] = causal_view_cross_entropy(
        logits_fn, params, tokens_BxL, log_probs, prompt_length, mask_id)
    loss = loss + view_weight * metrics["view_ce"]
  return loss, metrics


def _teacher_positions(masked_CxL, x0_CxL, teacher_target, block_length,
                       prompt_length, token_shift) -> jax.Array:
  """bool[C, L]: where the teacher is the target, `block_anchors` under
  'anchors' or, under 'masked', every masked position at index >= 1 before
  the row's end (module docstring)."""
  if teacher_target == "anchors":
    return block_anchors(masked_CxL, x0_CxL, block_length, prompt_length,
                         token_shift=token_shift)
  return masked_CxL & _teacher_scorable(x0_CxL, prompt_length, EOS_ID)


def _check_options(logits_fn, tokens_BxL, block_length, mask_rate, teacher,
                   teacher_target, view_weight, consistency_weight,
                   mask_order) -> None:
  """Raises ValueError for `certainty_forcing_loss`'s block_length not
  dividing L, mask_rate outside (0, 1), teacher options
  `check_teacher_target` refuses, or a consistency_weight
  `check_consistency` refuses."""
  check_consistency(consistency_weight, mask_order)
  check_block_length(block_length, tokens_BxL.shape[1])
  if not (is_number(mask_rate) and 0 < mask_rate < 1):
    raise ValueError(f"mask_rate={mask_rate!r} must be a number in (0, 1)")
  check_teacher_target(teacher_target, view_weight, teacher is not None,
                       shifted(logits_fn))


def _teacher_log_probs(teacher, tokens_BxL) -> jax.Array:
  """float32[B, L, V]: the teacher's log-probabilities of the rows, a
  constant of the gradient.

  Raises:
    ValueError: a teacher that is not callable.
  """
  if not callable(teacher):
    raise ValueError(f"teacher must be None or a function of the tokens "
                     f"(`next_token_log_probs` bound); got a "
                     f"{type(teacher).__name__}")
  return jax.lax.stop_gradient(teacher(tokens_BxL))


def answer_certainty_forcing_loss(logits_fn, params, tokens_BxL: jax.Array,
                                  key: jax.Array, *, prompt_length: int,
                                  complementary: bool = True,
                                  weight: float = CERTAINTY_WEIGHT,
                                  temperature: float = CERTAINTY_TEMPERATURE,
                                  mask_id: int = MASK_ID):
  """Certainty forcing of a one-block masked-diffusion model (an exact-answer
  task's MDLM): the answer is the one block.

  Each row draws a masking rate t ~ U(0, 1) and masks each answer token
  (index >= `prompt_length`) with probability t, so that training sees
  every state a decoder of the block passes through (dParallel's fixed 0.5
  fits a current block among later, fully masked ones; here there are
  none); the complementary row masks exactly the answer tokens the first
  keeps. One bidirectional pass over x_t (PAD keys hidden), scored by
  `certainty_forcing_terms`. The prompt is never masked nor scored.

  Args:
    logits_fn, params: the denoiser (non-causal, no token shift).
    tokens_BxL: int32[B, L] rows [prompt | answer] (e.g. a teacher's
      answers, `training.task_distillation.teacher_rows`).
    key: PRNG key of the rates and masks.
    prompt_length: P in [0, L - 1].
    complementary, weight, temperature, mask_id: as
      `certainty_forcing_loss`.
  Returns:
    (loss float32[], metrics) of `certainty_forcing_terms`.
  Raises:
    ValueError: tokens not int[B, L]; prompt_length, weight or temperature
      outside its range; a causal or token-shifted model.
  """
  _check(logits_fn, tokens_BxL, prompt_length, weight, temperature,
         "answer_certainty_forcing_loss")
  if shifted(logits_fn):
    raise ValueError("answer_certainty_forcing_loss: a token-shifted model; "
                     "use certainty_forcing_loss (the BD3-LM layout)")
  batch, length = tokens_BxL.shape
  key_t, key_u = jax.random.split(key)
  answer_BxL = jnp.broadcast_to(jnp.arange(length) >= prompt_length,
                                tokens_BxL.shape) & (tokens_BxL != PAD_ID)
  t_B = jax.random.uniform(key_t, (batch,), jnp.float32)
  u_BxL = jax.random.uniform(key_u, tokens_BxL.shape, jnp.float32)
  masked_CxL = answer_BxL & (u_BxL < t_B[:, None])
  x0_CxL = tokens_BxL
  if complementary:
    masked_CxL = jnp.concatenate([masked_CxL, answer_BxL & ~masked_CxL])
    x0_CxL = jnp.concatenate([tokens_BxL, tokens_BxL])
  x_t_CxL = jnp.where(masked_CxL, mask_id, x0_CxL)
  attention = masks.key_padding_mask(x0_CxL != PAD_ID, length)
  logits = denoiser_logits(logits_fn, params, x_t_CxL, attention, None)
  return certainty_forcing_terms(logits, x0_CxL, masked_CxL, weight=weight,
                                 temperature=temperature, mask_id=mask_id)
