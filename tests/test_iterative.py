"""Tests of the iterative-decoding loop and its newer wirings: Fast-dLLM
threshold/factor decoding, prefix/dual KV caches, MaskGIT, ReMDM; two
contracts of every registered decoder (batch == rows alone; cost counted by
the stub equals the cost reported); and the checks every iterative decoder
makes of its options and inputs (`BAD_INPUTS`, with the Fast-dLLM, MaskGIT
and ReMDM options)."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base, make_decoder, registered
from lm_decoding.decoding.autoregressive import SequenceConfig
from lm_decoding.decoding.base import bind
from lm_decoding.decoding.denoising import DenoisingDecoder, ScheduledDecoder
from lm_decoding.decoding.rules import Step, commit_factor
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.schedule import cosine_schedule, transfer_schedule
from lm_decoding.decoding.speculative import DraftVerifyDecoder
from lm_decoding.models import Model, TransformerConfig, init_params, make_logits_fn
from lm_decoding.special_tokens import MASK_ID, PAD_ID

DENOISER = stubs.HashDenoiser()
SEED = jnp.uint32(5)
PROMPTS = jnp.array([[6, 7, 8], [9, PAD_ID, PAD_ID], [10, 11, PAD_ID]], jnp.int32)
PROMPT_LENGTHS = jnp.array([3, 1, 2], jnp.int32)
KEY = jax.random.key(0)
HOT = SamplingConfig(temperature=1.0)


def _denoise(decoder, models=None, **kwargs):
  models = models or bind(DENOISER, SEED)
  out = decoder.denoise(models, PROMPTS, PROMPT_LENGTHS, KEY, **kwargs)
  return jax.tree.map(np.asarray, out)


def _blocks_done_in_order(decoder, out):
  """Each block holds no MASK once the next one starts."""
  width, t = decoder.block_size(), decoder.output_length
  index = np.asarray(PROMPT_LENGTHS)[:, None] + np.arange(t)
  generated = np.take_along_axis(out.states, index[None], 2)
  for state in generated:
    masked = state == MASK_ID
    for b in range(t // width - 1):
      later = masked[:, (b + 1) * width:].sum() < t - (b + 1) * width
      if later:  # a later block started: this one is complete
        assert not masked[:, b * width:(b + 1) * width].any()


# ----------------------------------------------------------------------------
# Fast-dLLM threshold and factor decoding.

@pytest.mark.parametrize("block", [2, 4, 8])
def test_threshold_one_is_one_token_per_step_low_confidence(block):
  """tau = 1 commits only the most confident token each step: LLaDA's
  low-confidence decoding with K = T, token for token and step for step."""
  threshold = make_decoder("threshold", output_length=8, block_length=block,
                           threshold=1.0)
  llada = make_decoder("llada", output_length=8, steps=8, block_length=block)
  out, ref = _denoise(threshold, trace=True), _denoise(llada, trace=True)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.committed, ref.committed)
  np.testing.assert_array_equal(out.committed, np.ones((8, 3)))
  assert int(out.cost.nfe) == int(ref.cost.nfe) == 8
  _blocks_done_in_order(threshold, out)


@pytest.mark.parametrize("name, option", [("threshold", dict(threshold=1e-9)),
                                          ("factor", dict(factor=10.0))])
def test_permissive_rules_commit_a_whole_block_per_step(name, option):
  """tau near 0 (or f > W + 1) commits every masked position of the block in
  one step: one forward pass per block."""
  decoder = make_decoder(name, output_length=8, block_length=4, **option)
  out = _denoise(decoder, trace=True)
  expected = np.zeros((8, 3), np.int32)
  expected[[0, 4]] = 4  # step 0 of each block of 4
  np.testing.assert_array_equal(out.committed, expected)
  assert int(out.cost.nfe) == 2
  assert not np.any(out.tokens == MASK_ID)


def test_factor_rule_counts():
  """(n + 1)(1 - c_n) < f on known confidences, and f tiny == tau = 1."""
  confidence = jnp.array([0.9, 0.2, 0.7, 0.8])  # sorted .9 .8 .7 .2
  step = Step(k=jnp.int32(0), masked=jnp.ones(4, bool),
              fill=jnp.ones(4, bool), num_masked=jnp.int32(4),
              drawn=jnp.zeros(4, jnp.int32),
              probs=jnp.stack([confidence, 1 - confidence], -1),
              committed_confidence=jnp.zeros(4), uniform=jnp.zeros(4))
  # n=1: 2 * .1 = .2 < 1; n=2: 3 * .2 = .6 < 1; n=3: 4 * .3 = 1.2 >= 1.
  np.testing.assert_array_equal(commit_factor(step, 1.0), [1, 0, 0, 1])
  tight = make_decoder("factor", output_length=8, block_length=4, factor=1e-9)
  one = make_decoder("threshold", output_length=8, block_length=4, threshold=1.0)
  np.testing.assert_array_equal(_denoise(tight).tokens, _denoise(one).tokens)


def test_threshold_adapts_nfe_to_confidence():
  """A confident model finishes in fewer steps than an unsure one."""
  vocab, length = 12, 12
  sure = np.zeros((length, vocab), np.float32)
  sure[:, 5] = 20.0  # p(5) ~ 1 everywhere
  unsure = np.zeros((length, vocab), np.float32)
  unsure[:, 5] = 0.5  # p(5) ~ 0.2
  decoder = make_decoder("threshold", output_length=8, threshold=0.9)
  nfe = []
  for table in (sure, unsure):
    stub = stubs.TableLogitsFn.by_position(lambda p: 0, vocab, length)
    stub.table[:] = table[None, :, None, None, :]
    nfe.append(int(decoder.decode(bind(stub, None), PROMPTS, PROMPT_LENGTHS,
                                  KEY).nfe))
  assert nfe == [1, 8]


# ----------------------------------------------------------------------------
# Prefix and dual KV caches, on a tiny real Transformer.

def _transformer(attention):
  config = TransformerConfig(vocab_size=24, d_model=32, num_layers=2,
                             num_heads=2, num_kv_heads=1, head_dim=16,
                             mlp_dim=64, max_len=16, attention=attention)
  return bind(make_logits_fn(config), init_params(config, jax.random.key(3)))


@pytest.mark.parametrize("kv_cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_equals_the_uncached_decoder(kv_cache):
  models = _transformer("bidirectional")
  options = dict(output_length=8, block_length=4, threshold=0.3)
  exact = make_decoder("threshold", **options)
  cached = make_decoder("threshold", kv_cache=kv_cache, cache_refresh="step",
                        **options)
  out = _denoise(cached, models, measure_error=True)
  ref = _denoise(exact, models)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.committed, ref.committed)
  assert out.max_logit_error < 1e-4
  # Two calls per step (refresh + cached query) on these token counts.
  steps = int((out.committed.sum(1) > 0).sum())
  assert int(out.cost.calls["model"]) == 2 * steps
  # Refreshed once per block instead, the cache is an approximation whose
  # error the decoder measures (so the check above could fail).
  approx = make_decoder("threshold", kv_cache=kv_cache, **options)
  assert _denoise(approx, models, measure_error=True).max_logit_error > 1e-5


@pytest.mark.parametrize("decoder_options", [
    dict(name="threshold", threshold=0.3),
    dict(name="llada", steps=8),
    dict(name="mdlm", steps=8, sampling=HOT),
])
def test_prefix_cache_of_a_causal_model_is_exact(decoder_options):
  """A causal model's prefix keys never see the suffix: the prefix cache,
  refreshed once per block, decodes exactly as the uncached loop."""
  models = _transformer("causal")
  options = dict(decoder_options, output_length=8, block_length=4,
                 attention="causal")
  name = options.pop("name")
  ref = _denoise(make_decoder(name, **options), models)
  out = _denoise(make_decoder(name, kv_cache="prefix", **options), models,
                 measure_error=True)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert out.max_logit_error < 1e-4
  # The cached queries cover fewer positions than full passes would.
  width = PROMPTS.shape[1] + 8
  assert int(out.cost.tokens["model"]) < int(ref.cost.tokens["model"])
  assert int(ref.cost.tokens["model"]) == 3 * width * int(ref.cost.nfe)


def test_dual_cache_queries_only_the_block():
  """Per step a dual cache processes B x W positions, a prefix cache the
  rest of the generated region, no cache all B x L; one refresh per block."""
  models = bind(stubs.TableLogitsFn.random(0, 16, 16), None)
  t, w, batch, length = 8, 4, 3, PROMPTS.shape[1] + 8
  for kv_cache, query in (("dual", [w, w]), ("prefix", [t, t - w])):
    decoder = make_decoder("llada", output_length=t, block_length=w, steps=8,
                           kv_cache=kv_cache, reuse_logits=False)
    out = _denoise(decoder, models)
    # Per block: a refresh pass (which also serves step 0), then 3 queries.
    expected = sum(batch * length + 3 * batch * q for q in query)
    assert int(out.cost.tokens["model"]) == expected
    assert int(out.cost.calls["model"]) == 8


# ----------------------------------------------------------------------------
# MaskGIT and ReMDM.

def test_cosine_schedule_worked_examples():
  np.testing.assert_array_equal(cosine_schedule(8, 4), [1, 2, 2, 3])
  np.testing.assert_array_equal(cosine_schedule(3, 8), [1, 1, 1] + [0] * 5)
  np.testing.assert_array_equal(cosine_schedule(0, 3), [0, 0, 0])
  for n in range(0, 40, 7):
    for k in (1, 2, 5, 16):
      counts = np.asarray(cosine_schedule(n, k))
      assert counts.sum() == n and counts.min() >= 0
      if n >= k:
        assert counts.min() >= 1
  with pytest.raises(ValueError, match="steps=0"):
    cosine_schedule(4, 0)


def test_maskgit_commits_on_the_cosine_schedule():
  decoder = make_decoder("maskgit", output_length=8, steps=4, sampling=HOT,
                         early_stop=False)
  out = _denoise(decoder, trace=True)
  expected = np.asarray(cosine_schedule(8, 4))
  np.testing.assert_array_equal(out.committed, np.stack([expected] * 3, 1))
  assert not np.any(out.tokens == MASK_ID)


@pytest.mark.parametrize("remask", [1, 2])
def test_remdm_remasks_within_its_budget_and_still_finishes(remask):
  decoder = make_decoder("remdm", output_length=8, steps=8, block_length=4,
                         remask_per_step=remask)
  out = _denoise(decoder, trace=True)
  t = 8
  index = np.asarray(PROMPT_LENGTHS)[:, None] + np.arange(t)
  seq = np.take_along_axis(out.states, index[None], 2)
  start = np.full((1, 3, t), MASK_ID)
  seq = np.concatenate([start, seq])
  remasked = (seq[:-1] != MASK_ID) & (seq[1:] == MASK_ID)  # [K, B, T]
  per_step = remasked.sum(-1)
  assert per_step.max() <= remask
  assert per_step.sum() > 0  # it did re-mask (the test can fail)
  # Never at a block's first or last step (steps 0, 3, 4, 7).
  assert not per_step[[0, 3, 4, 7]].any()
  # Net progress follows LLaDA's schedule, so every block ends on time.
  expected = np.tile(np.asarray(transfer_schedule(4, 4)), 2)
  np.testing.assert_array_equal(out.committed, np.stack([expected] * 3, 1))
  assert not np.any(out.tokens == MASK_ID)


# ----------------------------------------------------------------------------
# Contracts of every registered decoder.

def _build(name, length, **options):
  """Decoder `name` generating `length` tokens, sampling where it can."""
  cls = base.decoder_class(name)
  if issubclass(cls, DraftVerifyDecoder):  # caches of P + T + 1 slots
    options.setdefault("gamma", 2)
  if issubclass(cls, SequenceConfig):
    if name != "ar_beam":
      options.setdefault("sampling", HOT)
    return make_decoder(name, output_length=length, **options)
  if issubclass(cls, ScheduledDecoder):
    options.setdefault("steps", length)
  if name not in ("threshold", "factor"):
    options.setdefault("sampling", HOT)
  return make_decoder(name, output_length=length, **options)


RAGGED = jnp.array([[5, 6, 7], [7, 0, 0], [3, 5, 0], [9, 9, 9], [6, 0, 0],
                    [8, 7, 0], [5, 5, 5], [10, 0, 0]], jnp.int32)
RAGGED_LENGTHS = jnp.array([3, 1, 2, 3, 1, 2, 3, 1], jnp.int32)


@pytest.mark.parametrize("name", registered())
def test_batch_equals_each_row_alone(name):
  """At batch sizes 1, 3 and 8 a row decodes exactly as alone, given the
  key it has in the batch (`base.row_keys`)."""
  decoder = _build(name, 4, eos_ids=())
  models = stubs.bind_roles(
      decoder, stubs.TableLogitsFn.random(1, 12, 8, masked_ids=(PAD_ID,)))
  alone = [decoder.decode(models, RAGGED[b:b + 1], RAGGED_LENGTHS[b:b + 1],
                          base.row_keys(KEY, 8)[b:b + 1]).tokens[0]
           for b in range(8)]
  for batch in (1, 3, 8):
    keys = base.row_keys(KEY, 8)[:batch]
    out = decoder.decode(models, RAGGED[:batch], RAGGED_LENGTHS[:batch], keys)
    for b in range(batch):
      np.testing.assert_array_equal(out.tokens[b], alone[b])
  # A single key gives the same keys as row_keys(key, B): same result.
  out = decoder.decode(models, RAGGED[:3], RAGGED_LENGTHS[:3], KEY)
  for b in range(3):
    np.testing.assert_array_equal(out.tokens[b], alone[b])
  assert len({tuple(np.asarray(row)) for row in alone}) > 1


@pytest.mark.parametrize("name", registered())
def test_reported_cost_is_what_the_stub_ran(name):
  """Per-role calls and forward tokens, counted by the stub (not by
  formula), equal the decoder's report."""
  decoders = [_build(name, 4)]
  for kv_cache in ("prefix", "dual"):  # every cache the decoder accepts
    try:
      decoders.append(_build(name, 4, kv_cache=kv_cache, block_length=2))
    except ValueError as e:
      assert "kv_cache" in str(e) or "block_length" in str(e)
  for decoder in decoders:
    stub = stubs.TableLogitsFn.random(2, 12, 12, masked_ids=(PAD_ID,))
    models = {role: Model(stubs.TableLogitsFn(stub.table), None)
              for role in decoder.roles}  # one stub (and count) per role
    out = decoder.decode(models, RAGGED[:3], RAGGED_LENGTHS[:3], KEY)
    jax.effects_barrier()
    assert set(out.calls) == set(out.forward_tokens) == set(decoder.roles)
    assert int(out.nfe) == sum(len(m.logits_fn.executed)
                               for m in models.values())
    for role, model in models.items():
      assert int(out.calls[role]) == len(model.logits_fn.executed)
      assert int(out.forward_tokens[role]) == sum(model.logits_fn.executed)


