"""Uniform-noise diffusion decoding: DiffusionGemma's entropy-bounded sampler
(`uniform_eb`) and UDLM/Duo's ancestral sampler (`uniform_ancestral`).

A canvas of W positions starts from tokens drawn uniformly from the whole
vocabulary (no MASK) and is denoised for at most K_b steps. Step k of a
block (counted down, as the reference does: c = K_b - k, from K_b to 1):

  1. logits of the canvas (the prefix of committed tokens as context);
  2. the linear temperature schedule: processed = logits / tau_c,
     tau_c = t_min + (t_max - t_min) c / K_b (so tau = t_max at the first
     step and t_min + (t_max - t_min) / K_b at the last);
  3. every canvas position draws a token from softmax(processed) through
     `sampling` (the AR processors; temperature 1 by default);
  4. entropy-bounded acceptance (the EB-sampler, Ben-Hamu et al. 2025,
     arXiv:2505.24857): sort the positions by the entropy of
     softmax(processed), ascending, and accept the longest prefix whose
     summed entropy minus its largest stays <= `entropy_bound` (the lowest
     one is always accepted); accepted positions take their draw;
  5. renoising: every position not accepted gets a fresh uniform token;
  6. the stable-and-confident stop: a row stops when the argmax canvas of
     processed equals each of its last `stability_threshold` argmax canvases
     and the mean entropy over the canvas is < `confidence_threshold`; a
     stopped row's canvas is frozen and costs no more steps of its own;
  7. self-conditioning, for a model with that input
     (`TransformerConfig.self_conditioning`): softmax(processed) of the
     canvas is the model's `self_conditioning` input at the next step
     (zeros at a block's first step and at every prefix position), as the
     reference feeds its processed logits back and its decoder takes their
     softmax.
The block's output is the last argmax canvas. Accepted tokens are not final:
a position accepted at one step is re-predicted at the next and may be
renoised or accepted with another token (self-correction); `stats` counts
how often (`revised` of `accepted`).

As in DiffusionGemma (transformers' `DiffusionGemmaGenerationMixin`), the
output is cut into N = T / W blocks decoded left to right, each on a canvas
that sees the prompt and the committed blocks and nothing after itself.
Attention: a query in the committed prefix sees only the prefix, a query in
the canvas sees the prefix and the canvas, so the prefix's keys do not
depend on the canvas and caching them is exact: with kv_cache="prefix" one
full pass at each block start fills the KV cache (its canvas logits serve
the first step, as Fast-dLLM) and every other step runs the W canvas
positions only; kv_cache="none" runs the full [B, L] pass every step.

Deliberate differences from the reference (transformers 5.24):
  - the self-conditioning input is the probabilities, softmax(processed)
    with MASK at 0, where the reference passes the processed logits and
    its decoder takes their softmax: the same input (tested step for step);
  - the canvas starts from per-row, per-position keys (`base.row_keys`),
    so a row decodes the same alone or in a batch; the reference draws
    one torch tensor per call;
  - ties in entropy are ordered by position (a stable sort); torch.sort's
    order among equal entropies is unspecified;
  - MASK (`mask_id`) is never drawn nor output (its logit is -inf before
    the temperature, so it has no share of the entropies either), as in
    every decoder of this package; the reference's vocabulary has no MASK
    to exclude;
  - t_max == t_min (a constant temperature) is allowed; the reference
    requires t_max > t_min;
  - `nfe` counts the calls made for the batch (a call whenever any row is
    still denoising); per-row step counts are in `stats["steps"]`, the
    reference's per-row `decoder_forward_passes`.
Randomness: row b's draws at global step s and absolute position p come
from fold_in(fold_in(row_key[b], s), p), the canvas at block n's start from
fold_in(fold_in(row_key[b], 2^31 - 1), n) (`steps.CanvasSteps`).

The loop is the engine's (`engine.generate` with `steps.CanvasSteps`); the
steps are `rules.eb_canvas_step` and `rules.ancestral_canvas_step`; the
contexts `contexts.CanvasPrefix` (kv_cache="prefix") and a `contexts.FullPass`
with the canvas attention (kv_cache="none").

`uniform_ancestral` (`UniformAncestralDecoder`) runs the same canvas loop
(blocks, prefix cache, self-conditioning input, keys) with another step: no
acceptance, renoising or stop; every position draws z_s from the reverse
step q(z_s | z_t, x_theta) of the forward process (`ancestral_posterior`),
from t = 1 down to s = 0 in K_b equal steps, and the last draws are the
output (UDLM, Schiff et al. 2024; Duo, Sahoo et al. 2025).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import jax
import jax.numpy as jnp

from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding import base
from lm_decoding.decoding.base import DecodeResult, register
from lm_decoding.decoding.contexts import CanvasPrefix, FullPass
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.decoding.steps import CanvasSteps
from lm_decoding.decoding.rules import (
    Canvas, ancestral_canvas_step, eb_canvas_step)
from lm_decoding.decoding.rows import finish_at_eos
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model
from lm_decoding.models.config import token_shift


@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformCanvasDecoder(ScheduledDecoder):
  """A sampler on a uniform-noise canvas (module docstring): the canvas loop
  of `uniform_eb` and `uniform_ancestral`, which differ in their step
  (`canvas_step`).

  `steps` is the step budget over the whole output, K_b = steps / N per
  block (the reference's max_denoising_steps with one block).

  Attributes (besides `denoising.ScheduledDecoder`'s):
    t_min, t_max: the temperature schedule, 0 <= t_min <= t_max, t_max > 0
      and finite.
    kv_cache: "none" or "prefix" (module docstring); logits are never
      reused (the canvas changes at every step).
  Raises:
    ValueError: an option outside its range.
  """

  steps: int = 48
  t_min: float = 0.4
  t_max: float = 0.8
  sampling: SamplingConfig = SamplingConfig(temperature=1.0)
  kv_cache: str = "none"
  stability_threshold = 0  # argmax canvases kept (`Canvas.history`)

  def __post_init__(self):
    super().__post_init__()
    if not (is_number(self.t_min) and is_number(self.t_max)
            and 0 <= self.t_min <= self.t_max and 0 < self.t_max < math.inf):
      raise ValueError(f"t_min={self.t_min!r} and t_max={self.t_max!r} must "
                       "satisfy 0 <= t_min <= t_max, t_max > 0 and finite")
    if self.kv_cache not in ("none", "prefix"):
      raise ValueError(f"kv_cache={self.kv_cache!r}; allowed: ('none', "
                       "'prefix') (the canvas cannot see a cached suffix)")

  def context(self):
    """`contexts.CanvasPrefix` or a `FullPass` with the canvas attention."""
    if self.kv_cache == "prefix":
      return CanvasPrefix()
    return FullPass(attention="canvas")

  def step_kind(self) -> CanvasSteps:
    return CanvasSteps(self)

  def canvas_step(self, k, global_step, logits_BxWxV, canvas, start_B, keys_B,
                  vocab, steps) -> Canvas:
    """The canvas after step k of a block (global step `global_step`)."""
    raise NotImplementedError

  def run(self, models: Mapping[str, Model], prompts: jax.Array,
          prompt_lengths: jax.Array, key: jax.Array, trace: bool = False,
          measure_error: bool = False):
    """(tokens int32[B, T], cost, stats, trace records or None): the raw
    canvases; arguments and errors as `DenoisingDecoder.denoise`, and a
    token-shifted model is refused (ValueError). With `measure_error`,
    stats['max_logit_error'] float32[] is the largest |logit| difference
    between the prefix cache's canvas logits and an uncached full pass on
    the same canvas (extra, uncounted passes; 0 for kv_cache "none")."""
    out = self.denoise(models, prompts, prompt_lengths, key, trace=trace,
                       measure_error=measure_error)
    canvas = out.state
    stats = dict(accepted=canvas.accepted, revised=canvas.revised,
                 steps=canvas.steps)
    if measure_error:
      stats["max_logit_error"] = out.max_logit_error
    return out.tokens, out.cost, stats, canvas.trace

  def _check(self, models, prompts, prompt_lengths):
    prompts, prompt_lengths = super()._check(models, prompts, prompt_lengths)
    if token_shift(models["model"].logits_fn):
      raise ValueError(f"{self.registry_name} decodes models without a "
                       "token shift")
    return prompts, prompt_lengths

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Generates output_length tokens per row (module docstring).

    Returns:
      `DecodeResult`; committed int32[K, B] is W at each block's first
      step slot (its canvas is committed whole); stats: steps int32[B]
      (steps each row ran) and the subclass's (`_stats`).
    Raises:
      ValueError: as `DenoisingDecoder.denoise`.
    """
    tokens, cost, stats, _ = self.run(models, prompts, prompt_lengths, key)
    tokens, lengths = finish_at_eos(tokens, self.eos_ids, self.pad_id)
    width = self.block_size()
    steps = self.max_block_steps(width)
    committed = jnp.zeros((self.num_blocks() * steps, tokens.shape[0]),
                          jnp.int32).at[::steps].set(width)
    return base.result(tokens, lengths, committed, cost, **self._stats(stats))

  def _stats(self, stats: dict) -> dict:
    return {"steps": stats["steps"]}


@register("uniform_eb")
@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformEntropyBoundDecoder(UniformCanvasDecoder):
  """DiffusionGemma's sampler on a uniform-noise canvas (module docstring).

  Attributes (besides `UniformCanvasDecoder`'s):
    entropy_bound: > 0 nats, the EB-sampler's bound (reference default 0.1).
    t_min, t_max: reference defaults 0.4, 0.8.
    stability_threshold: >= 0 steps the argmax canvas must have held.
    confidence_threshold: > 0 nats, the mean entropy below which a stable
      row stops (reference default 0.005).
    early_stop: the stable-and-confident stop (False: every block runs its
      K_b steps).
  Raises:
    ValueError: as `UniformCanvasDecoder`, or an option above outside its
      range.
  """

  entropy_bound: float = 0.1
  stability_threshold: int = 1
  confidence_threshold: float = 0.005

  def __post_init__(self):
    super().__post_init__()
    for name in ("entropy_bound", "confidence_threshold"):
      value = getattr(self, name)
      if not is_number(value) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a number > 0")
    if not is_count(self.stability_threshold, 0):
      raise ValueError(f"stability_threshold={self.stability_threshold!r} "
                       "must be an integer >= 0")

  def canvas_step(self, *args) -> Canvas:
    return eb_canvas_step(self, *args)

  def _stats(self, stats: dict) -> dict:
    """accepted and revised int32[B] (acceptances, and those that replaced
    an earlier accepted token at the same position: the self-correction
    count), steps int32[B], self_correction float32[B] = revised /
    accepted."""
    rate = stats["revised"] / jnp.maximum(stats["accepted"], 1)
    return dict(self_correction=rate.astype(jnp.float32), **stats)


@register("uniform_ancestral")
@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformAncestralDecoder(UniformCanvasDecoder):
  """Ancestral sampling of uniform-state diffusion (UDLM, Schiff et al.
  2024, arXiv:2412.10193; Duo, Sahoo et al. 2025, arXiv:2506.10892): the
  sampler of their few-step claim. From a uniform canvas at t = 1, each of
  the K_b steps of a block draws every position from the reverse step
  q(z_s | z_t, x_theta) (`rules.ancestral_posterior`) with s = t - 1 / K_b, on
  the linear schedule alpha_t = 1 - t of the bound; the last step lands at
  s = 0 and its draws are the output. Nothing is accepted or frozen: every
  position may change at every step. No early stop; the prefix cache,
  blocks and self-conditioning as `uniform_eb`.

  Differences from the references: MASK is never drawn (its share of the
  posterior is dropped; its x_theta is 0, so the share is (1 - alpha_s) /
  V or less, except where the canvas itself holds MASK, which only the
  first step's uniform draw can), and the temperature divides the
  denoiser's logits (t_min = t_max = 1, the default, is the exact
  posterior) before the posterior is formed; temperatures below about
  1e-8 overflow the float32 posterior. `early_stop` does not apply.
  """

  t_min: float = 1.0
  t_max: float = 1.0

  def canvas_step(self, *args) -> Canvas:
    return ancestral_canvas_step(self, *args)
