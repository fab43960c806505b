"""Autoregressive decoding: KV-cached (scan or early-exit loop) and uncached.

Registered decoders (configs below; all return a `DecodeResult`):
  "ar"             prefill, then a jit-compiled `lax.scan` over the remaining
                   new tokens, threading the KV cache. NFE = output_length
                   (1 prefill + output_length - 1 one-token steps).
  "ar_early_exit"  the same steps in a `lax.while_loop` that stops once every
                   row has emitted an EOS. NFE = 1 + steps actually run; the
                   outputs equal "ar"'s (same keys, same steps).
  "ar_uncached"    no cache: every new token recomputes the whole fixed-size
                   buffer (the cost baseline). NFE = output_length.

Every decoder here uses one model, role "model": `decode(bind(logits_fn,
params), prompts, prompt_lengths, key)`.

Prompts are right-padded, int32[B, P], with prompt_lengths int32[B] in [1, P].
Each row's tokens sit at positions 0, 1, ... whatever its length. Token i of
row b is drawn from the logits at position prompt_length - 1 + i with the key
fold_in(row_key[b], i) (`base.row_keys`), by `sampling.sample`, so a row
decodes the same alone or in any batch. A row ends at its first token in
`eos_ids` (kept); it then emits PAD, commits nothing and is still fed (static
shapes), until all rows end (early exit) or output_length.

Worked example ("ar", greedy, eos_ids (3,), cache S = 6 slots, T = 3):
  prompts [[5, 6, 7], [8, 9, PAD]], prompt_lengths [3, 2]
  prefill  feeds both rows at positions [0, 1, 2]; cache index [3, 3] is set
           to [3, 2] (row 1's PAD slot is overwritten next). Token 0 from the
           logits at positions [2, 1], say [a, EOS]: row 1 ends.      NFE 1
  step 1   feeds token 0 [[a], [EOS]] at positions [[3], [2]] (slots 3
           and 2); token 1 [b, PAD] (row 1 is done).                 NFE 2
  step 2   feeds [[b], [PAD]] at positions [[4], [3]]; token 2 [c, PAD]. NFE 3
  result   tokens [[a, b, c], [EOS, PAD, PAD]], lengths [3, 1],
           committed [[1, 1], [1, 0], [1, 0]] (int32[T, B]).
The cache (or uncached buffer) needs prompt + output_length slots; more is
refused with a ValueError before compiling, because `dynamic_update_slice`
would silently clamp writes past the end onto earlier slots.

The cache a logits_fn returns must have `at(index)` with `index` int32[B],
the per-row write slot (as `lm_decoding.models.KVCache`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding import debug
from lm_decoding.checks import is_count
from lm_decoding.decoding import base, rows, sampling
from lm_decoding.decoding.base import DecodeResult, id_tuple, register
from lm_decoding.models import Model, masks
from lm_decoding.models.binding import LogitsFn
from lm_decoding.special_tokens import EOS_ID, PAD_ID

PROMPT_ATTENTION = ("causal", "bidirectional")


@dataclasses.dataclass(frozen=True)
class SequenceConfig:
  """Options shared by the autoregressive decoders (beam search included).

  Attributes:
    output_length: T >= 1 tokens generated per row (EOS included).
    eos_ids: ids that end a row (any one of them); () never ends early.
    pad_id: id written after a row's end.
    cache_length: KV-cache slots (for "ar_uncached": the recomputed buffer
      length); None means prompt width P + output_length.
    prompt_attention: how the prompt attends to itself: 'causal' (the
      default; a causal LM) or 'bidirectional' (each prompt token sees the
      whole prompt, `masks.prefix_lm_mask`: a prefix LM such as the
      translation AR model, whose source is a bidirectional prefix). Only
      the prefill (or, uncached, every full pass) is affected: tokens after
      the prompt are causal either way. Honoured by "ar", "ar_early_exit",
      "ar_uncached" and "ar_beam"; subclasses that do their own prefill
      (speculative) keep the causal default.

  Raises:
    ValueError: an option outside its range.
  """

  output_length: int = 32
  eos_ids: tuple[int, ...] = (EOS_ID,)
  pad_id: int = PAD_ID
  cache_length: int | None = None
  prompt_attention: str = "causal"

  def __post_init__(self):
    object.__setattr__(self, "eos_ids", id_tuple(self.eos_ids))
    if self.prompt_attention not in PROMPT_ATTENTION:
      raise ValueError(f"prompt_attention={self.prompt_attention!r}; "
                       f"allowed: {PROMPT_ATTENTION}")
    if not is_count(self.output_length):
      raise ValueError(
          f"output_length={self.output_length} must be an integer >= 1")
    if any(e < 0 for e in self.eos_ids):
      raise ValueError(f"eos_ids={self.eos_ids} must all be >= 0")
    if self.pad_id < 0:
      raise ValueError(f"pad_id={self.pad_id} must be >= 0")
    if self.cache_length is not None and not is_count(self.cache_length):
      raise ValueError(f"cache_length={self.cache_length} must be >= 1")

  roles = ("model",)

  def expected_work(self, batch: int, prompt_width: int) -> base.Work:
    """One cached AR decode at B = `batch`, P = `prompt_width`: a prefill
    and T - 1 one-position steps, one draw per row per token (exact)."""
    t = self.output_length
    return base.Work(batch * (prompt_width + t - 1), batch * t)

  def checked_cache_length(self, models: Mapping[str, Model],
                           prompts: jax.Array, prompt_lengths: jax.Array):
    """Validates a decode call's inputs; returns the cache length to use.

    Raises:
      ValueError: models not binding exactly `roles`; prompts not int[B, P]
        with P >= 1 or (when concrete) ids outside the vocabulary;
        prompt_lengths not [B] or (when concrete) outside [1, P]; eos_ids
        or pad_id outside the vocabulary; P + output_length > cache length;
        cache length > logits_fn.max_len.
    """
    base.check_models(self, models)
    prompts, prompt_lengths = rows.check_prompts(prompts, prompt_lengths,
                                                needs_prompt=True)
    width = prompts.shape[1]
    length = (width + self.output_length if self.cache_length is None
              else self.cache_length)
    if width + self.output_length > length:
      raise ValueError(
          f"prompt width P={width} + output_length={self.output_length} "
          f"must be <= cache_length={length}")
    base.check_positions(
        models["model"], "model", length,
        f"prompt width P={width} + output_length={self.output_length}"
        if self.cache_length is None
        else f"cache_length={self.cache_length}")
    base.check_sequence_ids(prompts, self.eos_ids, self.pad_id,
                            models["model"])
    return length, prompts, prompt_lengths


def prompt_mask(prompt_attention: str, prompt_lengths_B: jax.Array,
                length: int, key_length: int) -> jax.Array | None:
  """The attention mask of a pass over [prompt, ...] from slot 0.

  Args:
    prompt_attention: 'causal' (returns None: the model's default) or
      'bidirectional' (`masks.prefix_lm_mask` over the prompt).
    prompt_lengths_B: int32[B] in [1, length].
    length: L queries at slots 0..L-1.
    key_length: S >= L key slots (the cache length; L without a cache).
  Returns:
    None or bool[B, L, S] (slots >= L unseen).
  """
  if prompt_attention == "causal":
    return None
  mask_BxLxL = masks.prefix_lm_mask(prompt_lengths_B, length)
  return jnp.pad(mask_BxLxL, ((0, 0), (0, 0), (0, key_length - length)))


def prefill_body(models, role, cost, prompts_BxP, prompt_lengths_B,
                 cache_length, prompt_attention="causal"):
  """The traceable part of `prefill` (no checks): for use inside a jit.

  `prompt_attention` is `SequenceConfig.prompt_attention`.
  Returns (logits float32[B, V], cache, cost with the call counted).
  """
  batch, width = prompts_BxP.shape
  positions_BxP = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32),
                                   (batch, width))
  cache = models[role].logits_fn.init_cache(batch, cache_length)
  out, cost = base.forward(
      models, role, cost, prompts_BxP.astype(jnp.int32), positions_BxP,
      cache=cache, attention_mask=prompt_mask(
          prompt_attention, prompt_lengths_B, width, cache_length))
  last_Bx1x1 = (prompt_lengths_B - 1)[:, None, None]
  logits_BxV = jnp.take_along_axis(out.logits, last_Bx1x1, axis=1)[:, 0]
  return logits_BxV, out.cache.at(prompt_lengths_B), cost


@debug.jit(static_argnames=("cache_length",))
def _prefill(model, prompts, prompt_lengths, cache_length):
  models = {"model": model}
  logits, cache, _ = prefill_body(models, "model", base.Cost.zero(models),
                                  prompts, prompt_lengths, cache_length)
  return logits, cache


def prefill(logits_fn: LogitsFn, params: Any, prompts: jax.Array,
            prompt_lengths: jax.Array,
            cache_length: int | None = None) -> tuple[jax.Array, Any]:
  """One forward pass over right-padded prompts (time to first token).

  Args:
    logits_fn: the model (static: hashable).
    params: its parameters.
    prompts: int32[B, P] right-padded prompts.
    prompt_lengths: int32[B] real tokens per row, in [1, P].
    cache_length: cache slots S in [P, logits_fn.max_len]; default P.
  Returns:
    logits: float32[B, V] next-token logits (from position length - 1).
    cache: the cache holding the prompts, index = prompt_lengths.
  Raises:
    ValueError: bad prompts/lengths or cache_length outside [P, max_len].
  """
  prompts, prompt_lengths = rows.check_prompts(prompts, prompt_lengths,
                                                needs_prompt=True)
  width = prompts.shape[1]
  cache_length = width if cache_length is None else cache_length
  if not width <= cache_length <= logits_fn.max_len:
    raise ValueError(f"cache_length={cache_length} must be in [P={width}, "
                     f"max_len={logits_fn.max_len}]")
  return _prefill(Model(logits_fn, params), prompts, prompt_lengths,
                  cache_length)


@flax.struct.dataclass
class _LoopState:
  """The decode loop's carry (the cache, if any, travels beside it)."""

  tokens: jax.Array  # int32[B, T] generated tokens, PAD where not (yet) any
  done: jax.Array  # bool[B] the row has emitted an EOS
  seen: jax.Array | None  # bool[B, V] ids in the row (repetition penalty only)
  committed: jax.Array  # int32[T, B] 1 where the row committed token i
  cost: base.Cost  # forward calls and positions so far


def _init_state(config, prompts_BxP, prompt_lengths_B, vocab_size, cost):
  batch, width = prompts_BxP.shape
  seen = None
  if config.sampling.repetition_penalty != 1:
    valid_BxP = jnp.arange(width)[None, :] < prompt_lengths_B[:, None]
    seen = sampling.token_presence(prompts_BxP, valid_BxP, vocab_size)
  steps = config.output_length
  return _LoopState(
      tokens=jnp.full((batch, steps), config.pad_id, jnp.int32),
      done=jnp.zeros((batch,), bool), seen=seen,
      committed=jnp.zeros((steps, batch), jnp.int32), cost=cost)


def _sample_rows(config, keys_B, step, logits_BxV, seen_BxV):
  """int32[B]: token `step` of each row, row b drawn with its own key."""
  if keys_B is None or sampling.is_greedy(config.temperature):
    return sampling.sample(None, logits_BxV, config, seen_BxV=seen_BxV)

  def one(key, logits_V, seen_V):
    seen = None if seen_V is None else seen_V[None]
    return sampling.sample(jax.random.fold_in(key, step), logits_V[None],
                           config, seen_BxV=seen)[0]

  return jax.vmap(one)(keys_B, logits_BxV, seen_BxV)


def _commit(config, state, step, logits_BxV, keys_B):
  """Chooses token `step` of every row from its logits and records it."""
  token_B = _sample_rows(config.sampling, keys_B, step, logits_BxV, state.seen)
  live_B = ~state.done
  token_B = jnp.where(live_B, token_B, config.pad_id)
  seen = state.seen
  if seen is not None:
    seen = seen.at[jnp.arange(token_B.shape[0]), token_B].set(True)
  return state.replace(
      tokens=jax.lax.dynamic_update_index_in_dim(state.tokens, token_B, step,
                                                 axis=1),
      done=state.done | rows.is_eos(token_B, config.eos_ids),
      seen=seen,
      committed=state.committed.at[step].set(live_B.astype(jnp.int32)))


def _result(state):
  return base.result(state.tokens, state.committed.sum(0), state.committed,
                     state.cost)


@debug.jit(static_argnames=("config", "cache_length"))
def _cached_decode(config, cache_length, models, prompts_BxP,
                   prompt_lengths_B, keys_B):
  """Prefill, token 0 from its logits, then one cached step per token.

  The cache is made and consumed inside this one jit: it never crosses a jit
  boundary, so there is nothing to donate, and the loop updates it in place.
  """
  first_logits_BxV, cache, cost = prefill_body(
      models, "model", base.Cost.zero(models), prompts_BxP, prompt_lengths_B,
      cache_length, config.prompt_attention)
  state = _init_state(config, prompts_BxP, prompt_lengths_B,
                      first_logits_BxV.shape[-1], cost)
  state = _commit(config, state, 0, first_logits_BxV, keys_B)

  def step(carry, i):
    state, cache = carry
    tokens_Bx1 = jax.lax.dynamic_slice_in_dim(state.tokens, i - 1, 1, axis=1)
    positions_Bx1 = (prompt_lengths_B + i - 1)[:, None]
    out, cost = base.forward(models, "model", state.cost, tokens_Bx1,
                             positions_Bx1, cache=cache)
    state = state.replace(cost=cost)
    return (_commit(config, state, i, out.logits[:, 0], keys_B),
            out.cache)

  steps = config.output_length
  if config.early_exit:
    def cond(loop):
      i, (state, _) = loop
      return (i < steps) & ~jnp.all(state.done)
    _, (state, _) = jax.lax.while_loop(
        cond, lambda loop: (loop[0] + 1, step(loop[1], loop[0])),
        (jnp.int32(1), (state, cache)))
  else:
    (state, _), _ = jax.lax.scan(lambda carry, i: (step(carry, i), None),
                                 (state, cache),
                                 jnp.arange(1, steps, dtype=jnp.int32))
  return _result(state)


@debug.jit(static_argnames=("config", "length"))
def _uncached_loop(config, length, models, prompts_BxP, prompt_lengths_B,
                   keys_B):
  """Each token runs logits_fn over the whole [B, length] buffer, no cache."""
  batch, width = prompts_BxP.shape
  rows_B = jnp.arange(batch)
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                   (batch, length))
  buffer_BxL = jnp.full((batch, length), config.pad_id, jnp.int32)
  buffer_BxL = buffer_BxL.at[:, :width].set(prompts_BxP.astype(jnp.int32))
  mask = prompt_mask(config.prompt_attention, prompt_lengths_B, length,
                     length)

  def logits_at(cost, buffer_BxL, i):
    out, cost = base.forward(models, "model", cost, buffer_BxL, positions_BxL,
                             attention_mask=mask)
    return out.logits[rows_B, prompt_lengths_B + i - 1], cost

  def advance(state, buffer_BxL, i, logits_BxV):
    state = _commit(config, state, i, logits_BxV, keys_B)
    buffer_BxL = buffer_BxL.at[rows_B, prompt_lengths_B + i].set(
        state.tokens[:, i])
    return state, buffer_BxL

  def step(carry, i):
    state, buffer_BxL = carry
    logits_BxV, cost = logits_at(state.cost, buffer_BxL, i)
    return advance(state.replace(cost=cost), buffer_BxL, i, logits_BxV), None

  first_logits_BxV, cost = logits_at(base.Cost.zero(models), buffer_BxL, 0)
  state = _init_state(config, prompts_BxP, prompt_lengths_B,
                      first_logits_BxV.shape[-1], cost)
  carry = advance(state, buffer_BxL, 0, first_logits_BxV)
  (state, _), _ = jax.lax.scan(
      step, carry, jnp.arange(1, config.output_length, dtype=jnp.int32))
  return _result(state)