@pytest.mark.parametrize("make, match", [
    (lambda: make_decoder("threshold", output_length=8, threshold=0.0),
     r"threshold=0.0 must be in \(0, 1\]"),
    (lambda: make_decoder("threshold", output_length=8, threshold=1.5),
     r"threshold=1.5 must be in \(0, 1\]"),
    (lambda: make_decoder("threshold", output_length=8, steps=8),
     r"takes no options \['steps'\]"),
    (lambda: make_decoder("factor", output_length=8, factor=0.0), "factor=0.0"),
    (lambda: make_decoder("threshold", output_length=8, block_length=3),
     "block_length=3"),
    (lambda: make_decoder("maskgit", output_length=8, steps=2, block_length=2),
     "steps=2 must be a multiple"),
    (lambda: make_decoder("maskgit", output_length=8, steps=8,
                          choice_temperature=-1.0), "choice_temperature"),
    (lambda: make_decoder("remdm", output_length=8, steps=8,
                          remask_per_step=0), "remask_per_step=0"),
    (lambda: make_decoder("llada", output_length=8, steps=8, kv_cache="triple"),
     "kv_cache='triple'"),
    (lambda: make_decoder("llada", output_length=8, steps=8,
                          cache_refresh="never"), "cache_refresh"),
    (lambda: make_decoder("mdlm", output_length=8, steps=8, schedule="square"),
     "schedule='square'"),
])
def test_bad_options_raise_at_construction(make, match):
  with pytest.raises(ValueError, match=match):
    make()


