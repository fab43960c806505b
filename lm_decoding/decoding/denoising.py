"""The denoising decoders' configs and entry points, over the engine.

`DenoisingDecoder` holds the fields every denoising decoder shares and its
entry points (`denoise`, `decode`, `cache_error`, `expected_work`); a family
says how its steps are paced (`max_block_steps`; `ScheduledDecoder`: K / N
per block), which cache context it runs (`context()`, `contexts.py`) and
which step (`step_kind()`, `steps.py`). The jitted functions here lay the
rows out (`engine.prompt_layout`) and run `engine.generate` once per call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding import debug
from lm_decoding.checks import is_count
from lm_decoding.decoding import base, rows
from lm_decoding.decoding.base import DecodeResult, id_tuple
from lm_decoding.decoding.engine import (
    Frame, Loop, check_special_ids, generate, prompt_layout)
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.steps import MaskedSteps
from lm_decoding.models import Model
from lm_decoding.models.config import token_shift
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID


@flax.struct.dataclass
class Denoised:
  """The raw outcome of the loop (before EOS handling).

  Attributes:
    tokens: int32[B, T] generated regions (`denoise`) or int32[B, L] whole
      sequences (`infill`).
    committed: int32[K, B] net tokens committed per step per row (K the
      static maximum of steps).
    cost: forward calls and positions (`base.Cost`).
    states: int32[K, B, L] the sequences after each step when traced, else
      None.
    max_logit_error: float32[] with `measure_error`, the largest |logit|
      difference between the context's window logits and an uncached full
      pass over the same tokens, over all steps (0 for an exact-by-
      construction context: a full pass); else None.
    state: the step's own state after the last block (`CanvasSteps`: the
      `rules.Canvas` with its counts and trace records).
  """

  tokens: jax.Array
  committed: jax.Array
  cost: base.Cost
  states: jax.Array | None = None
  max_logit_error: jax.Array | None = None
  state: Any = None

  @property
  def nfe(self) -> jax.Array:
    return self.cost.nfe


def _run(decoder, models, tokens_BxL, fill_BxL, valid_BxL, start_B,
         num_blocks, width, keys_B, trace, measure_error) -> Loop:
  """`generate` with the decoder's context and step (traced in a jit)."""
  frame = Frame(models=models, fill=fill_BxL, valid=valid_BxL, start=start_B,
                keys=keys_B, num_blocks=num_blocks, width=width,
                steps=decoder.max_block_steps(width),
                vocab=check_special_ids(decoder, models["model"], tokens_BxL),
                mask_id=decoder.mask_id)
  context, steps = decoder.context(), decoder.step_kind()
  loop = Loop.start(
      frame, tokens_BxL,
      context.logits_shape(frame.batch, frame.length, width, frame.vocab),
      steps.initial(frame, tokens_BxL, trace), trace)
  loop = generate(frame, context, steps, loop, measure_error)
  if trace:
    loop = loop.replace(states=loop.trace_states(tokens_BxL))
  return loop


@debug.jit(static_argnames=("decoder", "trace", "measure_error"))
def _generate(decoder, models, prompts, prompt_lengths, keys_B, trace,
              measure_error) -> Denoised:
  t = decoder.output_length
  tokens, fill, valid = prompt_layout(prompts, prompt_lengths, t,
                                      decoder.mask_id, decoder.pad_id)
  loop = _run(decoder, models, tokens, fill, valid, prompt_lengths,
              decoder.num_blocks(), decoder.block_size(), keys_B, trace,
              measure_error)
  index_BxT = prompt_lengths[:, None] + jnp.arange(t)[None, :]
  return Denoised(tokens=jnp.take_along_axis(loop.tokens, index_BxT, 1),
                  committed=loop.committed, cost=loop.cost,
                  states=loop.states,
                  max_logit_error=loop.error if measure_error else None,
                  state=loop.state)


