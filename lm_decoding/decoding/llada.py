"""LLaDA's sampler (Nie et al. 2025): fixed transfer schedule, ranked commits."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import ScheduledIterativeDecoder
from lm_decoding.decoding.rules import ORDERINGS, Step, ranked
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.schedule import dream_schedule, transfer_schedule

# How many positions a step commits: LLaDA's even split of the block's
# masked count, or Dream's fraction of those still masked.
TRANSFERS = {"even": transfer_schedule, "dream": dream_schedule}


@register("llada")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LLaDADecoder(ScheduledIterativeDecoder):
  """Semi-autoregressive blocks, K / N steps each, ranked commits.

  At step k of a block that started with n masked positions, the
  `transfer_schedule(n, K / N)[k]` masked positions ranked highest by
  `remasking` take their proposals; the rest stay masked ("remasking" in
  LLaDA's words). LLaDA's 'low_confidence' ranks by the probability of the
  drawn token under the softmax over the whole vocabulary, MASK included, as
  the reference implementation does; 'margin' and 'entropy' are the
  orderings of Kim et al. (2025) and Ben-Hamu et al. (2025). Ties go to the
  leftmost position.

  Dream's sampler (Ye et al. 2025, `diffusion_generate` with alg
  'maskgit_plus', 'topk_margin' or 'entropy' and alg_temp 0) is this
  decoder with `transfer='dream'` and remasking 'low_confidence', 'margin'
  or 'entropy' (one block, K steps), on a token-shifted model.

  Attributes (besides `IterativeDecoder`'s):
    remasking: one of `rules.ORDERINGS`.
    transfer: how many positions step k commits: 'even' (LLaDA's
      `schedule.transfer_schedule` of the block's masked count) or 'dream'
      (Dream's `schedule.dream_schedule`: floor(n_k (1 - s / t)) of the n_k
      still masked).
    sampling: default greedy (temperature 0), as in LLaDA.
  """

  sampling: SamplingConfig = SamplingConfig(temperature=0.0)
  remasking: str = "low_confidence"
  transfer: str = "even"

  def __post_init__(self):
    super().__post_init__()
    if self.remasking not in ORDERINGS:
      raise ValueError(f"remasking={self.remasking!r}; allowed: {ORDERINGS}")
    if self.transfer not in TRANSFERS:
      raise ValueError(f"transfer={self.transfer!r}; allowed: "
                       f"{tuple(TRANSFERS)}")

  def select(self, step: Step):
    count = TRANSFERS[self.transfer](step.num_masked,
                                     self.steps // self.num_blocks())[step.k]
    commit = ranked(step, self.remasking, count)
    return commit, jnp.zeros_like(commit)
