"""Tests of BD3-LM: objective (training.objectives), decoder (decoding.bd3lm)."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base
from lm_decoding.decoding.base import bind, make_decoder
from lm_decoding.decoding.bd3lm import BD3LMDecoder
from lm_decoding.decoding.contexts import block_causal_layout_mask
from lm_decoding.decoding.rules import (
    Step, active_sub_block, commit_above, commit_in_order)
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model, TransformerConfig, make_logits_fn
from lm_decoding.models import masks
from lm_decoding.models.diffusion import EPS, subs_log_probs
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training import objectives

TINY = TransformerConfig(vocab_size=16, d_model=32, num_layers=2, num_heads=2,
                         num_kv_heads=2, head_dim=16, mlp_dim=64, max_len=24,
                         attention="bidirectional")


PARAMS = stubs.random_params(TINY)
MODEL = make_logits_fn(TINY)
TOKENS = jax.random.randint(jax.random.key(1), (4, 8), 5, 16).at[1, 6:].set(
    PAD_ID).at[3, 3:].set(PAD_ID)


# ----------------------------------------------------------------------------
# The objective against independent computations.

def _mask_query_nll(logits_fn, params, tokens):
  """float32[B, L] -log p(x_l | x_<l) of the AR model BD3-LM is at W = 1.

  Computed without the [x_t ; x_0] layout: for each l, one causal pass over
  [x_0, ..., x_{l-1}, MASK, PAD...] (the PADs come after the MASK, so it
  never sees them); the logits at the MASK, without MASK (SUBS), score x_l.
  0 at PAD.
  """
  batch, length = tokens.shape
  l_L = jnp.arange(length)
  seqs_BxLxL = jnp.where(l_L[None, None] < l_L[None, :, None],
                         tokens[:, None], PAD_ID)
  seqs_BxLxL = jnp.where(l_L[None, None] == l_L[None, :, None], MASK_ID,
                         seqs_BxLxL).reshape(batch * length, length)
  logits = logits_fn(params, seqs_BxLxL,
                     jnp.broadcast_to(l_L, seqs_BxLxL.shape),
                     attention_mask=masks.causal_mask(batch * length, length)
                     ).logits.reshape(batch, length, length, -1)
  at_mask_BxLxV = jnp.take_along_axis(
      logits, l_L[None, :, None, None], axis=2)[:, :, 0]
  log_probs = subs_log_probs(at_mask_BxLxV, jnp.full(tokens.shape, MASK_ID),
                             MASK_ID)
  nll = -jnp.take_along_axis(log_probs, tokens[..., None], -1)[..., 0]
  return np.asarray(jnp.where(tokens == PAD_ID, 0.0, nll))


def test_block_length_one_bound_is_the_nll_of_the_mask_query_ar_model():
  nll_BxL = _mask_query_nll(MODEL, PARAMS, TOKENS)
  for key in (0, 1):
    loss, metrics = objectives.bd3lm_bound(
        MODEL, PARAMS, TOKENS, jax.random.key(key), 8, block_length=1)
    np.testing.assert_allclose(float(metrics["nll"]), nll_BxL.sum(),
                               rtol=1e-5)
    assert float(metrics["tokens"]) == np.sum(np.asarray(TOKENS) != PAD_ID)
    np.testing.assert_allclose(float(loss), nll_BxL.sum() / 25, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_length_one_loss_scores_masked_tokens_by_the_ar_model(seed):
  # Each masked token costs its mask-query AR NLL times 1/t of its block, so
  # E[loss] = (1 - eps) x the AR NLL per token (see `bd3lm_loss`).
  key = jax.random.key(seed)
  nll_BxL = _mask_query_nll(MODEL, PARAMS, TOKENS)
  t_BxL, x_t = objectives.bd3lm_noise(key, TOKENS, 1)
  masked = np.asarray(x_t) == MASK_ID
  assert masked.any() and (~masked & (np.asarray(TOKENS) != PAD_ID)).any()
  expected = np.sum(np.where(masked, nll_BxL / np.asarray(t_BxL), 0.0))
  _, metrics = objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, key,
                                     block_length=1)
  np.testing.assert_allclose(float(metrics["nll"]), expected, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_length_l_loss_is_the_mdlm_loss(seed):
  key = jax.random.key(seed)
  mdlm, mdlm_metrics = objectives.mdlm_loss(MODEL, PARAMS, TOKENS, key)
  bd3, bd3_metrics = objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, key,
                                           block_length=8)
  np.testing.assert_allclose(float(bd3), float(mdlm), rtol=1e-6)
  assert float(bd3_metrics["tokens"]) == float(mdlm_metrics["tokens"])
  halves, _ = objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, key,
                                    block_length=4)
  assert abs(float(halves) - float(mdlm)) > 1e-3  # the check can fail


def test_noise_is_one_time_per_block_and_mdlms_at_block_length_l():
  tokens = jnp.full((64, 12), 7, jnp.int32)
  key = jax.random.key(0)
  t_BxL, x_t = objectives.bd3lm_noise(key, tokens, 4)
  t = np.asarray(t_BxL).reshape(64, 3, 4)
  np.testing.assert_array_equal(t, np.broadcast_to(t[..., :1], t.shape))
  strata = np.floor((t[..., 0].ravel() - EPS) / (1 - EPS) * 192 + 1e-3)
  np.testing.assert_array_equal(np.sort(strata), np.arange(192))
  t_l, x_t_l = objectives.bd3lm_noise(key, tokens, 12)
  key_t, key_mask = jax.random.split(key)
  np.testing.assert_array_equal(
      t_l[:, 0], objectives.sample_times(key_t, 64, t_min=EPS))
  np.testing.assert_array_equal(x_t_l, objectives.mask_at_time(
      key_mask, tokens, t_l[:, 0], MASK_ID, EPS))
  assert not np.array_equal(x_t, x_t_l)


def test_training_layout_hides_what_each_half_may_not_see():
  logits_fn = stubs.RecordingLogitsFn()
  tokens = jnp.array([[5, 6, 7, 8], [9, 5, PAD_ID, PAD_ID]])
  objectives.bd3lm_loss(logits_fn, None, tokens, jax.random.key(0),
                        block_length=2)
  inputs, positions, mask = logits_fn.seen[0]
  np.testing.assert_array_equal(inputs[:, 4:], tokens)
  np.testing.assert_array_equal(positions, [[0, 1, 2, 3] * 2] * 2)
  block = np.array([0, 0, 1, 1])
  noisy = np.concatenate([block[:, None] == block,
                          block[None] < block[:, None]], 1)
  clean = np.concatenate([np.zeros((4, 4), bool),
                          block[None] <= block[:, None]], 1)
  expected = np.concatenate([noisy, clean])
  np.testing.assert_array_equal(mask[0], expected)
  valid = np.tile([True, True, False, False], 2)
  np.testing.assert_array_equal(mask[1], expected & valid[None])


# ----------------------------------------------------------------------------
# The objective on a toy distribution whose likelihood is exact.

SYMBOLS = np.array([5, 6, 7])
LENGTH = 3
ALL_SEQS = np.array(list(itertools.product(SYMBOLS, repeat=LENGTH)), np.int32)
JOINT = np.random.default_rng(0).dirichlet(np.full(len(ALL_SEQS), 0.7))


def _optimal_denoiser(params, tokens, positions, cache=None,
                      attention_mask=None):
  """log p(x at the query's position | the non-MASK keys it sees), exactly."""
  del params
  seqs, p = jnp.asarray(ALL_SEQS), jnp.asarray(JOINT, jnp.float32)
  at_key_BxSxN = seqs[:, positions].transpose(1, 2, 0)  # seq n at key j
  agrees_BxSxN = (tokens[..., None] == MASK_ID) | (at_key_BxSxN
                                                == tokens[..., None])
  consistent_BxQxN = jnp.all(~attention_mask[..., None]
                             | agrees_BxSxN[:, None], axis=2)
  at_query_BxQxNxV = jax.nn.one_hot(seqs[:, positions].transpose(1, 2, 0), 8)
  prob = jnp.einsum("bqn,n,bqnv->bqv", consistent_BxQxN, p, at_query_BxQxNxV)
  return ModelOutput(jnp.log(prob + 1e-30), cache)


def _toy_batch(batch):
  rows = np.random.default_rng(1).choice(len(ALL_SEQS), batch, p=JOINT)
  return jnp.asarray(ALL_SEQS[rows])


def _nll_per_token(tokens):
  index = {tuple(s): i for i, s in enumerate(ALL_SEQS)}
  log_p = np.log(JOINT[[index[tuple(s)] for s in np.asarray(tokens)]])
  return -log_p.mean() / LENGTH


def test_bound_of_the_optimal_denoiser_is_the_exact_nll():
  tokens = _toy_batch(2048)
  bound_1, _ = objectives.bd3lm_bound(_optimal_denoiser, None, tokens,
                                      jax.random.key(0), 4, block_length=1)
  np.testing.assert_allclose(float(bound_1), _nll_per_token(tokens),
                             rtol=1e-5)
  # Block length L: unbiased; standard deviation over keys ~0.004.
  bound_l, _ = objectives.bd3lm_bound(_optimal_denoiser, None, tokens,
                                      jax.random.key(0), 4, block_length=3)
  assert abs(float(bound_l) - _nll_per_token(tokens)) < 0.02


def test_loss_of_the_optimal_denoiser_estimates_the_nll():
  tokens = _toy_batch(2048)
  nll = _nll_per_token(tokens)
  for block_length, scale in ((1, 1 - EPS), (3, 1.0)):
    loss_fn = functools.partial(objectives.bd3lm_loss, _optimal_denoiser,
                                None, tokens, block_length=block_length)
    loss_K, _ = jax.jit(jax.vmap(loss_fn))(
        jax.random.split(jax.random.key(block_length), 16))
    assert abs(float(loss_K.mean()) - scale * nll) < 0.03


def test_loss_jits_and_differentiates_with_the_transformer():
  loss_fn = functools.partial(objectives.bd3lm_loss, MODEL, block_length=2)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      PARAMS, TOKENS, jax.random.key(2))
  assert np.isfinite(float(loss)) and float(loss) > 0
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert float(metrics["tokens"]) == 25


