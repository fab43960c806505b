"""Cache contexts of the denoising engine: how a step gets its window's logits.

A context is a frozen dataclass that `engine.generate` calls at five points:
`prefill` (once, before block 0), `begin` (a block's start; it may hand
step 0 its logits and say they are `fresh`), `call` (one counted model call
for the current tokens), `end` (a block's end), and `reference` (the exact,
uncounted logits that `measure_error` compares against). Each says whether
its logits are exact (`exact`), names itself in the records (`record`), and
says what a decode costs before it runs (`forward_tokens`). The contexts
that exist:

| context        | record       | exact | what a step calls                      |
|----------------|--------------|-------|----------------------------------------|
| `FullPass`     | full         | yes   | all L positions                        |
| `PrefixCache`  | prefix       | causal only | the window and all after it (Fast-dLLM) |
| `DualCache`    | dual         | causal only | the W window positions (Fast-dLLM) |
| `BlockCache`   | blocks       | yes   | the W window positions over the clean cache of committed blocks (BD3-LM; `block_cache.py`) |
| `SubBlockCache`| sub_blocks   | no    | the active sub-block's S positions (Fast-dLLM v2; `block_cache.py`) |
| `CanvasPrefix` | canvas_prefix| yes   | the W canvas positions (uniform diffusion) |

The attention a context builds is its `attention` field: 'bidirectional'
(a masked-diffusion denoiser: every valid key), 'causal', 'block_causal'
(BD3-LM: query p sees the valid keys of blocks <= its own, blocks anchored
at each row's prompt length), 'canvas' (a query in the committed prefix sees
the prefix, one in the canvas the prefix and the canvas). A model whose
logits at i predict token i + 1 (`TransformerConfig.token_shift`) is decoded
by every context: a full pass's logits are realigned (`aligned_logits`) and a
cached call starts one position earlier (`query_span`).

`Context` is the base a new context extends.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from lm_decoding.decoding import base
from lm_decoding.decoding.engine import Frame, Loop, put_windows, windows
from lm_decoding.models import Model, masks
from lm_decoding.models.config import token_shift
from lm_decoding.models.diffusion import shift_logits

ATTENTION = ("bidirectional", "causal", "block_causal", "canvas")


def aligned_logits(model: Model, logits_BxLxV: jax.Array) -> jax.Array:
  """A full pass's logits with index i predicting token i, whatever the
  model's token shift (`diffusion.shift_logits`)."""
  if token_shift(model.logits_fn):
    return shift_logits(logits_BxLxV)
  return logits_BxLxV


def query_span(model: Model, start_B: jax.Array, query: int):
  """(first int32[B], size): the cached call whose logits [:, :query]
  predict tokens [start, start + query): the same span, or for a
  token-shifted model one position earlier and one longer."""
  if token_shift(model.logits_fn):
    return start_B - 1, query + 1
  return start_B, query


def block_causal_layout_mask(prompt_lengths_B: jax.Array, valid_BxL: jax.Array,
                             block_length: int) -> jax.Array:
  """bool[B, L, L]: query p of row b sees valid keys of blocks <= its own.

  Blocks are anchored at each row's prompt length: position p of row b is in
  block floor((p - prompt_lengths[b]) / block_length) (negative in the
  prompt), as `docs/block_diffusion.md` draws it.

  Args:
    prompt_lengths_B: int32[B] where block 0 starts in each row.
    valid_BxL: bool[B, L] keys that exist (False on the PAD tail).
    block_length: W >= 1.
  """
  length = valid_BxL.shape[1]
  block_BxL = jnp.floor_divide(
      jnp.arange(length)[None, :] - prompt_lengths_B[:, None], block_length)
  return ((block_BxL[:, None, :] <= block_BxL[:, :, None])
          & valid_BxL[:, None, :])


def canvas_mask(valid_BxL, start_B, width, num_queries, first_query_B):
  """bool[B, L, S]: queries from first_query[b] on, a query before the
  canvas [start, start + W) sees the keys before it, one in it those before
  its end; nothing sees PAD or positions past the canvas."""
  key_L = jnp.arange(valid_BxL.shape[1])
  query_BxL = first_query_B[:, None] + jnp.arange(num_queries)[None, :]
  end_B = start_B + width
  seen = jnp.where((query_BxL >= start_B[:, None])[..., None],
                   key_L[None, None, :] < end_B[:, None, None],
                   key_L[None, None, :] < start_B[:, None, None])
  return seen & valid_BxL[:, None, :]


def full_mask(attention: str, frame: Frame, start_B) -> jax.Array:
  """bool[B, L, L] the attention of a full pass while block `start_B` is
  decoded (module docstring)."""
  batch, length = frame.batch, frame.length
  if attention == "block_causal":
    return block_causal_layout_mask(frame.start, frame.valid, frame.width)
  if attention == "canvas":
    return canvas_mask(frame.valid, start_B, frame.width, length,
                       jnp.zeros((batch,), jnp.int32))
  mask = masks.key_padding_mask(frame.valid, length)
  if attention == "causal":
    mask &= masks.causal_mask(batch, length)
  return mask