@debug.jit(static_argnames=("decoder", "trace"))
def infill_rows(decoder, models, tokens, fill, valid, keys_B, trace
                ) -> Denoised:
  """The engine on whole sequences, `fill` positions MASK, one block."""
  tokens = jnp.where(fill, decoder.mask_id, tokens).astype(jnp.int32)
  batch, length = tokens.shape
  loop = _run(decoder, models, tokens, fill, valid,
              jnp.zeros((batch,), jnp.int32), 1, length, keys_B, trace,
              measure_error=False)
  return Denoised(tokens=loop.tokens, committed=loop.committed,
                  cost=loop.cost, states=loop.states, state=loop.state)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DenoisingDecoder:
  """Fields and entry points of every decoder on the engine.

  A family says how its steps are paced (`max_block_steps(W)`), which cache
  context it runs (`context()`, `contexts.py`) and which step
  (`step_kind()`: `MaskedSteps` or `CanvasSteps`); a masked decoder adds
  its commit rule (`select`, from `rules.py`).

  Attributes:
    output_length: T, tokens generated per row (>= 1).
    block_length: semi-autoregressive block length dividing output_length,
      or None for one block of T.
    sampling: how each position's proposal is drawn (the AR processors;
      temperature 0 is argmax); MASK is never drawn.
    reuse_logits: skip the call when no row changed (MDLM's caching trick;
      never for the canvas, which changes at every step).
    early_stop: end a block as soon as the step says it is done (no masked
      position; a stopped canvas row), else run its whole step budget.
    mask_id, pad_id: MASK and PAD token ids.
    eos_ids: ids that end a row.

  Raises:
    ValueError: an option outside its range (checked at construction, so
      before anything compiles).
  """

  roles = ("model",)

  output_length: int
  block_length: int | None = None
  sampling: SamplingConfig = SamplingConfig(temperature=1.0)
  reuse_logits: bool = True
  early_stop: bool = True
  mask_id: int = MASK_ID
  pad_id: int = PAD_ID
  eos_ids: tuple[int, ...] = (EOS_ID,)

  def __post_init__(self):
    object.__setattr__(self, "eos_ids", id_tuple(self.eos_ids))
    if not is_count(self.output_length):
      raise ValueError(f"output_length={self.output_length!r} must be an "
                       "integer >= 1")
    if not isinstance(self.sampling, SamplingConfig):
      raise ValueError(f"sampling={self.sampling!r} must be a SamplingConfig")
    if self.sampling.repetition_penalty != 1:
      raise ValueError(f"sampling.repetition_penalty="
                       f"{self.sampling.repetition_penalty} must be 1: "
                       "parallel decoders draw every position at once")
    for name in ("reuse_logits", "early_stop"):
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ValueError(f"{name}={getattr(self, name)!r} must be True or "
                         "False")
    if min(self.mask_id, self.pad_id, *self.eos_ids) < 0:
      raise ValueError(f"mask_id={self.mask_id}, pad_id={self.pad_id} and "
                       f"eos_ids={self.eos_ids} must be >= 0")
    if self.mask_id == self.pad_id or self.mask_id in self.eos_ids:
      raise ValueError(f"mask_id={self.mask_id} must differ from pad_id="
                       f"{self.pad_id} and eos_ids={self.eos_ids}")
    block = self.block_size()
    if not is_count(block) or self.output_length % block:
      raise ValueError(f"block_length={self.block_length!r} must be in "
                       f"[1, {self.output_length}] and divide "
                       f"output_length={self.output_length}")

  def block_size(self) -> int:
    """W, the length of one block of the generated region."""
    return self.output_length if self.block_length is None else self.block_length

  def num_blocks(self) -> int:
    return self.output_length // self.block_size()

  def max_block_steps(self, width: int) -> int:
    """Static step budget of one block of `width` positions."""
    raise NotImplementedError

  def context(self):
    """The cache context this config runs (`contexts.py`)."""
    raise NotImplementedError

  def step_kind(self):
    """The step this config runs: `MaskedSteps(self)` unless overridden."""
    return MaskedSteps(self)

  def expected_work(self, batch: int, prompt_width: int) -> base.Work:
    """The work of one decode at B = `batch`, P = `prompt_width`, from the
    options alone: the context's forward positions at the full step budget
    (exact for a scheduled decoder that never skips a call; an upper bound
    for a self-paced one or one reusing logits) and B W drawn positions per
    step."""
    width = self.block_size()
    steps = self.max_block_steps(width)
    forward = self.context().forward_tokens(batch, prompt_width,
                                            self.output_length, width, steps)
    return base.Work(forward, self.num_blocks() * steps * batch * width)

  def _check(self, models, prompts, prompt_lengths):
    """(prompts, prompt_lengths) checked before tracing (see `denoise`)."""
    base.check_models(self, models)
    prompts, prompt_lengths = rows.check_prompts(
        prompts, prompt_lengths,
        needs_prompt=token_shift(models["model"].logits_fn))
    width = prompts.shape[1]
    max_len = models["model"].logits_fn.max_len
    if width + self.output_length > max_len:
      raise ValueError(
          f"prompt width P={width} + output_length={self.output_length} must "
          f"be <= logits_fn.max_len={max_len}")
    base.check_token_ids("prompts", prompts, models["model"])
    base.check_token_ids("mask_id and pad_id", (self.mask_id, self.pad_id),
                         models["model"])
    return prompts, prompt_lengths

  def denoise(self, models: Mapping[str, Model], prompts: jax.Array,
              prompt_lengths: jax.Array, key: jax.Array, trace: bool = False,
              measure_error: bool = False) -> Denoised:
    """Runs the loop on prompted rows, before EOS handling.

    Args:
      models: {"model": Model(logits_fn, params)}, the denoiser.
      prompts: int32[B, P] right-padded prompts (P may be 0).
      prompt_lengths: int32[B] in [0, P] (in [1, P] for a token-shifted
        model); all 0 for unconditional samples.
      key: PRNG key, or one per row (`base.row_keys`).
      trace: also return the sequences after every step (`states`).
      measure_error: also record the largest logit difference between the
        context's logits and an uncached pass (extra, uncounted passes).
    Returns:
      `Denoised` with tokens int32[B, T] (the raw generated regions).
    Raises:
      ValueError: models not binding "model"; prompts not int[B, P],
        prompt_lengths not [B] or (when concrete) outside [0, P], or
        P + output_length > logits_fn.max_len; mask_id or pad_id >= V.
    """
    prompts, prompt_lengths = self._check(models, prompts, prompt_lengths)
    return _generate(self, models, prompts, prompt_lengths,
                     base.row_keys(key, prompts.shape[0]), trace,
                     measure_error)

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Generates output_length tokens per row (see `denoise` for the arguments).

    Returns:
      `DecodeResult`: tokens int32[B, T] cut after the first EOS, lengths
      int32[B], nfe, committed int32[K, B], calls and forward_tokens.
    Raises:
      ValueError: as `denoise`.
    """
    out = self.denoise(models, prompts, prompt_lengths, key)
    tokens, lengths = rows.finish_at_eos(out.tokens, self.eos_ids,
                                         self.pad_id)
    return base.result(tokens, lengths, out.committed, out.cost)

  def cache_error(self, models: Mapping[str, Model], prompts: jax.Array,
                  prompt_lengths: jax.Array, key: jax.Array) -> jax.Array:
    """float32[]: the largest |logit| difference between this decode's
    context and exact full passes over the same tokens (`denoise` with
    `measure_error`; arguments and errors as `denoise`)."""
    return self.denoise(models, prompts, prompt_lengths, key,
                        measure_error=True).max_logit_error


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduledDecoder(DenoisingDecoder):
  """A denoising decoder spending K / N steps on each of its N blocks.

  Attributes (besides `DenoisingDecoder`'s):
    steps: K, the step budget over the whole output, a multiple of N.

  Raises:
    ValueError: steps missing, or not a multiple of the number of blocks
      N = output_length / block_length.
  """

  steps: int | None = None

  def __post_init__(self):
    super().__post_init__()
    if self.steps is not None and not is_count(self.steps):
      raise ValueError(f"steps={self.steps!r} must be an integer >= 1")
    if self.steps is None or self.steps % self.num_blocks():
      raise ValueError(f"steps={self.steps} must be a multiple of the number "
                       f"of blocks output_length / block_length = "
                       f"{self.num_blocks()}")

  def max_block_steps(self, width: int) -> int:
    del width
    return self.steps // self.num_blocks()