@pytest.mark.parametrize("call, match", [
    (lambda: objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, jax.random.key(0),
                                   block_length=3), "block_length=3"),
    (lambda: objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, jax.random.key(0),
                                   block_length=0), "block_length=0"),
    (lambda: objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, jax.random.key(0),
                                   block_length=True), "block_length=True"),
    (lambda: objectives.bd3lm_bound(MODEL, PARAMS, TOKENS, jax.random.key(0),
                                    4, block_length=16), "block_length=16"),
    (lambda: objectives.bd3lm_bound(MODEL, PARAMS, TOKENS, jax.random.key(0),
                                    0, block_length=2), "num_timesteps"),
    (lambda: objectives.bd3lm_loss(MODEL, PARAMS, TOKENS, jax.random.key(0),
                                   block_length=2, eps=0.0), "eps"),
    (lambda: objectives.bd3lm_loss(
        make_logits_fn(TINY.replace(attention="causal")), PARAMS, TOKENS,
        jax.random.key(0), block_length=2), "attention"),
])
def test_bad_objective_options_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()


# ----------------------------------------------------------------------------
# The decoder.

VISIBLE_HASH = stubs.VisibleHashLogitsFn()
PROMPTS = jnp.array([[5, 6, 7, 5], [7, PAD_ID, PAD_ID, PAD_ID], [3, 5, 6, PAD_ID],
                     [PAD_ID, PAD_ID, PAD_ID, PAD_ID], [6, 6, PAD_ID, PAD_ID],
                     [5, 7, 6, 5], [7, 7, 7, PAD_ID], [5, PAD_ID, PAD_ID, PAD_ID]])
