"""Self-speculation (lm_decoding/decoding/self_speculative.py): a
block-diffusion model with a token shift drafts in diffusion mode and
verifies at block size 1; the output is that AR model's, token for token
(greedy) or in distribution (sampling: chi-square against enumeration, as
tests/test_speculative.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base, make_decoder, speculative
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model, TransformerConfig, make_logits_fn
from lm_decoding.models.binding import causal_view
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID
from test_speculative import (CONFIGS, P_VALUE, PROMPT_LENGTHS, PROMPTS,
                              RAGGED, RAGGED_LENGTHS, exact_distribution, fit,
                              long_stub, sample_rows, target_stub)

KEY = jax.random.key(0)
GREEDY = SamplingConfig(temperature=0.0)
BLOCK = 4


def shifted(inner, block_length=BLOCK):
  """`inner` declared a block-diffusion model with a token shift."""
  config = TransformerConfig(
      vocab_size=inner.vocab_size, d_model=8, num_layers=1, num_heads=1,
      num_kv_heads=1, head_dim=8, mlp_dim=8, max_len=inner.max_len,
      attention="block_causal", block_length=block_length, token_shift=True)
  return Model(stubs.ConfiguredLogitsFn(inner, config), None)


def agreeing_stub(seed):
  """`long_stub` (random trigrams, EOS in rows 1 and 3) whose next token at
  two positions in three is fixed by the position alone (+12): there the
  draft, which reads MASK, agrees with the target; at the third it does
  not. Acceptance lengths then vary from round to round."""
  stub = long_stub(seed)
  rng = np.random.default_rng(seed)
  fixed = rng.integers(5, stub.vocab_size, stub.max_len)
  for position in range(stub.max_len):
    if position % 3:
      stub.table[:, position, ..., fixed[position]] += 12.0
  return stub


def transformer(seed=0, **changes):
  config = TransformerConfig(
      vocab_size=32, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1,
      head_dim=16, mlp_dim=64, max_len=64, attention="block_causal",
      block_length=BLOCK, token_shift=True).replace(**changes)
  return Model(make_logits_fn(config), stubs.random_params(config, seed))


def ar_greedy(model, length, prompts, lengths, **options):
  return make_decoder("ar", output_length=length, sampling=GREEDY,
                      **options).decode({"model": causal_view(model)},
                                        prompts, lengths, None)


# --- Greedy: the AR decode of the same weights, token for token. -----------

@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_equals_ar_greedy_on_a_stub_for_256_tokens(gamma):
  model = shifted(agreeing_stub(1))
  reference = ar_greedy(model, 256, RAGGED, RAGGED_LENGTHS)
  lengths = np.asarray(reference.lengths)
  assert len(set(lengths.tolist())) > 1 and lengths.max() == 256
  out = make_decoder("self_speculative", output_length=256, gamma=gamma,
                     sampling=GREEDY).decode({"model": model}, RAGGED,
                                             RAGGED_LENGTHS, None)
  np.testing.assert_array_equal(out.tokens, reference.tokens)
  np.testing.assert_array_equal(out.lengths, reference.lengths)
  counts = np.asarray(out.stats["accept_counts"]).sum(0)
  # Rounds that accepted masked-position drafts (gamma 1: x's own d_0).
  assert counts[min(2, gamma):].sum() > 0
  if gamma > 1:
    assert counts[1:gamma].sum() > 0  # and rounds that rejected one


def test_greedy_equals_ar_greedy_on_a_transformer():
  """Real keys and values: the verify call's causal cache, rolled back at
  every rejection, gives the AR decode of the causal view."""
  model = transformer()
  prompts, lengths = RAGGED % 32, RAGGED_LENGTHS
  reference = ar_greedy(model, 24, prompts, lengths, eos_ids=())
  out = make_decoder("self_speculative", output_length=24, gamma=3,
                     sampling=GREEDY, eos_ids=()).decode(
                         {"model": model}, prompts, lengths, None)
  np.testing.assert_array_equal(out.tokens, reference.tokens)
  # The block-causal model itself decodes differently (its prefill lets a
  # prompt token see the later ones of its block): the view matters.
  block_causal = make_decoder("ar", output_length=24, sampling=GREEDY,
                              eos_ids=()).decode({"model": model}, prompts,
                                                 lengths, None)
  assert (np.asarray(block_causal.tokens)
          != np.asarray(reference.tokens)).any()


def test_a_row_decodes_the_same_alone_as_in_a_batch():
  model = transformer(1)
  prompts, lengths = RAGGED % 32, RAGGED_LENGTHS
  keys = jax.random.split(KEY, 4)
  decoder = make_decoder("self_speculative", output_length=12, gamma=3,
                         sampling=SamplingConfig(temperature=1.0))
  batch = decoder.decode({"model": model}, prompts, lengths, keys)
  for b in range(4):
    row = decoder.decode({"model": model}, prompts[b:b + 1],
                         lengths[b:b + 1], keys[b:b + 1])
    np.testing.assert_array_equal(row.tokens[0], batch.tokens[b])
    np.testing.assert_array_equal(row.stats["accept_counts"][0],
                                  batch.stats["accept_counts"][b])


def test_jitted_equals_eager():
  model = shifted(agreeing_stub(2))
  decoder = make_decoder("self_speculative", output_length=5, gamma=3,
                         sampling=SamplingConfig(temperature=1.0))
  prompts, lengths = RAGGED[:1], RAGGED_LENGTHS[:1]
  jitted = decoder.decode({"model": model}, prompts, lengths, KEY)
  with jax.disable_jit():
    eager = decoder.decode({"model": model}, prompts, lengths, KEY)
  np.testing.assert_array_equal(jitted.tokens, eager.tokens)
  np.testing.assert_array_equal(jitted.stats["accept_counts"],
                                eager.stats["accept_counts"])


def test_the_draft_call_equals_an_uncached_pass_over_the_drafting_layout():
  """The cached draft call (x causal on the causal prefix cache, the MASK
  block bidirectional) gives the logits of one uncached pass over
  [prompt, MASK x gamma] with that mask: the slots, positions and mask of
  the cached call are the layout's."""
  model, gamma = transformer(3), 3
  decoder = make_decoder("self_speculative", output_length=6, gamma=gamma,
                         sampling=SamplingConfig(temperature=1.0))
  prompts, lengths = RAGGED % 32, RAGGED_LENGTHS
  models = {"target": causal_view(model), "draft": model}
  keys = base.row_keys(KEY, 4)
  state = speculative.start(decoder, decoder.cache_length_for(3), models,
                            prompts, lengths, keys)
  _, q, _, _ = decoder.propose(models, state, keys)
  for b in (0, 1):  # prompts of 3 and 1 tokens
    n = int(lengths[b])
    tokens = jnp.concatenate([prompts[b, :n], jnp.full((gamma,), MASK_ID)])
    width = n + gamma
    i = jnp.arange(width)
    mask = (i[None, :] <= i[:, None]) | (i[:, None] >= n)
    logits = model.logits_fn(model.params, tokens[None], i[None],
                             attention_mask=mask[None]).logits[0]
    want = jax.nn.softmax(logits[n - 1:n - 1 + gamma].at[:, MASK_ID].set(
        -jnp.inf), -1)
    np.testing.assert_allclose(q[b], want, atol=1e-5)


