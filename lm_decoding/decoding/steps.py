"""The steps of the denoising engine: what one step does with the window's logits.

`engine.generate` calls a step object at a block's start (`begin`), to ask
whether the block goes on (`live`), for the model's self-conditioning input
(`conditioning`), once per step (`step`: the window's new tokens, the net
commits and the new state) and at a block's end (`end`); `Loop.state` is its
slot for its own state. Two kinds exist: `MaskedSteps` (propose, select,
commit: every masked decoder, the rule being the decoder's `select` over
`rules.py`) and `CanvasSteps` (the uniform-noise canvas).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from lm_decoding.decoding.engine import Frame, Loop, put_windows, windows
from lm_decoding.decoding.rules import Canvas, Step
from lm_decoding.decoding.sampling import sample, suppress
from lm_decoding.models.config import self_conditioned


@dataclasses.dataclass(frozen=True)
class MaskedSteps:
  """The step of the masked decoders: propose, select, commit.

  Every window position draws a token through `decoder.sampling` with MASK
  excluded (SUBS, Sahoo et al. 2024) and gets `probs`, the softmax of its
  raw logits over the whole vocabulary, MASK included (LLaDA's confidence);
  `decoder.select(step)` (a `rules` rule, for ONE row, `jax.vmap`-ed) says
  which masked positions take their draw and which committed ones return
  to MASK. State: the confidence float32[B, L] each committed token had, and
  the masked count int32[B] of each row's window at the block start. A
  block stays live while a row has a masked window position (always,
  without `decoder.early_stop`).
  """

  decoder: Any

  @property
  def reuse(self) -> bool:
    return self.decoder.reuse_logits

  def initial(self, frame: Frame, tokens_BxL: jax.Array, trace: bool) -> dict:
    del frame, trace
    return dict(confidence=jnp.zeros(tokens_BxL.shape, jnp.float32),
                num_masked=jnp.zeros(tokens_BxL.shape[:1], jnp.int32))

  def _masked(self, frame: Frame, tokens_BxL, start_B) -> jax.Array:
    return (windows(frame.fill, start_B, frame.width)
            & (windows(tokens_BxL, start_B, frame.width) == frame.mask_id))

  def begin(self, frame: Frame, n, loop: Loop, start_B) -> Loop:
    del n
    num_masked = jnp.sum(self._masked(frame, loop.tokens, start_B), -1,
                         dtype=jnp.int32)
    return loop.replace(state=dict(loop.state, num_masked=num_masked))

  def live(self, frame: Frame, loop: Loop, start_B) -> jax.Array:
    return (jnp.any(self._masked(frame, loop.tokens, start_B))
            | (not self.decoder.early_stop))

  def conditioning(self, loop: Loop) -> None:
    del loop

  def measured(self, k, loop: Loop) -> jax.Array:
    del k
    return jnp.ones(loop.tokens.shape[:1], bool)

  def step(self, frame: Frame, k, global_step, logits_BxWxV, loop: Loop,
           start_B):
    """(window int32[B, W], net int32[B] committed minus re-masked, state)."""
    decoder, width = self.decoder, frame.width

    def row(window_logits_WxV, tokens_W, fill_W, confidence_W, num_masked,
            start, key):
      step_key = jax.random.fold_in(key, global_step)
      keys_Wx2 = jax.vmap(lambda p: jax.random.split(
          jax.random.fold_in(step_key, p)))(start + jnp.arange(width))
      logits = window_logits_WxV.astype(jnp.float32)
      probs = jax.nn.softmax(logits, -1)
      no_mask = suppress(logits, decoder.sampling.suppress_ids,
                         also=(decoder.mask_id,))
      drawn = jax.vmap(lambda key, x: sample(key, x[None],
                                             decoder.sampling)[0])(
                                                 keys_Wx2[:, 0], no_mask)
      masked = fill_W & (tokens_W == decoder.mask_id)
      commit, remask = decoder.select(Step(
          k=k, masked=masked, fill=fill_W, num_masked=num_masked,
          drawn=drawn, probs=probs, committed_confidence=confidence_W,
          uniform=jax.vmap(jax.random.uniform)(keys_Wx2[:, 1])))
      commit &= masked
      remask &= fill_W & ~masked
      p_drawn = jnp.take_along_axis(probs, drawn[:, None], -1)[:, 0]
      new_tokens = jnp.where(commit, drawn,
                             jnp.where(remask, decoder.mask_id, tokens_W))
      new_confidence = jnp.where(commit, p_drawn,
                                 jnp.where(remask, 0.0, confidence_W))
      net = (jnp.sum(commit, dtype=jnp.int32)
             - jnp.sum(remask, dtype=jnp.int32))
      return new_tokens, new_confidence, net

    window = lambda x: windows(x, start_B, width)
    tokens, confidence, net = jax.vmap(row)(
        logits_BxWxV, window(loop.tokens), window(frame.fill),
        window(loop.state["confidence"]), loop.state["num_masked"], start_B,
        frame.keys)
    state = dict(loop.state, confidence=put_windows(
        loop.state["confidence"], confidence, start_B))
    return tokens, net, state

  def end(self, frame: Frame, n, loop: Loop, start_B) -> Loop:
    del frame, n, start_B
    return loop


_CANVAS = 2**31 - 1  # the key of the starting canvases (never a step number)


@dataclasses.dataclass(frozen=True)
class CanvasSteps:
  """The step of the uniform-noise canvas (`rules.Canvas`, its state).

  At each block's start the window gets a canvas drawn uniformly from the
  whole vocabulary, row b's from fold_in(fold_in(row_key[b], 2^31 - 1), n);
  each step is `decoder.canvas_step` (`rules.eb_canvas_step` or
  `rules.ancestral_canvas_step`) and writes the new canvas into the window;
  a block stays live while a row has not stopped; at its end the window
  takes the last argmax canvas. Logits are never reused (the canvas changes
  at every step). The self-conditioning input is the canvas's last
  softmax(processed) when the model takes one.
  """

  decoder: Any
  reuse = False

  def initial(self, frame: Frame, tokens_BxL: jax.Array, trace: bool):
    """The `rules.Canvas` before block 0 (its per-block fields are reset by
    `begin`)."""
    del tokens_BxL
    conditioned = self_conditioned(frame.model.logits_fn)
    batch, width = frame.batch, frame.width
    zeros = jnp.zeros((batch,), jnp.int32)
    records = None
    if trace:
      shape = (frame.num_blocks * frame.steps, batch, width)
      records = {name: jnp.zeros(shape, jnp.int32)
                 for name in ("canvas_in", "drawn", "noise", "canvas_out",
                              "argmax")}
      records["accepted"] = jnp.zeros(shape, bool)
      records.update({name: jnp.zeros(shape[:2], bool)
                      for name in ("live", "stop")})
    window = jnp.zeros((batch, width), jnp.int32)
    return Canvas(
        window=window, argmax=window,
        history=jnp.full((batch, self.decoder.stability_threshold, width), -1,
                         jnp.int32),
        done=jnp.zeros((batch,), bool),
        last_accepted=jnp.full((batch, width), -1, jnp.int32),
        accepted=zeros, revised=zeros, steps=zeros, trace=records,
        previous=jnp.zeros((batch, width, frame.vocab), jnp.float32)
        if conditioned else None)

  def begin(self, frame: Frame, n, loop: Loop, start_B) -> Loop:
    canvas_BxW = jax.vmap(lambda key: jax.random.randint(
        jax.random.fold_in(jax.random.fold_in(key, _CANVAS), n),
        (frame.width,), 0, frame.vocab))(frame.keys).astype(jnp.int32)
    canvas = loop.state
    canvas = canvas.replace(
        window=canvas_BxW, argmax=canvas_BxW,
        history=jnp.full_like(canvas.history, -1),
        done=jnp.zeros_like(canvas.done),
        last_accepted=jnp.full_like(canvas.last_accepted, -1),
        previous=(None if canvas.previous is None
                  else jnp.zeros_like(canvas.previous)))
    return loop.replace(tokens=put_windows(loop.tokens, canvas_BxW, start_B),
                        state=canvas)

  def live(self, frame: Frame, loop: Loop, start_B) -> jax.Array:
    del frame, start_B
    return ~jnp.all(loop.state.done)

  def conditioning(self, loop: Loop) -> jax.Array | None:
    return loop.state.previous

  def measured(self, k, loop: Loop) -> jax.Array:
    """Rows still denoising, after step 0 (whose logits are a full pass)."""
    return (k > 0) & ~loop.state.done

  def step(self, frame: Frame, k, global_step, logits_BxWxV, loop: Loop,
           start_B):
    canvas = self.decoder.canvas_step(k, global_step, logits_BxWxV,
                                      loop.state, start_B, frame.keys,
                                      frame.vocab, frame.steps)
    return canvas.window, jnp.zeros((frame.batch,), jnp.int32), canvas

  def end(self, frame: Frame, n, loop: Loop, start_B) -> Loop:
    del frame, n
    return loop.replace(tokens=put_windows(loop.tokens, loop.state.argmax,
                                           start_B))