PROMPT_LENGTHS = jnp.array([4, 1, 3, 0, 2, 4, 3, 1])
KEY = jax.random.key(0)
GREEDY = SamplingConfig(temperature=0.0)
DECODERS = [  # greedy where drawing is not the point: it compiles faster
    BD3LMDecoder(output_length=8, steps=8, block_length=2),
    BD3LMDecoder(output_length=8, steps=16, block_length=4, reuse_logits=False,
                 sampling=GREEDY),
    BD3LMDecoder(output_length=6, steps=6, block_length=1, early_stop=False,
                 sampling=GREEDY),
    BD3LMDecoder(output_length=6, steps=3, block_length=6,
                 remasking="low_confidence", sampling=GREEDY),
    BD3LMDecoder(output_length=8, steps=4, block_length=4, remasking="margin",
                 sampling=SamplingConfig(temperature=0.8, top_k=3)),
]
TRIGRAM = stubs.TableLogitsFn.random(0, 8, 24, masked_ids=(PAD_ID,))
def _decode(decoder, logits_fn, prompts=PROMPTS,
            prompt_lengths=PROMPT_LENGTHS, key=KEY, params=None):
  logits_fn.executed.clear()
  out = decoder.decode(bind(logits_fn, params), prompts, prompt_lengths, key)
  jax.effects_barrier()
  return jax.tree.map(np.asarray, out), list(logits_fn.executed)


