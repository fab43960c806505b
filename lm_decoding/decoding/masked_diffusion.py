"""Masked-diffusion (parallel) decoding: MDLM ancestral sampling and LLaDA.

Both decoders fill MASK positions of a fixed-length sequence in K steps; each
step makes (at most) one full bidirectional forward pass over the whole
sequence and commits many positions at once. A committed token never changes.

Layout. With right-padded prompts int32[B, P] and prompt_lengths int32[B],
every row is laid out in a static length L = P + T (T = gen_length) as
[prompt | T MASK | PAD], positions arange(L), and PAD keys masked out
(`input_mask`). Worked example, P = 3, T = 4, M = MASK, _ = PAD:

    prompts [[7, 8, 9], [5, _, _]], prompt_lengths [3, 1]
    row 0:  7 8 9 M M M M      generated region: positions 3..6
    row 1:  5 M M M M _ _      generated region: positions 1..4
    input_mask row 1: 1 1 1 1 1 0 0

Unconditional generation is prompt_lengths all 0. After K steps the generated
regions are gathered into int32[B, T], and tokens after a row's first EOS
become PAD (`finish_at_eos`).

Step. The update of ONE sequence is written once per decoder (`_update`) and
`jax.vmap`-ed over the batch; `lax.scan` iterates it K times under `jax.jit`
with the decoder config static. The denoiser has no time input, so its logits
depend on the tokens alone: when no row changed in a step, the next step
reuses the previous logits instead of calling the model (MDLM's caching
trick, Sahoo et al. 2024). NFE counts the calls actually made for the batch:
one call whenever ANY row changed, so a batch may cost more calls than its
rows alone.

- "mdlm" (Sahoo et al. 2024): ancestral sampling over t_k = 1 - k/K with the
  log-linear schedule; from t to s each masked position is unmasked with
  probability (alpha_s - alpha_t) / (1 - alpha_t) (everything left at the
  last step) to a token drawn from the SUBS probabilities.
- "llada" (Nie et al. 2025): semi-autoregressive blocks of the generated
  region decoded left to right, K / num_blocks steps each; every step predicts
  all masked positions of the current block and commits the
  `transfer_schedule` count of them with the highest confidence (probability
  of the drawn token: low-confidence remasking) or at random (random
  remasking); the rest stay masked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding.base import (
    DecodeResult, LogitsFn, id_tuple, is_count, register)
from lm_decoding.decoding.sampling import categorical
from lm_decoding.decoding.schedule import transfer_schedule
from lm_decoding.models.heads import subs_log_probs
from lm_decoding.training.schedules import log_linear_alpha

REMASKING = ("low_confidence", "random")


@flax.struct.dataclass
class Denoised:
  """The raw outcome of K denoising steps (before EOS handling).

  Attributes:
    tokens: int32[B, T] generated regions (`denoise`) or int32[B, L] whole
      sequences (`infill`); no MASK left.
    nfe: int32[] logits_fn calls made for the batch.
    committed: int32[K, B] tokens committed per step per row.
    states: int32[K, B, L] the sequences after each step when traced, else
      None.
  """

  tokens: jax.Array
  nfe: jax.Array
  committed: jax.Array
  states: jax.Array | None


@flax.struct.dataclass
class _Plan:
  """What one row decodes when (leading axis B in the batch).

  Attributes:
    fill: bool[L] positions to decode.
    block: int32[L] block of each fill position (-1 elsewhere).
    schedule: int32[K] positions to commit at each step (LLaDA).
    step_block: int32[K] the block decoded at each step.
  """

  fill: jax.Array
  block: jax.Array
  schedule: jax.Array
  step_block: jax.Array


def prompt_layout(prompts: jax.Array, prompt_lengths: jax.Array,
                  gen_length: int, mask_id: int, pad_id: int):
  """Lays out [prompt | gen_length MASK | PAD] rows (see the module docstring).

  Args:
    prompts: int32[B, P] right-padded prompts.
    prompt_lengths: int32[B] real prompt tokens per row, in [0, P].
    gen_length: T, MASK positions per row.
    mask_id, pad_id: MASK and PAD token ids.
  Returns:
    tokens: int32[B, P + T]; fill: bool[B, P + T] the generated region;
    input_mask: bool[B, P + T] False on the PAD tail.
  """
  prompts = jnp.asarray(prompts, jnp.int32)
  lengths_Bx1 = jnp.asarray(prompt_lengths, jnp.int32)[:, None]
  index_L = jnp.arange(prompts.shape[1] + gen_length)
  padded_BxL = jnp.pad(prompts, ((0, 0), (0, gen_length)),
                       constant_values=pad_id)
  in_prompt = index_L < lengths_Bx1
  input_mask = index_L < lengths_Bx1 + gen_length
  fill = input_mask & ~in_prompt
  tokens = jnp.where(in_prompt, padded_BxL,
                     jnp.where(fill, mask_id, pad_id)).astype(jnp.int32)
  return tokens, fill, input_mask


def _eos_mask(tokens: jax.Array, eos_ids: tuple[int, ...]) -> jax.Array:
  if not eos_ids:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32))


def finish_at_eos(tokens: jax.Array, eos_ids: tuple[int, ...], pad_id: int):
  """Cuts rows after their first EOS.

  Args:
    tokens: int32[B, T] generated tokens.
    eos_ids: ids that end a row (empty: no row ends early).
    pad_id: id written after a row's first EOS.
  Returns:
    tokens: int32[B, T] with PAD after the first EOS (the EOS is kept);
    lengths: int32[B] tokens up to and including the first EOS (T if none).
  """
  is_eos = _eos_mask(tokens, eos_ids)
  t = tokens.shape[1]
  lengths = jnp.where(is_eos.any(1), jnp.argmax(is_eos, 1) + 1,
                      t).astype(jnp.int32)
  keep = jnp.arange(t)[None, :] < lengths[:, None]
  return jnp.where(keep, tokens, pad_id).astype(jnp.int32), lengths


def eos_counts(tokens: jax.Array, eos_ids: tuple[int, ...]):
  """Counts degenerate outputs of a decoder (for the quality report).

  Args:
    tokens: int32[B, T] raw generated tokens (`Denoised.tokens`, before
      `finish_at_eos`, which turns an all-EOS row into an empty one).
    eos_ids: ids that end a row.
  Returns:
    (empty, all_eos): int32[] rows whose first token is EOS (empty outputs)
    and rows that are EOS at every position.
  """
  is_eos = _eos_mask(tokens, eos_ids)
  return (jnp.sum(is_eos[:, 0], dtype=jnp.int32),
          jnp.sum(is_eos.all(1), dtype=jnp.int32))


def _make_plan(fill_BxL: jax.Array, block_BxL: jax.Array, num_blocks: int,
               steps: int) -> _Plan:
  """Per-row plan: each block gets steps / num_blocks steps in order."""
  batch = fill_BxL.shape[0]
  per_block = steps // num_blocks
  in_block_BxNxL = (block_BxL[:, None, :] ==
                    jnp.arange(num_blocks)[None, :, None]) & fill_BxL[:, None]
  counts_BxN = jnp.sum(in_block_BxNxL, -1, dtype=jnp.int32)
  schedule_BxNxS = jax.vmap(jax.vmap(
      lambda n: transfer_schedule(n, per_block)))(counts_BxN)
  step_block = jnp.arange(steps, dtype=jnp.int32) // per_block
  return _Plan(fill=fill_BxL, block=block_BxL,
               schedule=schedule_BxNxS.reshape(batch, steps),
               step_block=jnp.broadcast_to(step_block, (batch, steps)))


def _draw(key: jax.Array, log_probs_LxV: jax.Array,
          temperature: float) -> jax.Array:
  """int32[L] proposals from log-probs at `temperature` (0: argmax)."""
  if temperature == 0:
    return jnp.argmax(log_probs_LxV, -1).astype(jnp.int32)
  return categorical(key, log_probs_LxV / temperature)


def _denoise(decoder, logits_fn, params, tokens_BxL, plan, input_mask_BxL,
             key, trace):
  """K steps of `decoder._update` over the batch (traced inside a jit)."""
  batch, length = tokens_BxL.shape
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                   (batch, length))

  def call(tokens):
    logits, _ = logits_fn(params, tokens, positions_BxL, None, input_mask_BxL)
    return logits.astype(jnp.float32)

  update_B = jax.vmap(decoder._update, in_axes=(None, 0, 0, 0, 0))

  def step(carry, k):
    tokens, logits, stale, nfe = carry
    if decoder.use_cache:
      logits = jax.lax.cond(stale, call, lambda _: logits, tokens)
      nfe += stale.astype(jnp.int32)
    else:
      logits, nfe = call(tokens), nfe + 1
    keys = jax.random.split(jax.random.fold_in(key, k), batch)
    new_tokens = update_B(k, logits, tokens, plan, keys)
    committed_B = jnp.sum(new_tokens != tokens, 1, dtype=jnp.int32)
    carry = (new_tokens, logits, jnp.any(committed_B > 0), nfe)
    return carry, (committed_B, new_tokens if trace else None)

  logits = jnp.zeros(jax.eval_shape(call, tokens_BxL).shape, jnp.float32)
  vocab = logits.shape[-1]
  for name in ("mask_id", "pad_id"):
    if getattr(decoder, name) >= vocab:
      raise ValueError(f"{name}={getattr(decoder, name)} must be < vocab size "
                       f"{vocab}")
  init = (tokens_BxL, logits, jnp.bool_(True), jnp.int32(0))
  (tokens, _, _, nfe), (committed, states) = jax.lax.scan(
      step, init, jnp.arange(decoder.steps, dtype=jnp.int32))
  return Denoised(tokens=tokens, nfe=nfe, committed=committed, states=states)


@functools.partial(jax.jit, static_argnames=("decoder", "logits_fn", "trace"))
def _generate(decoder, logits_fn, params, prompts, prompt_lengths, key, trace):
  t = decoder.gen_length
  tokens, fill, input_mask = prompt_layout(prompts, prompt_lengths, t,
                                           decoder.mask_id, decoder.pad_id)
  offset_BxL = jnp.arange(tokens.shape[1]) - prompt_lengths[:, None]
  block_length = decoder.block_size()
  block = jnp.where(fill, offset_BxL // block_length, -1).astype(jnp.int32)
  plan = _make_plan(fill, block, t // block_length, decoder.steps)
  out = _denoise(decoder, logits_fn, params, tokens, plan, input_mask, key,
                 trace)
  index_BxT = prompt_lengths[:, None] + jnp.arange(t)[None, :]
  return out.replace(tokens=jnp.take_along_axis(out.tokens, index_BxT, 1))


@functools.partial(jax.jit, static_argnames=("decoder", "logits_fn", "trace"))
def _infill(decoder, logits_fn, params, tokens, fill, input_mask, key, trace):
  tokens = jnp.where(fill, decoder.mask_id, tokens).astype(jnp.int32)
  plan = _make_plan(fill, jnp.where(fill, 0, -1).astype(jnp.int32), 1,
                    decoder.steps)
  return _denoise(decoder, logits_fn, params, tokens, plan, input_mask, key,
                  trace)


def _check_range(name: str, values: jax.Array, low: int, high: int):
  if isinstance(values, jax.core.Tracer):
    return
  values = np.asarray(values)
  if values.size and (values.min() < low or values.max() > high):
    raise ValueError(f"{name} must lie in [{low}, {high}]; got {values}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MaskedDiffusionDecoder:
  """Fields and entry points shared by the masked-diffusion decoders.

  Attributes:
    gen_length: T, tokens generated per row (>= 1).
    steps: K, denoising steps (>= 1).
    temperature: sampling temperature (>= 0; 0 is argmax).
    use_cache: reuse the logits when no row changed in a step.
    mask_id, pad_id: MASK and PAD token ids.
    eos_ids: ids that end a row.

  Raises:
    ValueError: an option outside its range (checked at construction, so
      before anything compiles).
  """

  gen_length: int
  steps: int
  temperature: float = 1.0
  use_cache: bool = True
  mask_id: int = 4
  pad_id: int = 0
  eos_ids: tuple[int, ...] = (3,)

  def __post_init__(self):
    object.__setattr__(self, "eos_ids", id_tuple(self.eos_ids))
    for name in ("gen_length", "steps"):
      value = getattr(self, name)
      if not is_count(value):
        raise ValueError(f"{name}={value} must be an integer >= 1")
    if not 0 <= self.temperature < math.inf:
      raise ValueError(f"temperature={self.temperature} must be in [0, inf)")
    if min(self.mask_id, self.pad_id, *self.eos_ids) < 0:
      raise ValueError(f"mask_id={self.mask_id}, pad_id={self.pad_id} and "
                       f"eos_ids={self.eos_ids} must be >= 0")
    if self.mask_id == self.pad_id or self.mask_id in self.eos_ids:
      raise ValueError(f"mask_id={self.mask_id} must differ from pad_id="
                       f"{self.pad_id} and eos_ids={self.eos_ids}")

  def block_size(self) -> int:
    """Length of one semi-autoregressive block of the generated region."""
    return self.gen_length

  def denoise(self, logits_fn: LogitsFn, params: Any, prompts: jax.Array,
              prompt_lengths: jax.Array, key: jax.Array,
              trace: bool = False) -> Denoised:
    """Runs the K steps on prompted rows, before EOS handling.

    Args:
      logits_fn: the bidirectional denoiser (see `base.LogitsFn`).
      params: its parameters.
      prompts: int32[B, P] right-padded prompts (P may be 0).
      prompt_lengths: int32[B] in [0, P]; all 0 for unconditional samples.
      key: PRNG key.
      trace: also return the sequences after every step (`states`).
    Returns:
      `Denoised` with tokens int32[B, T] (the raw generated regions).
    Raises:
      ValueError: prompts not int[B, P], prompt_lengths not [B] or (when
        concrete) outside [0, P], or P + gen_length > logits_fn.max_len.
    """
    prompts = jnp.asarray(prompts)
    if prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer):
      raise ValueError(f"prompts must be int[B, P]; got {prompts.shape} "
                       f"{prompts.dtype}")
    prompts = prompts.astype(jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths)
    if not jnp.issubdtype(prompt_lengths.dtype, jnp.integer):
      raise ValueError(f"prompt_lengths must be int[B]; got "
                       f"{prompt_lengths.dtype}")
    prompt_lengths = prompt_lengths.astype(jnp.int32)
    batch, width = prompts.shape
    if prompt_lengths.shape != (batch,):
      raise ValueError(f"prompt_lengths must have shape ({batch},); got "
                       f"{prompt_lengths.shape}")
    _check_range("prompt_lengths", prompt_lengths, 0, width)
    if width + self.gen_length > logits_fn.max_len:
      raise ValueError(
          f"prompt width P={width} + gen_length={self.gen_length} must be <= "
          f"logits_fn.max_len={logits_fn.max_len}")
    return _generate(self, logits_fn, params, prompts, prompt_lengths, key,
                     trace)

  def decode(self, logits_fn: LogitsFn, params: Any, prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Generates gen_length tokens per row (see `denoise` for the arguments).

    Returns:
      `DecodeResult`: tokens int32[B, T] cut after the first EOS, lengths
      int32[B], nfe int32[], committed int32[K, B].
    Raises:
      ValueError: as `denoise`.
    """
    out = self.denoise(logits_fn, params, prompts, prompt_lengths, key)
    tokens, lengths = finish_at_eos(out.tokens, self.eos_ids, self.pad_id)
    return DecodeResult(tokens=tokens, lengths=lengths, nfe=out.nfe,
                        committed=out.committed)

  def infill(self, logits_fn: LogitsFn, params: Any, tokens: jax.Array,
             fill_mask: jax.Array, key: jax.Array,
             input_mask: jax.Array | None = None,
             trace: bool = False) -> Denoised:
    """Fills the positions `fill_mask` marks, keeping every other token.

    The fill positions of a row form one block (no semi-autoregressive
    blocks); no EOS handling.

    Args:
      logits_fn, params, key, trace: as `denoise`.
      tokens: int32[B, L] sequences (their tokens at fill positions are
        ignored).
      fill_mask: bool[B, L] positions to decode.
      input_mask: optional bool[B, L] valid keys (default all).
    Returns:
      `Denoised` with tokens int32[B, L]: `tokens` with the holes filled.
    Raises:
      ValueError: tokens not int[B, L], fill_mask or input_mask of another
        shape, or L > logits_fn.max_len.
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"tokens must be int[B, L]; got {tokens.shape} "
                       f"{tokens.dtype}")
    tokens = tokens.astype(jnp.int32)
    if input_mask is None:
      input_mask = jnp.ones(tokens.shape, bool)
    for name, value in (("fill_mask", fill_mask), ("input_mask", input_mask)):
      if jnp.shape(value) != tokens.shape:
        raise ValueError(f"{name} must have shape {tokens.shape}; got "
                         f"{jnp.shape(value)}")
    if tokens.shape[1] > logits_fn.max_len:
      raise ValueError(f"tokens length L={tokens.shape[1]} must be <= "
                       f"logits_fn.max_len={logits_fn.max_len}")
    return _infill(self, logits_fn, params, tokens,
                   jnp.asarray(fill_mask, bool), jnp.asarray(input_mask, bool),
                   key, trace)


@register("mdlm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class MDLMDecoder(_MaskedDiffusionDecoder):
  """MDLM ancestral sampler (Sahoo et al. 2024) with the caching trick.

  Step k of K goes from t = 1 - k/K to s = 1 - (k+1)/K of the log-linear
  schedule; a masked position is unmasked with probability
  (alpha_s - alpha_t) / (1 - alpha_t) (= 1 / (K - k) here, so a position's
  unmasking step is uniform over the K steps), and at the last step every
  remaining one is.
  """

  def _update(self, k, logits_LxV, tokens_L, plan, key):
    """Step k for ONE sequence: (float32[L, V], int32[L]) -> int32[L]."""
    key_draw, key_unmask = jax.random.split(key)
    t = 1.0 - k / self.steps
    s = 1.0 - (k + 1) / self.steps
    alpha_t, alpha_s = log_linear_alpha(t), log_linear_alpha(s)
    p_unmask = jnp.where(k == self.steps - 1, 1.0,
                         (alpha_s - alpha_t) / (1.0 - alpha_t))
    log_probs = subs_log_probs(logits_LxV, tokens_L, self.mask_id)
    masked = plan.fill & (tokens_L == self.mask_id)
    unmask = masked & (jax.random.uniform(key_unmask, tokens_L.shape) <
                       p_unmask)
    drawn = _draw(key_draw, log_probs, self.temperature)
    return jnp.where(unmask, drawn, tokens_L)


@register("llada")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LLaDADecoder(_MaskedDiffusionDecoder):
  """LLaDA sampling (Nie et al. 2025): blocks, schedule, remasking.

  Attributes (besides the shared ones):
    block_length: semi-autoregressive block length dividing gen_length, with
      steps divisible by the number of blocks; None is one block.
    remasking: 'low_confidence' (commit the most probable drawn tokens) or
      'random' (commit random masked positions).
    temperature: default 0 (argmax), as in LLaDA.

  Raises:
    ValueError: as the shared fields, or unknown remasking, block_length not
      dividing gen_length, or steps not a multiple of the number of blocks.
  """

  temperature: float = 0.0
  block_length: int | None = None
  remasking: str = "low_confidence"

  def __post_init__(self):
    super().__post_init__()
    if self.remasking not in REMASKING:
      raise ValueError(f"remasking={self.remasking!r}; allowed: {REMASKING}")
    block = self.block_size()
    if block < 1 or self.gen_length % block:
      raise ValueError(f"block_length={self.block_length} must be in "
                       f"[1, {self.gen_length}] and divide "
                       f"gen_length={self.gen_length}")
    num_blocks = self.gen_length // block
    if self.steps % num_blocks:
      raise ValueError(f"steps={self.steps} must be a multiple of the number "
                       f"of blocks gen_length / block_length = {num_blocks}")

  def block_size(self) -> int:
    return self.gen_length if self.block_length is None else self.block_length

  def _update(self, k, logits_LxV, tokens_L, plan, key):
    """Step k for ONE sequence: (float32[L, V], int32[L]) -> int32[L].

    Commits exactly plan.schedule[k] masked positions of the current block;
    ties in confidence go to the leftmost position.
    """
    key_draw, key_rank = jax.random.split(key)
    log_probs = subs_log_probs(logits_LxV, tokens_L, self.mask_id)
    drawn = _draw(key_draw, log_probs, self.temperature)
    masked = (plan.fill & (tokens_L == self.mask_id) &
              (plan.block == plan.step_block[k]))
    if self.remasking == "low_confidence":
      confidence = jnp.take_along_axis(log_probs, drawn[:, None], -1)[:, 0]
    else:
      confidence = jax.random.uniform(key_rank, tokens_L.shape)
    confidence = jnp.where(masked, confidence, -jnp.inf)
    order = jnp.argsort(confidence, descending=True, stable=True)
    first_n = jnp.arange(tokens_L.shape[0]) < plan.schedule[k]
    commit = masked & jnp.zeros_like(masked).at[order].set(first_n)
    return jnp.where(commit, drawn, tokens_L)
