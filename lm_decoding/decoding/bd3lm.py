"""BD3-LM block diffusion decoding with an exact KV cache (Arriola et al. 2025).

A BD3-LM (`training.objectives.bd3lm_loss`) denoises one block of W positions
at a time, attending bidirectionally within the block and to the clean blocks
before it; clean tokens only ever see earlier blocks and their own. Decoding
follows the reference sampler (kuleshov-group/bd3lms, `_semi_ar_sampler`):
blocks left to right, K / N denoising steps per block (MDLM's ancestral
update, or LLaDA-style ranked commits), with the committed blocks held in a
KV cache. The loop over blocks is the iterative decoders' own
(`iterative.denoise_blocks`): only the prefill, the calls and the commit of
a finished block are BD3-LM's.

Layout (as `iterative`): row b is [prompt | T MASK | PAD] in L = P + T slots,
positions arange(L); block n of row b is [P_b + n W, P_b + (n + 1) W): blocks
start at each row's prompt length. Every position p of row b belongs to block
floor((p - P_b) / W); the prompt therefore holds blocks -1, -2, ... counted
back from its end (the last W prompt tokens form block -1, a shorter first
block starts the prompt). Every call, cached or not, uses rows of ONE
block-causal mask over this layout: query p sees the valid keys of blocks
<= its own. Worked example, P_b = 3, W = 2, T = 4 (p: prompt, g: generated):

    position  0 1 2 3 4 5 6
    block    -2-1-1 0 0 1 1       p0 sees p0; p1, p2 see p0..p2;
    token     p p p g g g g       block 0 (3, 4) sees 0..4; block 1 all.

Contexts (`kv_cache`):
  "prefix"  (default) the exact cache of committed blocks: one prefill call
            writes the prompt's keys (block-causal, as training's clean half);
            each denoising step calls the model on the W window tokens only,
            at cache slots [start, start + W), attending to the cached prefix
            and to the window (bidirectional); once the block holds no MASK,
            one more call on its clean tokens writes their keys (as the
            reference's `store_kv` pass). The last block needs no such call.
            The denoising calls' own writes are dropped, so the cache only
            ever holds clean, committed keys.
  "dual"    the prefix cache above, plus Fast-dLLM v2's sub-block cache
            inside the active block (Wu et al. 2025, arXiv:2509.26328; with
            `sub_block_length` S < W): a step that starts a sub-block calls
            the whole window and keeps its keys; every other step calls
            only the active sub-block's S positions, attending to the
            committed blocks and to the window keys of the last such
            refresh (stale outside the sub-block: an approximation, as
            Fast-dLLM's dual cache; `measure_error` measures it). A block
            that finishes is still rewritten clean, so later blocks see
            exact keys. Rows refresh independently: when some rows of a
            batch start a sub-block and others do not, both calls run and
            each row keeps its own, so a row decodes the same in any batch.
  "none"    no cache: each step recomputes the whole layout with the
            block-causal mask; the window's logits are the same numbers
            (later blocks are hidden from it), so this is the exactness
            reference of the cached path. For static shapes every pass
            processes all L positions.
`reuse_logits` (MDLM's caching trick, also the reference's `p_x0_cache`)
skips a denoising call when no row changed since the previous one in the same
block; a block's first step always calls.

Token shift (a model adapted from an AR parent, `TransformerConfig.
token_shift`): the logits predicting block n's first token are those of the
last committed token before it, so a cached denoising call also feeds that
token (W + 1 positions from start - 1, `iterative.query_span`; its key is
the committed one, block-causal) and an uncached one realigns the pass
(`iterative.aligned_logits`). As in training (`objectives.bd3lm_loss`), that
prediction sees only committed blocks; the others see the noisy window.

Sub-blocks (`sub_block_length` S, Fast-dLLM v2): inside a block, the
threshold rule commits only in the first S-position sub-block that still
holds a MASK, so sub-blocks finish left to right; without the sub-block cache
every step still calls the whole window.

Cost per role "model" (`base.forward`): cached, B P for the prefill, B W per
denoising call (B (W + 1) with a token shift; B S, or B (S + 1), for a
sub-block call) and B W per commit; uncached, B L per call.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp

from lm_decoding import debug
from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding import base
from lm_decoding.decoding.base import register
from lm_decoding.decoding.fast_dllm import commit_above
from lm_decoding.decoding.iterative import (
    ORDERINGS, Denoised, Loop, Step, aligned_logits, windows,
    check_special_ids, denoise_blocks, prompt_layout, query_span)
from lm_decoding.decoding.mdlm import MDLMDecoder
from lm_decoding.decoding.schedule import transfer_schedule
from lm_decoding.models import Model
from lm_decoding.models.selection import top_n

BD3LM_KV_CACHES = ("prefix", "dual", "none")
COMMIT_RULES = ("ancestral",) + ORDERINGS + ("threshold",)


def block_causal_layout_mask(prompt_lengths_B: jax.Array, valid_BxL: jax.Array,
                             block_length: int) -> jax.Array:
  """bool[B, L, L]: query p of row b sees valid keys of blocks <= its own.

  Blocks are anchored at each row's prompt length: position p of row b is in
  block floor((p - prompt_lengths[b]) / block_length) (negative in the
  prompt), as in the module docstring.

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