def _full_pass(attention, frame: Frame, cost, tokens, start_B, conditioning,
               cache=None):
  """(ModelOutput with aligned logits float32[B, L, V], cost): one counted
  full pass, filling `cache` from slot 0 when given; `conditioning`
  float32[B, W, V] (or None) is the window's self-conditioning input."""
  if conditioning is not None:
    conditioning = put_windows(
        jnp.zeros((frame.batch, frame.length, frame.vocab), jnp.float32),
        conditioning, start_B)
  out, cost = base.forward(frame.models, "model", cost, tokens,
                           frame.positions,
                           cache=None if cache is None else cache.at(0),
                           attention_mask=full_mask(attention, frame, start_B),
                           self_conditioning=conditioning)
  return out._replace(logits=aligned_logits(frame.model, out.logits)), cost


def _window_reference(attention, frame: Frame, tokens, start_B, conditioning):
  """float32[B, W, V] the window's logits from an uncounted full pass."""
  out, _ = _full_pass(attention, frame, base.Cost.zero(frame.models), tokens,
                      start_B, conditioning)
  return windows(out.logits, start_B, frame.width)


@dataclasses.dataclass(frozen=True)
class Context:
  """The base of every context, and what each one provides.

  A context sets `exact` (its window logits equal an uncached full pass's
  over the same tokens), `exact_by_construction` (nothing to measure: a
  full pass) and `record` (the name the comparison's records carry), and
  implements
    begin(frame, loop, fresh bool[], start int32[B], conditioning)
        -> (loop, fresh): a block's start;
    call(frame, n int32[], loop, start int32[B], conditioning)
        -> (logits float32[B, W or L, V], loop with cost and cache): one
        counted model call for the current tokens;
    forward_tokens(batch, prompt_width, output_length, width, steps) -> int:
        the positions a decode's calls process at `steps` per block.
  `conditioning` is the step's self-conditioning input float32[B, W, V] or
  None. The defaults here: no prefill, the window's logits are what `call`
  returns, nothing at a block's end, the exact reference a full pass with
  the context's `attention`.
  """

  attention: str = "bidirectional"
  exact_by_construction = False  # no error to measure

  def __post_init__(self):
    if self.attention not in ATTENTION:
      raise ValueError(f"attention={self.attention!r}; allowed: {ATTENTION}")

  def prefill(self, frame: Frame, loop: Loop) -> Loop:
    del frame
    return loop

  def window(self, frame: Frame, logits, start_B):
    del frame, start_B
    return logits

  def end(self, frame: Frame, n, loop: Loop, start_B) -> Loop:
    del frame, n, start_B
    return loop

  def reference(self, frame: Frame, tokens, start_B, conditioning):
    return _window_reference(self.attention, frame, tokens, start_B,
                             conditioning)

  def logits_shape(self, batch: int, length: int, width: int, vocab: int):
    del length
    return (batch, width, vocab)


@dataclasses.dataclass(frozen=True)
class FullPass(Context):
  """No cache: every call recomputes all L positions (exact).

  Attributes:
    attention: the mask of the pass (module docstring).
    keep_across_blocks: full-pass logits still fresh at a block's start
      serve its first step (the masked decoders); False: every block's
      first step calls (BD3-LM's reference sampler).
  """

  keep_across_blocks: bool = True
  exact = True
  exact_by_construction = True
  record = "full"

  def begin(self, frame, loop, fresh, start_B, conditioning):
    del frame, start_B, conditioning
    return loop, fresh & self.keep_across_blocks

  def call(self, frame, n, loop, start_B, conditioning):
    del n
    out, cost = _full_pass(self.attention, frame, loop.cost, loop.tokens,
                           start_B, conditioning)
    return out.logits, loop.replace(cost=cost)

  def window(self, frame, logits, start_B):
    return windows(logits, start_B, frame.width)

  def logits_shape(self, batch, length, width, vocab):
    return (batch, length, vocab)

  def forward_tokens(self, batch, prompt_width, output_length, width, steps):
    """A full pass at each of the N K_b steps."""
    blocks = output_length // width
    return blocks * steps * batch * (prompt_width + output_length)


