"""CTC greedy decoding of a non-autoregressive translation model.

Deliberately not in the LM decoder registry: a translation decoder's
contract differs (see the `lm_decoding.decoding` package docstring).

Libovicky & Helcl (2018): the source [s_1 .. s_n, BOS] is followed by
upsample * n frames (`models.ctc_frames.ctc_layout`); one forward pass gives a
token or the blank (`parallel_text.BLANK_ID`) per frame; the output is the
frames' argmax with repeats collapsed and blanks dropped (`collapse`). The
output length is dynamic: no length head. One forward pass (NFE 1).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import jax
import jax.numpy as jnp

from lm_decoding.checks import check_counts
from lm_decoding.data import parallel_text
from lm_decoding.decoding import base, rows
from lm_decoding.models import Model, ctc_frames
from lm_decoding.special_tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID


def collapse(frames_BxF: jax.Array, frame_valid_BxF: jax.Array,
             output_length: int, blank_id: int = parallel_text.BLANK_ID
             ) -> tuple[jax.Array, jax.Array]:
  """CTC's many-to-one map: merge repeated frames, then drop blanks.

  E.g. frames [a, a, _, a, b, b] -> [a, a, b] (the blank separates the two
  a's). Invalid frames are ignored.

  Args:
    frames_BxF: int32[B, F] per-frame tokens (blank included).
    frame_valid_BxF: bool[B, F].
    output_length: T, the width of the output (longer outputs are cut).
    blank_id: the blank.
  Returns:
    tokens int32[B, T] left-aligned, PAD after; lengths int32[B] (<= T).
  """
  previous_BxF = jnp.concatenate(
      [jnp.full_like(frames_BxF[:, :1], blank_id), frames_BxF[:, :-1]], 1)
  keep_BxF = frame_valid_BxF & (frames_BxF != blank_id) & (
      frames_BxF != previous_BxF)
  slot_BxF = jnp.where(keep_BxF, jnp.cumsum(keep_BxF, 1) - 1, output_length)
  rows_Bx1 = jnp.arange(frames_BxF.shape[0])[:, None]
  tokens = jnp.full((frames_BxF.shape[0], output_length), PAD_ID, jnp.int32)
  tokens = tokens.at[rows_Bx1, slot_BxF].set(frames_BxF, mode="drop")
  return tokens, jnp.minimum(keep_BxF.sum(1), output_length).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=0)
def _decode(decoder, models, prompts_BxP, prompt_lengths_B):
  cost = base.Cost.zero(decoder.roles)
  model = models["model"]
  frames_BxFxV, frame_valid_BxF, _ = ctc_frames.frame_logits(
      model.logits_fn, model.params, prompts_BxP, prompt_lengths_B,
      decoder.upsample)
  cost = cost.add("model", jnp.zeros(
      (prompts_BxP.shape[0],
       prompts_BxP.shape[1] + frames_BxFxV.shape[1]), jnp.int32))
  never = jnp.zeros(frames_BxFxV.shape[-1], bool).at[
      jnp.asarray((BOS_ID, EOS_ID, MASK_ID))].set(True)
  frames_BxF = jnp.argmax(jnp.where(never, -jnp.inf, frames_BxFxV), -1)
  tokens, lengths = collapse(frames_BxF.astype(jnp.int32), frame_valid_BxF,
                             decoder.output_length)
  room_B = lengths < decoder.output_length
  rows_B = jnp.arange(tokens.shape[0])
  tokens = tokens.at[rows_B, jnp.where(room_B, lengths, tokens.shape[1])
                     ].set(EOS_ID, mode="drop")
  lengths = jnp.where(room_B, lengths + 1, lengths)
  return base.result(tokens, lengths, lengths[None], cost)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CTCDecoder:
  """Greedy CTC decoding (see the module docstring).

  Prompts are [source, BOS] right-padded (`parallel_text.prompts`); the
  output is the collapsed frames, then EOS when there is room.

  Attributes:
    output_length: T >= 1, the output width (longer outputs are cut).
    upsample: frames per source token, >= 1 (as in training).
  """

  output_length: int
  upsample: int = 3
  roles = ("model",)

  def __post_init__(self):
    check_counts(self, ("output_length", "upsample"))

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array = None
             ) -> base.DecodeResult:
    """Decodes every row in one forward pass; `key` is unused.

    Args:
      models: {'model': a CTC NAT}.
      prompts: int32[B, P] right-padded [source, BOS].
      prompt_lengths: int32[B] in [1, P].
      key: unused (greedy).
    Returns:
      `DecodeResult` (committed int32[1, B]: the row's length).
    Raises:
      ValueError: bad models or prompts; P + upsample * (P - 1) above the
        model's max_len.
    """
    base.check_models(self, models)
    prompts, prompt_lengths = rows.check_prompts(prompts, prompt_lengths,
                                                needs_prompt=True)
    width = prompts.shape[1]
    length = width + self.upsample * (width - 1)
    max_len = models["model"].logits_fn.max_len
    if length > max_len:
      raise ValueError(
          f"prompt width P={width} with upsample={self.upsample} needs "
          f"{length} positions; the model's max_len is {max_len}")
    base.check_token_ids("prompts", prompts, models["model"])
    return _decode(self, models, prompts.astype(jnp.int32),
                   prompt_lengths.astype(jnp.int32))
