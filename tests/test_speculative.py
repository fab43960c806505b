"""Draft-and-verify decoders: speculative, jacobi, prompt_lookup,
diffusion_draft, skeleton_polish (lm_decoding/decoding/{speculative,
self_drafting,hybrid}.py).

Exactness is tested against enumeration: on a trigram stub target the
distribution of every 3-token continuation is computed exactly (with the
same processors) and the decoders' samples are compared by chi-square.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import stubs
from lm_decoding.decoding import base, make_decoder, sampling, speculative
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.self_drafting import lookup
from lm_decoding.models import Model, TransformerConfig, init_params, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID

KEY = jax.random.key(0)
GREEDY = SamplingConfig(temperature=0.0)
P_VALUE = 1e-3  # keys are fixed: every run is the same run
DRAW_VERIFY = ("speculative", "jacobi", "prompt_lookup", "diffusion_draft",
               "skeleton_polish")


def models(target, draft=None):
  out = {"target": Model(target, None)}
  if draft is not None:
    out["draft"] = Model(draft, None)
  return out


def roles_for(name, target, draft):
  roles = base.decoder_class(name).roles
  return models(target, draft if "draft" in roles else None)


# --- Greedy: token for token the target's greedy decoding. -----------------

def long_stub(seed, vocab=12, max_len=272):
  """Random trigram logits, PAD and MASK never drawn; EOS only in row 1 (at
  position 80) and row 3 (at 200) of every 4: rows end at different places
  or not at all."""
  random = stubs.TableLogitsFn.random(seed, vocab, max_len,
                                      masked_ids=(PAD_ID, MASK_ID))
  table = np.repeat(random.table, 4, axis=0)
  table[..., EOS_ID] = -np.inf
  table[1, 80, ..., EOS_ID] = table[3, 200, ..., EOS_ID] = 100.0
  return stubs.TableLogitsFn(table)


RAGGED = jnp.array([[5, 6, 7], [7, 0, 0], [3, 5, 0], [9, 9, 9]], jnp.int32)
RAGGED_LENGTHS = jnp.array([3, 1, 2, 3], jnp.int32)


@pytest.mark.parametrize("name, options", [
    ("speculative", dict(gamma=1)),
    ("speculative", dict(gamma=4)),
    ("speculative", dict(gamma=8)),
    ("jacobi", dict(gamma=4)),
    ("prompt_lookup", dict(gamma=4)),
    ("diffusion_draft", dict(gamma=4, draft_steps=2)),
    ("skeleton_polish", dict(gamma=8, threshold=1.0, draft_steps=16)),
])
def test_greedy_equals_target_greedy_for_256_tokens(name, options):
  target, draft = long_stub(1), long_stub(2)
  reference = make_decoder("ar", output_length=256, sampling=GREEDY).decode(
      base.bind(target, None), RAGGED, RAGGED_LENGTHS, None)
  lengths = np.asarray(reference.lengths)
  assert len(set(lengths.tolist())) > 1 and lengths.max() == 256
  out = make_decoder(name, output_length=256, sampling=GREEDY,
                     **options).decode(roles_for(name, target, draft),
                                       RAGGED, RAGGED_LENGTHS, None)
  np.testing.assert_array_equal(out.tokens, reference.tokens)
  np.testing.assert_array_equal(out.lengths, reference.lengths)
  np.testing.assert_array_equal(np.asarray(out.committed).sum(0), lengths)


def test_an_agreeing_draft_is_fully_accepted():
  """Draft == target: every round accepts gamma tokens and adds the bonus."""
  target = long_stub(1)
  out = make_decoder("speculative", output_length=25, gamma=4,
                     sampling=GREEDY, eos_ids=()).decode(
                         models(target, target), RAGGED, RAGGED_LENGTHS, None)
  counts = np.asarray(out.stats["accept_counts"])
  np.testing.assert_array_equal(out.stats["rounds"], [5] * 4)
  np.testing.assert_array_equal(counts[:, -1], [5] * 4)
  assert int(out.calls["target"]) == 1 + 5  # prefill + rounds
  assert int(out.calls["draft"]) == 1 + 5 * 4  # prefill + gamma per round


# --- Sampling: exactly the target's distribution. ----------------------------

V = 6
T = 3
PROMPTS = jnp.array([[5, 2, 1], [2, 0, 0]], jnp.int32)
PROMPT_LENGTHS = jnp.array([3, 1], jnp.int32)
DRAWS = 24_000  # rows, alternating between the two prompts


def target_stub():
  return stubs.TableLogitsFn.random(11, V, 16, masked_ids=(PAD_ID,))


def exact_distribution(stub, prompt, config):
  """{continuation: probability} of T tokens after `prompt` under plain
  sampling from the stub with `config`'s processors (enumerated level by
  level: one `sampling.probabilities` call for all prefixes of a length)."""
  table = np.asarray(stub.table[0], np.float32)
  prefixes, probability = [tuple(prompt)], np.ones(1)
  for _ in range(T):
    logits = np.stack([table[len(c) - 1, c[-2] if len(c) > 1 else 0, c[-1]]
                       for c in prefixes])
    seen = np.zeros((len(prefixes), V), bool)
    for row, context in enumerate(prefixes):
      seen[row, list(context)] = True
    p = np.asarray(sampling.probabilities(jnp.asarray(logits), config,
                                          jnp.asarray(seen)), np.float64)
    joint = probability[:, None] * p
    keep = np.argwhere(joint > 0)
    prefixes = [prefixes[r] + (int(v),) for r, v in keep]
    probability = joint[joint > 0]
  return {c[len(prompt):]: q for c, q in zip(prefixes, probability)}


def sample_rows(decoder, models_):
  batch = DRAWS
  prompts = jnp.tile(PROMPTS, (batch // 2, 1))
  lengths = jnp.tile(PROMPT_LENGTHS, batch // 2)
  out = decoder.decode(models_, prompts, lengths, KEY)
  return np.asarray(out.tokens), out


def fit(tokens, exact):
  """(chi-square p-value, total variation distance) of sampled rows."""
  counts = {}
  for row in map(tuple, tokens):
    counts[row] = counts.get(row, 0) + 1
  assert set(counts) <= set(exact), "drew a continuation of probability 0"
  keys = sorted(exact)
  observed = np.array([counts.get(k, 0) for k in keys], np.float64)
  expected = np.array([exact[k] for k in keys]) * len(tokens)
  small = expected < 5  # pool the rare continuations into one bin
  if small.any():
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
  expected *= observed.sum() / expected.sum()
  tv = 0.5 * np.abs(np.array([counts.get(k, 0) for k in keys]) / len(tokens)
                    - np.array([exact[k] for k in keys])).sum()
  return stats.chisquare(observed, expected).pvalue, tv


CONFIGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7_topk3": SamplingConfig(temperature=0.7, top_k=3),
    "topp_minp_penalty": SamplingConfig(top_p=0.8, min_p=0.05,
                                        repetition_penalty=1.5),
}


def check_exact(decoder, models_, config):
  tokens, out = sample_rows(decoder, models_)
  for row in range(2):
    exact = exact_distribution(models_["target"].logits_fn,
                               np.asarray(PROMPTS[row, :PROMPT_LENGTHS[row]]),
                               config)
    p_value, _ = fit(tokens[row::2], exact)
    assert p_value > P_VALUE, (row, p_value)
  return out


@pytest.mark.parametrize("gamma, config", [
    (1, "t1"), (3, "t0.7_topk3"), (8, "topp_minp_penalty"),
    (3, "topp_minp_penalty")])
def test_speculative_samples_the_target_distribution(gamma, config):
  draft = stubs.TableLogitsFn.random(12, V, 16, masked_ids=(PAD_ID,))
  decoder = make_decoder("speculative", output_length=T, gamma=gamma,
                         sampling=CONFIGS[config], eos_ids=())
  out = check_exact(decoder, models(target_stub(), draft), CONFIGS[config])
  counts = np.asarray(out.stats["accept_counts"]).sum(0)
  assert counts[0] > 0 and counts[1:].sum() > 0  # rejections and acceptances


def test_a_one_hot_draft_still_samples_the_target_distribution():
  """q one-hot (a near-deterministic draft: logit margin 1e4): accepted
  with probability p(d), else drawn from p without d."""
  draft = stubs.TableLogitsFn.scripted([[1, 2, 5, 1, 2, 5, 1, 2, 5] * 2], V,
                                       margin=1e4)
  decoder = make_decoder("speculative", output_length=T, gamma=4,
                         sampling=CONFIGS["t1"], eos_ids=())
  check_exact(decoder, models(target_stub(), draft), CONFIGS["t1"])


@pytest.mark.parametrize("name", ["jacobi", "prompt_lookup"])
def test_self_drafting_samples_the_target_distribution(name):
  decoder = make_decoder(name, output_length=T, gamma=3,
                         sampling=CONFIGS["t0.7_topk3"], eos_ids=())
  check_exact(decoder, models(target_stub()), CONFIGS["t0.7_topk3"])


def test_diffusion_draft_left_to_right_is_exact_confidence_is_not():
  """The docstring's claim, measured: a denoiser whose logits depend on
  tokens to the right (HashDenoiser) drafts 3 tokens in 3 steps; committed
  left to right the output is the target's distribution (chi-square), in
  confidence order it deviates measurably (total variation distance)."""
  target, denoiser = target_stub(), stubs.HashDenoiser(vocab=V, max_len=16)
  config = CONFIGS["t1"]
  exact = exact_distribution(target, [5, 2, 1], config)
  tv = {}
  for order in ("left_to_right", "confidence"):
    decoder = make_decoder("diffusion_draft", output_length=T, gamma=3,
                           draft_steps=3, order=order, sampling=config,
                           eos_ids=())
    tokens, _ = sample_rows(decoder, {"target": Model(target, None),
                                      "draft": Model(denoiser,
                                                          jnp.uint32(7))})
    p_value, tv[order] = fit(tokens[0::2], exact)
    if order == "left_to_right":
      assert p_value > P_VALUE
  print("total variation:", tv)
  assert tv["confidence"] > 2 * tv["left_to_right"], tv


# --- Caches after rejection: those of plain decoding of the accepted prefix.

def test_both_caches_hold_exactly_the_accepted_prefix_after_every_round():
  target = stubs.TableLogitsFn.random(1, 12, 40, masked_ids=(PAD_ID,))
  draft = stubs.TableLogitsFn.random(2, 12, 40, masked_ids=(PAD_ID,))
  decoder = make_decoder("speculative", output_length=20, gamma=4,
                         sampling=SamplingConfig(temperature=1.0), eos_ids=())
  models_ = models(target, draft)
  length = decoder.cache_length_for(RAGGED.shape[1])
  keys = base.row_keys(KEY, 4)
  state = speculative.start(decoder, length, models_, RAGGED, RAGGED_LENGTHS,
                            keys)
  round_ = jax.jit(lambda s: speculative.verify_round(decoder, models_, s,
                                                      keys))
  rejected = 0
  for _ in range(8):
    state = round_(state)
    pos = np.asarray(state.pos)
    sequence = np.asarray(state.sequence)
    np.testing.assert_array_equal(state.cache.index, pos)
    for cache, allowed in ((state.cache, (0,)), (state.draft, (0, 1))):
      index = np.asarray(cache.index)
      assert set((pos - index).tolist()) <= set(allowed)
      for b in range(4):
        np.testing.assert_array_equal(cache.tokens[b, :index[b]],
                                      sequence[b, :index[b]])
    rejected += int((np.asarray(state.committed[state.round - 1])
                     <= decoder.gamma).sum())
  assert rejected > 0


def test_transformer_caches_equal_a_fresh_prefill_of_the_accepted_prefix():
  """Keys and values, not just token ids: after rounds with rejections, the
  target and draft caches equal a fresh prefill of the committed tokens."""
  config = TransformerConfig(vocab_size=16, d_model=32, num_layers=2,
                             num_heads=2, num_kv_heads=1, head_dim=16,
                             mlp_dim=64, max_len=48)
  logits_fn = make_logits_fn(config)
  models_ = {"target": Model(logits_fn,
                                  init_params(config, jax.random.key(1))),
             "draft": Model(logits_fn,
                                 init_params(config, jax.random.key(2)))}
  decoder = make_decoder("speculative", output_length=16, gamma=3,
                         sampling=SamplingConfig(temperature=1.0), eos_ids=())
  prompts, lengths = RAGGED % 16, RAGGED_LENGTHS
  length = decoder.cache_length_for(prompts.shape[1])
  keys = base.row_keys(KEY, 4)
  state = speculative.start(decoder, length, models_, prompts, lengths, keys)
  round_ = jax.jit(lambda s: speculative.verify_round(decoder, models_, s,
                                                      keys))
  for _ in range(3):
    state = round_(state)
  assert (np.asarray(state.committed[:3]) <= decoder.gamma).any()
  for role, cache in (("target", state.cache), ("draft", state.draft)):
    index = np.asarray(cache.index)
    width = int(index.max())
    tokens = state.sequence[:, :width]
    positions = jnp.broadcast_to(jnp.arange(width), tokens.shape)
    fresh = jax.jit(lambda p, t, x: logits_fn(
        p, t, x, cache=logits_fn.init_cache(4, length)).cache)(
            models_[role].params, tokens, positions)
    for layer in range(config.num_layers):
      for got, want in ((cache.k[layer], fresh.k[layer]),
                        (cache.v[layer], fresh.v[layer])):
        for b in range(4):
          np.testing.assert_allclose(got[b, :, :index[b]],
                                     want[b, :, :index[b]],
                                     atol=1e-5, rtol=1e-5)


# --- Statistics, cost and the pieces. ----------------------------------------

def test_acceptance_statistics_match_the_rounds_and_the_calls():
  target = stubs.TableLogitsFn.random(1, 12, 40, masked_ids=(PAD_ID,))
  draft = stubs.TableLogitsFn.random(2, 12, 40, masked_ids=(PAD_ID,))
  decoder = make_decoder("speculative", output_length=20, gamma=3,
                         sampling=SamplingConfig(temperature=1.0))
  out = decoder.decode(models(target, draft), RAGGED[:1], RAGGED_LENGTHS[:1],
                       KEY)
  counts = np.asarray(out.stats["accept_counts"])[0]
  rounds = int(out.stats["rounds"][0])
  assert counts.sum() == rounds == int(out.calls["target"]) - 1
  assert int(out.calls["draft"]) == 1 + 3 * rounds
  # Every round commits its accepted tokens + 1, except a cut last round.
  committed = (np.arange(4) + 1) @ counts
  assert committed >= int(out.lengths[0])
  assert committed - int(out.lengths[0]) <= 3


def test_prompt_lookup_copies_what_followed_the_earliest_match():
  """Case T3: the reference rule (Saxena 2023; transformers' prompt lookup)
  copies after the earliest match; match='latest' after the most recent."""
  context = jnp.array([1, 2, 3, 1, 2, 4, 1, 2, 0, 0], jnp.int32)
  np.testing.assert_array_equal(lookup(context, jnp.int32(7), 2, 2, PAD_ID),
                                [3, 1])
  np.testing.assert_array_equal(
      lookup(context, jnp.int32(7), 2, 2, PAD_ID, "latest"), [4, 1])
  sequence = jnp.array([5, 6, 7, 8, 9, 5, 6, 7, 2, 5, 6, 0, 0, 0], jnp.int32)
  # Last tokens (5, 6) at pos 10; the 3-gram "2 5 6" never occurred, so the
  # 2-gram "5 6" wins: at 0 (earliest) or at 5 (latest).
  np.testing.assert_array_equal(lookup(sequence, jnp.int32(10), 4, 3, PAD_ID),
                                [7, 8, 9, 5])
  np.testing.assert_array_equal(
      lookup(sequence, jnp.int32(10), 4, 3, PAD_ID, "latest"), [7, 2, 5, 6])
  # Copying past the known context gives PAD.
  np.testing.assert_array_equal(
      lookup(sequence, jnp.int32(10), 7, 3, PAD_ID, "latest"),
      [7, 2, 5, 6, PAD_ID, PAD_ID, PAD_ID])
  # No match at all.
  np.testing.assert_array_equal(lookup(sequence, jnp.int32(2), 2, 3, PAD_ID),
                                [PAD_ID, PAD_ID])


@pytest.mark.parametrize("match", ["earliest", "latest"])
def test_prompt_lookup_either_match_is_the_greedy_output(match):
  """Both rules decode the target's greedy output; their acceptance rates
  (accept_counts) are what differs, printed for the record."""
  target = long_stub(1)
  reference = make_decoder("ar", output_length=64, sampling=GREEDY).decode(
      base.bind(target, None), RAGGED, RAGGED_LENGTHS, None)
  out = make_decoder("prompt_lookup", output_length=64, sampling=GREEDY,
                     gamma=4, match=match).decode(
                         models(target), RAGGED, RAGGED_LENGTHS, None)
  np.testing.assert_array_equal(out.tokens, reference.tokens)
  counts = np.asarray(out.stats["accept_counts"]).sum(0)
  accepted = (np.arange(5) @ counts) / (4 * counts.sum())
  print(f"prompt lookup match={match}: draft tokens accepted {accepted:.3f}")


def test_draft_tokens_after_an_eos_are_not_counted_accepted():
  """Case T3: draft == target scripted [5, EOS, 6, 7]: all four drafts agree
  but only two are committed (the EOS ends the row); accept_counts says 2."""
  script = stubs.TableLogitsFn.scripted([[5, 5, 5, EOS_ID, 6, 7] + [9] * 10],
                                        12)
  out = make_decoder("speculative", output_length=8, gamma=4,
                     sampling=GREEDY, eos_ids=(EOS_ID,)).decode(
                         models(script, script), RAGGED[:1],
                         RAGGED_LENGTHS[:1], None)
  np.testing.assert_array_equal(out.tokens[0, :2], [5, EOS_ID])
  np.testing.assert_array_equal(out.stats["accept_counts"][0], [0, 0, 1, 0, 0])


SKELETON_T, SKELETON_GAMMA = 12, 4


def test_skeleton_with_threshold_zero_is_the_mdlm_sample():
  """Also the max_len boundary that works: a draft of max_len exactly
  P + T (the skeleton's span), a target of exactly P + T + gamma - 1 (the
  boundary below is refused: BAD_INPUTS below)."""
  width = RAGGED.shape[1]
  target = stubs.TableLogitsFn.random(
      1, 12, width + SKELETON_T + SKELETON_GAMMA - 1, masked_ids=(PAD_ID,))
  denoiser = stubs.HashDenoiser(vocab=12, max_len=width + SKELETON_T)
  decoder = make_decoder("skeleton_polish", output_length=SKELETON_T,
                         gamma=SKELETON_GAMMA, threshold=0.0, draft_steps=6)
  out = decoder.decode({"target": Model(target, None),
                        "draft": Model(denoiser, jnp.uint32(3))},
                       RAGGED, RAGGED_LENGTHS, KEY)
  skeleton_keys = jax.vmap(jax.random.split)(base.row_keys(KEY, 4))[:, 0]
  skeleton = decoder.skeleton_decoder().decode(
      {"model": Model(denoiser, jnp.uint32(3))}, RAGGED, RAGGED_LENGTHS,
      skeleton_keys)
  np.testing.assert_array_equal(out.tokens, skeleton.tokens)
  assert int(out.calls["draft"]) == int(skeleton.nfe)


@pytest.mark.parametrize("name, options, match", [
    ("speculative", dict(gamma=0), r"gamma=0 must be an integer >= 1"),
    ("speculative", dict(gamma=True), r"gamma=True must be an integer >= 1"),
    ("jacobi", dict(gamma=2.5), r"gamma=2.5 must be an integer >= 1"),
    ("prompt_lookup", dict(max_ngram=0), r"max_ngram=0 must be"),
    ("prompt_lookup", dict(match="first"), r"match='first'; allowed"),
    ("diffusion_draft", dict(gamma=2, draft_steps=3),
     r"draft_steps=3 must be an integer in \[1, gamma=2\]"),
    ("diffusion_draft", dict(order="random"), r"order='random'; allowed"),
    ("diffusion_draft", dict(sampling=SamplingConfig(repetition_penalty=1.2)),
     "repetition_penalty=1.2 must be 1"),
    ("skeleton_polish", dict(threshold=1.5), r"threshold=1.5 must be .*\[0, 1\]"),
    ("skeleton_polish", dict(threshold=True), r"threshold=True must be"),
    ("skeleton_polish", dict(mask_id=PAD_ID), "mask_id=0 must be"),
    ("speculative", dict(prompt_attention="bidirectional"),
     "prompt_attention='bidirectional' must be 'causal'"),
])
def test_bad_options_raise_at_construction(name, options, match):
  with pytest.raises(ValueError, match=match):
    make_decoder(name, output_length=8, **options)


def test_draft_and_target_of_different_vocabularies_raise_before_compiling():
  raising = stubs.RaisingLogitsFn(max_len=64, vocab_size=16)
  other = stubs.RaisingLogitsFn(max_len=64, vocab_size=17)
  for name in ("speculative", "diffusion_draft", "skeleton_polish"):
    with pytest.raises(ValueError, match=r"V=17 must equal the target's V=16"):
      make_decoder(name, output_length=8).decode(
          models(raising, other), RAGGED, RAGGED_LENGTHS, KEY)
  for name in ("diffusion_draft", "skeleton_polish"):
    with pytest.raises(ValueError, match=r"mask_id must be token ids in \[0, V=16\)"):
      make_decoder(name, output_length=8, mask_id=16).decode(
          models(raising, raising), RAGGED, RAGGED_LENGTHS, KEY)
  with pytest.raises(ValueError, match=r"must be <= the draft model's max_len"):
    make_decoder("speculative", output_length=8, gamma=8).decode(
        models(stubs.RaisingLogitsFn(max_len=64),
               stubs.RaisingLogitsFn(max_len=16)),
        RAGGED, RAGGED_LENGTHS, KEY)


# ----------------------------------------------------------------------------
# Bad models and inputs of the draft-and-verify decoders: rows (call,
# exception class, regex) as in tests/test_registry_contracts.py, decoding on
# `stubs.RaisingLogitsFn` (V = 16, max_len 16), so the check comes before any
# trace.

# The decoders binding a "target" role (self_speculative binds one "model"
# and derives its target: tests/test_self_speculative.py).
DRAFT_VERIFY = tuple(n for n in base.registered() if issubclass(
    base.decoder_class(n), speculative.DraftVerifyDecoder)
                     and "target" in base.decoder_class(n).roles)


def raising_transformer(attention: str) -> TransformerConfig:
  """A tiny Transformer config of `attention` kind: read by the checks, its
  KV cache built abstractly at most; no model of it ever runs."""
  return TransformerConfig(vocab_size=16, d_model=8, num_layers=1,
                           num_heads=1, num_kv_heads=1, head_dim=8, mlp_dim=8,
                           max_len=16, attention=attention)


# Models without KV cache support (the draft-and-verify decoders keep one for
# the target, and for speculative's draft), and how the message shows each;
# the cache asked for has B = 1 rows, P + T + gamma - 1 = 2 + 4 + 4 - 1 slots.
NO_CACHE = [
    ("no-init-cache", stubs.NoInitCacheLogitsFn(),
     r"NoInitCacheLogitsFn has no init_cache$"),
    ("init-cache-none", stubs.NoneCacheLogitsFn(),
     r"NoneCacheLogitsFn\.init_cache returned NoneType$"),
    ("config-cannot-build-a-cache", stubs.ConfigCacheLogitsFn(),
     r"ConfigCacheLogitsFn\.init_cache\(1, 9\) raised AttributeError: "
     r"'NoneType' object has no attribute"),
]
NEEDS_CACHE = (r"must support a KV cache: its logits_fn needs "
               r"init_cache\(batch_size, length\) returning a cache with "
               r"at\(\) and rollback\(\) \(as models.KVCache\); ")
# A target that supports a cache and fails on any call: speculative's draft
# cache is checked after the target's.
CACHED = stubs.ConfigCacheLogitsFn(config=raising_transformer("causal"))

BAD_INPUTS = [
    *[pytest.param(lambda n=n, fn=fn: stubs.decode_raising(
        n, roles={"target": fn}),
                   ValueError, rf"^the target model {NEEDS_CACHE}{got}",
                   id=f"{n}-target-{kind}")
      for n in DRAFT_VERIFY for kind, fn, got in NO_CACHE],
    *[pytest.param(lambda fn=fn: stubs.decode_raising(
        "speculative", roles={"target": CACHED, "draft": fn}), ValueError,
                   rf"^the draft model {NEEDS_CACHE}{got}",
                   id=f"speculative-draft-{kind}")
      for kind, fn, got in NO_CACHE],
    *[pytest.param(lambda n=n: stubs.decode_raising(n, roles={
        "target": stubs.RaisingLogitsFn(
            config=raising_transformer("bidirectional"))}), ValueError,
                   r"^the target model of \w+Decoder needs 'causal' "
                   r"attention; logits_fn.config.attention='bidirectional'$",
                   id=f"{n}-bidirectional-target") for n in DRAFT_VERIFY],
    pytest.param(lambda: stubs.decode_raising("speculative", roles={
        "draft": stubs.RaisingLogitsFn(
            config=raising_transformer("bidirectional"))}),
                 ValueError, r"^the draft model of SpeculativeDecoder needs "
                 r"'causal' attention; logits_fn.config.attention="
                 r"'bidirectional'$", id="speculative-bidirectional-draft"),
    *[pytest.param(lambda n=n: stubs.decode_raising(n, roles={
        "draft": stubs.RaisingLogitsFn(config=raising_transformer("causal"))}),
                   ValueError, r"^the draft model of \w+Decoder needs "
                   r"non-causal \(e.g. 'bidirectional'\) attention; "
                   r"logits_fn.config.attention='causal'$",
                   id=f"{n}-causal-diffusion-draft")
      for n in ("diffusion_draft", "skeleton_polish")],
    # The boundary below the one that works (a skeleton draft of max_len
    # P + T = 6, a target of P + T + gamma - 1 = 9: test above).
    pytest.param(lambda: stubs.decode_raising("skeleton_polish", roles={
        "draft": stubs.RaisingLogitsFn(max_len=5)}), ValueError,
                 r"^6 positions \(prompt width P=2 \+ output_length=4: the "
                 r"skeleton\) must be <= the draft model's max_len=5$",
                 id="skeleton_polish-draft-shorter-than-prompt-plus-output"),
    pytest.param(lambda: stubs.decode_raising("skeleton_polish", roles={
        "target": stubs.RaisingLogitsFn(max_len=8)}), ValueError,
                 r"^9 positions \(prompt width P=2 \+ output_length=4 \+ "
                 r"gamma=4 - 1\) must be <= the target model's max_len=8$",
                 id="skeleton_polish-target-shorter-than-its-cache"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()
