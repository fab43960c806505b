"""BD3-LM block diffusion decoding with an exact KV cache (Arriola et al. 2025).

A BD3-LM (`training.objectives.bd3lm_loss`) denoises one block of W positions
at a time, attending bidirectionally within the block and to the clean blocks
before it; clean tokens only ever see earlier blocks and their own. Decoding
follows the reference sampler (kuleshov-group/bd3lms, `_semi_ar_sampler`):
blocks left to right, K / N denoising steps per block (MDLM's ancestral
update, or LLaDA-style ranked commits), with the committed blocks held in a
KV cache. The loop is the engine's (`engine.generate` with
`steps.MaskedSteps`, as every masked decoder); the prefill, the calls and
the write of a finished block are the context's (`block_cache.BlockCache`).

Layout (as `engine`): row b is [prompt | T MASK | PAD] in L = P + T slots,
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

Contexts (`kv_cache`; `contexts.py` holds them):
  "prefix"  (default) `block_cache.BlockCache`, the exact cache of committed
            blocks: one prefill call writes the prompt's keys; each step
            calls the model on the W window tokens only, attending to the
            cached prefix and to the window (bidirectional); once the block
            holds no MASK, one more call on its clean tokens writes their
            keys (as the reference's `store_kv` pass).
  "dual"    `block_cache.SubBlockCache`, the cache above plus Fast-dLLM v2's
            sub-block cache inside the active block (Wu et al. 2025,
            arXiv:2509.26328; with `sub_block_length` S < W): approximate
            inside the block, exact across blocks.
  "none"    `contexts.FullPass` with the block-causal mask: each step
            recomputes the whole layout; the window's logits are the same
            numbers (later blocks are hidden from it), so this is the
            exactness reference of the cached path.
`reuse_logits` (MDLM's caching trick, also the reference's `p_x0_cache`)
skips a denoising call when no row changed since the previous one in the same
block; a block's first step always calls.

Token shift (a model adapted from an AR parent, `TransformerConfig.
token_shift`): the logits predicting block n's first token are those of the
last committed token before it, so a cached denoising call also feeds that
token (W + 1 positions from start - 1, `contexts.query_span`; its key is
the committed one, block-causal) and an uncached one realigns the pass
(`contexts.aligned_logits`). As in training (`objectives.bd3lm_loss`), that
prediction sees only committed blocks; the others see the noisy window.

Sub-blocks (`sub_block_length` S, Fast-dLLM v2): inside a block, the
threshold rule commits only in the first S-position sub-block that still
holds a MASK, so sub-blocks finish left to right; without the sub-block cache
every step still calls the whole window. Fast-dLLM v2's own generate also
writes each block's first token before denoising the block, by an AR step
(the argmax of the logits that predict it, which with a token shift are
the last committed position's); `ar_first_token` does the same at the
block's first step (one more call per block than its generate, whose
clean-block write returns those logits; the tokens are the same).

Cost per role "model" (`base.forward`): cached, B P for the prefill, B W per
denoising call (B (W + 1) with a token shift; B S, or B (S + 1), for a
sub-block call) and B W per commit; uncached, B L per call.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding.base import register
from lm_decoding.decoding.block_cache import BlockCache, SubBlockCache
from lm_decoding.decoding.contexts import FullPass
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.decoding.rules import (
    ORDERINGS, Step, active_sub_block, commit_above, commit_in_order, ranked,
    unmask_ancestral)
from lm_decoding.decoding.schedule import transfer_schedule
from lm_decoding.models import diffusion

BD3LM_KV_CACHES = ("prefix", "dual", "none")
COMMIT_RULES = ("ancestral",) + ORDERINGS + ("threshold",)


@register("bd3lm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class BD3LMDecoder(ScheduledDecoder):
  """Block diffusion decoding of a BD3-LM, blocks cached as they finish.

  Each of the N = T / W blocks gets K / N steps. `remasking` picks what a
  step commits: 'ancestral' (default) is MDLM's reverse process with
  `schedule` (the reference's DDPM update; `rules.unmask_ancestral`), any of
  `rules.ORDERINGS` commits the `transfer_schedule(W, K / N)[k]` masked
  positions ranked highest, as LLaDA does; 'threshold' commits every masked
  position whose confidence exceeds `threshold`, at least the most
  confident one (Fast-dLLM v2's parallel decoding inside a block, Wu et al.
  2025; `rules.commit_above`), and needs K = T (a block may take W
  steps). A token-shifted model is decoded as the module docstring says. Randomness is per row and per
  absolute position (`steps.MaskedSteps`), so a row decodes the same alone
  or in any batch, cached or not.

  Attributes (besides `denoising.ScheduledDecoder`'s):
    schedule: the noise schedule of 'ancestral', one of
      `diffusion.SCHEDULES`.
    block_length: W, dividing output_length; should be the block length the
      model was trained with (`config.train.block_length`). None is one
      block of T.
    kv_cache: 'prefix' (the exact cache of committed blocks), 'dual' (with
      sub-blocks) or 'none' (recompute; the reference path), see the module
      docstring.
    remasking: 'ancestral', one of `rules.ORDERINGS`, or 'threshold'.
    threshold: tau > 0 of remasking='threshold' (tau >= 1: one token per
      step); unused otherwise.
    sub_block_length: S dividing W, with remasking='threshold': commits go
      to the first sub-block of S positions still holding a MASK
      (Fast-dLLM v2); None is one sub-block of W. kv_cache='dual'
      needs it (module docstring).
    ar_first_token: with remasking='threshold', commit the block's first
      position alone at its first step (its argmax), then the threshold
      rule: Fast-dLLM v2's generate, whose AR step writes it (module
      docstring).
    in_order: with remasking='threshold', commit left to right only: the
      first masked position, then the next ones while each is above tau
      (`rules.commit_in_order`); False is `rules.commit_above` (any masked
      position above tau).
  Raises:
    ValueError: any option outside its range (at construction).
  """

  schedule: str = "log_linear"
  kv_cache: str = "prefix"
  remasking: str = "ancestral"
  threshold: float = 0.9
  sub_block_length: int | None = None
  ar_first_token: bool = False
  in_order: bool = False

  def __post_init__(self):
    super().__post_init__()
    if self.schedule not in diffusion.SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r}; allowed: "
                       f"{diffusion.SCHEDULES}")
    if self.kv_cache not in BD3LM_KV_CACHES:
      raise ValueError(f"kv_cache={self.kv_cache!r}; allowed for bd3lm: "
                       f"{BD3LM_KV_CACHES}")
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
    for name in ("ar_first_token", "in_order"):
      value = getattr(self, name)
      if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r} must be True or False")
      if value and self.remasking != "threshold":
        raise ValueError(f"{name}=True needs remasking='threshold', got "
                         f"{self.remasking!r}")
    if self.kv_cache == "dual" and self.sub_block_length is None:
      raise ValueError("kv_cache='dual' needs sub_block_length (a "
                       "divisor of block_length)")

  def sub_block_size(self) -> int:
    """S: `sub_block_length`, or the block length W when None."""
    return self.sub_block_length or self.block_size()

  def context(self):
    """`block_cache.BlockCache`, `SubBlockCache` or a block-causal `FullPass`
    (module docstring)."""
    if self.kv_cache == "prefix":
      return BlockCache()
    if self.kv_cache == "dual":
      return SubBlockCache(sub_block_length=self.sub_block_size())
    return FullPass(attention="block_causal", keep_across_blocks=False)

  def select(self, step: Step):
    steps = self.steps // self.num_blocks()
    if self.remasking == "ancestral":
      commit = unmask_ancestral(step, self.schedule, steps)
    elif self.remasking == "threshold":
      rule = commit_in_order if self.in_order else commit_above
      commit = rule(step.replace(masked=active_sub_block(
          step.masked, self.sub_block_size())), self.threshold)
      if self.ar_first_token:
        first = step.masked & (jnp.arange(step.masked.shape[0]) == 0)
        commit = jnp.where((step.k == 0) & first[0], first, commit)
    else:
      commit = ranked(step, self.remasking,
                      transfer_schedule(step.num_masked, steps)[step.k])
    return commit, jnp.zeros_like(commit)
