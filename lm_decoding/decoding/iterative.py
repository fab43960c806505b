"""One iterative-decoding loop for masked-diffusion LMs, with pluggable policies.

Every parallel decoder of this package (MDLM, LLaDA, Fast-dLLM threshold
decoding, MaskGIT, ReMDM, ...) is a wiring of this loop: a frozen dataclass
deriving from `IterativeDecoder` that says how many steps a block may take
(`max_block_steps`) and which masked positions to commit, and which committed
ones to re-mask, at each step (`select`). The loop itself, the layout, the
proposals, the KV-cache contexts, the cost accounting and the EOS handling
live here once (as dInfer separates iteration manager, decoding strategy and
KV-cache manager).

Layout. With right-padded prompts int32[B, P] and prompt_lengths int32[B],
every row is laid out in a static length L = P + T (T = output_length) as
[prompt | T MASK | PAD], positions arange(L), and PAD keys hidden
(`masks.key_padding_mask`). Worked example, P = 3, T = 4, M = MASK, _ = PAD:

    prompts [[7, 8, 9], [5, _, _]], prompt_lengths [3, 1]
    row 0:  7 8 9 M M M M      generated region: positions 3..6
    row 1:  5 M M M M _ _      generated region: positions 1..4
    valid row 1: 1 1 1 1 1 0 0

The generated region is cut into N = T / block_length blocks decoded left to
right (semi-autoregressive, as LLaDA; one block when block_length is None).
Block n of row b is the window of W = block_length positions starting at
prompt_lengths[b] + n W; rows move from block to block together, each with
its own state. The loop over blocks, `denoise_blocks`, is one
`lax.fori_loop` (one compiled body whatever N), shared with `bd3lm`.

Step (inside block n, for every row; written for ONE row and `jax.vmap`-ed):
  1. logits of the window, from the context (below);
  2. proposal: every window position draws a token through the same
     `SamplingConfig` as AR decoding (temperature, top-k, top-p, min-p), with
     MASK excluded (SUBS, Sahoo et al. 2024), and gets `probs`, the softmax
     of its raw logits over the whole vocabulary, MASK included (LLaDA's
     confidence, Nie et al. 2025);
  3. the decoder's `select` says which masked positions take their draw and
     which committed ones return to MASK;
  4. early stop: the block ends when no row has a masked window position, or
     after `max_block_steps` steps (`lax.while_loop`, static maximum).
Row b's randomness at global step s and absolute position p comes from
fold_in(fold_in(row_key[b], s), p) with the row keys of `base.row_keys`: a
row decodes the same alone or in any batch, and whatever its window.

Contexts (`kv_cache`), i.e. how the window's logits are computed:
  "none"    one full bidirectional pass over [B, L] per step (exact).
  "prefix"  Fast-dLLM's prefix cache (Wu et al. 2025): at each block start
            one full pass fills a KV cache; each step then recomputes only
            the window and everything after it, attending to the cached
            prefix. Exact for a causal model; approximate for a
            bidirectional one (the prefix keys saw the old suffix).
  "dual"    Fast-dLLM's dual cache: prefix and suffix both cached at the
            block start; each step recomputes only the W window positions.
As in Fast-dLLM, the full pass that fills the cache at a block start also
gives the block's first-step logits. `cache_refresh="step"` refills the
cache with a full pass before every cached step (two calls per step): the
exactness check of the cached path. `reuse_logits` skips the model call of a
step when no row changed since the last one (MDLM's caching trick; valid
because the denoiser has no time input, and the cache is fixed within a
block): NFE then counts the calls actually made for the batch, one whenever
ANY row changed.

Token shift. A model whose logits at i predict token i + 1
(`TransformerConfig.token_shift`: diffusion models adapted from an AR
parent) is decoded by the same loop: a full pass's logits are realigned by
`diffusion.shift_logits`, and a cached call starts one position earlier
(`query_span`), at the last token before the window, whose logits predict
the window's first token. Rows then need a prompt of at least one token.

Cost: every call goes through `base.forward`, role "model"; the result's
`forward_tokens` counts B x (L, T - nW or W) positions per call (one more
per row for a token-shifted model's cached calls). The prefix cache's query
size, T - nW, changes with the block: its model call is the one part of the
block compiled once per block (a `lax.switch` on n).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding import debug
from lm_decoding.checks import is_count
from lm_decoding.decoding import base, rows
from lm_decoding.decoding.base import DecodeResult, id_tuple
from lm_decoding.decoding.sampling import SamplingConfig, sample
from lm_decoding.models import Model, masks
from lm_decoding.models.config import token_shift
from lm_decoding.models.diffusion import shift_logits
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID

KV_CACHES = ("none", "prefix", "dual")
CACHE_REFRESH = ("block", "step")
ATTENTION = ("bidirectional", "causal")
ORDERINGS = ("low_confidence", "random", "margin", "entropy")


@flax.struct.dataclass
class Denoised:
  """The raw outcome of the loop (before EOS handling).

  Attributes:
    tokens: int32[B, T] generated regions (`denoise`) or int32[B, L] whole
      sequences (`infill`); no MASK left.
    committed: int32[K, B] net tokens committed per step per row (K the
      static maximum of steps).
    cost: forward calls and positions (`base.Cost`).
    states: int32[K, B, L] the sequences after each step when traced, else
      None.
    max_logit_error: float32[] with `measure_error`, the largest |logit|
      difference between the context's window logits and an uncached full
      pass over the same tokens, over all steps (0 for kv_cache "none");
      else None.
  """

  tokens: jax.Array
  committed: jax.Array
  cost: base.Cost
  states: jax.Array | None = None
  max_logit_error: jax.Array | None = None

  @property
  def nfe(self) -> jax.Array:
    return self.cost.nfe


@flax.struct.dataclass
class Step:
  """What a decoder's `select` sees of ONE row at one step (W = window).

  Attributes:
    k: int32[] step within the block (0-based).
    masked: bool[W] window positions still MASK.
    fill: bool[W] window positions the decoder may write (the generated
      region); `select` must never commit or re-mask outside it.
    num_masked: int32[] masked window positions when the block started.
    drawn: int32[W] proposed tokens (never MASK).
    probs: float32[W, V] softmax of the raw logits (MASK included).
    committed_confidence: float32[W] probability each committed generated
      token had when it was committed (0 elsewhere).
    uniform: float32[W] U[0, 1) noise for the selector's own randomness,
      drawn per absolute position (like the proposals), so a row's result
      does not depend on where its window starts.
  """

  k: jax.Array
  masked: jax.Array
  fill: jax.Array
  num_masked: jax.Array
  drawn: jax.Array
  probs: jax.Array
  committed_confidence: jax.Array
  uniform: jax.Array

  def confidence(self, ordering: str) -> jax.Array:
    """float32[W] score of each position under `ordering` (higher first).

    'low_confidence' p(drawn) (LLaDA), 'random' uniform noise, 'margin' top-1
    minus top-2 probability (Kim et al. 2025), 'entropy' minus the entropy of
    the position's distribution (Ben-Hamu et al. 2025).
    """
    if ordering == "low_confidence":
      return jnp.take_along_axis(self.probs, self.drawn[:, None], -1)[:, 0]
    if ordering == "random":
      return self.uniform
    if ordering == "margin":
      # Two max passes, not `lax.top_k(probs, 2)` (XLA's CPU top-k sorts
      # each row: 12-14x the rest of a step at T = 32) nor an argmax (slow
      # on CPU too): the top-2 value is the largest below the top, or the
      # top itself when it is reached twice (top_k's tie: margin 0).
      top = jnp.max(self.probs, -1, keepdims=True)
      at_top = self.probs == top
      below = jnp.max(jnp.where(at_top, -jnp.inf, self.probs), -1)
      second = jnp.where(at_top.sum(-1) > 1, top[:, 0], below)
      return top[:, 0] - second
    if ordering == "entropy":
      p = self.probs
      return jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.maximum(p, 1e-30)), 0.0),
                     -1)
    raise ValueError(f"ordering={ordering!r}; allowed: {ORDERINGS}")




def prompt_layout(prompts: jax.Array, prompt_lengths: jax.Array,
                  output_length: int, mask_id: int = MASK_ID,
                  pad_id: int = PAD_ID):
  """Lays out [prompt | output_length MASK | PAD] rows (see the module docstring).

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