@dataclasses.dataclass(frozen=True)
class _BlockStartCache(Context):
  """A cache filled at each block's start by one full pass whose window
  logits serve step 0 (as Fast-dLLM), or with `refresh_every_step` refilled
  before every call (two calls a step: the exactness check); dropped at the
  block's end."""

  refresh_every_step: bool = False

  def begin(self, frame, loop, fresh, start_B, conditioning):
    del fresh
    loop = loop.replace(cache=frame.model.logits_fn.init_cache(
        frame.batch, frame.length))
    if self.refresh_every_step:
      return loop, jnp.bool_(False)
    out, cost = _full_pass(self.attention, frame, loop.cost, loop.tokens,
                           start_B, conditioning, loop.cache)
    return loop.replace(cost=cost, cache=out.cache, logits=windows(
        out.logits, start_B, frame.width)), jnp.bool_(True)

  def call(self, frame, n, loop, start_B, conditioning):
    cost, cache = loop.cost, loop.cache
    if self.refresh_every_step:
      out, cost = _full_pass(self.attention, frame, cost, loop.tokens,
                             start_B, conditioning, cache)
      cache = out.cache
    return self._cached_call(frame, n, loop.replace(cost=cost, cache=cache),
                             start_B, conditioning)

  def end(self, frame, n, loop, start_B):
    del frame, n, start_B
    return loop.replace(cache=None)

  def _forward_tokens(self, batch, prompt_width, output_length, width, steps,
                      query):
    """A full pass per block, then (steps - 1) calls of query(n) positions
    (or with refresh_every_step a full pass and a call at every step)."""
    full = batch * (prompt_width + output_length)
    blocks = output_length // width
    if self.refresh_every_step:
      return sum(steps * (full + batch * query(n)) for n in range(blocks))
    return sum(full + (steps - 1) * batch * query(n) for n in range(blocks))


def _fast_dllm_call(attention: str, dual: bool, frame: Frame, loop: Loop,
                    start_B, query: int):
  """Fast-dLLM's cached call on `query` positions from the window's start:
  (window logits float32[B, W, V], loop with the call's keys kept)."""
  first_B, size = query_span(frame.model, start_B, query)
  causal = attention == "causal"
  if not dual or causal:  # prefix + the query span
    mask = masks.cache_query_mask(first_B, size, frame.length, causal)
  else:  # dual: every slot, the window fresh, prefix and suffix cached
    mask = jnp.ones((frame.batch, size, frame.length), bool)
  out, cost = base.forward(
      frame.models, "model", loop.cost, windows(loop.tokens, first_B, size),
      first_B[:, None] + jnp.arange(size, dtype=jnp.int32),
      cache=loop.cache.at(first_B),
      attention_mask=mask & masks.key_padding_mask(frame.valid, size))
  return out.logits[:, :frame.width], loop.replace(cost=cost, cache=out.cache)


@dataclasses.dataclass(frozen=True)
class PrefixCache(_BlockStartCache):
  """Fast-dLLM's prefix cache (Wu et al. 2025): each step recomputes the
  window and everything after it, (N - n) W positions, attending to the
  cached prefix. Exact for a causal model; approximate for a bidirectional
  one (the prefix keys saw the old suffix). The query size changes with the
  block: only the model call is compiled once per block (a `lax.switch`)."""

  record = "prefix"

  @property
  def exact(self) -> bool:
    return self.attention == "causal" or self.refresh_every_step

  def _cached_call(self, frame, n, loop, start_B, conditioning):
    del conditioning
    return jax.lax.switch(
        n, [functools.partial(_fast_dllm_call, self.attention, False, frame,
                              query=(frame.num_blocks - i) * frame.width)
            for i in range(frame.num_blocks)], loop, start_B)

  def forward_tokens(self, batch, prompt_width, output_length, width, steps):
    return self._forward_tokens(batch, prompt_width, output_length, width,
                                steps, lambda n: output_length - n * width)


@dataclasses.dataclass(frozen=True)
class DualCache(_BlockStartCache):
  """Fast-dLLM's dual cache: prefix and suffix cached at the block start;
  each step recomputes only the W window positions. Approximate unless
  causal."""

  record = "dual"

  @property
  def exact(self) -> bool:
    return self.attention == "causal" or self.refresh_every_step

  def _cached_call(self, frame, n, loop, start_B, conditioning):
    del n, conditioning
    return _fast_dllm_call(self.attention, True, frame, loop, start_B,
                           frame.width)

  def forward_tokens(self, batch, prompt_width, output_length, width, steps):
    return self._forward_tokens(batch, prompt_width, output_length, width,
                                steps, lambda n: width)


@dataclasses.dataclass(frozen=True)
class CanvasPrefix(_BlockStartCache):
  """The uniform canvas's prefix cache: a query in the committed prefix sees
  only the prefix, so its keys do not depend on the canvas and caching them
  is exact; each step after the first runs the W canvas positions, with the
  canvas's self-conditioning input."""

  attention: str = "canvas"
  exact = True
  record = "canvas_prefix"

  def _cached_call(self, frame, n, loop, start_B, conditioning):
    del n
    width = frame.width
    out, cost = base.forward(
        frame.models, "model", loop.cost, windows(loop.tokens, start_B, width),
        start_B[:, None] + jnp.arange(width, dtype=jnp.int32),
        cache=loop.cache.at(start_B),
        attention_mask=canvas_mask(frame.valid, start_B, width, width,
                                   start_B),
        self_conditioning=conditioning)
    return out.logits, loop.replace(cost=cost, cache=out.cache)

  def forward_tokens(self, batch, prompt_width, output_length, width, steps):
    return self._forward_tokens(batch, prompt_width, output_length, width,
                                steps, lambda n: width)
