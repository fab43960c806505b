"""Self-drafting: the target drafts for itself, with no second model.

Both decoders here propose deterministic drafts (q = one-hot(d)) and share the
verification loop of `speculative.DraftVerifyDecoder`, so their output is
distributed exactly as plain sampling from the target (greedy: the target's
greedy decoding, token for token). They differ in where the draft comes from:

  "jacobi"         Jacobi (fixed-point) decoding (Santilli et al. 2023,
                   "Accelerating Transformer Inference for Translation via
                   Parallel Decoding"; Song et al. 2021): the draft is the
                   target's own most likely tokens at the positions after
                   the accepted ones, from the previous round's call (made
                   with the previous guess in the context), PAD where the
                   previous call reached no further. The first guess is all
                   PAD. Greedy decoding converges to the AR fixed point, at
                   least one token per call.
  "prompt_lookup"  n-gram lookup in the row's own context (Saxena 2023,
                   "Prompt Lookup Decoding"; Yang et al. 2023, LLMA): find the
                   earliest earlier occurrence of the row's last n tokens
                   (n = max_ngram down to 1, the longest that occurs), as
                   Saxena's reference code and `transformers`'
                   `prompt_lookup_num_tokens` do, or with match='latest' the
                   most recent one, and propose the gamma tokens that
                   followed it; PAD where the copy would run past the known
                   context or nothing matches.

Cost: one target call of gamma + 1 tokens per round, plus the prefill; no
draft calls.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from lm_decoding.checks import is_count
from lm_decoding.decoding.base import register
from lm_decoding.decoding.speculative import DraftVerifyDecoder


@register("jacobi")
@dataclasses.dataclass(frozen=True, kw_only=True)
class JacobiDecoder(DraftVerifyDecoder):
  """Jacobi decoding verified by speculative sampling (module docstring)."""

  roles: ClassVar[tuple[str, ...]] = ("target",)

  def start(self, models, prompts_BxP, prompt_lengths_B, cache_length, cost,
            key_B):
    del models, prompt_lengths_B, cache_length, key_B
    guess = jnp.full((prompts_BxP.shape[0], self.gamma), self.pad_id,
                     jnp.int32)
    return guess, cost

  def propose(self, models, state, key_B):
    del models, key_B
    return state.draft, None, state.draft, state.cost

  def advance(self, state, accepted_B, p_BxG1xV, new_pos_B):
    """Next guess: argmax p at positions accepted + 1 .. gamma, then PAD."""
    del state, new_pos_B
    best_BxG1 = jnp.argmax(p_BxG1xV, -1).astype(jnp.int32)
    index_G = jnp.arange(self.gamma)
    source_BxG = accepted_B[:, None] + 1 + index_G[None, :]
    shifted = jnp.take_along_axis(
        best_BxG1, jnp.minimum(source_BxG, self.gamma), 1)
    return jnp.where(source_BxG <= self.gamma, shifted, self.pad_id)


LOOKUP_MATCHES = ("earliest", "latest")


def lookup(sequence_L: jax.Array, pos: jax.Array, gamma: int, max_ngram: int,
           pad_id: int, match: str = "earliest") -> jax.Array:
  """int32[gamma]: the prompt-lookup draft of ONE row (module docstring).

  Example: context [1, 2, 3, 1, 2, 4, 1, 2] (pos 7), max_ngram 2, gamma 2:
  the last 2-gram [1, 2] occurred at 0 and 3; 'earliest' drafts [3, 1],
  'latest' [4, 1].

  Args:
    sequence_L: int32[L] the row's tokens; positions <= pos are known.
    pos: int32[] position of the row's last token.
    gamma: draft length.
    max_ngram: longest n-gram tried.
    pad_id: the draft where nothing is known.
    match: which occurrence of the n-gram is copied from, one of
      `LOOKUP_MATCHES`.
  """
  length = sequence_L.shape[0]
  start_L = jnp.arange(length)
  draft = jnp.full((gamma,), pad_id, jnp.int32)
  found = jnp.bool_(False)
  for n in range(max_ngram, 0, -1):  # static: the longest n-gram wins
    match_L = (start_L + n - 1 < pos) & (pos - n + 1 >= 0)
    for j in range(n):
      shifted = jnp.roll(sequence_L, -j)  # shifted[s] = sequence[s + j]
      match_L &= shifted == sequence_L[jnp.maximum(pos - n + 1 + j, 0)]
    first = jnp.argmax(match_L[::-1] if match == "latest" else match_L)
    start = jnp.where(match_L.any(),
                      length - 1 - first if match == "latest" else first, -1)
    source_G = start + n + jnp.arange(gamma)
    copy = jnp.where(source_G <= pos, sequence_L[jnp.minimum(source_G,
                                                             length - 1)],
                     pad_id)
    use = ~found & (start >= 0)
    draft = jnp.where(use, copy, draft)
    found |= start >= 0
  return draft


@register("prompt_lookup")
@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptLookupDecoder(DraftVerifyDecoder):
  """Prompt-lookup (n-gram) drafting verified by speculative sampling.

  Attributes (besides `DraftVerifyDecoder`'s):
    max_ngram: longest n-gram matched, >= 1 (module docstring).
    match: 'earliest' (default, the reference rule) or 'latest' occurrence
      of the n-gram (`lookup`).
  """

  max_ngram: int = 3
  match: str = "earliest"
  roles: ClassVar[tuple[str, ...]] = ("target",)

  def __post_init__(self):
    super().__post_init__()
    if not is_count(self.max_ngram):
      raise ValueError(f"max_ngram={self.max_ngram!r} must be an integer >= 1")
    if self.match not in LOOKUP_MATCHES:
      raise ValueError(f"match={self.match!r}; allowed: {LOOKUP_MATCHES}")

  def propose(self, models, state, key_B):
    del models, key_B
    draft = jax.vmap(lambda s, p: lookup(s, p, self.gamma, self.max_ngram,
                                         self.pad_id, self.match))(
                                             state.sequence, state.pos)
    return draft, None, None, state.cost