def _propose(sampling: SamplingConfig, mask_id: int, keys_W, logits_WxV):
  """(drawn int32[W], probs float32[W, V]) for ONE row's window."""
  logits = logits_WxV.astype(jnp.float32)
  probs = jax.nn.softmax(logits, -1)
  no_mask = logits.at[:, mask_id].set(-jnp.inf)
  draw = lambda key, logits_V: sample(key, logits_V[None], sampling)[0]
  return jax.vmap(draw)(keys_W, no_mask), probs


@flax.struct.dataclass
class Loop:
  """The carry of the denoising loop (leading axis B on the per-row arrays)."""

  tokens: jax.Array  # int32[B, L]
  confidence: jax.Array  # float32[B, L] of committed generated tokens
  committed: jax.Array  # int32[K, B]
  executed: jax.Array  # bool[K] steps run
  states: jax.Array | None  # int32[K, B, L] when traced
  cost: base.Cost
  cache: Any  # the KV cache of a cached context, else None
  logits: jax.Array  # float32[B, L or W, V] the last call's logits (reuse)
  error: jax.Array  # float32[] max logit error (measure_error)

  @classmethod
  def start(cls, models, tokens_BxL, total_steps: int, logits_shape,
            trace: bool = False) -> "Loop":
    """The carry before the first step of `total_steps` (K)."""
    batch, length = tokens_BxL.shape
    return cls(
        tokens=tokens_BxL,
        confidence=jnp.zeros((batch, length), jnp.float32),
        committed=jnp.zeros((total_steps, batch), jnp.int32),
        executed=jnp.zeros((total_steps,), bool),
        states=(jnp.zeros((total_steps, batch, length), jnp.int32) if trace
                else None),
        cost=base.Cost.zero(models), cache=None,
        logits=jnp.zeros(logits_shape, jnp.float32), error=jnp.float32(0))


