"""Translation objectives on one backbone: prefix-LM AR, CMLM, CTC.

Every objective reads rows laid out by `parallel_text.layout`,
[source, BOS, target, EOS, PAD ...], and has the signature and the
`(loss, metrics)` return of `objectives` (metrics 'nll', 'tokens', 'loss'
on target tokens, plus the objective's own):

  translation_ar_loss  teacher forcing under the prefix-LM mask (source
                       bidirectional, target causal; Raffel et al. 2020).
  cmlm_loss            conditional masked LM (Ghazvininejad et al. 2019):
                       n ~ U{1..T} target tokens masked, cross-entropy on
                       them, plus the length head's cross-entropy.
  ctc_loss             CTC non-autoregressive translation (Libovicky &
                       Helcl 2018): the source upsampled into frames,
                       `optax.ctc_loss` with blank `parallel_text.BLANK_ID`.

CMLM and CTC attend with `masks.source_target_mask` (the source sees only
itself), so the source's hidden states, and the length prediction, do not
depend on the target.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lm_decoding.data import parallel_text
from lm_decoding.models import ctc_frames, masks
from lm_decoding.models.config import check_attention
from lm_decoding.models.selection import top_n
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training.objectives.common import (
    check_tokens, gather, summarise, token_positions)


def translation_ar_eval(logits_fn, params, tokens_BxL: jax.Array):
  """Target cross-entropy of a prefix LM with teacher forcing; deterministic.

  Predicts tokens[:, 1:] from tokens[:, :-1] under `masks.prefix_lm_mask`
  (prefix = source + BOS); scored targets are the target tokens and EOS.

  Args:
    logits_fn: the model; causal default attention (so the AR decoders'
      steps after the prompt are causal).
    params: its parameters.
    tokens_BxL: int32[B, L] `parallel_text.layout` rows.
  Returns:
    (loss, metrics) as in `objectives`.
  Raises:
    ValueError: tokens not int[B, L] with L >= 3, or a non-causal model.
  """
  check_tokens(tokens_BxL, min_length=3)
  check_attention(logits_fn, causal=True, user="translation_ar")
  prefix_B, _ = parallel_text.prefix_and_target_lengths(tokens_BxL)
  inputs_BxT, targets_BxT = tokens_BxL[:, :-1], tokens_BxL[:, 1:]
  mask = masks.prefix_lm_mask(prefix_B, inputs_BxT.shape[1])
  logits = logits_fn(params, inputs_BxT, token_positions(inputs_BxT),
                     attention_mask=mask).logits
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_position_T = jnp.arange(1, tokens_BxL.shape[1])
  scored_BxT = (targets_BxT != PAD_ID) & (
      target_position_T[None] >= prefix_B[:, None])
  nll_BxT = jnp.where(scored_BxT, -gather(log_probs, targets_BxT), 0.0)
  return summarise(nll_BxT.sum(), scored_BxT.sum())


def translation_ar_loss(logits_fn, params, tokens_BxL: jax.Array,
                        key: jax.Array):
  """`translation_ar_eval` with the training signature; `key` unused."""
  del key
  return translation_ar_eval(logits_fn, params, tokens_BxL)


def length_loss(length_logits_BxC: jax.Array, lengths_B: jax.Array):
  """Length head cross-entropy and accuracy (class c is length c + 1).

  Args:
    length_logits_BxC: float32[B, C].
    lengths_B: int32[B] true lengths; those above C count as C.
  Returns:
    (nll float32[B] in nats, correct bool[B]: argmax == true class).
  """
  classes = length_logits_BxC.shape[-1]
  label_B = jnp.clip(lengths_B, 1, classes) - 1
  log_probs = jax.nn.log_softmax(length_logits_BxC.astype(jnp.float32), -1)
  nll_B = -jnp.take_along_axis(log_probs, label_B[:, None], axis=1)[:, 0]
  return nll_B, jnp.argmax(length_logits_BxC, -1) == label_B


def cmlm_mask(key: jax.Array, target_BxL: jax.Array) -> jax.Array:
  """bool[B, L]: the target positions CMLM masks in training.

  Per row, n ~ U{1..T} (T = its target tokens, `target_BxL` True there),
  then n positions drawn uniformly without replacement (Ghazvininejad et
  al. 2019).
  """
  count_key, order_key = jax.random.split(key)
  count_B = target_BxL.sum(1)
  u_B = jax.random.uniform(count_key, count_B.shape)
  n_B = jnp.minimum(jnp.floor(u_B * count_B).astype(jnp.int32) + 1, count_B)
  scores_BxL = jax.random.uniform(order_key, target_BxL.shape)
  return jax.vmap(top_n)(scores_BxL, target_BxL, n_B)


def cmlm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
              length_weight: float = 0.1):
  """CMLM loss: masked-target cross-entropy + length_weight * length loss.

  EOS and PAD are dropped from the input (a CMLM target has no EOS: its
  length comes from the head). The length head pools the hidden states of
  the prefix (source + BOS).

  Args:
    logits_fn: the model, with a `length_logits` method (a Transformer with
      `length_classes` > 0).
    params: its parameters.
    tokens_BxL: int32[B, L] `parallel_text.layout` rows.
    key: PRNG key (masking).
    length_weight: weight of the length loss (nats per sentence).
  Returns:
    (loss, metrics): metrics as in `objectives` over masked tokens, plus
    'length_nll' (summed over rows), 'length_correct' (rows whose argmax
    length is right) and 'sentences'.
  Raises:
    ValueError: tokens not int[B, L] with L >= 3, or no length head.
  """
  check_tokens(tokens_BxL, min_length=3)
  if not hasattr(logits_fn, "length_logits"):
    raise ValueError("cmlm_loss needs logits_fn.length_logits (a model with "
                     "length_classes > 0)")
  prefix_B, target_len_B = parallel_text.prefix_and_target_lengths(
      tokens_BxL)
  position_L = jnp.arange(tokens_BxL.shape[1])[None]
  end_B = (prefix_B + target_len_B)[:, None]
  x0_BxL = jnp.where(position_L < end_B, tokens_BxL, PAD_ID)
  target_BxL = (position_L >= prefix_B[:, None]) & (position_L < end_B)
  masked_BxL = cmlm_mask(key, target_BxL)
  x_t_BxL = jnp.where(masked_BxL, MASK_ID, x0_BxL)
  mask = masks.source_target_mask(prefix_B, x0_BxL != PAD_ID)
  out = logits_fn(params, x_t_BxL, token_positions(x_t_BxL),
                  attention_mask=mask)
  log_probs = jax.nn.log_softmax(out.logits.astype(jnp.float32), axis=-1)
  nll = jnp.where(masked_BxL, -gather(log_probs, x0_BxL), 0.0).sum()
  length_nll_B, correct_B = length_loss(
      logits_fn.length_logits(params, out.hidden,
                              position_L < prefix_B[:, None]), target_len_B)
  token_loss, metrics = summarise(nll, masked_BxL.sum())
  loss = token_loss + length_weight * length_nll_B.mean()
  return loss, dict(metrics, loss=loss, length_nll=length_nll_B.sum(),
                    length_correct=correct_B.sum().astype(jnp.float32),
                    sentences=jnp.float32(tokens_BxL.shape[0]))


def _blank_targets(tokens_BxL: jax.Array, prefix_B: jax.Array,
                   target_len_B: jax.Array) -> jax.Array:
  """bool[B]: rows whose target holds the CTC blank.

  Raises:
    ValueError: concrete tokens with such a row, naming the rows.
  """
  position_L = jnp.arange(tokens_BxL.shape[1])
  in_target_BxL = ((position_L[None] >= prefix_B[:, None])
                   & (position_L[None] < (prefix_B + target_len_B)[:, None]))
  blank_B = (in_target_BxL & (tokens_BxL == parallel_text.BLANK_ID)).any(1)
  if not isinstance(blank_B, jax.core.Tracer) and bool(blank_B.any()):
    rows = np.flatnonzero(np.asarray(blank_B)).tolist()
    raise ValueError(f"tokens rows {rows} hold the CTC blank id "
                     f"{parallel_text.BLANK_ID} (PAD) inside their target; "
                     f"a blank cannot be a CTC label")
  return blank_B


def _ctc_labels(tokens_BxL: jax.Array, prefix_B: jax.Array,
                target_len_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(labels int32[B, L - 1], valid bool[B, L - 1]): each row's target moved
  to the front, valid on its first target_len_B[b] columns."""
  labels_BxT = tokens_BxL[:, 1:]  # wide enough for any target
  index_BxT = jnp.minimum(prefix_B[:, None] + jnp.arange(
      labels_BxT.shape[1])[None], tokens_BxL.shape[1] - 1)
  labels_BxT = jnp.take_along_axis(tokens_BxL, index_BxT, axis=1)
  label_valid_BxT = jnp.arange(labels_BxT.shape[1])[None] < target_len_B[
      :, None]
  return labels_BxT, label_valid_BxT