# Every decoder with the mask-reading stub; the cache-reading trigram stub
# with one sampled decoder and block length 1 (a commit at every position).
STUB_CASES = ([(d, VISIBLE_HASH) for d in DECODERS]
              + [(DECODERS[0], TRIGRAM), (DECODERS[2], TRIGRAM)])


@pytest.mark.parametrize("decoder, stub", STUB_CASES,
                         ids=lambda x: repr(x) if isinstance(
                             x, BD3LMDecoder) else type(x).__name__)
def test_cached_blocks_equal_uncached_recomputation_on_stubs(decoder, stub):
  cached, cached_calls = _decode(decoder, stub)
  uncached, uncached_calls = _decode(
      dataclasses.replace(decoder, kv_cache="none"), stub)
  np.testing.assert_array_equal(cached.tokens, uncached.tokens)
  np.testing.assert_array_equal(cached.committed, uncached.committed)
  # The same denoising calls, plus one prefill and N - 1 block commits.
  num_blocks = decoder.num_blocks()
  assert len(cached_calls) == len(uncached_calls) + num_blocks
  batch, prompt_width = PROMPTS.shape
  width = decoder.block_size()
  assert sum(cached_calls) == (batch * prompt_width + batch * width
                               * (len(uncached_calls) + num_blocks - 1))
  assert sum(uncached_calls) == (len(uncached_calls) * batch
                                 * (prompt_width + decoder.output_length))


@pytest.mark.parametrize("decoder", DECODERS, ids=repr)
@pytest.mark.parametrize("kv_cache", ["prefix", "none"])
def test_reported_cost_is_what_the_stub_executed(decoder, kv_cache):
  out, executed = _decode(dataclasses.replace(decoder, kv_cache=kv_cache),
                          VISIBLE_HASH)
  assert int(out.calls["model"]) == len(executed) == int(out.nfe)
  assert int(out.forward_tokens["model"]) == sum(executed)
  steps_per_block = decoder.steps // decoder.num_blocks()
  assert len(executed) <= decoder.steps + (kv_cache == "prefix") * (
      decoder.num_blocks())
  # Blocks left to right: block n's steps commit exactly its W positions.
  per_block = out.committed.reshape(decoder.num_blocks(), steps_per_block, -1)
  np.testing.assert_array_equal(per_block.sum(1), decoder.block_size())


@pytest.mark.parametrize("decoder", [
    dataclasses.replace(DECODERS[0], sampling=GREEDY), DECODERS[1]], ids=repr)
def test_cached_blocks_equal_uncached_recomputation_on_the_transformer(
    decoder):
  # Ancestral commits only: ranked commits of a random-weight model meet
  # near-ties in confidence, which float rounding may order either way.
  models = bind(MODEL, PARAMS)
  cached = decoder.denoise(models, PROMPTS, PROMPT_LENGTHS, KEY,
                           measure_error=True)
  uncached = dataclasses.replace(decoder, kv_cache="none").denoise(
      models, PROMPTS, PROMPT_LENGTHS, KEY)
  np.testing.assert_array_equal(cached.tokens, uncached.tokens)
  assert float(cached.max_logit_error) < 1e-4
  assert not np.any(np.asarray(cached.tokens) == MASK_ID)