def windows(x_BxL, start_B, width):
  """[B, W, ...]: row b's W entries of x from start[b] on."""
  return jax.vmap(lambda x, s: jax.lax.dynamic_slice_in_dim(x, s, width))(
      x_BxL, start_B)


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


def _put_windows(x_BxL, new_BxW, start_B):
  return jax.vmap(lambda x, n, s: jax.lax.dynamic_update_slice_in_dim(
      x, n, s, 0))(x_BxL, new_BxW, start_B)


def step_rows(decoder: IterativeDecoder, k: jax.Array, global_step: jax.Array,
              logits_BxWxV: jax.Array, tokens_BxW: jax.Array,
              fill_BxW: jax.Array, confidence_BxW: jax.Array,
              num_masked_B: jax.Array, start_B: jax.Array, keys_B: jax.Array):
  """One denoising step of every row's window: propose, select, commit.

  Steps 2 and 3 of the module docstring, written for ONE row and `jax.vmap`-ed
  over the batch; row b's randomness is fold_in(fold_in(keys[b],
  global_step), p) at absolute position p = start[b] + w.

  Args:
    decoder: supplies `sampling`, `mask_id` and `select`.
    k: int32[] step within the block; global_step: int32[] step overall.
    logits_BxWxV: float32[B, W, V] window logits.
    tokens_BxW: int32[B, W] window tokens; fill_BxW: bool[B, W] writable.
    confidence_BxW: float32[B, W] confidence of committed tokens.
    num_masked_B: int32[B] masked window positions at the block start.
    start_B: int32[B] absolute position of each window's first token.
    keys_B: [B] per-row PRNG keys (`base.row_keys`).
  Returns:
    (tokens int32[B, W], confidence float32[B, W], net int32[B]): the new
    window tokens and confidences, and tokens committed minus re-masked.
  """
  def row(window_logits_WxV, tokens_W, fill_W, confidence_W, num_masked,
          start, key):
    width = tokens_W.shape[0]
    step_key = jax.random.fold_in(key, global_step)
    keys_Wx2 = jax.vmap(lambda p: jax.random.split(
        jax.random.fold_in(step_key, p)))(start + jnp.arange(width))
    drawn, probs = _propose(decoder.sampling, decoder.mask_id, keys_Wx2[:, 0],
                            window_logits_WxV)
    masked = fill_W & (tokens_W == decoder.mask_id)
    step = Step(k=k, masked=masked, fill=fill_W, num_masked=num_masked,
                drawn=drawn, probs=probs, committed_confidence=confidence_W,
                uniform=jax.vmap(jax.random.uniform)(keys_Wx2[:, 1]))
    commit, remask = decoder.select(step)
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

  return jax.vmap(row)(logits_BxWxV, tokens_BxW, fill_BxW, confidence_BxW,
                       num_masked_B, start_B, keys_B)


