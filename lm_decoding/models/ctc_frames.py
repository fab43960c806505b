"""The frames of a CTC non-autoregressive translator, shared by its loss and its decoder.

A CTC NAT (Libovicky & Helcl 2018) reads rows [source, BOS, frames, PAD]
whose frames are the source upsampled, and emits one token or the blank per
frame. `ctc_layout` builds those rows and `frame_logits` runs the one
forward pass over them and gathers the frames' logits. The CTC loss
(`training.objectives.translation.ctc_loss`) and the CTC decoder
(`decoding.ctc`) both call `frame_logits`, so a model is decoded over the
frames it was trained on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import masks
from lm_decoding.special_tokens import PAD_ID


def ctc_layout(prefix_BxP: jax.Array, prefix_lengths_B: jax.Array,
               upsample: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Rows [source, BOS, frames, PAD] of a CTC NAT (Libovicky & Helcl 2018).

  The frames are the source upsampled: source token j repeated `upsample`
  times, so a source of n tokens has F_b = upsample * n frames, starting at
  position prefix_lengths[b] = n + 1. E.g. source [a, b], upsample 2:
  [a, b, BOS, a, a, b, b, PAD ...]. Traceable.

  Args:
    prefix_BxP: int32[B, P] right-padded prefixes [source, BOS] (`prompts`).
    prefix_lengths_B: int32[B] in [2, P].
    upsample: frames per source token, >= 1.
  Returns:
    tokens int32[B, P + upsample * (P - 1)]; valid bool[B, same] (False on
    PAD); frame_valid bool[B, upsample * (P - 1)]: which frame slots
    (positions prefix_lengths[b] + f) hold a frame.
  """
  width = prefix_BxP.shape[1]
  frames = upsample * (width - 1)
  position_L = jnp.arange(width + frames)[None]
  prefix_Bx1 = jnp.asarray(prefix_lengths_B, jnp.int32)[:, None]
  frame_count_Bx1 = upsample * (prefix_Bx1 - 1)
  valid_BxL = position_L < prefix_Bx1 + frame_count_Bx1
  index_BxL = jnp.where(position_L < prefix_Bx1, position_L,
                        (position_L - prefix_Bx1) // upsample)
  tokens_BxL = jnp.take_along_axis(prefix_BxP, jnp.clip(index_BxL, 0,
                                                        width - 1), axis=1)
  frame_valid_BxF = jnp.arange(frames)[None] < frame_count_Bx1
  return (jnp.where(valid_BxL, tokens_BxL, PAD_ID).astype(jnp.int32),
          valid_BxL, frame_valid_BxF)


def frame_logits(logits_fn, params, prefix_BxP: jax.Array,
                 prefix_lengths_B: jax.Array, upsample: int):
  """One forward pass of a CTC NAT over `ctc_layout` rows. Traceable.

  Args:
    logits_fn: the model (`models.make_logits_fn` or a stub), called once
      with a source-target attention mask (`masks.source_target_mask`).
    params: its parameters.
    prefix_BxP, prefix_lengths_B, upsample: as `ctc_layout`.
  Returns:
    (frame logits float32[B, F, V], frame_valid bool[B, F], the
    ModelOutput), F = upsample * (P - 1).
  """
  tokens_BxL, valid_BxL, frame_valid_BxF = ctc_layout(
      prefix_BxP, prefix_lengths_B, upsample)
  mask = masks.source_target_mask(prefix_lengths_B, valid_BxL)
  positions_BxL = jnp.broadcast_to(
      jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)
  out = logits_fn(params, tokens_BxL, positions_BxL, attention_mask=mask)
  index_BxF = prefix_lengths_B[:, None] + jnp.arange(
      frame_valid_BxF.shape[1])[None]
  index_BxF = jnp.minimum(index_BxF, tokens_BxL.shape[1] - 1)
  frames = jnp.take_along_axis(out.logits, index_BxF[..., None], axis=1)
  return frames.astype(jnp.float32), frame_valid_BxF, out
