"""Tests of lm_decoding.decoding.beam_search: exhaustive equivalence, per-row
EOS, bad options and inputs (`BAD_INPUTS`)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base
from lm_decoding.decoding import beam_search
from lm_decoding.decoding.base import bind
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, PAD_ID

STEPS = 3
PROMPTS, LENGTHS = [[1, 2, 1], [2, 1, PAD_ID]], [3, 2]


def _beam(logits_fn, params, num_beams, alpha, prompts=PROMPTS,
          lengths=LENGTHS, **options):
  options.setdefault("output_length", STEPS)
  decoder = base.make_decoder("ar_beam", num_beams=num_beams,
                              length_penalty=alpha, **options)
  return decoder.decode(bind(logits_fn, params), jnp.asarray(prompts, jnp.int32),
                        jnp.asarray(lengths, jnp.int32), None)


def _hypotheses(tokens):
  """Every output of at most STEPS tokens: ends at its first EOS, or at STEPS."""
  for n in range(1, STEPS + 1):
    for seq in itertools.product(tokens, repeat=n):
      if EOS_ID not in seq[:-1] and (seq[-1] == EOS_ID or n == STEPS):
        yield seq


def _brute_force(log_prob_fn, tokens, alpha):
  """The best hypothesis by log p / ((5 + n) / 6) ** alpha."""
  scored = [(sum(log_prob_fn(seq)) / ((5 + len(seq)) / 6) ** alpha, seq)
            for seq in _hypotheses(tokens)]
  return max(scored)[1]


def _check_equals_brute_force(result, best_per_row):
  for row, best in enumerate(best_per_row):
    n = len(best)
    assert result.lengths[row] == n
    np.testing.assert_array_equal(result.tokens[row],
                                  list(best) + [PAD_ID] * (STEPS - n))
    np.testing.assert_array_equal(result.committed[:, row],
                                  [1] * n + [0] * (STEPS - n))
  assert result.nfe == STEPS


def _stub_log_probs(row):
  prompt = STUB_PROMPTS[row][:STUB_LENGTHS[row]]

  def log_probs(seq):
    context = [PAD_ID] + prompt + list(seq)  # PAD: "previous" of position 0
    return [STUB.next_log_probs(0, p, context[p], context[p + 1])[token]
            for p, token in enumerate(seq, start=len(prompt) - 1)]
  return log_probs


def _biased_random_stub(seed):
  """A random position-dependent trigram; PAD never, EOS a little less likely.

  One model (R = 1): beam search regroups batch rows, so the rows must not
  select different models."""
  table = stubs.TableLogitsFn.random(seed, 4, 8, masked_ids=(PAD_ID,),
                                     scale=1.5).table.copy()
  table[..., EOS_ID] -= 1.0
  return stubs.TableLogitsFn(table)


# Eight cases in one compile: prompts differ in length and last tokens, so each
# row meets different position-dependent trigram log-probs.
STUB = _biased_random_stub(0)
STUB_PROMPTS = [[1, PAD_ID, PAD_ID, PAD_ID], [2, PAD_ID, PAD_ID, PAD_ID], [1, 2, PAD_ID, PAD_ID],
                [2, 1, PAD_ID, PAD_ID], [1, 1, 2, PAD_ID], [2, 2, 1, PAD_ID],
                [1, 2, 1, 2], [2, 1, 1, 1]]
STUB_LENGTHS = [1, 1, 2, 2, 3, 3, 4, 4]


def _stub_brute_force(alpha):
  return [_brute_force(_stub_log_probs(row), (1, 2, EOS_ID), alpha)
          for row in range(len(STUB_PROMPTS))]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("num_beams", [4, 15])  # 4 alive prefixes; 15 outputs
def test_beam_search_equals_brute_force_on_stub(alpha, num_beams):
  result = _beam(STUB, None, num_beams, alpha, STUB_PROMPTS, STUB_LENGTHS)
  _check_equals_brute_force(result, _stub_brute_force(alpha))


def test_beam_search_escapes_a_greedy_trap_with_its_parents_cache():
  """After prompt [1]: 1 (p .55) leads to a flat next step, 2 (p .4) to a sure
  1, then EOS is likely only after the pair (2, 1), which the model reads
  back from the cache. The best output is (2, 1, EOS) though its beam changes
  index; one beam misses it (so the brute-force check can fail)."""
  table = np.full((1, 8, 4, 4, 4), -np.inf, np.float32)
  table[0, 0, :, 1, 1:] = np.log([0.55, 0.4, 0.05])
  table[0, 1, :, 1, 1:] = np.log([0.34, 0.33, 0.33])
  table[0, 1, :, 2, 1:] = np.log([0.98, 0.01, 0.01])
  table[0, 2, :, :, 1:] = np.log([0.45, 0.45, 0.1])
  table[0, 2, 2, 1, 1:] = np.log([0.05, 0.05, 0.9])
  trap = stubs.TableLogitsFn(table)
  prompts, lengths = [[1]], [1]
  one, two = (_beam(trap, None, k, 0.0, prompts, lengths) for k in (1, 2))
  np.testing.assert_array_equal(one.tokens, [[1, EOS_ID, PAD_ID]])
  _check_equals_brute_force(two, [(2, 1, EOS_ID)])


@pytest.fixture(scope="module")
def tiny_transformer():
  """A real Transformer with vocab 4 ({0, 1, 2} and EOS): its logits read the
  KV cache, so reordering the cache between beams is checked too."""
  config = TransformerConfig(vocab_size=4, d_model=32, num_layers=2,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16, tie_embeddings=False)
  params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(3))
  return make_logits_fn(config), params


def _transformer_log_probs(logits_fn, params, row):
  """Exact log-probs of every hypothesis: one uncached forward over all."""
  prompt = PROMPTS[row][:LENGTHS[row]]
  hypotheses = list(_hypotheses((0, 1, 2, EOS_ID)))
  width = len(PROMPTS[0]) + STEPS
  rows = [prompt + list(h) for h in hypotheses]
  tokens = jnp.asarray([r + [PAD_ID] * (width - len(r)) for r in rows])
  positions = jnp.broadcast_to(jnp.arange(width), tokens.shape)
  logits = jax.jit(logits_fn)(params, tokens, positions).logits
  log_probs = np.asarray(jax.nn.log_softmax(logits, -1), np.float64)
  table = {h: [log_probs[i, len(prompt) - 1 + j, t] for j, t in enumerate(h)]
           for i, h in enumerate(hypotheses)}
  return table.__getitem__


def test_beam_search_equals_brute_force_on_transformer(tiny_transformer):
  logits_fn, params = tiny_transformer
  result = _beam(logits_fn, params, 9, 0.6)  # 9 = alive prefixes of length 2
  best = [_brute_force(_transformer_log_probs(logits_fn, params, row),
                       (0, 1, 2, EOS_ID), 0.6)
          for row in range(2)]
  _check_equals_brute_force(result, best)


def test_rows_end_at_their_own_eos():
  # Token i comes from position 1 + i; any id of {2, 7} ends a row.
  stub = stubs.TableLogitsFn.scripted(
      [[9, 5, 7, 9, 9, 9, 9, 9], [9, 5, 3, 6, 2, 9, 9, 9]], 10)
  result = _beam(stub, None, 3, 0.6, prompts=[[5, 6], [7, 8]], lengths=[2, 2],
                 output_length=5, eos_ids=(2, 7))
  np.testing.assert_array_equal(result.tokens, [[5, 7, PAD_ID, PAD_ID, PAD_ID],
                                                [5, 3, 6, 2, PAD_ID]])
  np.testing.assert_array_equal(result.lengths, [2, 4])
  assert result.nfe == 5


def test_length_penalty_is_gnmt():
  np.testing.assert_allclose(beam_search.gnmt_length_penalty(3, 0.6),
                             (8 / 6) ** 0.6, rtol=1e-6)
  assert beam_search.gnmt_length_penalty(7, 0.0) == 1.0


@pytest.mark.parametrize("options, match", [
    (dict(num_beams=0), "num_beams"),
    (dict(length_penalty=-0.1), "length_penalty"),
    (dict(length_penalty=float("nan")), "length_penalty"),
])
def test_bad_beam_options_raise(options, match):
  with pytest.raises(ValueError, match=match):
    base.make_decoder("ar_beam", **options)


def test_beam_search_never_emits_an_eos_id_outside_the_vocabulary():
  """Bug: with eos_ids=(V + 2,) beam search gathers log p(EOS) out of bounds
  (clamped to token V - 1) and returns token id V + 2 in its output.

  Fix: in `_beam_decode` (trace time, V = first_logits_BxV.shape[-1]) raise
  ValueError when any eos id or pad_id is >= V, naming eos_ids / pad_id.
  """
  vocab = 8
  stub = stubs.TableLogitsFn.random(0, vocab, 10, masked_ids=(PAD_ID,))
  decoder = base.make_decoder("ar_beam", output_length=4, num_beams=2,
                              eos_ids=(vocab + 2,))
  try:
    out = decoder.decode(bind(stub, None), jnp.asarray([[5, 6, 7], [5, 6, 0]]),
                         jnp.asarray([3, 2]), jax.random.key(0))
  except ValueError as e:
    assert "eos_ids" in str(e)
  else:
    assert int(jnp.max(out.tokens)) < vocab


@pytest.mark.parametrize("name, options, match", [
    ("ar_beam", dict(output_length=2, num_beams=2.5), "num_beams"),
])
def test_integer_options_reject_non_integers(name, options, match):
  """As tests/test_autoregressive.py's test of that name."""
  with pytest.raises(ValueError, match=match):
    base.make_decoder(name, **options)


# Rows (call, exception class, regex) as in tests/test_registry_contracts.py.
BAD_INPUTS = [
    pytest.param(lambda: stubs.decoder("ar_beam", num_beams=True), ValueError,
                 r"num_beams=True must be >= 1", id="beam-num-beams-true"),
    pytest.param(lambda: stubs.decoder("ar_beam", length_penalty=True),
                 ValueError, r"length_penalty=True must be in \[0, inf\)",
                 id="beam-length-penalty-true"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()