@pytest.mark.parametrize("name", registered())
def test_unknown_or_missing_role_raises_before_the_model_runs(name):
  decoder = _build(name, 4)
  raising = stubs.RaisingLogitsFn(max_len=16)
  for models in ({"draft": Model(raising, None)},
                 {"model": Model(raising, None),
                  "target": Model(raising, None)}):
    with pytest.raises(ValueError, match="roles"):
      decoder.decode(models, RAGGED[:2], RAGGED_LENGTHS[:2], KEY)
  with pytest.raises(ValueError, match="base.bind"):
    decoder.decode(raising, RAGGED[:2], RAGGED_LENGTHS[:2], KEY)


@pytest.mark.parametrize("name", registered())
@pytest.mark.parametrize("temperature", [1e-39, 1e-37])
def test_tiny_temperatures_decode_greedily_in_every_decoder(name,
                                                            temperature):
  """R2: below `sampling.MIN_TEMPERATURE` every decoder takes the argmax
  (here token 5 at every position; MASK = 4 and EOS = 3 are not it) instead
  of dividing the logits by a subnormal temperature."""
  row = np.array([0.5, -1, 1, 0, 0, 2, -0.5, 1.5], np.float32)
  stub = stubs.TableLogitsFn.random(0, 8, 8)
  stub.table[:] = row
  options = {} if name == "ar_beam" else dict(
      sampling=SamplingConfig(temperature=temperature))
  decoder = _build(name, 3, **options)
  out = decoder.decode(stubs.bind_roles(decoder, stub), RAGGED[:2],
                       RAGGED_LENGTHS[:2], KEY)
  np.testing.assert_array_equal(out.tokens, np.full((2, 3), 5))