@register("ar")
@dataclasses.dataclass(frozen=True)
class AutoregressiveDecoder(SequenceConfig):
  """KV-cached autoregressive decoding with a `lax.scan` (see module doc).

  Attributes (besides `SequenceConfig`'s):
    sampling: how each token is chosen (greedy: temperature 0).
    early_exit: class constant; True loops with `lax.while_loop` until every
      row has ended ("ar_early_exit").
  """

  sampling: sampling.SamplingConfig = sampling.SamplingConfig()
  early_exit: ClassVar[bool] = False

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.sampling, sampling.SamplingConfig):
      raise ValueError(f"sampling={self.sampling!r} must be a SamplingConfig")

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Decodes output_length after right-padded prompts.

    Args:
      models: {"model": Model(logits_fn, params)} (`base.bind`).
      prompts: int32[B, P] right-padded prompts.
      prompt_lengths: int32[B] real tokens per row, in [1, P].
      key: PRNG key (or one per row, see `base.row_keys`); token i of row b
        uses fold_in(row_key[b], i). Unused (may be None) when sampling is
        greedy.
    Returns:
      A `DecodeResult` with tokens int32[B, output_length].
    Raises:
      ValueError: see `SequenceConfig.checked_cache_length` (before compiling).
    """
    length, prompts, prompt_lengths = self.checked_cache_length(
        models, prompts, prompt_lengths)
    return _cached_decode(self, length, models, prompts, prompt_lengths,
                          self._keys(key, prompts.shape[0]))

  def _keys(self, key, batch):
    if sampling.is_greedy(self.sampling.temperature):
      return None
    return base.row_keys(key, batch)


@register("ar_early_exit")
@dataclasses.dataclass(frozen=True)
class EarlyExitDecoder(AutoregressiveDecoder):
  """The "ar" steps in a `lax.while_loop` that stops when every row has
  ended; NFE counts the steps run."""

  early_exit: ClassVar[bool] = True


@register("ar_uncached")
@dataclasses.dataclass(frozen=True)
class UncachedDecoder(AutoregressiveDecoder):
  """Full recompute of the fixed [B, cache_length] buffer for every token."""

  def expected_work(self, batch: int, prompt_width: int) -> base.Work:
    """T full passes over B x (P + T) positions, one draw per row per token
    (exact at the default cache_length)."""
    t = self.output_length
    return base.Work(t * batch * (prompt_width + t), batch * t)

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """As `AutoregressiveDecoder.decode`, without a cache."""
    length, prompts, prompt_lengths = self.checked_cache_length(
        models, prompts, prompt_lengths)
    return _uncached_loop(self, length, models, prompts, prompt_lengths,
                          self._keys(key, prompts.shape[0]))