# --- Sampling: exactly the block-size-1 model's distribution. ----------------

@pytest.mark.parametrize("gamma, config", [(3, "topp_minp_penalty")])
def test_samples_follow_the_block_one_distribution(gamma, config):
  """The stub reads MASK in the draft call, so q differs from p; the
  committed tokens still follow the target's enumerated distribution."""
  stub = target_stub()
  decoder = make_decoder("self_speculative", output_length=3, gamma=gamma,
                         sampling=CONFIGS[config], eos_ids=())
  tokens, out = sample_rows(decoder, {"model": shifted(stub)})
  for row in range(2):
    exact = exact_distribution(
        stub, np.asarray(PROMPTS[row, :PROMPT_LENGTHS[row]]), CONFIGS[config])
    p_value, _ = fit(tokens[row::2], exact)
    assert p_value > P_VALUE, (row, p_value)
  counts = np.asarray(out.stats["accept_counts"]).sum(0)
  assert counts[:gamma].sum() > 0 and counts[2:].sum() > 0


# --- Statistics and expected work. ---------------------------------------------

def test_calls_rounds_and_the_acceptance_histogram_agree():
  model = shifted(agreeing_stub(3))
  out = make_decoder("self_speculative", output_length=60, gamma=4,
                     sampling=GREEDY, eos_ids=()).decode(
                         {"model": model}, RAGGED[:1], RAGGED_LENGTHS[:1],
                         None)
  counts = np.asarray(out.stats["accept_counts"])[0]
  rounds = int(out.stats["rounds"][0])
  assert counts.sum() == rounds
  assert set(out.calls) == {"model"}
  assert int(out.calls["model"]) == 1 + 2 * rounds  # prefill, draft + verify
  assert int(out.forward_tokens["model"]) == 3 + 2 * rounds * 5
  # Every round commits its accepted tokens + 1, except a cut last round.
  assert 0 <= (np.arange(5) + 1) @ counts - 60 <= 4