@pytest.mark.parametrize("name", registered())
def test_bad_ids_and_keys_raise_before_the_model_runs(name):
  """Ids outside the vocabulary (embedded as NaN by a Transformer), a
  missing key for a decoder that samples, and a raw uint32 PRNGKey are
  refused with a ValueError naming them, before anything is traced."""
  stub = stubs.TableLogitsFn.random(0, 12, 8)
  decoder = _build(name, 2)
  for bad in (12, -1):
    with pytest.raises(ValueError, match=r"prompts must be token ids in \[0, V=12\)"):
      decoder.decode(stubs.bind_roles(decoder, stub),
                     RAGGED[:2].at[0, 0].set(bad), RAGGED_LENGTHS[:2], KEY)
  if name != "ar_beam":  # beam search draws nothing
    with pytest.raises(ValueError, match="key=None"):
      decoder.decode(stubs.bind_roles(decoder, stub), RAGGED[:2],
                     RAGGED_LENGTHS[:2], None)
    with pytest.raises(ValueError, match="typed PRNG key"):
      decoder.decode(stubs.bind_roles(decoder, stub), RAGGED[:2],
                     RAGGED_LENGTHS[:2], jax.random.PRNGKey(0))


def test_options_that_would_fail_late_raise_at_construction_or_call():
  with pytest.raises(ValueError, match="repetition_penalty=1.3 must be 1"):
    make_decoder("mdlm", output_length=4, steps=4,
                 sampling=SamplingConfig(repetition_penalty=1.3))
  stub = stubs.TableLogitsFn.random(0, 12, 8)
  with pytest.raises(ValueError, match="eos_ids and pad_id"):
    make_decoder("ar", output_length=2, eos_ids=(99,)).decode(
        bind(stub, None), RAGGED[:2], RAGGED_LENGTHS[:2], KEY)
  with pytest.raises(ValueError, match="block_length=2: infill"):
    make_decoder("llada", output_length=4, steps=4, block_length=2).infill(
        bind(stub, None), RAGGED[:2], jnp.ones((2, 3), bool), KEY)


