"""The masked-diffusion decoders on the engine, with Fast-dLLM's caches.

Every masked parallel decoder of this package (MDLM, LLaDA, Fast-dLLM
threshold decoding, MaskGIT, ReMDM, ...) is a frozen dataclass deriving from
`IterativeDecoder`: it says how many steps a block may take
(`max_block_steps`, `denoising.ScheduledDecoder`'s K / N or a self-paced W) and
which masked positions to commit, and which committed ones to re-mask, at
each step (`select`, over the rules of `rules.py`). The loop, the layout, the
proposals and the cost accounting are the engine's (`engine.generate` with
`steps.MaskedSteps`); the cache context is picked here by `kv_cache`:

  "none"    `contexts.FullPass`: one full pass over [B, L] per step (exact).
  "prefix"  `contexts.PrefixCache`, Fast-dLLM's prefix cache (Wu et al.
            2025): at each block start one full pass fills a KV cache and
            gives step 0's logits; each step then recomputes only the window
            and everything after it. Exact for a causal model; approximate
            for a bidirectional one (the prefix keys saw the old suffix).
  "dual"    `contexts.DualCache`, Fast-dLLM's dual cache: prefix and suffix
            cached at the block start; each step recomputes only the W
            window positions.
`cache_refresh="step"` refills the cache with a full pass before every
cached step (two calls per step): the exactness check of the cached path.
`reuse_logits` skips the model call of a step when no row changed since the
last one (MDLM's caching trick; valid because the denoiser has no time
input, and the cache is fixed within a block): NFE then counts the calls
actually made for the batch, one whenever ANY row changed.

Token shift. A model whose logits at i predict token i + 1
(`TransformerConfig.token_shift`: diffusion models adapted from an AR
parent) is decoded by the same contexts (`contexts.aligned_logits`,
`contexts.query_span`). Rows then need a prompt of at least one token.

Cost: every call goes through `base.forward`, role "model"; the result's
`forward_tokens` counts B x (L, T - nW or W) positions per call (one more
per row for a token-shifted model's cached calls).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp

from lm_decoding.decoding import base, rows
from lm_decoding.decoding.contexts import DualCache, FullPass, PrefixCache
from lm_decoding.decoding.denoising import (
    DenoisingDecoder, Denoised, ScheduledDecoder, infill_rows)
from lm_decoding.decoding.rules import Step
from lm_decoding.models import Model
from lm_decoding.models.config import token_shift

KV_CACHES = ("none", "prefix", "dual")
CACHE_REFRESH = ("block", "step")
ATTENTION = ("bidirectional", "causal")


@dataclasses.dataclass(frozen=True, kw_only=True)
class IterativeDecoder(DenoisingDecoder):
  """A masked decoder with Fast-dLLM's contexts, infilling too.

  A subclass adds its own options and implements `max_block_steps(W)` (the
  static step budget of one block of W positions) and `select(step)` ->
  (commit bool[W], remask bool[W]) for ONE row (see `rules.Step`).

  Attributes (besides `denoising.DenoisingDecoder`'s):
    kv_cache: "none", "prefix" or "dual" (see the module docstring).
    cache_refresh: "block" (refill the cache at each block start) or "step"
      (every step: exact, for checks).
    attention: "bidirectional" (a masked-diffusion denoiser) or "causal"
      (the masks the loop builds are causal too).

  Raises:
    ValueError: an option outside its range (checked at construction, so
      before anything compiles).
  """

  kv_cache: str = "none"
  cache_refresh: str = "block"
  attention: str = "bidirectional"

  def __post_init__(self):
    super().__post_init__()
    for name, allowed in (("kv_cache", KV_CACHES),
                          ("cache_refresh", CACHE_REFRESH),
                          ("attention", ATTENTION)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name}={getattr(self, name)!r}; allowed: "
                         f"{allowed}")

  def context(self):
    """`contexts.FullPass`, `PrefixCache` or `DualCache` (module docstring)."""
    if self.kv_cache == "none":
      return FullPass(attention=self.attention)
    cache = PrefixCache if self.kv_cache == "prefix" else DualCache
    return cache(attention=self.attention,
                 refresh_every_step=self.cache_refresh == "step")

  def select(self, step: Step) -> tuple[jax.Array, jax.Array]:
    """(commit bool[W], remask bool[W]) for ONE row at one step."""
    raise NotImplementedError

  def infill(self, models: Mapping[str, Model], tokens: jax.Array,
             fill_mask: jax.Array, key: jax.Array,
             valid: jax.Array | None = None,
             trace: bool = False) -> Denoised:
    """Fills the positions `fill_mask` marks, keeping every other token.

    The whole sequence is one window (no blocks); no EOS handling.

    Args:
      models, key, trace: as `denoise`.
      tokens: int32[B, L] sequences (their tokens at fill positions are
        ignored).
      fill_mask: bool[B, L] positions to decode.
      valid: optional bool[B, L] valid keys (default all).
    Returns:
      `Denoised` with tokens int32[B, L]: `tokens` with the holes filled.
    Raises:
      ValueError: block_length set, tokens not int[B, L], fill_mask or
        valid of another shape, or L > logits_fn.max_len; for a
        token-shifted model, a kv_cache other than 'none' or a hole at
        position 0 (nothing predicts token 0).
    """
    if self.num_blocks() > 1:
      raise ValueError(f"block_length={self.block_length}: infill decodes "
                       "the whole sequence as one block; use "
                       "block_length=None")
    base.check_models(self, models)
    tokens = rows.int_matrix("tokens", tokens, "int[B, L]")
    if valid is None:
      valid = jnp.ones(tokens.shape, bool)
    for name, value in (("fill_mask", fill_mask), ("valid", valid)):
      if jnp.shape(value) != tokens.shape:
        raise ValueError(f"{name} must have shape {tokens.shape}; got "
                         f"{jnp.shape(value)}")
    if token_shift(models["model"].logits_fn) and (
        self.kv_cache != "none" or bool(jnp.any(jnp.asarray(fill_mask)[:, 0]))):
      raise ValueError("infill with a token-shifted model needs kv_cache="
                       f"'none' (got {self.kv_cache!r}) and no hole at "
                       "position 0 (nothing predicts token 0)")
    max_len = models["model"].logits_fn.max_len
    if tokens.shape[1] > max_len:
      raise ValueError(f"tokens length L={tokens.shape[1]} must be <= "
                       f"logits_fn.max_len={max_len}")
    base.check_token_ids("mask_id and pad_id", (self.mask_id, self.pad_id),
                         models["model"])  # may trace the model for V: last
    return infill_rows(self, models, tokens, jnp.asarray(fill_mask, bool),
                   jnp.asarray(valid, bool),
                   base.row_keys(key, tokens.shape[0]), trace)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduledIterativeDecoder(IterativeDecoder, ScheduledDecoder):
  """A masked decoder spending K / N steps on each of its N blocks
  (`denoising.ScheduledDecoder`'s `steps`)."""