def test_expected_work_is_the_decoders_own():
  decoder = make_decoder("self_speculative", output_length=32, gamma=4)
  # 16 rounds of a draft and a verify call of 5 positions; 4 + 5 drawn.
  work = decoder.expected_work(1, 16)
  assert (work.forward_tokens, work.drawn) == (16 + 16 * 10, 16 * 9)


# --- Bad input: refused by name before compiling. ------------------------------

def raising(attention="block_causal", block_length=BLOCK, token_shift=True):
  return stubs.RaisingLogitsFn(config=TransformerConfig(
      vocab_size=16, d_model=8, num_layers=1, num_heads=1, num_kv_heads=1,
      head_dim=8, mlp_dim=8, max_len=16, attention=attention,
      block_length=block_length, token_shift=token_shift))


@pytest.mark.parametrize("fn, options, match", [
    (raising("causal", 0), {}, r"^SelfSpeculativeDecoder needs non-causal "
     r"\(e.g. 'bidirectional'\) attention; logits_fn.config.attention="
     r"'causal'$"),
    (raising(token_shift=False), {}, r"needs a model with a token shift .*"
     r"token_shift=False$"),
    (raising("bidirectional", 0, token_shift=False), {},
     r"token_shift=False$"),
    (raising(), dict(gamma=5), r"^gamma=5 must be in \[1, block_length=4\]"),
])
def test_bad_models_are_refused_before_any_call(fn, options, match):
  with pytest.raises(ValueError, match=match):
    stubs.decode_raising("self_speculative", roles={"model": fn}, **options)


@pytest.mark.parametrize("options, match", [
    (dict(gamma=0), r"gamma=0 must be an integer >= 1"),
    (dict(mask_id=PAD_ID), r"mask_id=0 must be an id >= 0 other than"),
    (dict(mask_id=EOS_ID), r"mask_id=3 must be"),
])
def test_bad_options_raise_at_construction(options, match):
  with pytest.raises(ValueError, match=match):
    make_decoder("self_speculative", output_length=8, **options)


def test_other_roles_are_refused():
  with pytest.raises(ValueError, match=r"needs roles"):
    make_decoder("self_speculative", output_length=4).decode(
        {"target": Model(stubs.RaisingLogitsFn(), None)},
        jnp.asarray([[5, 6]]), jnp.asarray([2]), KEY)