def check_special_ids(decoder: IterativeDecoder, model: Model,
                      tokens_BxL: jax.Array, positions_BxL: jax.Array) -> int:
  """The vocab size V, after checking that mask_id and pad_id are below it.

  Traces one abstract call of `model` on the first column (nothing runs).

  Raises:
    ValueError: decoder.mask_id or decoder.pad_id >= V.
  """
  vocab = jax.eval_shape(
      lambda t: model.logits_fn(model.params, t, positions_BxL[:, :1]),
      tokens_BxL[:, :1]).logits.shape[-1]
  for name in ("mask_id", "pad_id"):
    if getattr(decoder, name) >= vocab:
      raise ValueError(f"{name}={getattr(decoder, name)} must be < vocab "
                       f"size {vocab}")
  return vocab


def denoise_block(decoder: IterativeDecoder, n: jax.Array, loop: Loop,
                  fresh: jax.Array, start_B: jax.Array, width: int,
                  fill_BxW: jax.Array, keys_B: jax.Array,
                  call: Callable[[Loop, jax.Array], tuple[jax.Array, Loop]],
                  view: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
                  exact: Callable[[jax.Array], jax.Array] | None = None):
  """The steps of block n for every row: the loop of every iterative decoder.

  A `lax.while_loop` of at most `decoder.max_block_steps(W)` steps that ends
  early once no row has a masked window position (`decoder.early_stop`).
  Each step gets the window logits (calling the model unless `fresh`: no
  token changed since the logits in `loop.logits` were computed), then
  proposes, selects and commits with `step_rows`.

  Args:
    decoder: the decoder config (static).
    n: int32[] block index (static or traced); global step n K_b + k.
    loop: the carry; fresh: bool[] loop.logits hold the current tokens'.
    start_B: int32[B] absolute position of each row's window.
    width: W (static).
    fill_BxW: bool[B, W] window positions the decoder may write.
    keys_B: [B] per-row keys.
    call: (loop, start_B) -> (logits, loop with cost and cache updated): one
      counted model call for the current tokens.
    view: (logits, start_B) -> float32[B, W, V] window logits of what `call`
      returns; None when `call` returns the window logits.
    exact: tokens int32[B, L] -> float32[B, L, V] uncached logits (uncounted)
      to measure the approximation of a cached context; None: no measure.
  Returns:
    (loop, fresh) after the block.
  """
  max_steps = decoder.max_block_steps(width)
  masked_B = jnp.sum(fill_BxW & (windows(loop.tokens, start_B, width)
                                 == decoder.mask_id), -1, dtype=jnp.int32)

  def cond(carry):
    k, loop, _ = carry
    window = windows(loop.tokens, start_B, width)
    live = jnp.any(fill_BxW & (window == decoder.mask_id))
    return (k < max_steps) & (live | (not decoder.early_stop))

  def body(carry):
    k, loop, fresh = carry
    logits, called = jax.lax.cond(fresh, lambda: (loop.logits, loop),
                                  lambda: call(loop, start_B))
    window_logits = logits if view is None else view(logits, start_B)
    error = loop.error
    if exact is not None:
      error = jnp.maximum(error, jnp.max(jnp.abs(
          windows(exact(loop.tokens), start_B, width) - window_logits)))
    global_step = n * max_steps + k
    tokens_BxW, confidence_BxW, net_B = step_rows(
        decoder, k, global_step, window_logits,
        windows(loop.tokens, start_B, width), fill_BxW,
        windows(loop.confidence, start_B, width), masked_B, start_B, keys_B)
    tokens = _put_windows(loop.tokens, tokens_BxW, start_B)
    fresh = decoder.reuse_logits & jnp.all(tokens == loop.tokens)
    loop = called.replace(
        tokens=tokens,
        confidence=_put_windows(loop.confidence, confidence_BxW, start_B),
        committed=loop.committed.at[global_step].set(net_B),
        executed=loop.executed.at[global_step].set(True),
        states=(None if loop.states is None
                else loop.states.at[global_step].set(tokens)),
        logits=logits, error=error)
    return k + 1, loop, fresh

  _, loop, fresh = jax.lax.while_loop(cond, body,
                                      (jnp.int32(0), loop, fresh))
  return loop, fresh


