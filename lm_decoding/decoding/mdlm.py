"""MDLM's ancestral sampler (Sahoo et al. 2024) on the iterative loop."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import ScheduledIterativeDecoder
from lm_decoding.decoding.rules import Step, unmask_ancestral
from lm_decoding.models import diffusion


@register("mdlm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class MDLMDecoder(ScheduledIterativeDecoder):
  """Ancestral sampling of a masked-diffusion LM, with the caching trick.

  Step k of the k_b = K / N steps of a block goes from t = 1 - k / k_b to
  s = 1 - (k + 1) / k_b; each masked position is unmasked with probability
  (alpha_s - alpha_t) / (1 - alpha_t) of `schedule` (with the log-linear
  schedule 1 / (k_b - k): a position's unmasking step is uniform over the
  steps), to its proposal drawn from the SUBS probabilities; at the last step
  every remaining one is. `reuse_logits` (default on) is MDLM's caching
  trick. With block_length set this is the semi-autoregressive MDLM of
  BD3-LM's baselines.

  Attributes (besides `IterativeDecoder`'s):
    schedule: the noise schedule, one of `diffusion.SCHEDULES`.
  """

  schedule: str = "log_linear"

  def __post_init__(self):
    super().__post_init__()
    if self.schedule not in diffusion.SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r}; allowed: "
                       f"{diffusion.SCHEDULES}")

  def select(self, step: Step):
    commit = unmask_ancestral(step, self.schedule,
                              self.steps // self.num_blocks())
    return commit, jnp.zeros_like(commit)