def active_sub_block(masked_W: jax.Array, sub_block_length: int) -> jax.Array:
  """bool[W]: the masked positions of the first sub-block of n =
  `sub_block_length` positions that still holds one (all False if none)."""
  index_W = jnp.arange(masked_W.shape[0]) // sub_block_length
  first = jnp.min(jnp.where(masked_W, index_W, masked_W.shape[0]))
  return masked_W & (index_W == first)


def _run(decoder: BD3LMDecoder, models: Mapping[str, Model],
         prompts_BxP: jax.Array, prompt_lengths_B: jax.Array,
         keys_B: jax.Array, measure_error: bool) -> Loop:
  """Decodes every block (traced inside a jit)."""
  batch, prompt_width = prompts_BxP.shape
  tokens_BxL, fill_BxL, valid_BxL = prompt_layout(
      prompts_BxP, prompt_lengths_B, decoder.output_length, decoder.mask_id,
      decoder.pad_id)
  length = tokens_BxL.shape[1]
  width, num_blocks = decoder.block_size(), decoder.num_blocks()
  sub = decoder.sub_block_size()
  max_steps = decoder.max_block_steps(width)
  cached = decoder.kv_cache != "none"
  model = models["model"]
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                   (batch, length))
  mask_BxLxL = block_causal_layout_mask(prompt_lengths_B, valid_BxL, width)
  vocab = check_special_ids(decoder, model, tokens_BxL, positions_BxL)

  def span_call(cost, tokens_BxL, cache, first_B, size):
    """One cached call on `size` positions from first_B: (ModelOutput, cost)."""
    return base.forward(
        models, "model", cost, windows(tokens_BxL, first_B, size),
        first_B[:, None] + jnp.arange(size, dtype=jnp.int32),
        cache=cache.at(first_B),
        attention_mask=windows(mask_BxLxL, first_B, size))

  def sub_block_logits(loop, start_B):
    """The sub-block cache's call(s): (float32[B, W, V] window logits, loop
    with the kept keys); see the module docstring."""
    masked_BxW = windows(loop.tokens, start_B, width) == decoder.mask_id
    first_B = jnp.min(jnp.where(masked_BxW, jnp.arange(width) // sub,
                                width // sub - 1), -1)
    offset_B = first_B * sub
    refresh_B = jnp.all(windows(masked_BxW, offset_B, sub), -1)

    def whole(cost):
      out, cost = span_call(cost, loop.tokens, loop.cache,
                            *query_span(model, start_B, width))
      return out.logits[:, :width], out.cache, cost

    def part(cost):
      out, cost = span_call(cost, loop.tokens, loop.cache,
                            *query_span(model, start_B + offset_B, sub))
      logits = jax.vmap(lambda w, s, o: jax.lax.dynamic_update_slice_in_dim(
          w, s, o, 0))(loop.logits, out.logits[:, :sub], offset_B)
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

  def window_logits(n, loop, start_B):
    """One counted call: (float32[B, W, V] window logits, loop)."""
    del n
    if decoder.kv_cache == "dual":
      return sub_block_logits(loop, start_B)
    if cached:
      out, cost = span_call(loop.cost, loop.tokens, loop.cache,
                            *query_span(model, start_B, width))
      return out.logits[:, :width], loop.replace(cost=cost)
    out, cost = base.forward(models, "model", loop.cost, loop.tokens,
                             positions_BxL, attention_mask=mask_BxLxL)
    return (windows(aligned_logits(model, out.logits), start_B, width),
            loop.replace(cost=cost))

  def exact(tokens):
    return aligned_logits(model, model.logits_fn(
        model.params, tokens, positions_BxL, attention_mask=mask_BxLxL).logits)

  def commit_block(n, loop, start_B):
    """Writes the finished window's clean keys into the cache (not after
    the last block)."""
    def write(loop):
      out, cost = span_call(loop.cost, loop.tokens, loop.cache, start_B,
                            width)
      return loop.replace(cache=out.cache, cost=cost)
    return jax.lax.cond(n + 1 < num_blocks, write, lambda c: c, loop)

  def begin(n, loop, fresh, start_B):  # the window moved: call at step 0
    del n, fresh, start_B
    return loop, jnp.bool_(False)

  loop = Loop.start(models, tokens_BxL, num_blocks * max_steps,
                    (batch, width, vocab))
  if cached:
    cache = model.logits_fn.init_cache(batch, length)
    if prompt_width:  # prefill: the prompt's keys, block-causal
      out, cost = base.forward(
          models, "model", loop.cost, tokens_BxL[:, :prompt_width],
          positions_BxL[:, :prompt_width], cache=cache.at(0),
          attention_mask=mask_BxLxL[:, :prompt_width])
      cache, loop = out.cache, loop.replace(cost=cost)
    loop = loop.replace(cache=cache)
  return denoise_blocks(
      decoder, loop, prompt_lengths_B, num_blocks, width, fill_BxL, keys_B,
      begin, window_logits, end=commit_block if cached else None,
      exact=exact if measure_error and cached else None)


@debug.jit(static_argnames=("decoder", "measure_error"))
def _generate(decoder, models, prompts, prompt_lengths, keys_B, measure_error):
  loop = _run(decoder, models, prompts, prompt_lengths, keys_B,
              measure_error)
  index_BxT = (prompt_lengths[:, None]
               + jnp.arange(decoder.output_length)[None, :])
  return Denoised(tokens=jnp.take_along_axis(loop.tokens, index_BxT, 1),
                  committed=loop.committed, cost=loop.cost,
                  max_logit_error=loop.error if measure_error else None)


@register("bd3lm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class BD3LMDecoder(MDLMDecoder):
  """Block diffusion decoding of a BD3-LM, blocks cached as they finish.

  Each of the N = T / W blocks gets K / N steps. `remasking` picks what a
  step commits: 'ancestral' (default) is MDLM's reverse process with
  `schedule` (the reference's DDPM update; see `MDLMDecoder`), any of
  `iterative.ORDERINGS` commits the `transfer_schedule(W, K / N)[k]` masked
  positions ranked highest, as LLaDA does; 'threshold' commits every masked
  position whose confidence exceeds `threshold`, at least the most
  confident one (Fast-dLLM v2's parallel decoding inside a block, Wu et al.
  2025; `fast_dllm.commit_above`), and needs K = T (a block may take W
  steps). A token-shifted model is decoded as the module docstring says. Randomness is per row and per
  absolute position (`iterative.step_rows`), so a row decodes the same alone
  or in any batch, cached or not.

  Attributes (besides `MDLMDecoder`'s):
    block_length: W, dividing output_length; should be the block length the
      model was trained with (`config.train.block_length`). None is one
      block of T.
    kv_cache: 'prefix' (the exact cache of committed blocks) or 'none'
      (recompute; the reference path), see the module docstring.
    remasking: 'ancestral', one of `iterative.ORDERINGS`, or 'threshold'.
    threshold: tau > 0 of remasking='threshold' (tau >= 1: one token per
      step); unused otherwise.
    sub_block_length: S dividing W, with remasking='threshold': commits go
      to the first sub-block of S positions still holding a MASK
      (Fast-dLLM v2); None is one sub-block of W. kv_cache='dual'
      needs it (module docstring).
  `attention` must stay 'bidirectional' and `cache_refresh` 'block': the
  decoder builds its own block-causal masks and writes each block once.

  Raises:
    ValueError: any option outside its range (at construction).
  """

  kv_cache: str = "prefix"
  remasking: str = "ancestral"
  threshold: float = 0.9
  sub_block_length: int | None = None

  def __post_init__(self):
    super().__post_init__()
    if self.kv_cache not in BD3LM_KV_CACHES:
      raise ValueError(f"kv_cache={self.kv_cache!r}; allowed for bd3lm: "
                       f"{BD3LM_KV_CACHES}")
    if self.cache_refresh != "block":
      raise ValueError(f"cache_refresh={self.cache_refresh!r}; bd3lm writes "
                       "each block once: only 'block'")
    if self.attention != "bidirectional":
      raise ValueError(f"attention={self.attention!r}; bd3lm builds its own "
                       "block-causal masks: only 'bidirectional'")
    if self.remasking not in COMMIT_RULES:
      raise ValueError(f"remasking={self.remasking!r}; allowed: "
                       f"{COMMIT_RULES}")
    if not is_number(self.threshold) or not 0 < self.threshold < float("inf"):
      raise ValueError(f"threshold={self.threshold!r} must be in (0, inf)")
    if self.remasking == "threshold" and self.steps != self.output_length:
      raise ValueError(f"steps={self.steps} must equal output_length="
                       f"{self.output_length} with remasking='threshold': a "
                       "block may take one step per position")
    if self.sub_block_length is not None:
      if (not is_count(self.sub_block_length)
          or self.block_size() % self.sub_block_length):
        raise ValueError(f"sub_block_length={self.sub_block_length!r} must "
                         "be a positive divisor of block_length="
                         f"{self.block_size()}")
      if self.remasking != "threshold":
        raise ValueError(f"sub_block_length={self.sub_block_length} needs "
                         f"remasking='threshold', got {self.remasking!r}")
    if self.kv_cache == "dual" and self.sub_block_length is None:
      raise ValueError("kv_cache='dual' needs sub_block_length (a "
                       "divisor of block_length)")

  def sub_block_size(self) -> int:
    """S: `sub_block_length`, or the block length W when None."""
    return self.sub_block_length or self.block_size()

  def select(self, step: Step):
    if self.remasking == "ancestral":
      return super().select(step)
    if self.remasking == "threshold":
      commit = commit_above(
          step.replace(masked=active_sub_block(step.masked,
                                               self.sub_block_size())),
          self.threshold)
      return commit, jnp.zeros_like(commit)
    count = transfer_schedule(step.num_masked,
                              self.steps // self.num_blocks())[step.k]
    commit = top_n(step.confidence(self.remasking), step.masked, count)
    return commit, jnp.zeros_like(commit)

  def denoise(self, models: Mapping[str, Model], prompts: jax.Array,
              prompt_lengths: jax.Array, key: jax.Array, trace: bool = False,
              measure_error: bool = False) -> Denoised:
    """Runs the block loop on prompted rows, before EOS handling.

    Args:
      models, prompts, prompt_lengths, key: as `IterativeDecoder.denoise`.
      trace: not supported (must be False).
      measure_error: also record the largest logit difference between the
        cached window logits and the uncached block-causal pass (extra,
        uncounted passes; 0 with kv_cache 'none').
    Returns:
      `Denoised` with tokens int32[B, T] and committed int32[K, B].
    Raises:
      ValueError: as `IterativeDecoder.denoise`, or trace=True.
    """
    if trace:
      raise ValueError("trace=True is not supported by bd3lm")
    prompts, prompt_lengths = self._check(models, prompts, prompt_lengths)
    return _generate(self, models, prompts, prompt_lengths,
                     base.row_keys(key, prompts.shape[0]), measure_error)

  def infill(self, *args, **kwargs):
    """Not supported: BD3-LM decodes blocks left to right after a prompt.

    Raises:
      NotImplementedError: always.
    """
    raise NotImplementedError("bd3lm decodes blocks left to right after a "
                              "prompt; use mdlm or llada to infill")
