"""Fast-dLLM's confidence-aware parallel decoding (Wu et al. 2025).

Both decoders set their own pace inside each semi-autoregressive block: a
step commits every masked position the rule accepts, at least one (the most
confident), so a block of W positions takes between 1 and W steps and NFE
adapts to how sure the model is. Confidence is LLaDA's: the probability of
the drawn token under the softmax over the whole vocabulary. Combine with
`kv_cache="prefix"` or `"dual"` for Fast-dLLM's approximate caches.

- "threshold": commit the masked positions whose confidence exceeds tau
  (strictly: the reference's >= differs only at exact equality, and the
  strict rule keeps tau = 1 meaning one token per step even when a float32
  softmax rounds a probability to exactly 1). tau = 1 is LLaDA's
  low-confidence decoding with K = T; tau near 0 commits the whole block in
  one step.
- "factor": with the masked confidences sorted, c_1 >= c_2 >= ..., commit
  the n most confident for the largest n with (n + 1)(1 - c_n) < f (the
  paper's factor rule, from its bound on the error of parallel decoding).
- "entropy_bound": the EB-sampler (Ben-Hamu et al. 2025, arXiv:2505.24857)
  in its own masked-diffusion setting: with the masked positions sorted by
  the entropy of their softmax (whole vocabulary, as the confidence),
  commit the longest prefix whose summed entropy minus its largest is
  <= the bound (`rules.entropy_bounded`, shared with the uniform-noise
  sampler). Bound near 0 is one token per step.

The rules themselves are `rules.commit_above`, `rules.commit_factor` and
`rules.entropy_bounded`; the classes here are their configs.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.checks import is_number
from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import IterativeDecoder
from lm_decoding.decoding.rules import (
    Step, commit_above, commit_factor, entropy_bounded)
from lm_decoding.decoding.sampling import SamplingConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SelfPacedDecoder(IterativeDecoder):
  """Up to W steps per block of W; at least one commit per step."""

  sampling: SamplingConfig = SamplingConfig(temperature=0.0)

  def max_block_steps(self, width: int) -> int:
    return width


@register("threshold")
@dataclasses.dataclass(frozen=True, kw_only=True)
class ThresholdDecoder(_SelfPacedDecoder):
  """Commit every masked position with confidence > tau (see module doc).

  Attributes (besides `IterativeDecoder`'s):
    threshold: tau in (0, 1].
  """

  threshold: float = 0.9

  def __post_init__(self):
    super().__post_init__()
    if not is_number(self.threshold) or not 0 < self.threshold <= 1:
      raise ValueError(f"threshold={self.threshold!r} must be in (0, 1] "
                       "(a number)")

  def select(self, step: Step):
    commit = commit_above(step, self.threshold)
    return commit, jnp.zeros_like(commit)


@register("entropy_bound")
@dataclasses.dataclass(frozen=True, kw_only=True)
class EntropyBoundDecoder(_SelfPacedDecoder):
  """Commit the EB-sampler's set of masked positions (see module doc).

  Attributes (besides `IterativeDecoder`'s):
    entropy_bound: > 0 nats.
  """

  entropy_bound: float = 0.1

  def __post_init__(self):
    super().__post_init__()
    if not is_number(self.entropy_bound) or not self.entropy_bound > 0:
      raise ValueError(f"entropy_bound={self.entropy_bound!r} must be a "
                       "number > 0")

  def select(self, step: Step):
    commit = entropy_bounded(-step.confidence("entropy"), step.masked,
                             self.entropy_bound)
    return commit, jnp.zeros_like(commit)


@register("factor")
@dataclasses.dataclass(frozen=True, kw_only=True)
class FactorDecoder(_SelfPacedDecoder):
  """Commit the n most confident, largest n with (n + 1)(1 - c_n) < f.

  Attributes (besides `IterativeDecoder`'s):
    factor: f > 0; larger commits more per step.
  """

  factor: float = 1.0

  def __post_init__(self):
    super().__post_init__()
    if not is_number(self.factor) or not 0 < self.factor < float("inf"):
      raise ValueError(f"factor={self.factor!r} must be in (0, inf) "
                       "(a number)")

  def select(self, step: Step):
    commit = commit_factor(step, self.factor)
    return commit, jnp.zeros_like(commit)
