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
  <= the bound (`uniform_diffusion.entropy_bounded`, shared with the
  uniform-noise sampler). Bound near 0 is one token per step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lm_decoding.checks import is_number
from lm_decoding.decoding.base import register
from lm_decoding.decoding.iterative import IterativeDecoder, Step
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.uniform_diffusion import entropy_bounded
from lm_decoding.models.selection import top_n


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SelfPacedDecoder(IterativeDecoder):
  """Up to W steps per block of W; at least one commit per step.

  Raises:
    ValueError: `steps` given (these decoders take no step budget).
  """

  sampling: SamplingConfig = SamplingConfig(temperature=0.0)

  def __post_init__(self):
    super().__post_init__()
    if self.steps is not None:
      raise ValueError(f"steps={self.steps} must be None: "
                       f"{type(self).__name__} takes as many steps as it "
                       "needs, at most block_length per block")

  def max_block_steps(self, width: int) -> int:
    return width

  def select(self, step: Step):
    confidence = step.confidence("low_confidence")
    commit = self._accept(jnp.where(step.masked, confidence, -jnp.inf),
                          step.masked)
    commit |= top_n(confidence, step.masked, 1)
    return commit, jnp.zeros_like(commit)


def commit_above(step: Step, threshold: float) -> jax.Array:
  """bool[W]: the masked positions with confidence > `threshold`, and at
  least the most confident one: threshold decoding's commit (module doc),
  for the decoders that offer it as one of their rules (BD3-LM)."""
  confidence = step.confidence("low_confidence")
  return ((step.masked & (confidence > threshold))
          | top_n(confidence, step.masked, 1))


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

  def _accept(self, confidence_W, masked_W):
    return masked_W & (confidence_W > self.threshold)


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

  def _accept(self, confidence_W, masked_W):
    sorted_W = -jnp.sort(-confidence_W)  # descending; -inf past the masked
    n_W = jnp.arange(1, sorted_W.shape[0] + 1)
    count = jnp.sum((n_W + 1) * (1.0 - sorted_W) < self.factor)
    return top_n(confidence_W, masked_W, count)
