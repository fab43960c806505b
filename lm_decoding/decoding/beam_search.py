"""Beam search over a KV cache, with GNMT's length penalty.

"ar_beam" keeps, per row, the `num_beams` best unfinished hypotheses (alive)
and the `num_beams` best finished ones. Each step expands every alive beam by
every token: continuations with an EOS id become finished hypotheses, scored

    score = log p(y) / lp(|y|),   lp(n) = ((5 + n) / 6) ** alpha

(Wu et al. 2016, GNMT; |y| counts the generated tokens, EOS included;
alpha = 0 is the plain log-probability); the best `num_beams` non-EOS
continuations stay alive. After output_length steps the alive hypotheses
count as finished at length output_length, and each row returns its best
hypothesis by score. There is no early stopping: every row runs all steps, and
rows are independent (per-row EOS and prompt lengths).

Cache: one prefill at batch B, then the cache is repeated per beam (row-major
B x M rows) and its rows follow their beams (`cache.reorder`, as
`KVCache.reorder`). NFE = output_length (1 prefill + one [B * M]-row step per further
token).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding import debug
from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding import base, rows
from lm_decoding.decoding.autoregressive import SequenceConfig, prefill_body
from lm_decoding.decoding.base import DecodeResult, register
from lm_decoding.models import Model


def gnmt_length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """lp(n) = ((5 + n) / 6) ** alpha (Wu et al. 2016); float32 like `length`."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


@flax.struct.dataclass
class _BeamState:
  """Per row b and beam k: alive and finished hypotheses."""

  alive_tokens: jax.Array  # int32[B, M, T], PAD after the last token
  alive_log_prob: jax.Array  # float32[B, M], -inf for an empty beam
  finished_tokens: jax.Array  # int32[B, M, T], EOS kept, PAD after
  finished_score: jax.Array  # float32[B, M], -inf for an empty slot
  finished_length: jax.Array  # int32[B, M]
  cost: base.Cost


def _top(k, scores_BxC, *values_BxC):
  """The k best entries of scores per row, and the same entries of values."""
  best, ids = jax.lax.top_k(scores_BxC, k)
  take = lambda v: jnp.take_along_axis(
      v, ids.reshape(ids.shape + (1,) * (v.ndim - 2)), axis=1)
  return (best,) + tuple(take(v) for v in values_BxC)


def _beam_step(config, state, cache, step, logits_BMxV):
  """Extends every alive beam by token `step`; returns (state, cache)."""
  batch, beams, steps = state.alive_tokens.shape
  vocab = logits_BMxV.shape[-1]
  eos_E = jnp.asarray(config.eos_ids, jnp.int32)
  log_prob_BxMxV = (jax.nn.log_softmax(logits_BMxV.astype(jnp.float32), -1)
                    .reshape(batch, beams, vocab)
                    + state.alive_log_prob[:, :, None])

  # Hypotheses ending here with an EOS join the finished ones.
  ended_BxMxExT = jnp.broadcast_to(
      state.alive_tokens[:, :, None],
      (batch, beams, len(config.eos_ids), steps)).at[..., step].set(eos_E)
  ended_score_BxMxE = (log_prob_BxMxV[:, :, eos_E]
                       / gnmt_length_penalty(step + 1, config.length_penalty))
  finished_score, finished_tokens, finished_length = _top(
      beams,
      jnp.concatenate([state.finished_score,
                       ended_score_BxMxE.reshape(batch, -1)], axis=1),
      jnp.concatenate([state.finished_tokens,
                       ended_BxMxExT.reshape(batch, -1, steps)], axis=1),
      jnp.concatenate([state.finished_length,
                       jnp.full((batch, beams * len(config.eos_ids)), step + 1,
                                jnp.int32)], axis=1))

  # The best non-EOS continuations stay alive; their caches follow them.
  is_eos_V = rows.is_eos(jnp.arange(vocab), config.eos_ids)
  continuing_BxMV = jnp.where(is_eos_V, -jnp.inf, log_prob_BxMxV).reshape(
      batch, beams * vocab)
  alive_log_prob, flat_BxM = jax.lax.top_k(continuing_BxMV, beams)
  parent_BxM, token_BxM = flat_BxM // vocab, flat_BxM % vocab
  alive_tokens = jnp.take_along_axis(
      state.alive_tokens, parent_BxM[:, :, None], axis=1).at[:, :, step].set(
          token_BxM)
  rows_BM = (jnp.arange(batch)[:, None] * beams + parent_BxM).reshape(-1)
  cache = cache.reorder(rows_BM)
  return state.replace(
      alive_tokens=alive_tokens, alive_log_prob=alive_log_prob,
      finished_tokens=finished_tokens, finished_score=finished_score,
      finished_length=finished_length), cache