# ----------------------------------------------------------------------------
# Bad options and inputs of the iterative decoders.

PARALLEL = tuple(n for n in registered()
                 if issubclass(base.decoder_class(n), DenoisingDecoder))


@pytest.mark.parametrize("name", PARALLEL)
def test_masked_diffusion_rejects_fractional_prompt_lengths(name):
  """Bug: MDLM/LLaDA cast prompt_lengths to int32 silently (2.5 -> 2) while
  the AR decoders refuse non-integers.

  Fix: in `DenoisingDecoder._check`, before the cast, raise
  ValueError unless `jnp.issubdtype(jnp.result_type(prompt_lengths),
  jnp.integer)` (after `jnp.asarray`), naming prompt_lengths.
  """
  with pytest.raises(ValueError, match="prompt_lengths"):
    stubs.decoder(name).decode(bind(stubs.RaisingLogitsFn(), None),
                               jnp.ones((2, 3), jnp.int32),
                               jnp.asarray([3.0, 2.5]), KEY)


@pytest.mark.parametrize("name", PARALLEL)
@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_masked_diffusion_temperature_must_be_finite(name, temperature):
  """Bug: `temperature < 0` lets NaN and inf through; decoding then returns
  garbage silently (MDLM all PAD, LLaDA all MASK).

  Fix: the parallel decoders draw through `SamplingConfig`, whose
  `__post_init__` raises unless 0 <= temperature < inf.
  """
  with pytest.raises(ValueError, match="temperature=(nan|inf)"):
    make_decoder(name, output_length=4, steps=4,
                 sampling=SamplingConfig(temperature=temperature))


