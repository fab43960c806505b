"""Where a decoded row starts and where it ends: one prompt check, one EOS rule.

Every decoder takes right-padded prompts int32[B, P] with prompt_lengths
int32[B], and every decoder ends a row at its first token in `eos_ids`.
Both rules are written here once, below every decoder, so that a decoder
cannot accept a prompt another refuses or end a row where another would not.

Prompt lengths lie in [int(needs_prompt), P], `needs_prompt` a property of
the model: True when the first generated token is predicted from the prompt
(a causal LM, whose logits at position i predict token i + 1; a diffusion
model adapted from one, `TransformerConfig.token_shift`; a translation model
whose prompt [source, BOS] always holds BOS), so a row needs one prompt
token; False for a masked-diffusion denoiser (logits at i predict token i),
for which a row of length 0 is an unconditional sample.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def int_matrix(name: str, value: Any, shape: str) -> jax.Array:
  """`value` as int32[B, L].

  Raises:
    ValueError: naming `name` and `shape` (e.g. "int[B, P]") unless `value`
      is a 2-D integer array.
  """
  value = jnp.asarray(value)
  if value.ndim != 2 or not jnp.issubdtype(value.dtype, jnp.integer):
    raise ValueError(f"{name} must be {shape}; got {value.shape} "
                     f"{value.dtype}")
  return value.astype(jnp.int32)


def check_prompts(prompts: Any, prompt_lengths: Any, needs_prompt: bool
                  ) -> tuple[jax.Array, jax.Array]:
  """Checks right-padded prompts; returns them as int32 arrays.

  Args:
    prompts: int[B, P] right-padded prompts (lists and numpy arrays too).
    prompt_lengths: int[B] real tokens per row.
    needs_prompt: the model predicts the first generated token from the
      prompt (see the module docstring): prompt lengths must then be >= 1,
      else >= 0.
  Returns:
    (prompts int32[B, P], prompt_lengths int32[B]).
  Raises:
    ValueError: prompts not int[B, P] (P >= 1 with needs_prompt);
      prompt_lengths not int[B]; or (when concrete) a prompt length outside
      [int(needs_prompt), P]. Traced lengths are not range-checked.
  """
  low = int(needs_prompt)
  prompts = int_matrix("prompts", prompts, f"int[B, P] with P >= {low}")
  batch, width = prompts.shape
  if width < low:
    raise ValueError(f"prompts must be int[B, P] with P >= {low} (the model "
                     f"predicts the first token from the prompt); got "
                     f"{prompts.shape}")
  prompt_lengths = jnp.asarray(prompt_lengths)
  if (prompt_lengths.shape != (batch,)
      or not jnp.issubdtype(prompt_lengths.dtype, jnp.integer)):
    raise ValueError(f"prompt_lengths must be int[B] with B={batch}; got "
                     f"{prompt_lengths.shape} {prompt_lengths.dtype}")
  if not isinstance(prompt_lengths, jax.core.Tracer):
    lengths = np.asarray(prompt_lengths)
    if lengths.size and not low <= lengths.min() <= lengths.max() <= width:
      why = (" (the model predicts the first token from the prompt: a row "
             "needs a prompt token)" if needs_prompt else "")
      raise ValueError(f"prompt_lengths={lengths.tolist()} must be in "
                       f"[{low}, P={width}]{why}")
  return prompts, prompt_lengths.astype(jnp.int32)


def is_eos(tokens: jax.Array, eos_ids: tuple[int, ...]) -> jax.Array:
  """bool[...]: which tokens end a row (any id in `eos_ids`; none if empty).

  Args:
    tokens: int32[...] token ids of any shape.
    eos_ids: the ids that end a row.
  """
  tokens = jnp.asarray(tokens)
  if not eos_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32))


def finish_at_eos(tokens: jax.Array, eos_ids: tuple[int, ...], pad_id: int
                  ) -> tuple[jax.Array, jax.Array]:
  """Cuts rows after their first EOS.

  Args:
    tokens: int32[B, T] generated tokens.
    eos_ids: ids that end a row (empty: no row ends early).
    pad_id: id written after a row's first EOS.
  Returns:
    tokens: int32[B, T] with PAD after the first EOS (the EOS is kept);
    lengths: int32[B] tokens up to and including the first EOS (T if none).
  """
  ended_BxT = is_eos(tokens, eos_ids)
  t = tokens.shape[1]
  lengths = jnp.where(ended_BxT.any(1), jnp.argmax(ended_BxT, 1) + 1,
                      t).astype(jnp.int32)
  keep = jnp.arange(t)[None, :] < lengths[:, None]
  return jnp.where(keep, tokens, pad_id).astype(jnp.int32), lengths


def eos_counts(tokens: jax.Array, eos_ids: tuple[int, ...]
               ) -> tuple[jax.Array, jax.Array]:
  """Counts degenerate outputs of a decoder (for the quality report).

  Args:
    tokens: int32[B, T] raw generated tokens (before `finish_at_eos`, which
      turns an all-EOS row into an empty one).
    eos_ids: ids that end a row.
  Returns:
    (empty, all_eos): int32[] rows whose first token is EOS (empty outputs)
    and rows that are EOS at every position.
  """
  ended_BxT = is_eos(tokens, eos_ids)
  return (jnp.sum(ended_BxT[:, 0], dtype=jnp.int32),
          jnp.sum(ended_BxT.all(1), dtype=jnp.int32))
