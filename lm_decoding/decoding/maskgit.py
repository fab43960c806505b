"""MaskGIT's parallel decoding (Chang et al. 2022) on the iterative loop."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.checks import is_number
from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import ScheduledIterativeDecoder
from lm_decoding.decoding.rules import Step
from lm_decoding.decoding.schedule import cosine_schedule
from lm_decoding.models.selection import top_n


@register("maskgit")
@dataclasses.dataclass(frozen=True, kw_only=True)
class MaskGITDecoder(ScheduledIterativeDecoder):
  """Cosine schedule, commits ranked by confidence plus annealed noise.

  At step k of the k_b = K / N steps of a block that started with n masked
  positions, `cosine_schedule(n, k_b)[k]` masked positions are committed:
  those with the highest log p(drawn) + tau (1 - (k + 1) / k_b) g, g a
  standard Gumbel draw per position and tau the confidence (choice)
  temperature; the noise anneals to 0 at the last step, so early steps
  explore and late ones commit by confidence alone.

  Attributes (besides `IterativeDecoder`'s):
    choice_temperature: tau >= 0 (MaskGIT uses 4.5; 0 is pure confidence).
  """

  choice_temperature: float = 4.5

  def __post_init__(self):
    super().__post_init__()
    if (not is_number(self.choice_temperature)
        or not 0 <= self.choice_temperature < float("inf")):
      raise ValueError(f"choice_temperature={self.choice_temperature!r} "
                       "must be in [0, inf) (a number)")

  def select(self, step: Step):
    steps = self.steps // self.num_blocks()
    count = cosine_schedule(step.num_masked, steps)[step.k]
    log_p = jnp.log(jnp.maximum(step.confidence("low_confidence"), 1e-30))
    gumbel = -jnp.log(-jnp.log(jnp.clip(step.uniform, 1e-20, 1.0 - 1e-7)))
    anneal = 1.0 - (step.k + 1) / steps
    score = log_p + self.choice_temperature * anneal * gumbel
    commit = top_n(score, step.masked, count)
    return commit, jnp.zeros_like(commit)