@pytest.mark.parametrize("decoder", [DECODERS[i] for i in (0, 3, 4)],
                         ids=repr)
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batch_equals_each_row_decoded_alone(decoder, batch):
  _assert_batch_equals_rows(decoder, batch)


def _assert_batch_equals_rows(decoder, batch):
  out, _ = _decode(decoder, VISIBLE_HASH, PROMPTS[:batch],
                   PROMPT_LENGTHS[:batch])
  keys = base.row_keys(KEY, batch)
  for b in range(batch):
    alone, _ = _decode(decoder, VISIBLE_HASH, PROMPTS[b:b + 1],
                       PROMPT_LENGTHS[b:b + 1], keys[b:b + 1])
    np.testing.assert_array_equal(alone.tokens[0], out.tokens[b])
    np.testing.assert_array_equal(alone.lengths[0], out.lengths[b])


# Fast-dLLM v2's sub-blocks: threshold commits, S = 2 inside blocks of 4.
SUB_BLOCKS = BD3LMDecoder(output_length=8, steps=8, block_length=4,
                          remasking="threshold", threshold=0.3,
                          sub_block_length=2, sampling=GREEDY)


def test_in_order_commits_a_run_from_the_first_masked_position():
  confidence = jnp.array([0.9, 0.2, 0.8, 0.3, 0.95])
  step = Step(k=jnp.int32(0), masked=jnp.array([False, True, True, True, True]),
              fill=jnp.ones(5, bool), num_masked=jnp.int32(4),
              drawn=jnp.zeros(5, jnp.int32),
              probs=jnp.stack([confidence, 1 - confidence], -1),
              committed_confidence=jnp.zeros(5), uniform=jnp.zeros(5))
  # The first masked position whatever its confidence, the next while above
  # tau; the unsure 3 stops the run before the sure 4.
  np.testing.assert_array_equal(commit_in_order(step, 0.5), [0, 1, 1, 0, 0])
  np.testing.assert_array_equal(commit_above(step, 0.5), [0, 0, 1, 0, 1])
  np.testing.assert_array_equal(commit_in_order(step, 1.0), [0, 1, 0, 0, 0])
  np.testing.assert_array_equal(commit_in_order(step, 0.1), [0, 1, 1, 1, 1])
  gap = step.replace(masked=jnp.array([False, True, False, True, True]))
  np.testing.assert_array_equal(commit_in_order(gap, 0.25), [0, 1, 0, 1, 1])
  np.testing.assert_array_equal(commit_in_order(gap, 0.5), [0, 1, 0, 0, 0])
  none = step.replace(masked=jnp.zeros(5, bool))
  assert not commit_in_order(none, 0.5).any()


def _masked_holes(states, output_length, block_length):
  """Whether any block of any traced state shows a token after a MASK (each
  row's blocks start at its prompt length)."""
  generated = np.stack([np.asarray(states)[:, b, start:start + output_length]
                        for b, start in enumerate(PROMPT_LENGTHS.tolist())], 1)
  blocks = generated.reshape(generated.shape[:2] + (-1, block_length))
  seen_mask = np.cumsum(blocks == MASK_ID, -1) > 0
  return bool(np.any(seen_mask & (blocks != MASK_ID)))


def test_in_order_threshold_keeps_every_block_a_masked_suffix():
  decoder = BD3LMDecoder(output_length=8, steps=8, block_length=4,
                         remasking="threshold", threshold=0.2,
                         sampling=GREEDY)
  models = bind(TRIGRAM, None)
  outs = {order: dataclasses.replace(decoder, in_order=order).denoise(
      models, PROMPTS, PROMPT_LENGTHS, KEY, trace=True)
          for order in (False, True)}
  assert _masked_holes(outs[False].states, 8, 4)  # the stub makes holes
  assert not _masked_holes(outs[True].states, 8, 4)
  committed = np.asarray(outs[True].committed)
  assert committed.max() > 1 and committed.sum(0).tolist() == [8] * 8
  uncached = dataclasses.replace(decoder, in_order=True, kv_cache="none")
  np.testing.assert_array_equal(
      outs[True].tokens,
      uncached.denoise(models, PROMPTS, PROMPT_LENGTHS, KEY).tokens)


