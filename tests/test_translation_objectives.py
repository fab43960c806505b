"""Tests of lm_decoding.training.objectives.translation and the length head."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.data import parallel_text
from lm_decoding.models import ctc_frames
from lm_decoding.models import (
    TransformerConfig, init_params, make_logits_fn, masks)
from lm_decoding.special_tokens import BOS_ID, EOS_ID, PAD_ID
from lm_decoding.training import objectives
from lm_decoding.training.objectives import translation as to

V = 7  # ids 5, 6 are words


def _pooled_count_lengths(source_BxL):
  """Length logits with most mass on (pooled positions) - 1, i.e. a length
  head that predicts length = pooled count."""
  return jnp.log(jax.nn.one_hot(source_BxL.sum(1) - 1, 8) * 0.9 + 0.1 / 8)


def _table_logits(table):
  """Logits table[position], hidden ones, `_pooled_count_lengths`."""
  return stubs.PositionLogitsFn(table, _pooled_count_lengths)


def _collapse(path):
  merged = [k for k, _ in itertools.groupby(path)]
  return [k for k in merged if k != parallel_text.BLANK_ID]


@pytest.mark.parametrize("labels", [[5, 5], [5, 6, 5], [6]])
def test_ctc_loss_equals_brute_force_sum_over_alignments(labels):
  table = jax.random.normal(jax.random.key(0), (16, V))
  row = [5, 6, BOS_ID] + labels + [EOS_ID]
  tokens = jnp.asarray([row + [PAD_ID] * (10 - len(row))], jnp.int32)
  _, metrics = to.ctc_loss(_table_logits(table), None, tokens, None,
                           source_width=2, upsample=2)
  # Frames are positions 3..6 (prefix 3, 2 source tokens x 2).
  probs = np.asarray(jax.nn.softmax(table[3:7], -1), np.float64)
  total = sum(np.prod([probs[f, s] for f, s in enumerate(path)])
              for path in itertools.product(range(V), repeat=4)
              if _collapse(path) == labels)
  assert float(metrics["nll"]) == pytest.approx(-np.log(total), rel=1e-4)
  assert metrics["tokens"] == len(labels) and metrics["infeasible"] == 0


def test_ctc_loss_counts_infeasible_rows():
  table = jnp.zeros((16, V))
  tokens = jnp.asarray([[5, BOS_ID, 5, 6, 5, EOS_ID, 0, 0]], jnp.int32)
  loss, metrics = to.ctc_loss(_table_logits(table), None, tokens, None,
                              source_width=1, upsample=2)
  assert metrics["infeasible"] == 1 and metrics["tokens"] == 0
  assert loss == 0


def test_ctc_layout_upsamples_the_source():
  tokens, valid, frame_valid = ctc_frames.ctc_layout(
      jnp.asarray([[5, 6, BOS_ID], [6, BOS_ID, PAD_ID]]),
      jnp.asarray([3, 2]), 2)
  np.testing.assert_array_equal(tokens, [[5, 6, 2, 5, 5, 6, 6],
                                         [6, 2, 6, 6, 0, 0, 0]])
  np.testing.assert_array_equal(valid, tokens != PAD_ID)
  np.testing.assert_array_equal(frame_valid.sum(1), [4, 2])


def test_length_loss_exact():
  logits = jnp.log(jnp.asarray([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
  nll, correct = to.length_loss(logits, jnp.asarray([2, 9]))
  np.testing.assert_allclose(nll, [-np.log(0.25), -np.log(0.7)], rtol=1e-6)
  np.testing.assert_array_equal(correct, [False, True])


def test_cmlm_length_head_pools_the_prefix():
  # Prefix lengths 3 and 2; target lengths 3 and 1: the stub predicts the
  # prefix length, right for row 0 only.
  tokens = jnp.asarray([[5, 6, BOS_ID, 5, 5, 6, EOS_ID, 0],
                        [6, BOS_ID, 5, EOS_ID, 0, 0, 0, 0]], jnp.int32)
  _, metrics = to.cmlm_loss(_table_logits(jnp.zeros((8, V))), None, tokens,
                            jax.random.key(1), length_weight=1.0)
  assert metrics["length_correct"] == 1
  expect = -np.log(0.9 + 0.1 / 8) - np.log(0.1 / 8)
  assert float(metrics["length_nll"]) == pytest.approx(expect, rel=1e-5)
  assert 2 <= metrics["tokens"] <= 4  # n ~ U{1..T} per row


def test_cmlm_mask_draws_1_to_t_target_positions():
  target = jnp.asarray([[False, True, True, True, False]] * 64)
  masked = to.cmlm_mask(jax.random.key(0), target)
  counts = np.asarray(masked.sum(1))
  assert not (masked & ~target).any()
  assert set(counts) == {1, 2, 3}


def _tiny(length_classes=0, attention="bidirectional"):
  return TransformerConfig(vocab_size=16, d_model=16, num_layers=1,
                           num_heads=2, num_kv_heads=2, head_dim=8,
                           mlp_dim=32, max_len=16, attention=attention,
                           length_classes=length_classes)


def test_length_head_params_only_when_switched_on():
  without = init_params(_tiny(), jax.random.key(0))
  with_head = init_params(_tiny(length_classes=5), jax.random.key(0))
  assert set(with_head) - set(without) == {"length_head"}
  assert with_head["length_head"]["dense"]["kernel"].shape == (16, 5)
  chex.assert_trees_all_equal(
      without, {k: v for k, v in with_head.items() if k != "length_head"})
  with pytest.raises(ValueError, match="length_classes"):
    make_logits_fn(_tiny()).length_logits(without, None, None)


def test_cmlm_length_prediction_does_not_see_the_target():
  config = _tiny(length_classes=5)
  logits_fn, params = make_logits_fn(config), init_params(
      config, jax.random.key(0))
  rows = jnp.asarray([[7, 8, BOS_ID, 9, 10, EOS_ID, 0, 0],
                      [7, 8, BOS_ID, 11, 12, 13, EOS_ID, 0]], jnp.int32)
  grads, metrics = jax.grad(
      lambda p: to.cmlm_loss(logits_fn, p, rows, jax.random.key(0)),
      has_aux=True)(params)
  assert float(jnp.abs(grads["length_head"]["dense"]["kernel"]).sum()) > 0
  prefix = jnp.asarray([[7, 8, BOS_ID]] * 2)
  source = jnp.ones((2, 3), bool)
  alone = logits_fn.length_logits(
      params, logits_fn(params, prefix, jnp.arange(3)[None].repeat(2, 0))
      .hidden, source)
  full = logits_fn(params, rows, jnp.arange(8)[None].repeat(2, 0),
                   attention_mask=masks.source_target_mask(
                       jnp.asarray([3, 3]), rows != PAD_ID))
  pooled = jnp.arange(8)[None].repeat(2, 0) < 3
  np.testing.assert_allclose(
      logits_fn.length_logits(params, full.hidden, pooled), alone, atol=1e-5)


def test_translation_ar_with_empty_source_is_ar_eval():
  config = _tiny(attention="causal")
  logits_fn, params = make_logits_fn(config), init_params(
      config, jax.random.key(0))
  rows = jnp.asarray([[BOS_ID, 9, 10, EOS_ID, 0],
                      [BOS_ID, 11, EOS_ID, 0, 0]], jnp.int32)
  loss, metrics = to.translation_ar_eval(logits_fn, params, rows)
  ref_loss, ref = objectives.ar_eval(logits_fn, params, rows)
  assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
  assert metrics["tokens"] == ref["tokens"] == 5
  rows = jnp.asarray([[7, 8, BOS_ID, 9, EOS_ID, 0]], jnp.int32)
  _, metrics = to.translation_ar_eval(logits_fn, params, rows)
  assert metrics["tokens"] == 2  # the target token and EOS


def test_ctc_loss_is_never_negative():
  """Case T1: two frames (blank 0, token 17) and the label [token]: float32
  rounds -log p to -8e-8 unless clamped."""
  table = jnp.full((16, V), -1e4).at[:, parallel_text.BLANK_ID].set(0.0)
  table = table.at[:, 5].set(17.0)
  tokens = jnp.asarray([[6, BOS_ID, 5, EOS_ID, PAD_ID]], jnp.int32)
  _, metrics = to.ctc_loss(_table_logits(table), None, tokens, None,
                           source_width=1, upsample=2)
  assert metrics["tokens"] == 1 and float(metrics["nll"]) >= 0.0


def test_ctc_loss_refuses_a_blank_in_the_target():
  """Case T2: a target holding the blank id (PAD) is refused, row named;
  under jit the row is left out and counted infeasible."""
  table = jnp.zeros((16, V))
  tokens = jnp.asarray([[6, BOS_ID, 5, 6, EOS_ID, PAD_ID],
                        [6, BOS_ID, 5, PAD_ID, EOS_ID, PAD_ID]], jnp.int32)
  with pytest.raises(ValueError, match=r"rows \[1\].*blank"):
    to.ctc_loss(_table_logits(table), None, tokens, None, source_width=1,
                upsample=3)
  _, metrics = jax.jit(lambda t: to.ctc_loss(
      _table_logits(table), None, t, None, source_width=1, upsample=3))(tokens)
  assert metrics["infeasible"] == 1 and metrics["tokens"] == 2
