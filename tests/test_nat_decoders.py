"""Tests of the non-autoregressive translation decoders: CTC, Mask-Predict."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base, ctc, mask_predict
from lm_decoding.special_tokens import BOS_ID, EOS_ID, MASK_ID, PAD_ID

V, MAX_LEN = 9, 16
PROMPTS = jnp.asarray([[5, 6, BOS_ID], [7, BOS_ID, PAD_ID]], jnp.int32)
PROMPT_LENGTHS = jnp.asarray([3, 2], jnp.int32)


def test_collapse_merges_repeats_then_drops_blanks():
  a, b, blank = 5, 6, PAD_ID
  frames = jnp.asarray([[a, a, blank, a, b, b], [b, blank, blank, b, a, a]])
  valid = jnp.asarray([[True] * 6, [True] * 4 + [False] * 2])
  tokens, lengths = ctc.collapse(frames, valid, 4)
  np.testing.assert_array_equal(tokens, [[a, a, b, 0], [b, b, 0, 0]])
  np.testing.assert_array_equal(lengths, [3, 2])
  tokens, lengths = ctc.collapse(frames, valid, 2)
  np.testing.assert_array_equal(tokens, [[a, a], [b, b]])
  np.testing.assert_array_equal(lengths, [2, 2])


def test_ctc_decoder_is_one_pass_of_collapsed_argmax():
  winners = [0, 0, 0, 5, 5, PAD_ID, 5, 6, 6, 0, 0, 0, 0, 0, 0, 0]
  table = jax.nn.one_hot(jnp.asarray(winners), V) * 5.0
  stub = stubs.PositionLogitsFn(table)
  out = ctc.CTCDecoder(output_length=5, upsample=2).decode(
      base.bind(stub, None), PROMPTS, PROMPT_LENGTHS, None)
  # Row 0: frames are positions 3..6 -> 5 5 _ 5 -> [5, 5]; row 1: 2..3.
  np.testing.assert_array_equal(out.tokens, [[5, 5, EOS_ID, 0, 0],
                                             [5, EOS_ID, 0, 0, 0]])
  np.testing.assert_array_equal(out.lengths, [3, 2])
  assert out.nfe == 1 and out.forward_tokens["model"] == 2 * (3 + 4)


def test_remask_count_is_the_linear_schedule():
  lengths = jnp.asarray([10, 7])
  counts = [remask.tolist() for remask in
            (mask_predict.remask_count(lengths, t, 4) for t in range(1, 4))]
  assert counts == [[7, 5], [5, 3], [2, 1]]


@pytest.mark.parametrize("steps", [1, 3, 4])
def test_mask_predict_remasks_the_scheduled_lowest_probability_slots(steps):
  table = jax.random.normal(jax.random.key(0), (MAX_LEN, V)) * 3
  stub = stubs.PositionLogitsFn(table, inputs=[])
  out = mask_predict.MaskPredictDecoder(output_length=6, steps=steps).decode(
      base.bind(stub, None), PROMPTS, PROMPT_LENGTHS, None)
  assert out.nfe == steps and len(stub.inputs) == steps
  log_p = np.asarray(jax.nn.log_softmax(
      table.at[:, jnp.asarray([0, 2, 3, 4])].set(-jnp.inf), -1).max(-1))
  for t, rows in enumerate(stub.inputs[1:], 1):
    n = 6 * (steps - t) // steps
    np.testing.assert_array_equal(out.stats["remasked"][t], [n, n])
    for row, start in zip(rows, PROMPT_LENGTHS.tolist()):
      slots = np.arange(start, start + 6)
      expect = slots[np.argsort(log_p[slots], kind="stable")[:n]]
      np.testing.assert_array_equal(np.flatnonzero(row == MASK_ID),
                                    np.sort(expect))
  best = np.asarray(jnp.argmax(table.at[:, jnp.asarray([0, 2, 3, 4])].set(
      -jnp.inf), -1))
  np.testing.assert_array_equal(out.tokens[0, :6], best[3:9])
  np.testing.assert_array_equal(out.tokens[1, :6], best[2:8])


def test_length_beam_1_equals_decoding_at_the_argmax_length():
  table = jax.random.normal(jax.random.key(1), (MAX_LEN, V)) * 3
  lengths = jnp.log(jnp.asarray([[.1, .2, .5, .1, .1, 0, 0],
                                 [.1, .1, .1, .1, .6, 0, 0]]) + 1e-9)
  head = mask_predict.MaskPredictDecoder(output_length=7, steps=2,
                      lengths="head").decode(
      base.bind(stubs.PositionLogitsFn(table, lambda _: lengths), None), PROMPTS,
      PROMPT_LENGTHS, None)
  np.testing.assert_array_equal(head.stats["target_lengths"], [3, 5])
  assert head.nfe == 1 + 2
  for row, n in ((0, 3), (1, 5)):
    fixed = mask_predict.MaskPredictDecoder(output_length=n, steps=2).decode(
        base.bind(stubs.PositionLogitsFn(table), None), PROMPTS[row:row + 1],
        PROMPT_LENGTHS[row:row + 1], None)
    np.testing.assert_array_equal(head.tokens[row, :n], fixed.tokens[0])
    assert head.tokens[row, n] == EOS_ID


def test_length_beam_keeps_the_best_average_log_probability():
  # Candidates 3 and 5 (beam 2); position probabilities decide the winner.
  table = jnp.zeros((MAX_LEN, V)).at[:, 5].set(8.0).at[6:, 5].set(0.0)
  lengths = jnp.log(jnp.asarray([[.1, .2, .4, .1, .3, 0, 0]] * 2) + 1e-9)
  out = mask_predict.MaskPredictDecoder(output_length=7, steps=1,
                     lengths="head", length_beam=2).decode(
      base.bind(stubs.PositionLogitsFn(table, lambda _: lengths), None), PROMPTS,
      PROMPT_LENGTHS, None)
  # Row 0 targets start at 3: length 5 reaches the flat positions 6, 7.
  np.testing.assert_array_equal(out.stats["target_lengths"], [3, 3])


@pytest.mark.parametrize("options,match", [
    (dict(steps=0), "steps=0"), (dict(length_beam=2), "length_beam=2"),
    (dict(lengths="oracle"), "lengths='oracle'")])
def test_mask_predict_rejects_bad_options(options, match):
  with pytest.raises(ValueError, match=match):
    mask_predict.MaskPredictDecoder(output_length=4, **options)