def denoise_blocks(decoder: IterativeDecoder, loop: Loop, start_B: jax.Array,
                   num_blocks: int, width: int, fill_BxL: jax.Array,
                   keys_B: jax.Array, begin: Callable, call: Callable,
                   end: Callable | None = None, view: Callable | None = None,
                   exact: Callable | None = None) -> Loop:
  """The loop over N blocks of W positions of every iterative decoder.

  Block n of row b is the window [start[b] + n W, start[b] + (n + 1) W);
  for n = 0 .. N - 1, `begin` prepares the block (e.g. fills a KV cache),
  `denoise_block` runs its steps, and `end` closes it (e.g. writes its clean
  keys). The blocks are a `lax.fori_loop`: one compiled body whatever N.

  Args:
    decoder: the decoder config (static).
    loop: the carry before block 0.
    start_B: int32[B] absolute position of each row's block 0.
    num_blocks: N; width: W (static).
    fill_BxL: bool[B, L] positions the decoder may write.
    keys_B: [B] per-row keys (`base.row_keys`).
    begin: (n, loop, fresh, start_B) -> (loop, fresh) before block n's
      steps, `fresh` (bool[]) saying whether loop.logits hold the current
      tokens' logits.
    call: (n, loop, start_B) -> (logits, loop): one counted model call (see
      `denoise_block`), n traced.
    end: (n, loop, start_B) -> loop after block n's steps; None: nothing.
    view, exact: as `denoise_block`'s.
  Returns:
    The carry after block N - 1.
  """
  def block(n, carry):
    loop, fresh = carry
    block_start_B = start_B + n * width
    loop, fresh = begin(n, loop, fresh, block_start_B)
    loop, fresh = denoise_block(
        decoder, n, loop, fresh, block_start_B, width,
        windows(fill_BxL, block_start_B, width), keys_B,
        functools.partial(call, n), view, exact)
    if end is not None:
      loop = end(n, loop, block_start_B)
    return loop, fresh

  return jax.lax.fori_loop(0, num_blocks, block,
                           (loop, jnp.bool_(False)))[0]


