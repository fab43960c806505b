"""Tests of masked-diffusion decoding (MDLM and LLaDA) with stub denoisers,
and their bad options and inputs (`BAD_INPUTS`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base
from lm_decoding.decoding.base import bind
from lm_decoding.decoding.engine import prompt_layout
from lm_decoding.decoding.rules import Step
from lm_decoding.decoding.llada import LLaDADecoder
from lm_decoding.decoding.mdlm import MDLMDecoder
from lm_decoding.decoding.rows import eos_counts, finish_at_eos
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID


def _constant(row, length=64):
  return stubs.PositionLogitsFn([row] * length)


STUB = stubs.HashDenoiser()
PARAMS = jnp.uint32(17)
PROMPTS = jnp.array([[6, 7, 8], [9, PAD_ID, PAD_ID], [PAD_ID, PAD_ID, PAD_ID]], jnp.int32)
PROMPT_LENGTHS = jnp.array([3, 1, 0], jnp.int32)


def _denoise(decoder, prompts=PROMPTS, prompt_lengths=PROMPT_LENGTHS, seed=0,
             logits_fn=STUB):
  """Traced run; returns (Denoised, model calls counted through the stub)."""
  first = len(logits_fn.executed)
  out = decoder.denoise(bind(logits_fn, PARAMS), prompts, prompt_lengths,
                        jax.random.key(seed), trace=True)
  jax.effects_barrier()
  return jax.tree.map(np.asarray, out), len(logits_fn.executed) - first


def _expected_nfe(committed_KxB):
  """Calls made with the caching trick: step 0, then after any commit."""
  changed_K = committed_KxB.sum(1) > 0
  return 1 + int(changed_K[:-1].sum())


def _check_unmasking(initial_BxL, states_KxBxL, committed_KxB):
  """C6: MASK -> token at most once per position, counts match `committed`."""
  seq = np.concatenate([np.asarray(initial_BxL)[None], states_KxBxL])
  changed = seq[1:] != seq[:-1]
  assert changed.sum(0).max() <= 1, "a position changed twice"
  assert np.all(seq[:-1][changed] == MASK_ID), "a committed token changed"
  assert not np.any(seq[1:][changed] == MASK_ID)
  np.testing.assert_array_equal(changed.sum(-1), committed_KxB)
  masks_KxB = (seq == MASK_ID).sum(-1)
  np.testing.assert_array_equal(masks_KxB[:-1] - masks_KxB[1:], committed_KxB)
  assert masks_KxB[-1].max() == 0, "MASK left after the last step"


# Decoders run on PROMPTS (ragged, one unconditional row), each with the
# tokens LLaDA must commit per step (its per-block transfer schedule; C6, C7),
# or None for MDLM (random counts). These run every step of their budget
# (early_stop=False), so NFE follows `_expected_nfe`; early stopping has its
# own tests.
FULL = dict(early_stop=False)
MDLM = MDLMDecoder(output_length=8, steps=4, **FULL)
MDLM_CACHED = MDLMDecoder(output_length=4, steps=16, **FULL)  # steps > positions
MDLM_UNCACHED = dataclasses.replace(MDLM_CACHED, reuse_logits=False)
LLADA = LLaDADecoder(output_length=8, steps=4, **FULL)
LLADA_RANDOM = LLaDADecoder(output_length=5, steps=3, block_length=5,
                            remasking="random", **FULL)
LLADA_TWO_BLOCKS = LLaDADecoder(output_length=8, steps=4, block_length=4,
                                remasking="random",
                                sampling=SamplingConfig(temperature=1.0),
                                **FULL)
LLADA_BLOCKS = LLaDADecoder(output_length=6, steps=6, block_length=2,
                            eos_ids=(EOS_ID, 9), **FULL)
CASES = [
    (MDLM, None),
    (MDLM_CACHED, None),
    (MDLM_UNCACHED, None),
    (LLADA, [2, 2, 2, 2]),
    (LLADA_TWO_BLOCKS, [2, 2, 2, 2]),
    (LLADA_RANDOM, [2, 2, 1]),
    (LLaDADecoder(output_length=6, steps=4, block_length=3,
                  sampling=SamplingConfig(temperature=0.7), **FULL),
     [2, 1, 2, 1]),
    (LLADA_BLOCKS, [1] * 6),
    (LLaDADecoder(output_length=4, steps=6, block_length=2, remasking="random",
                  **FULL),
     [1, 1, 0, 1, 1, 0]),
]


@pytest.mark.parametrize("decoder, expected", CASES, ids=repr)
@pytest.mark.parametrize("seed", [0, 1])
def test_decoders_unmask_once_on_schedule_and_count_calls(decoder, expected,
                                                          seed):
  out, calls = _denoise(decoder, seed=seed)
  t = decoder.output_length
  initial, fill, _ = prompt_layout(PROMPTS, PROMPT_LENGTHS, t, MASK_ID, PAD_ID)
  assert out.tokens.shape == (3, t) and out.tokens.dtype == np.int32
  assert not np.any(out.tokens == MASK_ID)
  assert out.tokens.min() >= 0 and out.tokens.max() < STUB.vocab
  _check_unmasking(initial, out.states, out.committed)
  np.testing.assert_array_equal(out.committed.sum(0), [t, t, t])
  # The prompt region and the PAD tail are never modified.
  for state in out.states:
    np.testing.assert_array_equal(state[~fill], np.asarray(initial)[~fill])
  index_BxT = np.asarray(PROMPT_LENGTHS)[:, None] + np.arange(t)
  generated_KxBxT = np.take_along_axis(out.states, index_BxT[None], 2)
  np.testing.assert_array_equal(out.tokens, generated_KxBxT[-1])
  assert out.nfe == calls
  if decoder.reuse_logits:
    assert calls == _expected_nfe(out.committed) <= decoder.steps
  else:
    assert calls == decoder.steps
  if expected is None:
    return
  np.testing.assert_array_equal(out.committed, np.stack([expected] * 3, 1))
  if min(expected) > 0:
    assert calls == decoder.steps
  # Semi-autoregressive: after a block's last step it holds no MASK and every
  # later block is still all MASK.
  block = decoder.block_size()
  per_block = decoder.steps // (t // block)
  for k in range(per_block - 1, decoder.steps, per_block):
    end = (k // per_block + 1) * block
    assert not np.any(generated_KxBxT[k][:, :end] == MASK_ID)
    assert np.all(generated_KxBxT[k][:, end:] == MASK_ID)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mdlm_caching_trick_saves_calls_without_changing_output(seed):
  out, calls = _denoise(MDLM_CACHED, seed=seed)
  ref, ref_calls = _denoise(MDLM_UNCACHED, seed=seed)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.committed, ref.committed)
  np.testing.assert_array_equal(out.states, ref.states)
  assert ref.nfe == ref_calls == 16
  assert out.nfe == calls == _expected_nfe(out.committed) < 16


def _mask_loving(vocab=8):
  """F4: logits MASK +10, every other token 0."""
  logits = [0.0] * vocab
  logits[MASK_ID] = 10.0
  return _constant(logits)


def _chi2_uniform(counts):
  expected = counts.sum() / counts.size
  return ((counts - expected) ** 2 / expected).sum()


def test_mdlm_never_draws_mask_and_unmasks_uniformly_over_steps():
  # Log-linear schedule: P(unmask at step k | masked) = 1 / (K - k), so a
  # single position is unmasked at each of the K steps with probability 1/K;
  # its token is uniform over the 7 tokens other than MASK.
  steps, rows = 4, 2000
  decoder = MDLMDecoder(output_length=1, steps=steps, eos_ids=())
  out = decoder.decode(bind(_mask_loving(), None), jnp.zeros((rows, 0), jnp.int32),
                       jnp.zeros(rows, jnp.int32), jax.random.key(3))
  tokens = np.asarray(out.tokens).ravel()
  assert not np.any(tokens == MASK_ID)
  others = np.delete(np.bincount(tokens, minlength=8), MASK_ID)
  assert _chi2_uniform(others) < 22.46, others  # df 6, p = 0.001
  step_of_row = np.argmax(np.asarray(out.committed), 0)
  counts = np.bincount(step_of_row, minlength=steps)
  assert _chi2_uniform(counts) < 16.27, counts  # df 3, p = 0.001


def test_llada_argmax_never_picks_mask_even_when_the_model_prefers_it():
  rows = 1000  # 2000 tokens
  decoder = LLaDADecoder(output_length=2, steps=1, eos_ids=())
  out = decoder.decode(bind(_mask_loving(), None), jnp.zeros((rows, 0), jnp.int32),
                       jnp.zeros(rows, jnp.int32), jax.random.key(5))
  assert not np.any(np.asarray(out.tokens) == MASK_ID)


def test_ragged_batch_decodes_as_its_rows_alone():
  decoder = LLADA_BLOCKS  # 3 blocks, argmax, low-confidence remasking
  batch, _ = _denoise(decoder)
  width = PROMPTS.shape[1] + decoder.output_length
  for b in range(3):
    # Alone and padded wider: only the (masked-out) PAD tail grows.
    alone, _ = _denoise(decoder, jnp.pad(PROMPTS[b:b + 1], ((0, 0), (0, 2))),
                        PROMPT_LENGTHS[b:b + 1])
    np.testing.assert_array_equal(batch.tokens[b], alone.tokens[0])
    np.testing.assert_array_equal(batch.states[:, b],
                                  alone.states[:, 0, :width])
    np.testing.assert_array_equal(batch.committed[:, b], alone.committed[:, 0])
  # The rows differ, so the test would notice rows leaking into each other.
  assert len({tuple(row) for row in batch.tokens}) == 3


def test_mdlm_row_does_not_depend_on_the_other_rows():
  decoder = MDLM
  other = PROMPTS.at[1:].set(jnp.array([[10, 11, 12], [13, 14, PAD_ID]]))
  first, _ = _denoise(decoder)
  second, _ = _denoise(decoder, other, jnp.array([3, 3, 2], jnp.int32))
  np.testing.assert_array_equal(first.tokens[0], second.tokens[0])
  np.testing.assert_array_equal(first.committed[:, 0], second.committed[:, 0])
  assert not np.array_equal(first.tokens[1:], second.tokens[1:])


@pytest.mark.parametrize("decoder", [MDLM, LLADA_RANDOM], ids=repr)
def test_infill_fills_only_the_holes(decoder):
  rng = np.random.default_rng(0)
  shape = (3, PROMPTS.shape[1] + decoder.output_length)
  tokens = jnp.asarray(rng.integers(5, 16, shape), jnp.int32)
  fill = rng.random(shape) < 0.5
  fill[2] = False  # a row with nothing to fill
  first = len(STUB.executed)
  out = decoder.infill(bind(STUB, PARAMS), tokens, fill, jax.random.key(1),
                       trace=True)
  jax.effects_barrier()
  filled = np.asarray(out.tokens)
  np.testing.assert_array_equal(filled[~fill], np.asarray(tokens)[~fill])
  assert not np.any(filled == MASK_ID)
  np.testing.assert_array_equal(np.asarray(out.committed).sum(0), fill.sum(1))
  initial = np.where(fill, MASK_ID, np.asarray(tokens))
  _check_unmasking(initial, np.asarray(out.states), np.asarray(out.committed))
  calls = len(STUB.executed) - first
  assert out.nfe == calls == _expected_nfe(np.asarray(out.committed))


@pytest.mark.parametrize("decoder", [MDLM, LLADA_RANDOM], ids=repr)
def test_decode_is_infill_of_the_prompt_layout(decoder):
  tokens, fill, input_mask = prompt_layout(PROMPTS, PROMPT_LENGTHS,
                                           decoder.output_length, MASK_ID, PAD_ID)
  key = jax.random.key(2)
  out = decoder.denoise(bind(STUB, PARAMS), PROMPTS, PROMPT_LENGTHS, key, trace=True)
  filled = decoder.infill(bind(STUB, PARAMS), tokens, fill, key, input_mask,
                          trace=True)
  np.testing.assert_array_equal(out.states, filled.states)
  np.testing.assert_array_equal(out.committed, filled.committed)
  assert out.nfe == filled.nfe


def test_prompt_layout_worked_example():
  tokens, fill, input_mask = prompt_layout(
      jnp.array([[7, 8, 9], [5, PAD_ID, PAD_ID]]), jnp.array([3, 1]), 4, MASK_ID, PAD_ID)
  np.testing.assert_array_equal(tokens, [[7, 8, 9, 4, 4, 4, 4],
                                         [5, 4, 4, 4, 4, 0, 0]])
  np.testing.assert_array_equal(fill, [[0, 0, 0, 1, 1, 1, 1],
                                       [0, 1, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(input_mask, [[1] * 7, [1] * 5 + [0] * 2])


def test_finish_at_eos_and_eos_counts():
  raw = jnp.array([[5, 3, 6, 3], [3, 5, 5, 5], [5, 6, 7, 8], [3, 3, 3, 3],
                   [5, 7, 3, 6]], jnp.int32)
  tokens, lengths = finish_at_eos(raw, (3,), PAD_ID)
  np.testing.assert_array_equal(tokens, [[5, 3, 0, 0], [3, 0, 0, 0],
                                         [5, 6, 7, 8], [3, 0, 0, 0],
                                         [5, 7, 3, 0]])
  np.testing.assert_array_equal(lengths, [2, 1, 4, 1, 3])
  _, lengths = finish_at_eos(raw, (3, 7), PAD_ID)  # 7 alone ends a row
  np.testing.assert_array_equal(lengths, [2, 1, 3, 1, 2])
  tokens, lengths = finish_at_eos(raw, (), PAD_ID)
  np.testing.assert_array_equal(tokens, raw)
  np.testing.assert_array_equal(lengths, [4] * 5)
  assert tuple(map(int, eos_counts(raw, (3,)))) == (2, 1)
  assert tuple(map(int, eos_counts(raw, ()))) == (0, 0)


def test_decode_cuts_after_the_first_committed_eos():
  vocab, width, t = 16, 4, 6
  table = []
  for p in range(width + t):  # argmax (10 + p) % vocab, except EOS at 4
    row = [0.0] * vocab
    row[EOS_ID if p == 4 else (10 + p) % vocab] = 5.0
    table.append(tuple(row))
  stub = stubs.PositionLogitsFn(table)
  decoder = LLaDADecoder(output_length=t, steps=3)
  prompts = jnp.array([[8, 9, PAD_ID, PAD_ID], [PAD_ID] * 4, [5, 6, 7, 8]])
  lengths = jnp.array([2, 0, 4])
  out = decoder.decode(bind(stub, None), prompts, lengths, jax.random.key(0))
  np.testing.assert_array_equal(out.tokens, [[12, 13, 3, 0, 0, 0],
                                             [10, 11, 12, 13, 3, 0],
                                             [3, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(out.lengths, [3, 5, 1])
  raw = decoder.denoise(bind(stub, None), prompts, lengths, jax.random.key(0)).tokens
  np.testing.assert_array_equal(raw[2], [3, 15, 0, 1, 2, 3])
  assert tuple(map(int, eos_counts(raw, decoder.eos_ids))) == (1, 0)


def test_decode_under_an_outer_jit_matches_the_traced_run():
  decoder = LLADA_TWO_BLOCKS  # random remasking, temperature 1
  run = jax.jit(decoder.decode)
  jitted = run(bind(STUB, PARAMS), PROMPTS, PROMPT_LENGTHS, jax.random.key(0))
  traced, _ = _denoise(decoder)
  tokens, lengths = finish_at_eos(traced.tokens, decoder.eos_ids, PAD_ID)
  np.testing.assert_array_equal(jitted.tokens, tokens)
  np.testing.assert_array_equal(jitted.lengths, lengths)
  np.testing.assert_array_equal(jitted.committed, traced.committed)
  assert jitted.nfe == traced.nfe


def test_tiny_transformer_denoiser():
  config = TransformerConfig(vocab_size=32, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16, attention="bidirectional")
  params = init_params(config, jax.random.key(0))
  decoder = LLaDADecoder(output_length=6, steps=4, block_length=3)
  out = decoder.decode(bind(make_logits_fn(config), params), PROMPTS, PROMPT_LENGTHS,
                       jax.random.key(1))
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (3, 6) and not np.any(tokens == MASK_ID)
  assert np.all((1 <= np.asarray(out.lengths)) & (out.lengths <= 6))
  assert int(out.nfe) == 4
  np.testing.assert_array_equal(out.committed, [[2] * 3, [1] * 3] * 2)


@pytest.mark.parametrize("make, match", [
    (lambda: MDLMDecoder(output_length=8, steps=0), "steps=0"),
    (lambda: MDLMDecoder(output_length=0, steps=2), "output_length=0"),
    (lambda: MDLMDecoder(output_length=8, steps=2,
                         sampling=SamplingConfig(temperature=-0.5)),
     "temperature=-0.5"),
    (lambda: LLaDADecoder(output_length=8, steps=4, block_length=3),
     "block_length=3"),
    (lambda: LLaDADecoder(output_length=8, steps=4, block_length=0),
     "block_length=0"),
    (lambda: LLaDADecoder(output_length=8, steps=4, block_length=16),
     "block_length=16"),
    (lambda: LLaDADecoder(output_length=8, steps=3, block_length=4), "steps=3"),
    (lambda: LLaDADecoder(output_length=8, steps=4, remasking="top_k"),
     "remasking='top_k'"),
    (lambda: MDLMDecoder(output_length=8, steps=2, pad_id=-1), "pad_id=-1"),
    (lambda: LLaDADecoder(output_length=8, steps=2, eos_ids=(EOS_ID, MASK_ID)),
     "mask_id=4 must differ"),
    (lambda: base.make_decoder("llada", output_length=8, steps=4, top_k=2),
     "top_k"),
])
def test_bad_config_raises(make, match):
  with pytest.raises(ValueError, match=match):
    make()


@pytest.mark.parametrize("call, match", [
    (lambda d: d.decode(bind(stubs.NoneCacheLogitsFn(max_len=10), None), PROMPTS,
                        PROMPT_LENGTHS, jax.random.key(0)), "max_len=10"),
    (lambda d: d.decode(bind(stubs.NoneCacheLogitsFn(), None), PROMPTS,
                        jnp.array([3, 4, 0]), jax.random.key(0)),
     "prompt_lengths"),
    (lambda d: d.decode(bind(stubs.NoneCacheLogitsFn(), None), PROMPTS, jnp.array([3, 1]),
                        jax.random.key(0)), "prompt_lengths"),
    (lambda d: d.decode(bind(stubs.NoneCacheLogitsFn(), None), PROMPTS[0],
                        PROMPT_LENGTHS, jax.random.key(0)), "prompts"),
    (lambda d: d.decode(bind(stubs.NoneCacheLogitsFn(), None), PROMPTS * 1.0,
                        PROMPT_LENGTHS, jax.random.key(0)), "prompts"),
    (lambda d: d.infill(bind(stubs.NoneCacheLogitsFn(), None), PROMPTS,
                        jnp.ones((3, 2), bool), jax.random.key(0)),
     "fill_mask"),
    (lambda d: d.infill(bind(stubs.NoneCacheLogitsFn(max_len=2), None), PROMPTS,
                        jnp.ones((3, 3), bool), jax.random.key(0)),
     "max_len=2"),
])
@pytest.mark.parametrize("decoder", [MDLMDecoder(output_length=8, steps=4),
                                     LLaDADecoder(output_length=8, steps=4)],
                         ids=repr)
def test_bad_input_raises_before_the_model_runs(decoder, call, match):
  with pytest.raises(ValueError, match=match):
    call(decoder)


def test_registered_by_name():
  assert {"mdlm", "llada"} <= set(base.registered())
  decoder = base.make_decoder("llada", output_length=8, steps=4, block_length=4,
                              eos_ids=[3, 7])
  assert decoder == LLaDADecoder(output_length=8, steps=4, block_length=4,
                                 eos_ids=(EOS_ID, 7))
  assert hash(decoder) == hash(dataclasses.replace(decoder))
  assert isinstance(base.make_decoder("mdlm", output_length=4, steps=2),
                    MDLMDecoder)


@pytest.mark.parametrize("name", ["llada", "threshold", "factor"])
def test_low_confidence_ranks_by_the_probability_over_the_whole_vocabulary(
    name):
  """R3, reference parity with LLaDA: confidence is the drawn token's
  probability under the softmax over ALL ids, MASK included (0.574 at
  position 0, 0.857 at position 1), so position 1 is committed first; a
  softmax renormalised without MASK would rank position 0 first (0.881 vs
  0.858). Draws still never produce MASK (position 0 prefers MASK's 1.5 to
  b's 0.0, yet draws a)."""
  a, mask = 0, 2
  stub = stubs.PositionLogitsFn([[2.0, 0.0, 1.5], [1.8, 0.0, -5.0]])
  options = dict(output_length=2, mask_id=mask, pad_id=1, eos_ids=())
  if name == "llada":
    options["steps"] = 2
  elif name == "threshold":
    options["threshold"] = 1.0  # one token per step
  else:
    options["factor"] = 1e-9
  decoder = base.make_decoder(name, **options)
  out = decoder.denoise(bind(stub, None), jnp.zeros((1, 0), jnp.int32),
                        jnp.zeros((1,), jnp.int32), jax.random.key(0),
                        trace=True)
  np.testing.assert_array_equal(out.states[0], [[mask, a]])
  np.testing.assert_array_equal(out.tokens, [[a, a]])


def _probs_row(top: dict[int, float], vocab: int = 8) -> list[float]:
  """Probabilities over `vocab` ids: `top` as given, the rest shared."""
  rest = (1.0 - sum(top.values())) / (vocab - len(top))
  return [top.get(i, rest) for i in range(vocab)]


# Positions 1..3 of a 1-token prompt: (confidence, margin) (0.5, 0.05),
# (0.4, 0.3) and a tie at the top (0.3, 0) -- margin ranks 2, 1, 3 where
# confidence ranks 1, 2, 3; a top-2 that skipped the tie would rank 3 second.
MARGIN_PROBS = (_probs_row({0: 0.9}), _probs_row({5: 0.5, 6: 0.45}),
                _probs_row({6: 0.4, 7: 0.1}), _probs_row({7: 0.3, 5: 0.3}))


def test_margin_is_top1_minus_top2_with_ties_as_top_k():
  probs = jnp.asarray(MARGIN_PROBS, jnp.float32)
  step = Step(k=jnp.int32(0), masked=jnp.ones(4, bool),
              fill=jnp.ones(4, bool), num_masked=jnp.int32(4),
              drawn=jnp.argmax(probs, -1).astype(jnp.int32), probs=probs,
              committed_confidence=jnp.zeros(4), uniform=jnp.zeros(4))
  np.testing.assert_allclose(step.confidence("margin"),
                             [0.9 - 0.1 / 7, 0.05, 0.3, 0.0], atol=1e-6)
  # Random rows with repeated values: exactly lax.top_k's two largest.
  rng = np.random.default_rng(0)
  many = jnp.asarray(rng.integers(0, 5, (64, 16)) / 8.0, jnp.float32)
  step = step.replace(probs=many, drawn=jnp.zeros(64, jnp.int32))
  top2 = jax.lax.top_k(many, 2)[0]
  np.testing.assert_array_equal(step.confidence("margin"),
                                top2[:, 0] - top2[:, 1])


@pytest.mark.parametrize("remasking, order", [
    ("margin", [2, 1, 3]), ("low_confidence", [1, 2, 3])])
def test_llada_commits_in_its_ordering_exactly(remasking, order):
  """One token per step (K = T = 3), greedy, fixed logits per position."""
  logits = tuple(tuple(np.log(row).tolist()) for row in MARGIN_PROBS)
  decoder = LLaDADecoder(output_length=3, steps=3, remasking=remasking,
                         eos_ids=(), **FULL)
  out = decoder.denoise(bind(stubs.PositionLogitsFn(logits), None),
                        jnp.array([[6]], jnp.int32), jnp.array([1], jnp.int32),
                        jax.random.key(0), trace=True)
  drawn = {1: 5, 2: 6, 3: 5}  # greedy; the tie at 3 goes to the lower id
  expected, states = [6, MASK_ID, MASK_ID, MASK_ID], []
  for position in order:
    expected[position] = drawn[position]
    states.append(list(expected))
  np.testing.assert_array_equal(out.states[:, 0], states)
  np.testing.assert_array_equal(out.tokens, [[5, 6, 5]])


@pytest.mark.parametrize("name, options, match", [
    ("mdlm", dict(output_length=4, steps=2.5), "steps"),
    ("mdlm", dict(output_length=2.5, steps=2), "output_length"),
    ("llada", dict(output_length=2.5, steps=2), "output_length"),
])
def test_integer_options_reject_non_integers(name, options, match):
  """As tests/test_autoregressive.py's test of that name."""
  with pytest.raises(ValueError, match=match):
    base.make_decoder(name, **options)


# Rows (call, exception class, regex) as in tests/test_registry_contracts.py:
# the message names the argument and its range, before any trace (decoding
# on `stubs.RaisingLogitsFn`, V = 16, with T = K = 4).
BAD_INPUTS = [
    pytest.param(lambda: stubs.decoder("mdlm", reuse_logits="yes"),
                 ValueError, r"reuse_logits='yes' must be True or False",
                 id="mdlm-reuse-logits-as-a-string"),
    pytest.param(lambda: stubs.decoder("mdlm", sampling=SamplingConfig(
        repetition_penalty=1.2)), ValueError,
                 r"repetition_penalty=1.2 must be 1",
                 id="mdlm-repetition-penalty"),
    pytest.param(lambda: stubs.decoder("mdlm", steps=True), ValueError,
                 r"steps=True must be an integer >= 1", id="mdlm-steps-true"),
    pytest.param(lambda: stubs.decoder("llada", block_length=3), ValueError,
                 r"block_length=3 must be in \[1, 4\] and divide",
                 id="llada-block-length-not-dividing"),
    pytest.param(lambda: stubs.decoder("mdlm", kv_cache="full"), ValueError,
                 r"kv_cache='full'; allowed: \('none', 'prefix', 'dual'\)",
                 id="mdlm-kv-cache-unknown"),
    pytest.param(lambda: stubs.decoder("mdlm", schedule="quadratic"),
                 ValueError, r"schedule='quadratic'; allowed",
                 id="mdlm-schedule-unknown"),
    pytest.param(lambda: stubs.decoder("llada", remasking="highest"),
                 ValueError, r"remasking='highest'; allowed",
                 id="llada-remasking-unknown"),
    pytest.param(lambda: stubs.decoder("mdlm", mask_id=PAD_ID), ValueError,
                 r"mask_id=0 must differ from pad_id=0",
                 id="mdlm-mask-id-is-pad"),
    pytest.param(lambda: stubs.decode_raising("mdlm", lengths=(2.5,)),
                 ValueError, r"prompt_lengths must be int\[B\]",
                 id="mdlm-fractional-prompt-length"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()
