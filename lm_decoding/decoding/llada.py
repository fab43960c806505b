"""LLaDA's sampler (Nie et al. 2025): fixed transfer schedule, ranked commits."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import ScheduledIterativeDecoder
from lm_decoding.decoding.rules import ORDERINGS, Step, ranked
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.schedule import transfer_schedule


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

  Attributes (besides `IterativeDecoder`'s):
    remasking: one of `rules.ORDERINGS`.
    sampling: default greedy (temperature 0), as in LLaDA.
  """

  sampling: SamplingConfig = SamplingConfig(temperature=0.0)
  remasking: str = "low_confidence"

  def __post_init__(self):
    super().__post_init__()
    if self.remasking not in ORDERINGS:
      raise ValueError(f"remasking={self.remasking!r}; allowed: {ORDERINGS}")

  def select(self, step: Step):
    count = transfer_schedule(step.num_masked,
                              self.steps // self.num_blocks())[step.k]
    commit = ranked(step, self.remasking, count)
    return commit, jnp.zeros_like(commit)
