"""Tests of lm_decoding.decoding.sampling (cases C1-C3 of decoding_cases.md),
and its bad options (`BAD_INPUTS`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from lm_decoding.decoding import sampling
from lm_decoding.decoding.sampling import SamplingConfig

P_VALUE = 1e-3  # chi-square threshold; keys are fixed, so runs are exact
DRAWS = 20_000


def _kept(logits):
  return set(np.flatnonzero(np.isfinite(np.asarray(logits)[0])).tolist())


def _frequencies_fit(tokens, probs):
  """Chi-square p-value of drawn `tokens` against `probs` (zeros must stay 0)."""
  counts = np.bincount(np.asarray(tokens), minlength=len(probs))
  support = probs > 0
  assert counts[~support].sum() == 0, f"drew excluded tokens: {counts}"
  return stats.chisquare(counts[support],
                         DRAWS * probs[support] / probs[support].sum()).pvalue


def _draw(logits_V, config, seed=0):
  logits_BxV = jnp.broadcast_to(jnp.asarray(logits_V, jnp.float32),
                                (DRAWS, len(logits_V)))
  return sampling.sample(jax.random.key(seed), logits_BxV, config)


def _softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max())
  return e / e.sum()


# C1: top-p at an exact boundary, and neighbours.
@pytest.mark.parametrize("probs, top_p, expected", [
    ([0.5, 0.25, 0.125, 0.125], 0.75, {0, 1}),
    ([0.5, 0.25, 0.125, 0.125], 0.5, {0}),
    ([0.125, 0.5, 0.125, 0.25], 0.75, {1, 3}),
    ([0.5, 0.25, 0.125, 0.125], 0.875, {0, 1, 2}),
    ([0.5, 0.25, 0.125, 0.125], 0.76, {0, 1, 2}),
    ([0.5, 0.25, 0.125, 0.125], 0.74, {0, 1}),
    ([0.5, 0.25, 0.125, 0.125], 1.0, {0, 1, 2, 3}),
    ([0.5, 0.25, 0.125, 0.125], 1e-6, {0}),
    ([0.25, 0.25, 0.25, 0.25], 0.5, {0, 1}),  # ties: lower ids, smallest set
    ([0.25, 0.25, 0.25, 0.25], 0.51, {0, 1, 2}),
    ([0.0, 0.0, 1.0, 0.0], 0.3, {2}),
])
def test_top_p_mask_exact_boundaries(probs, top_p, expected):
  mask = sampling.top_p_mask(jnp.asarray([probs], jnp.float32), top_p)
  assert set(np.flatnonzero(np.asarray(mask)[0]).tolist()) == expected


def test_top_p_filter_keeps_smallest_sufficient_set():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(64, 12)) * 2
  for top_p in (0.1, 0.5, 0.9, 0.99):
    kept = np.isfinite(np.asarray(sampling.top_p_filter(
        jnp.asarray(logits, jnp.float32), top_p)))
    probs = np.apply_along_axis(_softmax, 1, logits)
    for row_probs, row_kept in zip(probs, kept):
      mass, smallest = row_probs[row_kept].sum(), row_probs[row_kept].min()
      assert row_probs.argmax() in np.flatnonzero(row_kept)
      assert smallest >= row_probs[~row_kept].max(initial=0)  # a top set
      assert mass >= top_p - 1e-6 and mass - smallest < top_p + 1e-6


def test_top_p_one_keeps_everything_even_with_tiny_tail():
  logits = jnp.asarray([[30.0, 0.0, -30.0, -60.0, -90.0]])
  assert _kept(sampling.top_p_filter(logits, 1.0)) == {0, 1, 2, 3, 4}


# C2: top-k off by one, and neighbours.
C2_LOGITS = [-2, -1, 0, 0.8, 0, 0.1, 0.3, 0.4, 0.5, 0.6, 0.7, -3]


@pytest.mark.parametrize("top_k", range(0, len(C2_LOGITS) + 2))
def test_top_k_keeps_exactly_the_k_largest(top_k):
  kept = _kept(sampling.top_k_filter(jnp.asarray([C2_LOGITS]), top_k))
  order = np.argsort(-np.asarray(C2_LOGITS), kind="stable")
  n = len(C2_LOGITS) if top_k == 0 else min(top_k, len(C2_LOGITS))
  assert kept == set(order[:n].tolist())
  if top_k == 1:
    assert kept == {3}
  if top_k == 3:
    assert kept == {3, 10, 9}


def test_top_k_ties_keep_exactly_k():
  logits = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
  assert _kept(sampling.top_k_filter(logits, 2)) == {0, 1}


@pytest.mark.parametrize("temperature", [1.0, 100.0])
def test_top_k_one_sampling_is_argmax_for_every_key(temperature):
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(64, 12)), jnp.float32)
  config = SamplingConfig(temperature=temperature, top_k=1)
  for seed in range(16):
    np.testing.assert_array_equal(
        sampling.sample(jax.random.key(seed), logits, config),
        np.argmax(np.asarray(logits), -1))


# C3: repetition penalty sign, and neighbours.
@pytest.mark.parametrize("seen, expected", [
    (1, [2.0, -2.0, 0.5]),
    (0, [1.0, -1.0, 0.5]),
    (2, [2.0, -1.0, 0.25]),
])
def test_repetition_penalty_is_sign_aware(seen, expected):
  logits = jnp.asarray([[2.0, -1.0, 0.5]])
  seen_BxV = jax.nn.one_hot(jnp.asarray([seen]), 3, dtype=bool)
  out = sampling.apply_repetition_penalty(logits, seen_BxV, 2.0)
  np.testing.assert_allclose(out[0], expected)
  if seen == 1:
    np.testing.assert_allclose(jax.nn.softmax(logits)[0, 1], 0.0391, atol=1e-4)
    np.testing.assert_allclose(jax.nn.softmax(out)[0, 1], 0.0148, atol=1e-4)


@pytest.mark.parametrize("penalty", [1.01, 1.5, 4.0])
def test_repetition_penalty_never_raises_a_seen_token(penalty):
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(512, 8)) * 3, jnp.float32)
  logits = logits.at[:8, 0].set(0.0)  # zero logits stay zero
  seen = jnp.asarray(rng.random((512, 8)) < 0.4)
  out = sampling.apply_repetition_penalty(logits, seen, penalty)
  assert np.all(np.where(seen, out <= logits, out == logits))
  # One seen token per row: its probability cannot rise.
  one = jax.nn.one_hot(jnp.asarray(rng.integers(0, 8, 512)), 8, dtype=bool)
  before, after = (jax.nn.softmax(x) for x in
                   (logits, sampling.apply_repetition_penalty(logits, one, penalty)))
  assert np.all(np.asarray(after)[np.asarray(one)]
                <= np.asarray(before)[np.asarray(one)] + 1e-7)


def test_greedy_applies_the_repetition_penalty_first():
  logits = jnp.asarray([[2.0, 1.5, -1.0], [2.0, 1.5, -1.0]])
  seen = jnp.asarray([[True, False, False], [False, False, False]])
  config = SamplingConfig(temperature=0.0, repetition_penalty=2.0)
  np.testing.assert_array_equal(
      sampling.sample(jax.random.key(0), logits, config, seen_BxV=seen), [1, 0])
  with pytest.raises(ValueError, match="seen_BxV"):
    sampling.sample(jax.random.key(0), logits, config)


def test_token_presence_ignores_invalid_positions():
  tokens = jnp.asarray([[1, 2, 5], [4, 4, 0]])
  valid = jnp.asarray([[True, True, False], [True, False, False]])
  seen = np.asarray(sampling.token_presence(tokens, valid, 6))
  assert [set(np.flatnonzero(r).tolist()) for r in seen] == [{1, 2}, {4}]


@pytest.mark.parametrize("min_p, expected", [
    (0.0, {0, 1, 2, 3}), (0.4, {0, 1}), (0.25, {0, 1, 2}), (0.9, {0})])
def test_min_p_keeps_tokens_above_fraction_of_max(min_p, expected):
  logits = jnp.log(jnp.asarray([[0.5, 0.25, 0.15, 0.1]]))
  assert _kept(sampling.min_p_filter(logits, min_p)) == expected


@pytest.mark.parametrize("name, value", [
    ("temperature", -1.0), ("temperature", -1e-9), ("temperature", float("nan")),
    ("top_p", 0.0), ("top_p", -0.1), ("top_p", 1.01), ("top_p", float("nan")),
    ("top_k", -1), ("top_k", 1.5),
    ("min_p", -0.1), ("min_p", 1.0),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("repetition_penalty", float("inf")),
])
def test_sampling_config_rejects_out_of_range(name, value):
  with pytest.raises(ValueError, match=name):
    SamplingConfig(**{name: value})


def test_sampling_config_accepts_neutral_edges_and_is_hashable():
  config = SamplingConfig(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                          repetition_penalty=1.0)
  assert hash(config) == hash(SamplingConfig(temperature=0.0))


@pytest.mark.parametrize("logits, temperature", [
    ([1.0, 0.5, 0.0, -1.0, 2.0, -0.5], 1.0),
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1.0),
    ([3.0, -3.0, 0.0, 1.0, -1.0, 0.5], 1.0),  # a ~0.1% tail token
    ([1.0, 0.5, 0.0, -1.0, 2.0, -0.5], 0.5),
])
def test_sampling_follows_softmax(logits, temperature):
  drawn = _draw(logits, SamplingConfig(temperature=temperature))
  probs = _softmax(np.asarray(logits) / temperature)
  assert _frequencies_fit(drawn, probs) > P_VALUE
  # The same test rejects a slightly wrong distribution (it can fail).
  assert _frequencies_fit(drawn, _softmax(np.asarray(logits) / temperature * 1.3)
                          ) < P_VALUE or np.ptp(logits) == 0


@pytest.mark.parametrize("config, allowed", [
    (SamplingConfig(top_k=3), {4, 0, 1}),
    (SamplingConfig(top_p=0.8), {4, 0, 1}),
    (SamplingConfig(min_p=0.3), {4, 0}),
    (SamplingConfig(top_k=4, top_p=0.7), {4, 0}),
    (SamplingConfig(top_k=2, temperature=2.0), {4, 0}),
])
def test_filtered_sampling_draws_allowed_tokens_renormalised(config, allowed):
  logits = np.asarray([1.0, 0.5, 0.0, -1.0, 2.0, -0.5])
  drawn = _draw(logits, config, seed=3)
  probs = _softmax(logits / config.temperature)
  probs[[i for i in range(len(logits)) if i not in allowed]] = 0.0
  assert _frequencies_fit(drawn, probs) > P_VALUE


def test_per_row_temperature_overrides_config():
  logits_V = jnp.asarray([1.0, 0.5, 0.0, -1.0, 2.0, -0.5])
  half = DRAWS // 2
  temperature_B = jnp.concatenate([jnp.zeros(half), jnp.ones(half)])
  logits_BxV = jnp.broadcast_to(logits_V, (DRAWS, 6))
  drawn = np.asarray(sampling.sample(
      jax.random.key(4), logits_BxV, SamplingConfig(temperature=0.0),
      temperature_B=temperature_B))
  assert np.all(drawn[:half] == 4)
  counts = np.bincount(drawn[half:], minlength=6)
  assert stats.chisquare(counts, half * _softmax(logits_V)).pvalue > P_VALUE
  with pytest.raises(ValueError, match="temperature_B"):
    sampling.sample(jax.random.key(0), logits_BxV, SamplingConfig(),
                    temperature_B=jnp.ones(3))
  with pytest.raises(ValueError, match="temperature_B"):
    sampling.sample(jax.random.key(0), logits_BxV[:2], SamplingConfig(),
                    temperature_B=jnp.asarray([1.0, -1.0]))


def test_greedy_ignores_key_and_filters():
  rng = np.random.default_rng(5)
  logits = jnp.asarray(rng.normal(size=(32, 9)), jnp.float32)
  config = SamplingConfig(temperature=0.0, top_k=2, top_p=0.3, min_p=0.5)
  for seed in range(3):
    np.testing.assert_array_equal(
        sampling.sample(jax.random.key(seed), logits, config),
        np.argmax(np.asarray(logits), -1))


@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (3, 4, 33), (2, 32000)])
def test_argmax_equals_numpys_first_maximum_on_ties_infinities_and_nans(shape):
  """`sampling.argmax` (two reductions) against numpy's argmax: random rows
  with ties on a coarse grid, rows of all-equal, +-inf and NaN entries."""
  rng = np.random.default_rng(sum(shape))
  x = rng.integers(-3, 3, size=shape).astype(np.float32)  # many ties
  flat = x.reshape(-1, shape[-1])
  specials = [np.inf, -np.inf, np.nan]
  for row in range(0, flat.shape[0], 2):
    flat[row, rng.integers(shape[-1], size=2)] = specials[row % 3]
  flat[-1] = -np.inf  # a row of all -inf: index 0
  expected = np.argmax(x, axis=-1)
  np.testing.assert_array_equal(sampling.argmax(jnp.asarray(x)), expected)
  np.testing.assert_array_equal(jax.jit(sampling.argmax)(jnp.asarray(x)),
                                expected)
  assert sampling.argmax(jnp.asarray(x)).dtype == jnp.int32


@pytest.mark.parametrize("vocab, group", [(4096, 64), (1000, 25), (256, 16),
                                          (250, 10), (257, 1)])
def test_group_size_is_the_largest_divisor_up_to_sqrt(vocab, group):
  assert sampling._group_size(vocab) == group


@pytest.mark.parametrize("vocab", [256, 1000])
def test_two_level_categorical_follows_softmax(vocab):
  """The hierarchical Gumbel-max draw (large V) is exact: chi-square over all
  tokens (cells pooled to expected counts >= 5) and over the groups."""
  draws = 200_000
  logits_V = jax.random.normal(jax.random.key(vocab), (vocab,)) * 1.5
  logits_V = logits_V.at[7].set(-jnp.inf)  # excluded entries stay excluded
  tokens = np.asarray(jax.jit(sampling.categorical)(
      jax.random.key(1), jnp.broadcast_to(logits_V, (draws, vocab))))
  probs = _softmax(logits_V)
  counts = np.bincount(tokens, minlength=vocab)
  assert counts[7] == 0
  order = np.argsort(probs)
  expected = probs[order] * draws
  cut = np.searchsorted(np.cumsum(expected), 5.0)  # pool the rarest cells
  observed = np.concatenate([[counts[order[:cut + 1]].sum()],
                             counts[order[cut + 1:]]])
  pooled = np.concatenate([[expected[:cut + 1].sum()], expected[cut + 1:]])
  assert stats.chisquare(observed, pooled).pvalue > P_VALUE
  g = sampling._group_size(vocab)
  group_counts = counts.reshape(-1, g).sum(1)
  assert stats.chisquare(group_counts,
                         probs.reshape(-1, g).sum(1) * draws).pvalue > P_VALUE


def test_two_level_categorical_rejects_a_wrong_distribution():
  """The chi-square above can fail: draws from a tempered softmax do not fit."""
  vocab, draws = 256, 200_000
  logits_V = jax.random.normal(jax.random.key(0), (vocab,)) * 1.5
  tokens = np.asarray(sampling.categorical(
      jax.random.key(1), jnp.broadcast_to(logits_V / 0.9, (draws, vocab))))
  counts = np.bincount(tokens, minlength=vocab).reshape(-1, 16).sum(1)
  expected = _softmax(logits_V).reshape(-1, 16).sum(1) * draws
  assert stats.chisquare(counts, expected).pvalue < P_VALUE


# R2 (reliability_cases.md): a tiny positive temperature overflowed logits / T
# and returned the wrong token; below MIN_TEMPERATURE decoding is greedy.
BELOW_FLOOR = [1e-45, 1e-39, 1e-38, 1e-37, 1e-30, 1e-10,
               sampling.MIN_TEMPERATURE / 2,
               float(np.nextafter(sampling.MIN_TEMPERATURE, 0))]


@pytest.mark.parametrize("temperature", [0.0] + BELOW_FLOOR)
def test_temperature_below_the_floor_is_greedy(temperature):
  logits_BxV = jnp.asarray([[50.0, 60.0, 0.0]] * 4)
  config = SamplingConfig(temperature=temperature)
  for seed in range(3):
    np.testing.assert_array_equal(
        sampling.sample(jax.random.key(seed), logits_BxV, config), [1] * 4)
  assert sampling.is_greedy(temperature)


@pytest.mark.parametrize("temperature", [sampling.MIN_TEMPERATURE, 1e-5, 1e-3])
def test_temperature_at_and_above_the_floor_stays_finite(temperature):
  """Sampled (not the greedy shortcut), yet one-hot here: still token 1."""
  assert not sampling.is_greedy(temperature)
  logits_BxV = jnp.asarray([[50.0, 60.0, 0.0]] * 4)
  drawn = sampling.sample(jax.random.key(0), logits_BxV,
                          SamplingConfig(temperature=temperature))
  np.testing.assert_array_equal(drawn, [1] * 4)


def test_per_row_temperature_below_the_floor_is_greedy_for_that_row():
  temperature_B = jnp.asarray([1e-37, 1e-39, 0.0, 5e-7, 1e3])
  logits_BxV = jnp.broadcast_to(jnp.asarray([50.0, 60.0, 0.0]), (5, 3))
  np.testing.assert_array_equal(
      sampling.is_greedy(temperature_B), [True, True, True, True, False])
  hot_rows = set()
  for seed in range(20):
    drawn = np.asarray(sampling.sample(
        jax.random.key(seed), logits_BxV, SamplingConfig(),
        temperature_B=temperature_B))
    np.testing.assert_array_equal(drawn[:4], [1] * 4)
    hot_rows.add(int(drawn[4]))
  assert len(hot_rows) > 1  # T = 1000 really samples


def test_sampling_temperature_must_be_finite():
  """Bug: SamplingConfig(temperature=inf) is accepted; logits / inf turns
  -inf logits into NaN and the decoders then emit a token whose logit was
  -inf (token 0 of a stub that masks it).

  Fix: in `SamplingConfig.__post_init__` check
  `0 <= self.temperature < math.inf`, "in [0, inf) (0 = greedy)".
  """
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingConfig(temperature=float("inf"))


def test_sample_rejects_nan_row_temperature():
  """Bug: `np.any(temperature_B < 0)` is False for NaN, so a NaN row
  temperature silently draws token 0.

  Fix: in `sampling.sample` raise when
  `not np.all(np.isfinite(t) & (t >= 0))` for a concrete temperature_B.
  """
  with pytest.raises(ValueError, match="temperature_B"):
    sampling.sample(jax.random.key(0), jnp.zeros((2, 8)),
                    sampling.SamplingConfig(),
                    temperature_B=jnp.asarray([jnp.nan, 1.0]))


@pytest.mark.parametrize("vocab", [256, 257])
def test_categorical_with_one_finite_logit_always_draws_it(vocab):
  """Two levels (256 = 16 groups of 16) and one level (257 is prime)."""
  tokens = np.asarray([0, vocab // 2 + 1, vocab - 1] * 8)
  logits = np.full((tokens.size, vocab), -np.inf, np.float32)
  logits[np.arange(tokens.size), tokens] = 0.5
  drawn = jax.jit(sampling.categorical)(jax.random.key(vocab),
                                        jnp.asarray(logits, jnp.bfloat16))
  np.testing.assert_array_equal(drawn, tokens)


# Rows (call, exception class, regex) as in tests/test_registry_contracts.py:
# the message names the option and its range.
BAD_INPUTS = [
    pytest.param(lambda: SamplingConfig(temperature=True),
                 ValueError, r"temperature=True must be in \[0, inf\)",
                 id="sampling-temperature-true"),
    pytest.param(lambda: SamplingConfig(top_p=True), ValueError,
                 r"top_p=True must be in \(0, 1\]", id="sampling-top-p-true"),
    pytest.param(lambda: SamplingConfig(top_k=2.5), ValueError,
                 r"top_k=2.5 must be an integer >= 0", id="sampling-top-k-2.5"),
    pytest.param(lambda: SamplingConfig(min_p=1.0), ValueError,
                 r"min_p=1.0 must be in \[0, 1\)", id="sampling-min-p-1"),
    pytest.param(lambda: SamplingConfig(repetition_penalty=0.0),
                 ValueError, r"repetition_penalty=0.0 must be in \(0, inf\)",
                 id="sampling-repetition-penalty-0"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()
