"""The denoising engine: one loop over blocks and steps for every parallel decoder.

Every denoising decoder of this package (masked diffusion, Fast-dLLM, block
diffusion, the uniform-noise canvas) is a frozen config that picks two parts
and hands them to `generate`, as gemma's diffusion sampler plugs small frozen
strategy objects into one text-sampling loop and dInfer splits iteration
manager, decoding strategy and KV-cache manager (the configs and their
entry points, `denoise`, `decode`, `expected_work`, are `denoising.py`):

- a cache *context* (`contexts.py`): how a step gets the window's logits
  (a full pass, Fast-dLLM's approximate prefix or dual cache, BD3-LM's
  exact cache of committed blocks or its sub-block cache, the canvas's
  exact prefix), each saying whether it is exact and what it costs;
- a *step* (`steps.MaskedSteps` or `steps.CanvasSteps`, over the pure rules
  of `rules.py`): what one step does with those logits, with a slot in the
  carry (`Loop.state`) for the rule's own state.

Layout. With right-padded prompts int32[B, P] and prompt_lengths int32[B],
every row is laid out in a static length L = P + T (T = output_length) as
[prompt | T MASK | PAD], positions arange(L), and PAD keys hidden. Worked
example, P = 3, T = 4, M = MASK, _ = PAD:

    prompts [[7, 8, 9], [5, _, _]], prompt_lengths [3, 1]
    row 0:  7 8 9 M M M M      generated region: positions 3..6
    row 1:  5 M M M M _ _      generated region: positions 1..4
    valid row 1: 1 1 1 1 1 0 0

The generated region is cut into N = T / W blocks decoded left to right
(semi-autoregressive, as LLaDA; one block when block_length is None). Block
n of row b is the window of W positions from start[b] + n W; rows move from
block to block together, each with its own state. For n = 0 .. N - 1 (one
`lax.fori_loop`, one compiled body whatever N):

    step.begin     the rule's block start (a canvas: a fresh uniform draw);
    context.begin  the context's block start (a Fast-dLLM cache: one full
                   pass that also gives step 0's logits);
    steps          a `lax.while_loop` of at most K_b = `Frame.steps` steps,
                   while `step.live`: the window's logits (`context.call`,
                   skipped while `fresh`: no token changed since the last
                   call and the rule allows reuse, MDLM's caching trick),
                   then `step.step` writes the window's new tokens;
    step.end, context.end   (a canvas writes its argmax; BD3-LM writes the
                   finished block's clean keys).

Global step s = n K_b + k indexes `Loop.committed` and the per-row, per-
position keys fold_in(fold_in(row_key[b], s), p), so a row decodes the same
alone or in any batch, whatever its window. `measure_error` records the
largest |logit| difference between the context's window logits and its
uncounted exact pass (`context.reference`) over the rows the step marks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding.decoding import base
from lm_decoding.models import Model
from lm_decoding.special_tokens import MASK_ID, PAD_ID


def prompt_layout(prompts: jax.Array, prompt_lengths: jax.Array,
                  output_length: int, mask_id: int = MASK_ID,
                  pad_id: int = PAD_ID):
  """Lays out [prompt | output_length MASK | PAD] rows (module docstring).

  Args:
    prompts: int32[B, P] right-padded prompts.
    prompt_lengths: int32[B] real prompt tokens per row, in [0, P].
    output_length: T, MASK positions per row.
    mask_id, pad_id: MASK and PAD token ids.
  Returns:
    tokens: int32[B, P + T]; fill: bool[B, P + T] the generated region;
    valid: bool[B, P + T] False on the PAD tail.
  """
  prompts = jnp.asarray(prompts, jnp.int32)
  lengths_Bx1 = jnp.asarray(prompt_lengths, jnp.int32)[:, None]
  index_L = jnp.arange(prompts.shape[1] + output_length)
  padded_BxL = jnp.pad(prompts, ((0, 0), (0, output_length)),
                       constant_values=pad_id)
  in_prompt = index_L < lengths_Bx1
  valid = index_L < lengths_Bx1 + output_length
  fill = valid & ~in_prompt
  tokens = jnp.where(in_prompt, padded_BxL,
                     jnp.where(fill, mask_id, pad_id)).astype(jnp.int32)
  return tokens, fill, valid


def windows(x_BxL, start_B, width):
  """[B, W, ...]: row b's W entries of x from start[b] on."""
  return jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, width))(
      x_BxL, start_B)


def put_windows(x_BxL, new_BxW, start_B):
  """x with row b's entries from start[b] on replaced by new[b]."""
  return jax.vmap(lambda x, n, s: jax.lax.dynamic_update_slice_in_dim(
      x, n, s, 0))(x_BxL, new_BxW, start_B)


@dataclasses.dataclass(frozen=True)
class Frame:
  """The static context of one decode: what every part reads, none changes.

  Attributes:
    models: {role: Model}; the denoiser is "model".
    fill: bool[B, L] positions the decoder may write.
    valid: bool[B, L] keys that exist (False on the PAD tail).
    start: int32[B] absolute position of each row's block 0.
    keys: [B] per-row PRNG keys (`base.row_keys`).
    num_blocks: N; width: W; steps: K_b, the most steps of one block.
    vocab: V.
    mask_id: the MASK id.
  """

  models: Mapping[str, Model]
  fill: jax.Array
  valid: jax.Array
  start: jax.Array
  keys: jax.Array
  num_blocks: int
  width: int
  steps: int
  vocab: int
  mask_id: int

  @property
  def model(self) -> Model:
    return self.models["model"]

  @property
  def batch(self) -> int:
    return self.fill.shape[0]

  @property
  def length(self) -> int:
    return self.fill.shape[1]

  @property
  def positions(self) -> jax.Array:
    """int32[B, L] arange(L) in every row."""
    return jnp.broadcast_to(jnp.arange(self.length, dtype=jnp.int32),
                            (self.batch, self.length))