def _run(decoder, models, tokens_BxL, fill_BxL, valid_BxL, start_B,
         num_blocks, width, keys_B, trace, measure_error):
  """The loop over N blocks of W positions (traced inside a jit)."""
  batch, length = tokens_BxL.shape
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                   (batch, length))
  causal = decoder.attention == "causal"
  full_mask = masks.key_padding_mask(valid_BxL, length)
  if causal:
    full_mask &= masks.causal_mask(batch, length)
  max_steps = decoder.max_block_steps(width)
  total = num_blocks * max_steps

  model = models["model"]

  def full_pass(cost, tokens, cache=None):
    out, cost = base.forward(models, "model", cost, tokens, positions_BxL,
                             cache=None if cache is None else cache.at(0),
                             attention_mask=full_mask)
    return out._replace(logits=aligned_logits(model, out.logits)), cost

  def call(n, loop, start_B):
    """One counted call: float32[B, L, V] full-pass logits, or with a KV
    cache float32[B, W, V] window logits; and the loop."""
    if decoder.kv_cache == "none":
      out, cost = full_pass(loop.cost, loop.tokens)
      return out.logits, loop.replace(cost=cost)
    cost, cache = loop.cost, loop.cache
    if decoder.cache_refresh == "step":
      out, cost = full_pass(cost, loop.tokens, cache)
      cache = out.cache
    if decoder.kv_cache == "dual":
      return cached_call(width, loop, start_B, cost, cache)
    # A prefix cache queries the rest of the generated region, (N - n) W
    # positions: one branch per block, so that only the model call, not the
    # whole block, is compiled N times.
    return jax.lax.switch(
        n, [functools.partial(cached_call, (num_blocks - i) * width)
            for i in range(num_blocks)], loop, start_B, cost, cache)

  def cached_call(query, loop, start_B, cost, cache):
    """The cached call on `query` positions from the window's start."""
    first_B, size = query_span(model, start_B, query)
    q_tokens = windows(loop.tokens, first_B, size)
    q_positions = first_B[:, None] + jnp.arange(size, dtype=jnp.int32)
    valid_keys = masks.key_padding_mask(valid_BxL, size)
    if decoder.kv_cache == "prefix" or causal:  # prefix + the query span
      mask = masks.cache_query_mask(first_B, size, length, causal)
    else:  # dual: every slot, the window fresh, prefix and suffix cached
      mask = jnp.ones((batch, size, length), bool)
    out, cost = base.forward(models, "model", cost, q_tokens, q_positions,
                             cache=cache.at(first_B),
                             attention_mask=mask & valid_keys)
    return out.logits[:, :width], loop.replace(cost=cost, cache=out.cache)

  def exact(tokens):  # measurement only: not counted as cost
    return aligned_logits(model, model.logits_fn(
        model.params, tokens, positions_BxL, attention_mask=full_mask).logits)

  def begin(n, loop, fresh, start_B):
    """A cached context's block start: a fresh cache, filled (with step 0's
    logits) by one full pass unless every step refreshes it."""
    del n
    if decoder.kv_cache == "none":  # full-pass logits stay valid
      return loop, fresh
    loop = loop.replace(
        cache=models["model"].logits_fn.init_cache(batch, length))
    if decoder.cache_refresh == "step":
      return loop, jnp.bool_(False)
    out, cost = full_pass(loop.cost, loop.tokens, loop.cache)
    loop = loop.replace(cost=cost, cache=out.cache,
                        logits=windows(out.logits, start_B, width))
    return loop, jnp.bool_(True)

  vocab = check_special_ids(decoder, models["model"], tokens_BxL,
                            positions_BxL)
  loop = Loop.start(
      models, tokens_BxL, total,
      (batch, length if decoder.kv_cache == "none" else width, vocab), trace)
  view = None
  if decoder.kv_cache == "none":
    view = lambda logits, start: windows(logits, start, width)
  loop = denoise_blocks(
      decoder, loop, start_B, num_blocks, width, fill_BxL, keys_B, begin, call,
      end=lambda n, loop, start: loop.replace(cache=None), view=view,
      exact=exact if measure_error else None)
  if trace:  # a step not run (early stop) shows the state before it
    last_K = jax.lax.cummax(jnp.where(loop.executed, jnp.arange(total), -1))
    states = jnp.concatenate([tokens_BxL[None], loop.states])[last_K + 1]
    loop = loop.replace(states=states)
  return loop


@debug.jit(static_argnames=("decoder", "trace",
                                             "measure_error"))