def test_active_sub_block_is_the_first_one_holding_a_mask():
  masked = jnp.array([False, False, True, False, True, True])
  np.testing.assert_array_equal(active_sub_block(masked, 2),
                                [False, False, True, False, False, False])
  np.testing.assert_array_equal(active_sub_block(masked, 3),
                                [False, False, True, False, False, False])
  np.testing.assert_array_equal(active_sub_block(masked, 6), masked)
  assert not active_sub_block(jnp.zeros(4, bool), 2).any()


def test_sub_blocks_with_the_exact_cache_equal_uncached_recomputation():
  cached, _ = _decode(SUB_BLOCKS, VISIBLE_HASH)
  uncached, _ = _decode(dataclasses.replace(SUB_BLOCKS, kv_cache="none"),
                        VISIBLE_HASH)
  np.testing.assert_array_equal(cached.tokens, uncached.tokens)
  np.testing.assert_array_equal(cached.committed, uncached.committed)


def test_sub_block_cache_of_one_sub_block_is_the_exact_cache():
  # S = W: the refresh is the block's first call, every later call covers
  # the whole window again, so no key is ever stale.
  whole = dataclasses.replace(SUB_BLOCKS, sub_block_length=4)
  exact, _ = _decode(whole, VISIBLE_HASH)
  sub, executed = _decode(dataclasses.replace(whole, kv_cache="dual"),
                          VISIBLE_HASH)
  np.testing.assert_array_equal(sub.tokens, exact.tokens)
  assert int(sub.forward_tokens["model"]) == sum(executed)


def test_sub_block_cache_calls_only_the_active_sub_block_between_refreshes():
  decoder = dataclasses.replace(SUB_BLOCKS, kv_cache="dual",
                                threshold=2.0)  # one commit per step
  out, executed = _decode(decoder, VISIBLE_HASH, PROMPTS[:1],
                          PROMPT_LENGTHS[:1])
  # Per block of 4: refresh (4), sub-block (2), refresh (4), sub-block (2);
  # after blocks 0..N-2 a commit (4); one prefill (4) first.
  assert executed == [4, 4, 2, 4, 2, 4, 4, 2, 4, 2]
  assert int(out.forward_tokens["model"]) == sum(executed)
  assert int(out.nfe) == len(executed)


@pytest.mark.parametrize("batch", [3, 8])
def test_sub_block_cache_batch_equals_each_row_decoded_alone(batch):
  # Rows start their sub-blocks at different steps: the mixed calls (a
  # step that makes two calls), as the count of calls shows.
  decoder = dataclasses.replace(SUB_BLOCKS, kv_cache="dual")
  out, executed = _decode(decoder, VISIBLE_HASH, PROMPTS[:batch],
                          PROMPT_LENGTHS[:batch])
  steps = int(np.any(out.committed > 0, -1).sum())
  assert len(executed) > steps + decoder.num_blocks()  # + prefill, commits
  _assert_batch_equals_rows(decoder, batch)


def test_sub_block_cache_is_approximate_and_measured_on_the_transformer():
  models = bind(MODEL, PARAMS)
  decoder = dataclasses.replace(SUB_BLOCKS, kv_cache="dual")
  out = decoder.denoise(models, PROMPTS, PROMPT_LENGTHS, KEY,
                        measure_error=True)
  exact = dataclasses.replace(SUB_BLOCKS).denoise(
      models, PROMPTS, PROMPT_LENGTHS, KEY, measure_error=True)
  assert float(exact.max_logit_error) < 1e-4
  assert float(out.max_logit_error) > 1e-3  # stale keys inside the block
  assert not np.any(np.asarray(out.tokens) == MASK_ID)


