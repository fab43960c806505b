"""A per-request router between AR, parallel and speculative decoding.

Deployed systems switch between decoders by request rather than pick one
(the "dynamic switching" hybrid of issue 7): a short request or a loose
latency budget can afford sequential AR decoding, a long one under a tight
budget needs a decoder with a fixed number of parallel steps, and a lossless
accelerator (speculative decoding) is worth it only where it is faster than
AR on the hardware at hand. `route` is that policy as a pure function of
measured cost curves:

  1. each decoder's latency at the requested output length T is
     interpolated from the latencies the harness measured (piecewise linear
     in T, extrapolated from the end segments: AR and speculative decoding
     are linear in T, a fixed-step parallel decoder nearly flat);
  2. difficulty shifts the curves: on a HARD request (difficulty above
     `RouterConfig.hard_entropy`) a lossy decoder's gen-PPL is multiplied by
     `hard_quality_penalty` (parallel drafts of a spread-out next-token
     distribution break more under the conditional-independence assumption)
     and a speculative decoder's latency by `hard_latency_factor` (its
     acceptance rate falls when the target is unsure);
  3. among the decoders whose predicted latency is within the budget, the
     best quality (lowest gen-PPL; ties: the faster); if none fits, the
     fastest.

The difficulty signal is the AR target's mean next-token entropy over the
prompt (`prompt_entropy`, one forward pass), in nats.

Where a decoder was not measured on the hardware at hand, `predicted_curve`
builds its curve from the analytic cost model (`cost_model`) and
`with_predictions` adds such curves for the decoders missing from the
measured ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding import rows
from lm_decoding.evaluation import cost_model
from lm_decoding.models import Model
from lm_decoding.models.config import TransformerConfig

KINDS = ("ar", "parallel", "speculative")


@dataclasses.dataclass(frozen=True)
class CostCurve:
  """One decoder's measured cost and quality.

  Attributes:
    name: the decoder's label (what `route` returns).
    kind: one of `KINDS`; "ar" and "speculative" are lossless (the output
      distribution is the AR target's), "parallel" is not.
    lengths: output lengths T the latency was measured at, strictly
      increasing, >= 2 points.
    latency_ms: float ms per request at each of `lengths`, >= 0.
    gen_ppl: quality, the evaluator's gen-PPL of the decoder's samples
      (lower is better), > 0.

  Raises:
    ValueError: an attribute outside its range (the message names it).
  """

  name: str
  kind: str
  lengths: tuple[int, ...]
  latency_ms: tuple[float, ...]
  gen_ppl: float

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind={self.kind!r}; allowed: {KINDS}")
    if (len(self.lengths) < 2
        or not all(is_count(t) for t in self.lengths)
        or any(a >= b for a, b in zip(self.lengths, self.lengths[1:]))):
      raise ValueError(f"lengths={self.lengths!r} must be >= 2 strictly "
                       "increasing integers >= 1")
    if (len(self.latency_ms) != len(self.lengths)
        or not all(is_number(m) and 0 <= m < math.inf
                   for m in self.latency_ms)):
      raise ValueError(f"latency_ms={self.latency_ms!r} must be one finite "
                       f"number >= 0 per length ({len(self.lengths)})")
    if not (is_number(self.gen_ppl) and 0 < self.gen_ppl < math.inf):
      raise ValueError(f"gen_ppl={self.gen_ppl!r} must be in (0, inf)")

  def latency_at(self, output_length: int) -> float:
    """Predicted ms at output length T: piecewise linear through the
    measured points, extrapolated from the first or last segment, >= 0."""
    t, ms = self.lengths, self.latency_ms
    if output_length <= t[0]:
      i = 0
    elif output_length >= t[-1]:
      i = len(t) - 2
    else:
      return float(np.interp(output_length, t, ms))
    slope = (ms[i + 1] - ms[i]) / (t[i + 1] - t[i])
    return max(0.0, ms[i] + slope * (output_length - t[i]))


@dataclasses.dataclass(frozen=True)
class RouterConfig:
  """How difficulty shifts the choice (module docstring, step 2).

  Attributes:
    hard_entropy: nats; a request whose difficulty is above it is hard.
    hard_quality_penalty: >= 1, multiplies a parallel decoder's gen-PPL on a
      hard request.
    hard_latency_factor: >= 1, multiplies a speculative decoder's latency on
      a hard request.

  Raises:
    ValueError: an attribute outside its range.
  """

  hard_entropy: float = 4.0
  hard_quality_penalty: float = 1.5
  hard_latency_factor: float = 1.5

  def __post_init__(self):
    if not (is_number(self.hard_entropy) and self.hard_entropy >= 0):
      raise ValueError(f"hard_entropy={self.hard_entropy!r} must be >= 0")
    for name in ("hard_quality_penalty", "hard_latency_factor"):
      value = getattr(self, name)
      if not (is_number(value) and 1 <= value < math.inf):
        raise ValueError(f"{name}={value!r} must be in [1, inf)")


def predicted_curve(name: str, kind: str, gen_ppl: float,
                    lengths: Sequence[int], config: TransformerConfig,
                    batch_size: int, prompt_length: int,
                    profile: cost_model.HardwareProfile,
                    steps: int | None = None,
                    block_length: int | None = None) -> CostCurve:
  """A `CostCurve` from the cost model instead of measurements.

  "ar": `cost_model.ar_decode_s`; "parallel": `cost_model.parallel_decode_s`
  with `steps` (and `block_length`) at each length. Speculative decoding's
  latency depends on its acceptance rate, which the cost model does not
  predict: measure it.

  Args:
    name, kind, gen_ppl: as `CostCurve` (gen_ppl: an expected quality, e.g.
      measured on another machine: quality does not depend on hardware).
    lengths: output lengths T to predict at (as `CostCurve.lengths`).
    config: the model (the denoiser's, for "parallel").
    batch_size: B, >= 1.
    prompt_length: P, >= 1.
    profile: the hardware.
    steps: K, required for "parallel" (>= 1), else None.
    block_length: see `cost_model.parallel_decode_s`; "parallel" only.
  Raises:
    ValueError: kind "speculative" or not in `KINDS`; steps given for "ar"
      or missing for "parallel"; as the cost model's functions and
      `CostCurve`.
  """
  if kind == "ar" and steps is None and block_length is None:
    seconds = [cost_model.ar_decode_s(config, batch_size, prompt_length, t,
                                      profile) for t in lengths]
  elif kind == "parallel" and steps is not None:
    seconds = [cost_model.parallel_decode_s(config, batch_size, prompt_length,
                                            t, steps, profile, block_length)
               for t in lengths]
  else:
    raise ValueError(f"kind={kind!r} with steps={steps!r}: the cost model "
                     "predicts 'ar' (no steps) and 'parallel' (steps >= 1)")
  return CostCurve(name, kind, tuple(lengths),
                   tuple(s * 1e3 for s in seconds), gen_ppl)


def with_predictions(measured: Sequence[CostCurve],
                     predicted: Sequence[CostCurve]) -> tuple[CostCurve, ...]:
  """The measured curves plus each predicted curve whose name was not
  measured (a measurement wins over a prediction)."""
  names = {c.name for c in measured}
  return tuple(measured) + tuple(c for c in predicted if c.name not in names)


def predicted(curve: CostCurve, output_length: int, difficulty: float,
              config: RouterConfig) -> tuple[float, float]:
  """(latency ms, gen-PPL) `route` expects of `curve` on a request."""
  latency, ppl = curve.latency_at(output_length), curve.gen_ppl
  if difficulty > config.hard_entropy:
    if curve.kind == "parallel":
      ppl *= config.hard_quality_penalty
    if curve.kind == "speculative":
      latency *= config.hard_latency_factor
  return latency, ppl


def route(curves: Sequence[CostCurve], output_length: int, budget_ms: float,
          difficulty: float, config: RouterConfig = RouterConfig()) -> str:
  """The decoder for one request (module docstring): the best predicted
  quality within the budget, else the fastest.

  Args:
    curves: the candidate decoders, names distinct.
    output_length: T, tokens requested, >= 1.
    budget_ms: latency budget in ms, > 0.
    difficulty: the request's difficulty signal (nats, `prompt_entropy`).
    config: how difficulty shifts the curves.
  Returns:
    The chosen curve's name.
  Raises:
    ValueError: no curves, repeated names, T < 1, budget <= 0, difficulty
      not a finite number.
  """
  names = [c.name for c in curves]
  if not names or len(set(names)) != len(names):
    raise ValueError(f"curves must be non-empty with distinct names, got "
                     f"{names}")
  if not is_count(output_length):
    raise ValueError(f"output_length={output_length!r} must be an integer "
                     ">= 1")
  if not (is_number(budget_ms) and budget_ms > 0):
    raise ValueError(f"budget_ms={budget_ms!r} must be > 0")
  if not (is_number(difficulty) and math.isfinite(difficulty)):
    raise ValueError(f"difficulty={difficulty!r} must be a finite number")
  expected = {c.name: predicted(c, output_length, difficulty, config)
              for c in curves}
  fits = [n for n in names if expected[n][0] <= budget_ms]
  if fits:
    return min(fits, key=lambda n: (expected[n][1], expected[n][0]))
  return min(names, key=lambda n: expected[n][0])


@jax.jit
def _entropy(model: Model, prompts_BxP, prompt_lengths_B):
  batch, width = prompts_BxP.shape
  positions_BxP = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32),
                                   (batch, width))
  logits = model.logits_fn(model.params, prompts_BxP, positions_BxP).logits
  log_p_BxPxV = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  entropy_BxP = -jnp.sum(jnp.exp(log_p_BxPxV) * log_p_BxPxV, -1)
  valid_BxP = jnp.arange(width)[None, :] < prompt_lengths_B[:, None]
  return (jnp.where(valid_BxP, entropy_BxP, 0.0).sum(1)
          / prompt_lengths_B.astype(jnp.float32))


def prompt_entropy(model: Model, prompts: jax.Array,
                   prompt_lengths: jax.Array) -> jax.Array:
  """float32[B]: the mean next-token entropy (nats) of a causal model over
  each prompt's positions, in one uncached forward pass: the difficulty
  signal of `route`.

  Args:
    model: a causal LM (e.g. the AR target).
    prompts: int32[B, P] right-padded prompts.
    prompt_lengths: int32[B] real tokens per row, in [1, P].
  Raises:
    ValueError: as `rows.check_prompts` (prompts int[B, P],
      lengths int[B] in [1, P]).
  """
  prompts, prompt_lengths = rows.check_prompts(prompts, prompt_lengths,
                                                needs_prompt=True)
  return _entropy(model, prompts.astype(jnp.int32),
                  prompt_lengths.astype(jnp.int32))