def ctc_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
             source_width: int, upsample: int = 3):
  """CTC loss of the target given the upsampled source (sum over alignments).

  Rows whose target (plus the blanks its repeats need) cannot fit in their
  frames have an infinite loss; they are left out of the loss and counted in
  metrics['infeasible']. A target token equal to the blank
  (`parallel_text.BLANK_ID`, PAD) cannot be a CTC label: called with concrete
  tokens, such a row is refused (ValueError naming it); under `jit` (no
  values to check) it is left out and counted as infeasible.

  A row's -log p is clamped at 0: where the target is all but certain, the
  float32 log-sum-exp of `optax.ctc_loss` rounds to a value a few 1e-8
  below 0 (true values below float32's resolution near 1 read as 0).

  Args:
    logits_fn: the model.
    params: its parameters.
    tokens_BxL: int32[B, L] `parallel_text.layout` rows.
    key: unused (no noise).
    source_width: Src, static: the longest source (max_source_tokens).
    upsample: frames per source token (Libovicky & Helcl use 3).
  Returns:
    (loss, metrics) as in `objectives`: 'nll' the summed -log p(target),
    'tokens' the target tokens of the feasible rows, plus 'infeasible'.
  Raises:
    ValueError: tokens not int[B, L] with L >= 3; source_width or upsample
      < 1; (concrete tokens) a target holding the blank id, naming the rows.
  """
  del key
  check_tokens(tokens_BxL, min_length=3)
  for name, value in (("source_width", source_width), ("upsample", upsample)):
    if value < 1:
      raise ValueError(f"{name}={value} must be >= 1")
  prefix_B, target_len_B = parallel_text.prefix_and_target_lengths(
      tokens_BxL)
  blank_B = _blank_targets(tokens_BxL, prefix_B, target_len_B)
  width = source_width + 1
  prefix_BxP = jnp.where(jnp.arange(width)[None] < prefix_B[:, None],
                         tokens_BxL[:, :width], PAD_ID)
  frames_BxFxV, frame_valid_BxF, _ = ctc_frames.frame_logits(
      logits_fn, params, prefix_BxP, prefix_B, upsample)
  labels_BxT, label_valid_BxT = _ctc_labels(tokens_BxL, prefix_B,
                                            target_len_B)
  nll_B = jnp.maximum(optax.ctc_loss(
      frames_BxFxV, (~frame_valid_BxF).astype(jnp.float32),
      jnp.where(label_valid_BxT, labels_BxT, 0),
      (~label_valid_BxT).astype(jnp.float32),
      blank_id=parallel_text.BLANK_ID), 0.0)
  repeats_B = (label_valid_BxT[:, 1:] & (labels_BxT[:, 1:] == labels_BxT[
      :, :-1])).sum(1)
  feasible_B = ((target_len_B + repeats_B <= frame_valid_BxF.sum(1))
                & ~blank_B)
  nll = jnp.where(feasible_B, nll_B, 0.0).sum()
  loss, metrics = summarise(nll, jnp.where(feasible_B, target_len_B, 0).sum())
  return loss, dict(metrics,
                    infeasible=(~feasible_B).sum().astype(jnp.float32))
