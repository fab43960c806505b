"""ReMDM-style re-masking of committed tokens (Wang et al. 2025).

A masked-diffusion sampler whose committed tokens are not final: at each
middle step the least confident committed tokens of the block go back to
MASK and are drawn again later, with more context. This is the confidence
variant ("ReMDM-conf") of the paper's re-masking samplers, on LLaDA's
schedule.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import ScheduledIterativeDecoder
from lm_decoding.decoding.rules import ORDERINGS, Step, ranked
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.schedule import transfer_schedule
from lm_decoding.models.selection import top_n


@register("remdm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReMDMDecoder(ScheduledIterativeDecoder):
  """LLaDA's schedule plus a bounded re-masking of committed tokens.

  Step k of the k_b = K / N steps of a block commits c_k + r_k masked
  positions (ranked by `ordering`) and re-masks the r_k committed ones of
  the block whose probability at commit time was lowest, where c_k is
  `transfer_schedule(n, k_b)[k]` and r_k = min(remask_per_step, committed
  tokens, masked positions beyond c_k). Net progress is exactly c_k, so the
  block still ends after k_b steps. The budget: no re-masking at the first
  and last step of a block, so at most remask_per_step * (k_b - 2)
  re-masks per block; they cost no extra forward pass (NFE as LLaDA's).
  A re-masked token may be committed again at a later step, never at the
  one that re-masked it.

  Attributes (besides `IterativeDecoder`'s):
    remask_per_step: r >= 1, the most tokens re-masked in one step.
    ordering: how masked positions are ranked for commits (`ORDERINGS`).
  """

  sampling: SamplingConfig = SamplingConfig(temperature=1.0)
  remask_per_step: int = 1
  ordering: str = "low_confidence"

  def __post_init__(self):
    super().__post_init__()
    if (isinstance(self.remask_per_step, bool)
        or not isinstance(self.remask_per_step, int)
        or self.remask_per_step < 1):
      raise ValueError(f"remask_per_step={self.remask_per_step!r} must be an "
                       "integer >= 1")
    if self.ordering not in ORDERINGS:
      raise ValueError(f"ordering={self.ordering!r}; allowed: {ORDERINGS}")

  def select(self, step: Step):
    steps = self.steps // self.num_blocks()
    count = transfer_schedule(step.num_masked, steps)[step.k]
    committed = step.fill & ~step.masked
    middle = (step.k > 0) & (step.k < steps - 1)
    spare = jnp.sum(step.masked) - count
    remask_count = jnp.where(
        middle, jnp.minimum(self.remask_per_step,
                            jnp.minimum(jnp.sum(committed), spare)), 0)
    remask = top_n(-step.committed_confidence, committed, remask_count)
    commit = ranked(step, self.ordering, count + remask_count)
    return commit, remask