def _generate(decoder, models, prompts, prompt_lengths, keys_B, trace,
              measure_error):
  t = decoder.output_length
  tokens, fill, valid = prompt_layout(prompts, prompt_lengths, t,
                                      decoder.mask_id, decoder.pad_id)
  width = decoder.block_size()
  loop = _run(decoder, models, tokens, fill, valid, prompt_lengths,
              t // width, width, keys_B, trace, measure_error)
  index_BxT = prompt_lengths[:, None] + jnp.arange(t)[None, :]
  return Denoised(tokens=jnp.take_along_axis(loop.tokens, index_BxT, 1),
                  committed=loop.committed, cost=loop.cost,
                  states=loop.states,
                  max_logit_error=loop.error if measure_error else None)


@debug.jit(static_argnames=("decoder", "trace"))
def _infill(decoder, models, tokens, fill, valid, keys_B, trace):
  tokens = jnp.where(fill, decoder.mask_id, tokens).astype(jnp.int32)
  batch, length = tokens.shape
  loop = _run(decoder, models, tokens, fill, valid,
              jnp.zeros((batch,), jnp.int32), 1, length, keys_B, trace,
              measure_error=False)
  return Denoised(tokens=loop.tokens, committed=loop.committed,
                  cost=loop.cost, states=loop.states)


@dataclasses.dataclass(frozen=True, kw_only=True)
class IterativeDecoder:
  """Fields and entry points shared by the iterative (diffusion) decoders.

  A subclass adds its own options and implements `max_block_steps(W)` (the
  static step budget of one block of W positions) and `select(step)` ->
  (commit bool[W], remask bool[W]) for ONE row (see `Step`).

  Attributes:
    output_length: T, tokens generated per row (>= 1).
    steps: K, the denoising-step budget over the whole output (>= 1), for
      the decoders that take one (`ScheduledDecoder`: K / N steps per
      block); None for those that set their own pace (threshold decoding).
    block_length: semi-autoregressive block length dividing output_length, or
      None for one block of T.
    sampling: how each position's proposal is drawn (the AR processors;
      temperature 0 is argmax); MASK is never drawn.
    kv_cache: "none", "prefix" or "dual" (see the module docstring).
    cache_refresh: "block" (refill the cache at each block start) or "step"
      (every step: exact, for checks).
    attention: "bidirectional" (a masked-diffusion denoiser) or "causal"
      (the masks the loop builds are causal too).
    reuse_logits: skip the call when no row changed (MDLM's caching trick).
    early_stop: end a block as soon as no row has a masked position in it
      (else run its whole step budget; the skipped steps commit nothing).
    mask_id, pad_id: MASK and PAD token ids.
    eos_ids: ids that end a row.

  Raises:
    ValueError: an option outside its range (checked at construction, so
      before anything compiles).
  """

  roles = ("model",)

  output_length: int
  steps: int | None = None
  block_length: int | None = None
  sampling: SamplingConfig = SamplingConfig(temperature=1.0)
  kv_cache: str = "none"
  cache_refresh: str = "block"
  attention: str = "bidirectional"
  reuse_logits: bool = True
  early_stop: bool = True
  mask_id: int = MASK_ID
  pad_id: int = PAD_ID
  eos_ids: tuple[int, ...] = (EOS_ID,)

  def __post_init__(self):
    object.__setattr__(self, "eos_ids", id_tuple(self.eos_ids))
    if not is_count(self.output_length):
      raise ValueError(f"output_length={self.output_length!r} must be an integer "
                       ">= 1")
    if self.steps is not None and not is_count(self.steps):
      raise ValueError(f"steps={self.steps!r} must be an integer >= 1")
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
    for name, allowed in (("kv_cache", KV_CACHES),
                          ("cache_refresh", CACHE_REFRESH),
                          ("attention", ATTENTION)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name}={getattr(self, name)!r}; allowed: "
                         f"{allowed}")
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

  def select(self, step: Step) -> tuple[jax.Array, jax.Array]:
    """(commit bool[W], remask bool[W]) for ONE row at one step."""
    raise NotImplementedError

  def _check(self, models, prompts, prompt_lengths):
    base.check_models(self, models)
    prompts, prompt_lengths = rows.check_prompts(
        prompts, prompt_lengths,
        needs_prompt=token_shift(models["model"].logits_fn))
    width = prompts.shape[1]
    max_len = models["model"].logits_fn.max_len
    if width + self.output_length > max_len:
      raise ValueError(
          f"prompt width P={width} + output_length={self.output_length} must be <= "
          f"logits_fn.max_len={max_len}")
    base.check_token_ids("prompts", prompts, models["model"])
    self._check_special_ids(models)
    return prompts, prompt_lengths

  def _check_special_ids(self, models):
    """Raises ValueError (before tracing) if mask_id or pad_id >= V."""
    base.check_token_ids("mask_id and pad_id", (self.mask_id, self.pad_id),
                         models["model"])

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
        cached context and an uncached pass (extra, uncounted passes).
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
    self._check_special_ids(models)  # may trace the model for V: last
    return _infill(self, models, tokens, jnp.asarray(fill_mask, bool),
                   jnp.asarray(valid, bool),
                   base.row_keys(key, tokens.shape[0]), trace)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduledDecoder(IterativeDecoder):
  """An iterative decoder spending K / N steps on each of its N blocks.

  Raises:
    ValueError: steps missing, or not a multiple of the number of blocks
      N = output_length / block_length.
  """

  def __post_init__(self):
    super().__post_init__()
    if self.steps is None or self.steps % self.num_blocks():
      raise ValueError(f"steps={self.steps} must be a multiple of the number "
                       f"of blocks output_length / block_length = "
                       f"{self.num_blocks()}")

  def max_block_steps(self, width: int) -> int:
    del width
    return self.steps // self.num_blocks()
