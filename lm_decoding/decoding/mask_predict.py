"""Mask-Predict (Ghazvininejad et al. 2019): CMLM decoding with a length beam.

Deliberately not in the LM decoder registry: a translation decoder's
contract differs (see the `lm_decoding.decoding` package docstring).

Rows are [source, BOS, t_1 .. t_{T_b}, PAD ...] under `masks.source_target_mask`
(the layout of `objectives.translation.cmlm_loss`). Worked example, T_b = 4
target slots, K = 2 iterations:

  t = 0: all T_b masked; one pass predicts every slot (argmax) and records
         its probability p.
  t = 1: re-mask the n = T_b * (K - t) / K = 2 slots of lowest p; one pass
         predicts them again (their p is updated, the others keep theirs).

K = 1 is one-shot CMLM decoding. The target length T_b comes from the length
head (`lengths='head'`: one extra pass over the source alone): the l most
likely lengths are decoded in parallel as l candidates and the one of
highest average log-probability is returned (the length beam). With
`lengths='fixed'` every row is decoded at T_b = output_length (the harness's
fixed-length mode; models without a length head).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import jax
import jax.numpy as jnp

from lm_decoding.checks import check_counts
from lm_decoding.decoding import base, rows
from lm_decoding.models import Model, masks
from lm_decoding.models.selection import top_n
from lm_decoding.special_tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID

LENGTHS = ("fixed", "head")
_NEVER = (PAD_ID, BOS_ID, EOS_ID, MASK_ID)  # never predicted in a target


def remask_count(lengths_B: jax.Array, t: jax.Array, steps: int) -> jax.Array:
  """int32[B]: n = floor(T_b * (K - t) / K), the slots re-masked at iteration
  t in 1..K-1 (Mask-Predict's linear schedule)."""
  return (lengths_B * (steps - t)) // steps


def lowest(probs_BxL: jax.Array, target_BxL: jax.Array,
           n_B: jax.Array) -> jax.Array:
  """bool[B, L]: per row the n target slots of lowest probability (ties to
  the leftmost)."""
  return jax.vmap(top_n)(-probs_BxL, target_BxL, n_B)


def _rows(prompts_BxP, prompt_lengths_B, lengths_B, width):
  """[prompt, MASK * T_b, PAD] rows of `width`, their target and valid masks."""
  position_BxL = jnp.broadcast_to(jnp.arange(width), (prompts_BxP.shape[0],
                                                      width))
  start_Bx1, end_Bx1 = prompt_lengths_B[:, None], (prompt_lengths_B
                                                   + lengths_B)[:, None]
  padded = jnp.pad(prompts_BxP, ((0, 0), (0, width - prompts_BxP.shape[1])))
  target = (position_BxL >= start_Bx1) & (position_BxL < end_Bx1)
  rows = jnp.where(position_BxL < start_Bx1, padded,
                   jnp.where(target, MASK_ID, PAD_ID))
  return rows.astype(jnp.int32), target, position_BxL < end_Bx1


def _predict(models, cost, rows, valid, prompt_lengths_B):
  positions = jnp.broadcast_to(jnp.arange(rows.shape[1]), rows.shape)
  out, cost = base.forward(
      models, "model", cost, rows, positions,
      attention_mask=masks.source_target_mask(prompt_lengths_B, valid))
  logits = out.logits.at[..., jnp.asarray(_NEVER)].set(-jnp.inf)
  log_probs = jax.nn.log_softmax(logits, -1)
  return jnp.argmax(log_probs, -1).astype(jnp.int32), log_probs.max(-1), cost


@functools.partial(jax.jit, static_argnums=0)
def _decode(decoder, models, prompts_BxP, prompt_lengths_B):
  batch, width = prompts_BxP.shape
  total, beam = width + decoder.output_length, decoder.length_beam
  cost = base.Cost.zero(decoder.roles)
  if decoder.lengths == "head":
    model = models["model"]
    source_BxP = jnp.arange(width)[None] < prompt_lengths_B[:, None]
    out, cost = base.forward(
        models, "model", cost, prompts_BxP,
        jnp.broadcast_to(jnp.arange(width), prompts_BxP.shape),
        attention_mask=masks.source_target_mask(prompt_lengths_B,
                                                source_BxP))
    length_logits = model.logits_fn.length_logits(
        model.params, out.hidden, source_BxP)
    length_logits = length_logits[:, :decoder.output_length]
    lengths_BxM = jax.lax.top_k(length_logits, beam)[1] + 1
  else:
    lengths_BxM = jnp.full((batch, beam), decoder.output_length)
  lengths_BM = lengths_BxM.reshape(-1).astype(jnp.int32)
  prompt_lengths_BM = jnp.repeat(prompt_lengths_B, beam)
  rows, target, valid = _rows(jnp.repeat(prompts_BxP, beam, 0),
                              prompt_lengths_BM, lengths_BM, total)
  tokens, log_p, cost = _predict(models, cost, rows, valid, prompt_lengths_BM)
  rows = jnp.where(target, tokens, rows)
  remasked_KxBM = jnp.zeros((decoder.steps, rows.shape[0]), jnp.int32)

  def iteration(t, carry):
    rows, log_p, remasked, cost = carry
    n_BM = remask_count(lengths_BM, t, decoder.steps)
    again = lowest(log_p, target, n_BM)
    tokens, new_log_p, cost = _predict(
        models, cost, jnp.where(again, MASK_ID, rows), valid,
        prompt_lengths_BM)
    return (jnp.where(again, tokens, rows), jnp.where(again, new_log_p,
                                                      log_p),
            remasked.at[t].set(again.sum(1)), cost)

  rows, log_p, remasked_KxBM, cost = jax.lax.fori_loop(
      1, decoder.steps, iteration, (rows, log_p, remasked_KxBM, cost))
  score_BM = jnp.where(target, log_p, 0.0).sum(1) / lengths_BM
  best_B = jnp.argmax(score_BM.reshape(batch, beam), 1)
  chosen_B = jnp.arange(batch) * beam + best_B
  length_B = lengths_BM[chosen_B]
  index_BxT = prompt_lengths_B[:, None] + jnp.arange(decoder.output_length)
  out_BxT = jnp.take_along_axis(rows[chosen_B], index_BxT, axis=1)
  slot_T = jnp.arange(decoder.output_length)[None]
  out_BxT = jnp.where(slot_T < length_B[:, None], out_BxT,
                      jnp.where(slot_T == length_B[:, None], EOS_ID, PAD_ID))
  lengths = jnp.minimum(length_B + 1, decoder.output_length)
  committed = jnp.zeros((decoder.steps, batch), jnp.int32).at[0].set(
      length_B)
  return base.result(out_BxT, lengths, committed, cost,
                     remasked=remasked_KxBM.reshape(decoder.steps, batch,
                                                   beam)[:, jnp.arange(batch),
                                                         best_B],
                     target_lengths=length_B)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaskPredictDecoder:
  """Mask-Predict with a length beam (see the module docstring).

  Prompts are [source, BOS] right-padded (`parallel_text.prompts`).
  Deterministic (argmax): `key` is unused.

  Attributes:
    output_length: T >= 1, the longest target (and the output width).
    steps: K >= 1 iterations (K forward passes; 1 = one-shot CMLM).
    length_beam: l >= 1 candidate lengths (only with lengths='head').
    lengths: 'head' (the model's length head, one extra pass) or 'fixed'
      (T_b = T for every row).
  """

  output_length: int
  steps: int = 10
  length_beam: int = 1
  lengths: str = "fixed"
  roles = ("model",)

  def __post_init__(self):
    check_counts(self, ("output_length", "steps", "length_beam"))
    if self.lengths not in LENGTHS:
      raise ValueError(f"lengths={self.lengths!r}; allowed: {LENGTHS}")
    if self.lengths == "fixed" and self.length_beam != 1:
      raise ValueError(f"length_beam={self.length_beam} needs lengths="
                       f"'head' (lengths='fixed' decodes one length)")
    if self.length_beam > self.output_length:
      raise ValueError(f"length_beam={self.length_beam} must be <= "
                       f"output_length={self.output_length}")

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array = None
             ) -> base.DecodeResult:
    """Translates right-padded prompts [source, BOS].

    Returns:
      `DecodeResult`: tokens int32[B, T] (the target, then EOS if shorter
      than T); committed[0] the target length, 0 after; stats 'remasked'
      int32[K, B] (slots re-masked per iteration, 0 at t = 0) and
      'target_lengths' int32[B] (the chosen length T_b).
    Raises:
      ValueError: bad models or prompts; P + T above the model's max_len;
        lengths='head' with a model without `length_logits`.
    """
    base.check_models(self, models)
    prompts, prompt_lengths = rows.check_prompts(prompts, prompt_lengths,
                                                needs_prompt=True)
    logits_fn = models["model"].logits_fn
    total = prompts.shape[1] + self.output_length
    if total > logits_fn.max_len:
      raise ValueError(f"prompt width P={prompts.shape[1]} + output_length="
                       f"{self.output_length} must be <= max_len="
                       f"{logits_fn.max_len}")
    if self.lengths == "head" and not hasattr(logits_fn, "length_logits"):
      raise ValueError("lengths='head' needs a model with a length head "
                       "(logits_fn.length_logits; length_classes > 0)")
    base.check_token_ids("prompts", prompts, models["model"])
    return _decode(self, models, prompts.astype(jnp.int32),
                   prompt_lengths.astype(jnp.int32))