def test_layout_mask_worked_example_and_training_alignment():
  mask = np.asarray(block_causal_layout_mask(
      jnp.array([3]), jnp.ones((1, 7), bool), 2))[0]
  block = np.array([-2, -1, -1, 0, 0, 1, 1])
  np.testing.assert_array_equal(mask, block[None] <= block[:, None])
  np.testing.assert_array_equal(mask[0], [1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(mask[3], [1, 1, 1, 1, 1, 0, 0])
  # Prompts of whole blocks: the clean half of the training layout.
  aligned = block_causal_layout_mask(jnp.array([4, 0]),
                                     jnp.ones((2, 8), bool), 2)
  np.testing.assert_array_equal(aligned, masks.block_causal_mask(2, 8, 2))
  np.testing.assert_array_equal(
      aligned, masks.bd3lm_training_mask(2, 8, 2)[:, 8:, 8:])
  padded = block_causal_layout_mask(jnp.array([1]),
                                    jnp.array([[1, 1, 1, 0]], bool), 1)
  assert not np.asarray(padded)[0, :, 3].any()


@pytest.mark.parametrize("make, match", [
    (lambda: BD3LMDecoder(output_length=8, steps=8, block_length=3),
     r"block_length=3 must be in \[1, 8\] and divide output_length=8"),
    (lambda: BD3LMDecoder(output_length=8, steps=6, block_length=2),
     "steps=6 must be a multiple of the number of blocks"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, block_length=2,
                          kv_cache="window"), "kv_cache='window'"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, block_length=4,
                          remasking="threshold", sub_block_length=3),
     "sub_block_length=3 must be a positive divisor of block_length=4"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, block_length=4,
                          sub_block_length=2),
     "sub_block_length=2 needs remasking='threshold'"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, block_length=4,
                          remasking="threshold", kv_cache="dual"),
     "kv_cache='dual' needs sub_block_length"),
    # the block-causal mask and the once-per-block write are the context's:
    # bd3lm has no options for them
    (lambda: make_decoder("bd3lm", output_length=8, steps=8,
                          cache_refresh="step"), "cache_refresh"),
    (lambda: make_decoder("bd3lm", output_length=8, steps=8,
                          attention="causal"), "attention"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, remasking="top"),
     "remasking='top'"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, in_order=True),
     "in_order=True needs remasking='threshold'"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, remasking="threshold",
                          in_order=1), "in_order=1 must be True or False"),
    (lambda: BD3LMDecoder(output_length=8, steps=8, schedule="square"),
     "schedule='square'"),
    (lambda: make_decoder("bd3lm", output_length=8, steps=8, tau=0.5), "tau"),
])
def test_bad_options_raise_at_construction(make, match):
  with pytest.raises(ValueError, match=match):
    make()


@pytest.mark.parametrize("call, match", [
    (lambda d: d.decode(bind(stubs.RaisingLogitsFn(max_len=10), None),
                        PROMPTS, PROMPT_LENGTHS, KEY), "max_len=10"),
    (lambda d: d.decode(bind(stubs.RaisingLogitsFn(), None), PROMPTS,
                        PROMPT_LENGTHS.at[0].set(5), KEY), "prompt_lengths"),
    (lambda d: d.decode({"draft": Model(stubs.RaisingLogitsFn())},
                        PROMPTS, PROMPT_LENGTHS, KEY), "roles"),
])
def test_bad_input_raises_before_the_model_runs(call, match):
  with pytest.raises(ValueError, match=match):
    call(BD3LMDecoder(output_length=8, steps=8, block_length=2))


def test_registered_and_hashable():
  decoder = make_decoder("bd3lm", output_length=8, steps=4, block_length=4)
  assert decoder == BD3LMDecoder(output_length=8, steps=4, block_length=4)
  assert hash(decoder) == hash(dataclasses.replace(decoder))
  assert decoder.kv_cache == "prefix" and decoder.remasking == "ancestral"
  # blocks go left to right after a prompt: no infill to refuse
  assert not hasattr(decoder, "infill")