@flax.struct.dataclass
class Loop:
  """The carry of the loop (leading axis B on the per-row arrays).

  Attributes:
    tokens: int32[B, L] the sequences.
    committed: int32[K, B] net tokens committed per global step (K = N K_b).
    executed: bool[K] global steps run.
    states: int32[K, B, L] the sequences after each step when traced.
    cost: calls and forward positions per role (`base.Cost`).
    cache: the context's KV cache, or None.
    logits: float32 the last call's logits (reused while `fresh`).
    error: float32[] largest logit error (`measure_error`).
    state: the step's own state (`MaskedSteps`: confidences; `CanvasSteps`:
      a `rules.Canvas`).
  """

  tokens: jax.Array
  committed: jax.Array
  executed: jax.Array
  states: jax.Array | None
  cost: base.Cost
  cache: Any
  logits: jax.Array
  error: jax.Array
  state: Any

  @classmethod
  def start(cls, frame: Frame, tokens_BxL, logits_shape, state,
            trace: bool = False) -> "Loop":
    """The carry before the first step."""
    total = frame.num_blocks * frame.steps
    return cls(
        tokens=tokens_BxL,
        committed=jnp.zeros((total, frame.batch), jnp.int32),
        executed=jnp.zeros((total,), bool),
        states=(jnp.zeros((total,) + tokens_BxL.shape, jnp.int32) if trace
                else None),
        cost=base.Cost.zero(frame.models), cache=None,
        logits=jnp.zeros(logits_shape, jnp.float32), error=jnp.float32(0),
        state=state)

  def trace_states(self, initial_BxL: jax.Array) -> jax.Array:
    """int32[K, B, L] the sequences after every global step; a step not
    run (early stop) shows the state before it."""
    total = self.executed.shape[0]
    last_K = jax.lax.cummax(jnp.where(self.executed, jnp.arange(total), -1))
    return jnp.concatenate([initial_BxL[None], self.states])[last_K + 1]


def generate(frame: Frame, context, steps, loop: Loop,
             measure_error: bool = False) -> Loop:
  """Runs every block of every row (module docstring); traced in a jit.

  Args:
    frame: the static context.
    context: a cache context (`contexts.py`).
    steps: `steps.MaskedSteps` or `steps.CanvasSteps`.
    loop: the carry before block 0 (`Loop.start`).
    measure_error: record `Loop.error` (extra, uncounted passes).
  Returns:
    The carry after block N - 1.
  """
  def block(n, carry):
    loop, fresh = carry
    start_B = frame.start + n * frame.width
    loop = steps.begin(frame, n, loop, start_B)
    loop, fresh = context.begin(frame, loop, fresh, start_B,
                                steps.conditioning(loop))
    cond = lambda c: (c[0] < frame.steps) & steps.live(frame, c[1], start_B)
    body = lambda c: _step(frame, context, steps, n, start_B, measure_error,
                           *c)
    _, loop, fresh = jax.lax.while_loop(cond, body,
                                        (jnp.int32(0), loop, fresh))
    loop = steps.end(frame, n, loop, start_B)
    return context.end(frame, n, loop, start_B), fresh

  loop = context.prefill(frame, loop)
  return jax.lax.fori_loop(0, frame.num_blocks, block,
                           (loop, jnp.bool_(False)))[0]


def _step(frame: Frame, context, steps, n, start_B, measure_error: bool, k,
          loop: Loop, fresh):
  """Step k of block n: the window's logits (the context's call unless
  `fresh`), the step, the carry's records; (k + 1, loop, fresh)."""
  conditioning = steps.conditioning(loop)
  logits, called = jax.lax.cond(
      fresh, lambda: (loop.logits, loop),
      lambda: context.call(frame, n, loop, start_B, conditioning))
  window_logits = context.window(frame, logits, start_B)
  error = loop.error
  if measure_error and not context.exact_by_construction:
    rows_B = steps.measured(k, loop)
    diff = jnp.abs(context.reference(frame, loop.tokens, start_B,
                                     conditioning) - window_logits)
    error = jnp.maximum(error,
                        jnp.where(rows_B[:, None, None], diff, 0.0).max())
  global_step = n * frame.steps + k
  window_BxW, net_B, state = steps.step(frame, k, global_step, window_logits,
                                        loop, start_B)
  tokens = put_windows(loop.tokens, window_BxW, start_B)
  fresh = steps.reuse & jnp.all(tokens == loop.tokens)
  loop = called.replace(
      tokens=tokens, state=state, logits=logits, error=error,
      committed=loop.committed.at[global_step].set(net_B),
      executed=loop.executed.at[global_step].set(True),
      states=(None if loop.states is None
              else loop.states.at[global_step].set(tokens)))
  return k + 1, loop, fresh


def check_special_ids(decoder, model: Model, tokens_BxL: jax.Array) -> int:
  """The vocab size V, after checking that mask_id and pad_id are below it.

  Traces one abstract call of `model` on the first column (nothing runs).

  Raises:
    ValueError: decoder.mask_id or decoder.pad_id >= V.
  """
  vocab = jax.eval_shape(
      lambda t: model.logits_fn(model.params, t, jnp.zeros_like(t)),
      tokens_BxL[:, :1]).logits.shape[-1]
  for name in ("mask_id", "pad_id"):
    if getattr(decoder, name) >= vocab:
      raise ValueError(f"{name}={getattr(decoder, name)} must be < vocab "
                       f"size {vocab}")
  return vocab
