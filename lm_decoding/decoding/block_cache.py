"""BD3-LM's exact cache of committed blocks, and its sub-block variant.

Contexts of the denoising engine (`contexts.py` says what a context is) for
a block-causal model (Arriola et al. 2025): the cache only ever holds clean,
committed keys, written once per block, so a step calls the model on its W
window positions alone. A decoder that drafts a block and then verifies it
in AR mode over the same exact cache (self-speculation with a token-shifted
block-diffusion model, S2D2 / SSD) reuses `BlockCache` as it is: its `call`
scores the window over the committed prefix (`query_span` feeds the token
before the window, whose logits predict the window's first token) and its
`end` writes the accepted block's clean keys.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lm_decoding.decoding import base
from lm_decoding.decoding.contexts import Context, full_mask, query_span
from lm_decoding.decoding.engine import Frame, put_windows, windows


def _span_call(frame: Frame, cost, tokens_BxL, cache, first_B, size):
  """(ModelOutput, cost): one counted block-causal call on `size` positions
  from first_B over the cache."""
  mask_BxLxL = full_mask("block_causal", frame, frame.start)
  return base.forward(
      frame.models, "model", cost, windows(tokens_BxL, first_B, size),
      first_B[:, None] + jnp.arange(size, dtype=jnp.int32),
      cache=cache.at(first_B),
      attention_mask=windows(mask_BxLxL, first_B, size))


@dataclasses.dataclass(frozen=True)
class BlockCache(Context):
  """BD3-LM's exact cache of committed blocks (Arriola et al. 2025).

  One prefill call writes the prompt's keys (block-causal, as training's
  clean half); each step calls the model on the W window tokens only, at
  slots [start, start + W), attending to the cached prefix and to the window
  (bidirectional), its own writes dropped; once a block ends, one more call
  on its clean tokens writes their keys (the reference's `store_kv` pass;
  not after the last block). The cache only ever holds clean, committed
  keys, so the logits are exact.
  """

  attention: str = "block_causal"
  exact = True
  record = "blocks"

  def prefill(self, frame, loop):
    cache = frame.model.logits_fn.init_cache(frame.batch, frame.length)
    prompt_width = frame.length - frame.num_blocks * frame.width
    if prompt_width:  # the prompt's keys, block-causal
      mask = full_mask("block_causal", frame, frame.start)
      out, cost = base.forward(
          frame.models, "model", loop.cost, loop.tokens[:, :prompt_width],
          frame.positions[:, :prompt_width], cache=cache.at(0),
          attention_mask=mask[:, :prompt_width])
      cache, loop = out.cache, loop.replace(cost=cost)
    return loop.replace(cache=cache)

  def begin(self, frame, loop, fresh, start_B, conditioning):
    del frame, fresh, start_B, conditioning  # the window moved: call
    return loop, jnp.bool_(False)

  def call(self, frame, n, loop, start_B, conditioning):
    del n, conditioning
    out, cost = _span_call(frame, loop.cost, loop.tokens, loop.cache,
                           *query_span(frame.model, start_B, frame.width))
    return out.logits[:, :frame.width], loop.replace(cost=cost)

  def end(self, frame, n, loop, start_B):
    def write(loop):
      out, cost = _span_call(frame, loop.cost, loop.tokens, loop.cache,
                             start_B, frame.width)
      return loop.replace(cache=out.cache, cost=cost)
    return jax.lax.cond(n + 1 < frame.num_blocks, write, lambda c: c, loop)

  def forward_tokens(self, batch, prompt_width, output_length, width, steps):
    """The prefill, a window per step, a clean write between blocks."""
    blocks = output_length // width
    return batch * (prompt_width + (blocks * (steps + 1) - 1) * width)


@dataclasses.dataclass(frozen=True)
class SubBlockCache(BlockCache):
  """`BlockCache` plus Fast-dLLM v2's sub-block cache inside the active
  block (Wu et al. 2025, arXiv:2509.26328): a step that starts a sub-block
  of S positions calls the whole window and keeps its keys; every other
  step calls only the active sub-block's S positions, attending to the
  committed blocks and to the window keys of the last refresh (stale
  outside the sub-block: approximate). A finished block is still rewritten
  clean, so later blocks see exact keys. Rows refresh independently: when
  some rows of a batch start a sub-block and others do not, both calls run
  and each row keeps its own, so a row decodes the same in any batch.

  Attributes:
    sub_block_length: S dividing W.
  """

  sub_block_length: int = 1
  exact = False
  record = "sub_blocks"

  def call(self, frame, n, loop, start_B, conditioning):
    del n, conditioning
    width, sub, model = frame.width, self.sub_block_length, frame.model
    masked_BxW = windows(loop.tokens, start_B, width) == frame.mask_id
    first_B = jnp.min(jnp.where(masked_BxW, jnp.arange(width) // sub,
                                width // sub - 1), -1)
    offset_B = first_B * sub
    refresh_B = jnp.all(windows(masked_BxW, offset_B, sub), -1)

    def whole(cost):
      out, cost = _span_call(frame, cost, loop.tokens, loop.cache,
                             *query_span(model, start_B, width))
      return out.logits[:, :width], out.cache, cost

    def part(cost):
      out, cost = _span_call(frame, cost, loop.tokens, loop.cache,
                             *query_span(model, start_B + offset_B, sub))
      logits = put_windows(loop.logits, out.logits[:, :sub], offset_B)
      return logits, out.cache, cost

    def mixed(cost):
      whole_logits, whole_cache, cost = whole(cost)
      part_logits, part_cache, cost = part(cost)
      return (jnp.where(refresh_B[:, None, None], whole_logits, part_logits),
              whole_cache.where(refresh_B, part_cache), cost)

    branch = jnp.where(jnp.all(refresh_B), 0,
                       jnp.where(jnp.any(refresh_B), 2, 1))
    logits, cache, cost = jax.lax.switch(branch, (whole, part, mixed),
                                         loop.cost)
    return logits, loop.replace(cache=cache, cost=cost)