# Rows (call, exception class, regex) as in tests/test_registry_contracts.py:
# the message names the argument and its range, before any trace.
BAD_INPUTS = [
    *[pytest.param(lambda n=n: stubs.decode_raising(n, mask_id=16), ValueError,
                   r"mask_id and pad_id must be token ids in \[0, V=16\)",
                   id=f"{n}-mask-id-is-V") for n in PARALLEL],
    *[pytest.param(lambda n=n: stubs.decoder(n, early_stop=1), ValueError,
                   r"early_stop=1 must be True or False",
                   id=f"{n}-early-stop-as-a-number") for n in PARALLEL],
    pytest.param(lambda: stubs.decoder("threshold", threshold=True),
                 ValueError, r"threshold=True must be in \(0, 1\] \(a number\)",
                 id="threshold-true"),
    pytest.param(lambda: stubs.decoder("threshold", threshold="high"),
                 ValueError, r"threshold='high' must be in \(0, 1\]",
                 id="threshold-a-word"),
    pytest.param(lambda: stubs.decoder("factor", factor=True), ValueError,
                 r"factor=True must be in \(0, inf\)", id="factor-true"),
    pytest.param(lambda: stubs.decoder("factor", factor=float("inf")),
                 ValueError, r"factor=inf must be in \(0, inf\)",
                 id="factor-inf"),
    pytest.param(lambda: stubs.decoder("maskgit", choice_temperature=True),
                 ValueError, r"choice_temperature=True must be in \[0, inf\)",
                 id="maskgit-choice-temperature-true"),
    pytest.param(lambda: stubs.decoder("remdm", remask_per_step=0),
                 ValueError, r"remask_per_step=0 must be an integer >= 1",
                 id="remdm-remask-per-step-0"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()