@debug.jit(static_argnames=("config", "cache_length"))
def _beam_decode(config, cache_length, models, prompts_BxP, prompt_lengths_B):
  batch = prompts_BxP.shape[0]
  beams, steps = config.num_beams, config.output_length
  first_logits_BxV, cache, cost = prefill_body(
      models, "model", base.Cost.zero(models), prompts_BxP, prompt_lengths_B,
      cache_length, config.prompt_attention)
  vocab = first_logits_BxV.shape[-1]
  if max(config.eos_ids + (config.pad_id,)) >= vocab:
    raise ValueError(f"eos_ids={config.eos_ids} and pad_id={config.pad_id} "
                     f"must be < vocab size {vocab}")
  per_beam = lambda x: jnp.repeat(x, beams, axis=0)
  cache = cache.reorder(jnp.repeat(jnp.arange(batch), beams))
  positions_BM = per_beam(prompt_lengths_B)
  empty = jnp.full((batch, beams, steps), config.pad_id, jnp.int32)
  state = _BeamState(
      alive_tokens=empty,
      alive_log_prob=jnp.full((batch, beams), -jnp.inf).at[:, 0].set(0.0),
      finished_tokens=empty,
      finished_score=jnp.full((batch, beams), -jnp.inf),
      finished_length=jnp.zeros((batch, beams), jnp.int32), cost=cost)
  carry = _beam_step(config, state, cache, 0, per_beam(first_logits_BxV))

  def step(carry, i):
    state, cache = carry
    tokens_BMx1 = state.alive_tokens[:, :, i - 1].reshape(batch * beams, 1)
    out, cost = base.forward(models, "model", state.cost, tokens_BMx1,
                             (positions_BM + i - 1)[:, None], cache=cache)
    state = state.replace(cost=cost)
    return _beam_step(config, state, out.cache, i, out.logits[:, 0]), None

  (state, _), _ = jax.lax.scan(step, carry,
                               jnp.arange(1, steps, dtype=jnp.int32))
  # Alive hypotheses that reached output_length without an EOS are complete.
  alive_score = (state.alive_log_prob
                 / gnmt_length_penalty(steps, config.length_penalty))
  _, tokens, lengths = _top(
      1,
      jnp.concatenate([state.finished_score, alive_score], axis=1),
      jnp.concatenate([state.finished_tokens, state.alive_tokens], axis=1),
      jnp.concatenate([state.finished_length,
                       jnp.full((batch, beams), steps, jnp.int32)], axis=1))
  lengths_B = lengths[:, 0]
  committed_TxB = (jnp.arange(steps)[:, None] < lengths_B[None, :])
  return base.result(tokens[:, 0], lengths_B,
                     committed_TxB.astype(jnp.int32), state.cost)


@register("ar_beam")
@dataclasses.dataclass(frozen=True)
class BeamSearchDecoder(SequenceConfig):
  """Beam search with the GNMT length penalty (see module doc).

  Attributes (besides `SequenceConfig`'s):
    num_beams: M >= 1 hypotheses kept alive (and finished) per row.
    length_penalty: alpha >= 0 of lp(n) = ((5 + n) / 6) ** alpha.

  Raises:
    ValueError: an option outside its range.
  """

  num_beams: int = 4
  length_penalty: float = 0.6

  def __post_init__(self):
    super().__post_init__()
    if not is_count(self.num_beams):
      raise ValueError(f"num_beams={self.num_beams} must be >= 1")
    if (not is_number(self.length_penalty)
        or not 0 <= self.length_penalty < math.inf):
      raise ValueError(f"length_penalty={self.length_penalty!r} must be in "
                       "[0, inf) (a number)")

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Returns each row's best hypothesis; `key` is unused (deterministic).

    Raises:
      ValueError: see `SequenceConfig.checked_cache_length` (before compiling).
    """
    del key
    length, prompts, prompt_lengths = self.checked_cache_length(
        models, prompts, prompt_lengths)
    return _beam_decode(self, length, models, prompts, prompt_lengths)
