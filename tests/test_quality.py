"""Tests of lm_decoding.evaluation.quality: exact values on hand-made cases,
empty and all-PAD rows."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.evaluation import quality
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import BOS_ID

V = 16
MAX_POS = 16


@dataclasses.dataclass(frozen=True)
class TableLM:
  """Stub evaluator: logits[b, i] = params[positions[b, i], tokens[b, i]].

  So log p(next | prefix) depends on the position and the previous token
  only, and is known exactly when params rows are log-distributions.
  """

  max_len: int = MAX_POS

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    return ModelOutput(params[positions, tokens], cache)


def random_table(seed):
  logits = np.random.default_rng(seed).normal(size=(MAX_POS, V, V))
  return np.array(jax.nn.log_softmax(logits, -1), np.float32)


def set_log_prob(table, pos, prev, token, log_prob):
  """Makes table[pos, prev] a log-distribution with `token` at `log_prob`."""
  row = np.full(V, np.log((1 - np.exp(log_prob)) / (V - 1)))
  row[token] = log_prob
  table[pos, prev] = row


def reference_gen_ppl(table, tokens, lengths, prompts, prompt_lengths):
  """Per-row NLL sums and counts by a plain loop over the table."""
  nll, counts = [], []
  for b in range(len(tokens)):
    seq = (list(prompts[b][:prompt_lengths[b]]) +
           list(tokens[b][:lengths[b]]))
    start = prompt_lengths[b]
    nll.append(-sum(float(table[j - 1, seq[j - 1], seq[j]])
                    for j in range(start, len(seq))))
    counts.append(len(seq) - start)
  return np.array(nll), np.array(counts)


# ------------------------------------------------------------- perplexity


def test_perplexity_c9_alone_and_batched():
  assert quality.perplexity([[-1., -2., -3.]], [[1, 1, 1]]) == pytest.approx(
      math.e ** 2, rel=1e-6)
  other = [-0.5, -1.5, -2.5, -0.25, -4.0]
  log_probs = [[-1., -2., -3., 7., np.nan], other]  # padding never read
  weights = [[1, 1, 1, 0, 0], [1] * 5]
  expected = math.exp((6 - sum(other)) / 8)
  assert quality.perplexity(log_probs, weights) == pytest.approx(
      expected, rel=1e-12)


def test_perplexity_weighted_and_errors():
  assert quality.perplexity([[-1., -3.]], [[3., 1.]]) == pytest.approx(
      math.exp(6 / 4))
  with pytest.raises(ValueError, match="same shape"):
    quality.perplexity([[-1.]], [[1., 1.]])
  with pytest.raises(ValueError, match=">= 0"):
    quality.perplexity([[-1., -1.]], [[1., -1.]])
  with pytest.raises(ValueError, match="sum to > 0"):
    quality.perplexity([[-1.]], [[0.]])


# ---------------------------------------------------------------- gen_ppl


def c9_case():
  """Doc A = [0, 5, 7] with log-probs [-1, -2, -3]; doc B has 5 tokens."""
  table = random_table(0)
  set_log_prob(table, 0, BOS_ID, 0, -1.0)  # token id 0 (= PAD id) is real
  set_log_prob(table, 1, 0, 5, -2.0)
  set_log_prob(table, 2, 5, 7, -3.0)
  tokens = np.array([[0, 5, 7, 0, 0], [9, 0, 11, 12, 13]], np.int32)
  return jnp.asarray(table), tokens, np.array([3, 5], np.int32)


def test_gen_ppl_c9_alone_and_batched():
  table, tokens, lengths = c9_case()
  alone = quality.gen_ppl(TableLM(), table, tokens[:1], lengths[:1])
  assert alone.ppl == pytest.approx(math.e ** 2, rel=1e-6)
  assert alone.num_tokens == 3
  both = quality.gen_ppl(TableLM(), table, tokens, lengths, batch_size=2)
  np.testing.assert_allclose(both.row_nll[0], 2.0, rtol=1e-6)
  # Per-token NLL, by generated position; NaN past the row's length.
  np.testing.assert_allclose(both.token_nll[0], [1, 2, 3, np.nan, np.nan],
                             rtol=1e-6)
  np.testing.assert_allclose(np.nanmean(both.token_nll, 1), both.row_nll)
  np.testing.assert_array_equal(both.row_counts, [3, 5])
  assert both.num_tokens == 8
  nll, _ = reference_gen_ppl(np.asarray(table), tokens, lengths,
                             np.full((2, 1), BOS_ID), [1, 1])
  assert both.ppl == pytest.approx(math.exp(nll.sum() / 8), rel=1e-6)


def random_batch(seed, b=7, t=6, p=4):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, (b, t)).astype(np.int32)
  lengths = rng.integers(0, t + 1, b).astype(np.int32)
  lengths[:2] = [t, 1]
  prompts = rng.integers(0, V, (b, p)).astype(np.int32)
  prompt_lengths = rng.integers(1, p + 1, b).astype(np.int32)
  return tokens, lengths, prompts, prompt_lengths


@pytest.mark.parametrize("prompted", [False, True])
def test_gen_ppl_matches_loop_and_ignores_batch_size(prompted):
  table = random_table(1)
  tokens, lengths, prompts, prompt_lengths = random_batch(2)
  kwargs = {}
  if prompted:
    kwargs = dict(prompts=prompts, prompt_lengths=prompt_lengths)
  else:
    prompts, prompt_lengths = np.full((7, 1), BOS_ID), np.ones(7, np.int32)
  nll, counts = reference_gen_ppl(table, tokens, lengths, prompts,
                                  prompt_lengths)
  expected = math.exp(nll.sum() / counts.sum())
  for batch_size in (1, 2, 3, 7, 16):
    out = quality.gen_ppl(TableLM(), jnp.asarray(table), tokens, lengths,
                          batch_size=batch_size, **kwargs)
    assert out.ppl == pytest.approx(expected, rel=1e-6)
    assert out.num_tokens == counts.sum() == lengths.sum()
    np.testing.assert_array_equal(out.row_counts, lengths)
    scored = counts > 0
    np.testing.assert_allclose(out.row_nll[scored],
                               nll[scored] / counts[scored], rtol=1e-6)
    assert np.all(np.isnan(out.row_nll[~scored]))
    np.testing.assert_allclose(np.nanmean(out.token_nll[scored], 1),
                               out.row_nll[scored], rtol=1e-6)
    np.testing.assert_array_equal(np.isnan(out.token_nll),
                                  np.arange(6)[None] >= lengths[:, None])
    np.testing.assert_allclose(out.row_entropy,
                               quality.unigram_entropy(tokens, lengths))


def test_gen_ppl_padding_content_is_never_scored():
  table = jnp.asarray(random_table(3))
  tokens, lengths, _, _ = random_batch(4)
  garbage = np.where(np.arange(6)[None] < lengths[:, None], tokens,
                     np.random.default_rng(5).integers(0, V, tokens.shape))
  a = quality.gen_ppl(TableLM(), table, tokens, lengths, batch_size=3)
  b = quality.gen_ppl(TableLM(), table, garbage.astype(np.int32), lengths,
                      batch_size=3)
  assert a.ppl == b.ppl


def test_gen_ppl_transformer_is_batch_size_independent():
  config = TransformerConfig(vocab_size=32, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16)
  params = init_params(config, jax.random.key(0))
  rng = np.random.default_rng(6)
  tokens = rng.integers(0, 32, (5, 8)).astype(np.int32)
  lengths = np.array([8, 0, 3, 1, 6], np.int32)
  ppls = [quality.gen_ppl(make_logits_fn(config), params, tokens, lengths,
                          batch_size=bs).ppl for bs in (2, 5)]
  np.testing.assert_allclose(ppls, ppls[0], rtol=1e-6)


def test_gen_ppl_refuses_a_bidirectional_evaluator_and_foreign_ids():
  """A bidirectional evaluator sees the token it scores (a flattering
  gen-PPL), and an id outside its vocabulary gave NaN: both are refused
  before anything compiles; ids in the padding are never read."""
  config = TransformerConfig(vocab_size=32, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16)
  params = init_params(config, jax.random.key(0))
  tokens = np.array([[5, 6, 7], [8, 9, 99]], np.int32)  # 99: padding
  lengths = np.array([3, 2], np.int32)
  with pytest.raises(ValueError, match="gen_ppl's evaluator needs 'causal'"):
    quality.gen_ppl(make_logits_fn(config.replace(attention="bidirectional")),
                    params, tokens, lengths)
  causal = make_logits_fn(config)
  assert np.isfinite(quality.gen_ppl(causal, params, tokens, lengths).ppl)
  with pytest.raises(ValueError, match=r"tokens\[1, 1\]=32 is outside the "
                     r"evaluator's vocabulary \[0, 32\)"):
    quality.gen_ppl(causal, params, np.where(tokens == 9, 32, tokens),
                    lengths)
  with pytest.raises(ValueError, match=r"prompts\[0, 0\]=-1 is outside"):
    quality.gen_ppl(causal, params, tokens, lengths,
                    prompts=np.array([[-1], [1]], np.int32),
                    prompt_lengths=np.array([1, 1], np.int32))


def test_gen_ppl_errors():
  table, tokens, lengths = c9_case()
  lm = TableLM()
  with pytest.raises(ValueError, match="lengths must be in"):
    quality.gen_ppl(lm, table, tokens, np.array([3, 6]))
  with pytest.raises(ValueError, match="lengths must be an int array"):
    quality.gen_ppl(lm, table, tokens, np.array([3]))
  with pytest.raises(ValueError, match="batch_size"):
    quality.gen_ppl(lm, table, tokens, lengths, batch_size=0)
  with pytest.raises(ValueError, match="together"):
    quality.gen_ppl(lm, table, tokens, lengths, prompts=tokens)
  with pytest.raises(ValueError, match="prompts must have B=2 rows"):
    quality.gen_ppl(lm, table, tokens, lengths, prompts=tokens[:1],
                    prompt_lengths=np.array([1]))
  with pytest.raises(ValueError, match="prompt_lengths must be in"):
    quality.gen_ppl(lm, table, tokens, lengths, prompts=tokens,
                    prompt_lengths=np.array([1, 6]))
  with pytest.raises(ValueError, match="prompt_lengths must be >= 1"):
    quality.gen_ppl(lm, table, tokens, lengths, prompts=tokens,
                    prompt_lengths=np.array([0, 1]))
  with pytest.raises(ValueError, match="max_len"):
    quality.gen_ppl(TableLM(max_len=4), table, tokens, lengths)
  with pytest.raises(ValueError, match="sum to > 0"):
    quality.gen_ppl(lm, table, tokens, np.array([0, 0]))


# --------------------------------------------------------------- entropy


def test_unigram_entropy_exact():
  tokens = np.array([[7, 7, 8, 8, 0, 0],
                     [3, 3, 3, 3, 3, 3],
                     [1, 2, 3, 4, 0, 0],
                     [0, 0, 1, 9, 9, 9],
                     [5, 5, 5, 5, 5, 5]], np.int32)
  lengths = np.array([4, 6, 4, 3, 0], np.int32)
  out = quality.unigram_entropy(tokens, lengths)
  np.testing.assert_allclose(
      out[:4], [math.log(2), 0.0, math.log(4),
                -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))],
      atol=1e-12)
  assert math.isnan(out[4])


# ----------------------------------------------------- repetition, distinct


def test_repetition_rate_exact():
  tokens = np.array([[1, 2, 1, 2, 3], [1, 1, 1, 0, 0], [4, 4, 0, 0, 0]],
                    np.int32)
  lengths = np.array([5, 3, 2], np.int32)
  expected = {1: [2 / 5, 2 / 3, 1 / 2], 2: [1 / 4, 1 / 2, 0.0],
              3: [0.0, 0.0, np.nan], 4: [0.0, np.nan, np.nan]}
  for n, want in expected.items():
    np.testing.assert_allclose(quality.repetition_rate(tokens, lengths, n),
                               want, atol=1e-12)
  with pytest.raises(ValueError, match="n=0"):
    quality.repetition_rate(tokens, lengths, 0)


def test_distinct_n_exact_and_rows_not_joined():
  tokens = np.array([[1, 2, 1, 2], [2, 1, 3, 0]], np.int32)
  lengths = np.array([4, 3], np.int32)
  assert quality.distinct_n(tokens, lengths, 1) == pytest.approx(3 / 7)
  # Bigrams 12 21 12 | 21 13: 3 unique of 5 (joining rows would add 22).
  assert quality.distinct_n(tokens, lengths, 2) == pytest.approx(3 / 5)
  assert quality.distinct_n(tokens, lengths, 4) == pytest.approx(1.0)
  assert math.isnan(quality.distinct_n(tokens, lengths, 5))


def test_per_row_distinct_is_one_minus_repetition():
  tokens, lengths, _, _ = random_batch(7, b=6, t=12)
  for n in range(1, 5):
    rep = quality.repetition_rate(tokens, lengths, n)
    for b in range(6):
      if lengths[b] >= n:
        one = quality.distinct_n(tokens[b:b + 1], lengths[b:b + 1], n)
        assert one == pytest.approx(1 - rep[b])


# ---------------------------------------------------------------- omission


def test_omission_rate_exact():
  refs = ["The cat sat on the mat.", "Café au lait", "the of and", "It is",
          "abc123def"]
  hyps = ["a CAT on a cat", "cafe AU lait", "anything", "", "def"]
  out = quality.omission_rate(hyps, refs)
  np.testing.assert_allclose(out[[0, 1, 4]], [2 / 3, 1 / 3, 1 / 2])
  assert math.isnan(out[2]) and math.isnan(out[3])
  kept = quality.omission_rate(hyps[:1], refs[:1], stopwords=frozenset())
  # {the, cat, sat, on, mat} minus {a, cat, on}: the, sat, mat.
  np.testing.assert_allclose(kept, [3 / 5])
  with pytest.raises(ValueError, match="same length"):
    quality.omission_rate(hyps[:2], refs)


# --- Empty and all-PAD rows. -------------------------------------------------

def test_metrics_on_empty_and_all_pad_rows():
  tokens = np.asarray([[0, 0, 0, 0], [5, 6, 0, 0], [7, 7, 7, 0]])
  lengths = np.asarray([4, 0, 3])  # row 0: four real PAD-id tokens
  np.testing.assert_allclose(quality.unigram_entropy(tokens, lengths),
                             [0.0, np.nan, 0.0])
  np.testing.assert_allclose(quality.repetition_rate(tokens, lengths, 1),
                             [0.75, np.nan, 2 / 3])
  assert quality.distinct_n(tokens, lengths, 1) == 2 / 7
  assert np.isnan(quality.distinct_n(tokens, lengths * 0, 2))
  assert np.isnan(quality.repetition_rate(np.zeros((2, 0), int),
                                          np.zeros(2, int), 1)).all()
  np.testing.assert_allclose(quality.omission_rate(["x", ""],
                                                   ["", "the cat"]), [np.nan, 1.0])


def test_gen_ppl_skips_empty_rows_and_refuses_no_tokens():
  evaluator = stubs.TableLogitsFn.random(6, 8, 12)
  tokens = np.asarray([[5, 6, 7], [0, 0, 0], [6, 0, 5]])
  full = quality.gen_ppl(evaluator, None, tokens, [3, 0, 2])
  alone = quality.gen_ppl(evaluator, None, tokens[[0, 2]], [3, 2])
  assert full.ppl == pytest.approx(alone.ppl, rel=1e-6)
  assert full.num_tokens == 5
  np.testing.assert_array_equal(full.row_counts, [3, 0, 2])
  assert np.isnan(full.row_nll[1]) and np.isnan(full.row_entropy[1])
  with pytest.raises(ValueError, match="no token"):
    quality.gen_ppl(evaluator, None, tokens, [0, 0, 0])


def test_gen_ppl_of_no_rows_names_the_problem():
  """Bug: B = 0 rows fails in np.concatenate ("need at least one array to
  concatenate"), naming neither argument.

  Fix: in `gen_ppl`, after `_rows`: `if b == 0: raise ValueError(
  "tokens must have B >= 1 rows")`.
  """
  evaluator = stubs.TableLogitsFn.random(6, 8, 12)
  with pytest.raises(ValueError, match="no token|tokens"):
    quality.gen_ppl(evaluator, None, np.zeros((0, 3), np.int32),
                    np.zeros((0,), np.int32))
