"""Uniform-noise diffusion decoding (issue 27): the entropy-bounded sampler,
its parity with transformers' DiffusionGemma components, and the masked
decoders' entropy-bound rule."""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.diffusion_gemma import generation_diffusion_gemma as ref

import stubs
from lm_decoding.decoding import base, make_decoder
from lm_decoding.decoding.rules import (
    ancestral_posterior, entropy, entropy_bounded)
from lm_decoding.models import TransformerConfig, make_logits_fn
from lm_decoding.models.transformer import ModelLogitsFn

KEY = jax.random.key(0)
V = 12
PROMPTS = jnp.array([[5, 6, 7], [7, 0, 0], [9, 8, 0]], jnp.int32)
LENGTHS = jnp.array([3, 1, 2], jnp.int32)


MASK = 4


def _stub(scale=2.0, seed=1):
  """Random trigram logits; MASK's -inf (the decoder excludes it; the
  reference, whose vocabulary has none, then agrees)."""
  return stubs.TableLogitsFn.random(seed, V, 16, masked_ids=(MASK,),
                                    scale=scale)


def _run(stub, **options):
  options.setdefault("eos_ids", ())
  decoder = make_decoder("uniform_eb", **options)
  return decoder, decoder.run(base.bind(stub, None), PROMPTS, LENGTHS, KEY,
                              trace=True)


def test_entropy_bounded_by_hand():
  e = jnp.array([0.3, 0.1, 0.2, 0.9, 0.1])
  allowed = jnp.array([True, True, True, True, False])
  # sorted allowed: 0.1 (1), 0.2 (2), 0.3 (0), 0.9 (3); sums before: 0, .1,
  # .3, .6
  for bound, want in ((1e-9, [0, 1, 0, 0, 0]), (0.15, [0, 1, 1, 0, 0]),
                      (0.35, [1, 1, 1, 0, 0]), (1e9, [1, 1, 1, 1, 0])):
    np.testing.assert_array_equal(entropy_bounded(e, allowed, bound),
                                  np.array(want, bool))
  # a tie goes to the leftmost position
  np.testing.assert_array_equal(
      entropy_bounded(jnp.array([0.5, 0.5]), jnp.array([True, True]), 1e-9),
      [True, False])


@pytest.mark.parametrize("kv_cache", ["none", "prefix"])
def test_bound_near_zero_accepts_one_position_per_step_huge_all(kv_cache):
  for bound, count in ((1e-9, 1), (1e9, 4)):
    _, (_, _, stats, trace) = _run(_stub(), output_length=8, steps=12,
                                   block_length=4, entropy_bound=bound,
                                   early_stop=False, kv_cache=kv_cache)
    np.testing.assert_array_equal(trace["accepted"].sum(-1),
                                  np.full((12, 3), count))
    np.testing.assert_array_equal(stats["accepted"], np.full(3, 12 * count))
    # accepted positions hold their draw, the others a fresh uniform token
    np.testing.assert_array_equal(
        trace["canvas_out"], np.where(trace["accepted"], trace["drawn"],
                                      trace["noise"]))


def test_self_correction_counts_changed_acceptances():
  _, (_, _, stats, trace) = _run(_stub(), output_length=4, steps=10,
                                 entropy_bound=0.5, early_stop=False)
  accepted, drawn = np.asarray(trace["accepted"]), np.asarray(trace["drawn"])
  last = np.full((3, 4), -1)
  revised = np.zeros(3, int)
  for k in range(10):
    changed = accepted[k] & (last >= 0) & (last != drawn[k])
    revised += changed.sum(-1)
    last = np.where(accepted[k], drawn[k], last)
  np.testing.assert_array_equal(stats["revised"], revised)
  np.testing.assert_array_equal(stats["accepted"], accepted.sum((0, 2)))
  assert revised.sum() > 0  # a uniform-noise canvas does revise


def test_prefix_cache_is_exact_with_a_transformer():
  """The committed prefix never sees the canvas, so caching it changes no
  token (2-block decode, random-weight bidirectional Transformer)."""
  config = TransformerConfig(vocab_size=V, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16)
  models = base.bind(make_logits_fn(config), stubs.random_params(config))
  outs = [make_decoder("uniform_eb", output_length=8, steps=8, block_length=4,
                       kv_cache=kv, entropy_bound=0.3, eos_ids=(),
                       t_min=0.2, t_max=0.3, confidence_threshold=1.0).decode(
                           models, PROMPTS, LENGTHS, KEY)
          for kv in ("none", "prefix")]
  np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
  np.testing.assert_array_equal(outs[0].stats["steps"], outs[1].stats["steps"])
  assert int(outs[1].forward_tokens["model"]) < int(
      outs[0].forward_tokens["model"])


@dataclasses.dataclass(frozen=True)
class _BiasedCanvasCalls(ModelLogitsFn):
  """A Transformer whose calls on `width` tokens (the cached canvas calls)
  add `bias` to every logit: a prefix cache off by exactly `bias`."""

  width: int = 4
  bias: float = 0.0

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None, self_conditioning=None):
    out = super().__call__(params, tokens, positions, cache=cache,
                           attention_mask=attention_mask,
                           self_conditioning=self_conditioning)
    if tokens.shape[1] == self.width:
      out = out._replace(logits=out.logits + self.bias)
    return out


@pytest.mark.parametrize("conditioned", [False, True])
@pytest.mark.parametrize("bias", [0.0, 0.5])
def test_cache_error_measures_the_cached_canvas_logits(bias, conditioned):
  """The comparison's max_logit_error of a uniform_eb row: rounding only
  with the exact prefix cache, exactly an injected offset otherwise; a
  self-conditioned model's cached and full passes take the same input."""
  config = TransformerConfig(vocab_size=V, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16,
                             self_conditioning=conditioned)
  models = base.bind(_BiasedCanvasCalls(config, width=4, bias=bias),
                     stubs.random_params(config))
  decoder = make_decoder("uniform_eb", output_length=8, steps=8,
                         block_length=4, kv_cache="prefix", eos_ids=(),
                         entropy_bound=0.3, early_stop=False)
  error = float(decoder.cache_error(models, PROMPTS, LENGTHS, KEY))
  assert error == pytest.approx(bias, abs=1e-5)
  # a full pass is exact by construction: nothing to measure
  assert float(dataclasses.replace(decoder, kv_cache="none").cache_error(
      models, PROMPTS, LENGTHS, KEY)) == 0


@pytest.mark.parametrize("options, match", [
    (dict(entropy_bound=0.0), r"entropy_bound=0.0 must be a number > 0"),
    (dict(entropy_bound=-1.0), r"entropy_bound=-1.0"),
    (dict(t_min=0.9, t_max=0.5), r"t_min=0.9 and t_max=0.5 must satisfy"),
    (dict(t_min=-0.1), r"t_min=-0.1"),
    (dict(stability_threshold=-1), r"stability_threshold=-1 must be an "
                                   r"integer >= 0"),
    (dict(confidence_threshold=0.0), r"confidence_threshold=0.0"),
    (dict(kv_cache="dual"), r"kv_cache='dual'"),
    (dict(steps=3, block_length=2), r"steps=3 must be a multiple"),
])
def test_bad_options_raise_before_tracing(options, match):
  options = {"output_length": 4, "steps": 4, **options}
  with pytest.raises(ValueError, match=match):
    make_decoder("uniform_eb", **options).decode(
        base.bind(stubs.RaisingLogitsFn(), None), PROMPTS, LENGTHS, KEY)


def test_masked_entropy_bound_commits_one_or_all():
  stub = stubs.TableLogitsFn.random(2, V, 16, masked_ids=(0,))
  for bound, nfe in ((1e-9, 8), (1e9, 1)):
    out = make_decoder("entropy_bound", output_length=8, entropy_bound=bound,
                       eos_ids=()).decode(base.bind(stub, None), PROMPTS,
                                          LENGTHS, KEY)
    assert int(out.nfe) == nfe
    assert np.all(np.asarray(out.committed).sum(0) == 8)


# --- Parity with transformers' DiffusionGemma sampler components. ---------

SETTINGS = [
    dict(steps=6, entropy_bound=0.1, t_min=0.4, t_max=0.8,
         stability_threshold=1, confidence_threshold=0.005),  # the defaults
    dict(steps=8, entropy_bound=0.5, t_min=0.1, t_max=1.5,
         stability_threshold=2, confidence_threshold=0.8),
    dict(steps=5, entropy_bound=2.0, t_min=0.0, t_max=1.0,
         stability_threshold=0, confidence_threshold=0.6),
    dict(steps=10, entropy_bound=0.02, t_min=0.3, t_max=0.6,
         stability_threshold=1, confidence_threshold=0.4),
    dict(steps=7, entropy_bound=1e6, t_min=0.5, t_max=0.7,
         stability_threshold=3, confidence_threshold=1.0),
]


def _reference_replay(stub, decoder, trace):
  """transformers' `_denoising_step` loop on the same stub, with its draws
  (torch.multinomial, the renoising canvas) replaced by ours."""
  width = decoder.output_length
  steps = decoder.steps
  layout = np.zeros((3, 3 + width), np.int32)
  lengths = np.asarray(LENGTHS)

  def forward(decoder_input_ids, self_conditioning_logits=None, **_):
    rows = np.array(layout)
    extra = {}
    if getattr(getattr(stub, "config", None), "self_conditioning", False):
      # the reference decoder's input: softmax of the logits fed back (zeros
      # at the first step and over the prompt)
      extra["self_conditioning"] = np.zeros(rows.shape + (V,), np.float32)
    for b in range(3):
      rows[b, :lengths[b]] = np.asarray(PROMPTS)[b, :lengths[b]]
      rows[b, lengths[b]:lengths[b] + width] = decoder_input_ids[b].numpy()
      if extra and self_conditioning_logits is not None:
        extra["self_conditioning"][b, lengths[b]:lengths[b] + width] = (
            torch.softmax(self_conditioning_logits[b], -1).numpy())
    logits = stub(None, jnp.asarray(rows),
                  jnp.broadcast_to(jnp.arange(rows.shape[1]), rows.shape),
                  **{k: jnp.asarray(v) for k, v in extra.items()}).logits
    window = np.stack([np.asarray(logits)[b, lengths[b]:lengths[b] + width]
                       for b in range(3)])
    return types.SimpleNamespace(logits=torch.tensor(window))

  sampler = ref.EntropyBoundSampler(
      ref.EntropyBoundSamplerConfig(entropy_bound=float(decoder.entropy_bound)),
      width, V, steps)
  processors = ref.LogitsProcessorList([ref.LinearTemperatureScheduleLogitsProcessor(
      decoder.t_min, decoder.t_max, steps)])
  stopping = ref.StableAndConfidentStoppingCriteria(
      decoder.stability_threshold, decoder.confidence_threshold)
  fake = types.SimpleNamespace(
      config=types.SimpleNamespace(text_config=types.SimpleNamespace(
          vocab_size=V)),
      model=types.SimpleNamespace(decoder=types.SimpleNamespace(
          embed_tokens=types.SimpleNamespace(weight=torch.zeros(1)))))
  canvas = torch.tensor(np.asarray(trace["canvas_in"][0]), dtype=torch.long)
  argmax, self_cond = canvas, None
  finished = torch.zeros(3, dtype=torch.bool)
  passes = torch.zeros(3, dtype=torch.int)
  record = []
  for k, cur_step in enumerate(reversed(range(1, steps + 1))):
    passes += ~finished
    drawn = torch.tensor(np.asarray(trace["drawn"][k]), dtype=torch.long)
    noise = torch.tensor(np.asarray(trace["noise"][k]), dtype=torch.long)
    sampler.initialize_canvas = lambda batch_size, device, n=noise: n
    torch.multinomial = lambda probs, num_samples, d=drawn: d.reshape(-1, 1)
    canvas, argmax, self_cond, finished = (
        ref.DiffusionGemmaGenerationMixin._denoising_step(
            fake, decoder_forward=forward, current_canvas=canvas,
            argmax_canvas=argmax, input_ids=None, decoder_position_ids=None,
            self_conditioning_logits=self_cond, mask_mapping=None, cache=None,
            finished_denoising=finished.clone(), cur_step=cur_step,
            sampler=sampler, logits_processor=processors,
            diffusion_stopping_criteria=stopping))
    record.append((sampler.accepted_token_mask.numpy(), canvas.numpy(),
                   argmax.numpy()))
    if torch.all(finished):
      break
  return record, argmax.numpy(), passes.numpy()


PARITY_STUB = _stub(scale=4.0, seed=3)


@functools.lru_cache(maxsize=None)
def _parity_run(index):
  return _run(PARITY_STUB, output_length=6, **SETTINGS[index])


def _assert_equals_the_reference(stub, run):
  """Our traced run of `stub` against `_reference_replay` of the same draws:
  accepted masks, canvases and argmax canvases at every step, the output,
  each row's stop step and the NFE."""
  decoder, (tokens, cost, stats, trace) = run
  record, final, passes = _reference_replay(stub, decoder, trace)
  live = np.asarray(trace["live"])
  for k, (accepted, canvas, argmax) in enumerate(record):
    rows = live[k]
    np.testing.assert_array_equal(np.asarray(trace["accepted"][k])[rows],
                                  accepted[rows], err_msg=f"step {k}")
    np.testing.assert_array_equal(trace["canvas_out"][k], canvas,
                                  err_msg=f"step {k}")
    np.testing.assert_array_equal(np.asarray(trace["argmax"][k])[rows],
                                  argmax[rows], err_msg=f"step {k}")
  np.testing.assert_array_equal(tokens, final)
  np.testing.assert_array_equal(stats["steps"], passes)  # each row's stop
  assert int(cost.nfe) == len(record) == passes.max()


@pytest.mark.parametrize("index", range(len(SETTINGS)))
def test_equals_the_transformers_sampler_step_for_step(index, monkeypatch):
  monkeypatch.setattr(torch, "multinomial", torch.multinomial)  # restored
  _assert_equals_the_reference(PARITY_STUB, _parity_run(index))


SELF_CONDITIONED_STUB = stubs.SelfConditionedLogitsFn(_stub(scale=4.0, seed=5),
                                                      weight=6.0)


@pytest.mark.parametrize("index", [0, 1, 3])
def test_self_conditioning_equals_the_transformers_sampler(index, monkeypatch):
  """A model that reads its self-conditioning input: the reference feeds
  its processed logits back and its decoder takes their softmax; ours
  feeds softmax(processed). Equal step for step, and the input matters
  (the same settings without it give other canvases)."""
  monkeypatch.setattr(torch, "multinomial", torch.multinomial)  # restored
  run = _run(SELF_CONDITIONED_STUB, output_length=6, **SETTINGS[index])
  _assert_equals_the_reference(SELF_CONDITIONED_STUB, run)
  plain = stubs.SelfConditionedLogitsFn(SELF_CONDITIONED_STUB.inner,
                                        weight=0.0)
  _, (_, _, _, unconditioned) = _run(plain, output_length=6,
                                     **SETTINGS[index])
  assert not np.array_equal(unconditioned["argmax"], run[1][3]["argmax"])


def test_parity_settings_exercise_stops_and_acceptance():
  """The parity settings are not vacuous: some rows stop early, some run
  the whole budget, and acceptance sizes vary."""
  stopped, full, sizes = False, False, set()
  for index, setting in enumerate(SETTINGS):
    _, (_, _, stats, trace) = _parity_run(index)
    stopped |= bool(np.any(np.asarray(stats["steps"]) < setting["steps"]))
    full |= bool(np.any(np.asarray(stats["steps"]) == setting["steps"]))
    sizes |= set(np.asarray(trace["accepted"]).sum(-1).ravel().tolist())
  assert stopped and full and len(sizes) >= 4


def test_entropy_matches_torch():
  logits = np.random.default_rng(0).normal(size=(5, V)).astype(np.float32) * 3
  np.testing.assert_allclose(
      entropy(jnp.asarray(logits)),
      torch.distributions.Categorical(logits=torch.tensor(logits)).entropy(),
      rtol=1e-6)


# ---- uniform_ancestral: UDLM / Duo's ancestral sampler ----------------------


def test_ancestral_posterior_is_bayes_rule_on_the_forward_process():
  """log q(z_s | z_t, x_theta) against Bayes' rule with the explicit V x V
  transition matrices, float64, at the first (alpha_t = 0), a middle and the
  last (alpha_s = 1) step."""
  rng = np.random.default_rng(0)
  log_p = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(5, V)) * 2,
                                         jnp.float32))
  z = jnp.asarray(rng.integers(0, V, 5), jnp.int32)
  p = np.exp(np.asarray(log_p, np.float64))
  for alpha_t, alpha_s in ((0.0, 0.25), (0.3, 0.7), (0.75, 1.0)):
    ratio = alpha_t / alpha_s
    forward = ratio * np.eye(V) + (1 - ratio) / V  # [y, z]: q(z_t=z | z_s=y)
    prior = alpha_s * p + (1 - alpha_s) / V  # [w, y]: q(z_s=y | x_theta)
    joint = prior * forward[:, np.asarray(z)].T
    want = joint / joint.sum(-1, keepdims=True)
    got = np.exp(np.asarray(ancestral_posterior(log_p, z, alpha_t, alpha_s),
                            np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


def _position_stub(table):
  return stubs.PositionLogitsFn(np.asarray(table, np.float32))


def _ancestral(stub, batch, output_length, **options):
  decoder = make_decoder("uniform_ancestral", output_length=output_length,
                         eos_ids=(), mask_id=MASK, **options)
  prompts = jnp.full((batch, 1), 5, jnp.int32)
  return decoder.decode(base.bind(stub, None), prompts,
                        jnp.ones((batch,), jnp.int32), KEY)


def test_ancestral_one_step_draws_from_the_denoiser():
  """K = 1 runs t = 1 -> 0: the posterior is x_theta itself, so each
  position's draws follow softmax(logits), MASK excluded (chi-square)."""
  from scipy import stats as scipy_stats
  table = np.random.default_rng(1).normal(size=(8, V)) * 1.5
  rows = 4000
  result = _ancestral(_position_stub(table), rows, 4, steps=1)
  assert int(result.nfe) == 1
  tokens = np.asarray(result.tokens)
  for position in range(4):
    logits = table[1 + position].copy()
    logits[MASK] = -np.inf
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    counts = np.bincount(tokens[:, position], minlength=V)
    assert counts[MASK] == 0
    support = probs > 0
    assert scipy_stats.chisquare(
        counts[support], rows * probs[support]).pvalue > 1e-3


@pytest.mark.parametrize("steps, block_length", [(1, None), (2, None),
                                                 (6, None), (4, 2)])
def test_ancestral_with_a_certain_denoiser_outputs_its_answer(steps,
                                                              block_length):
  """x_theta one-hot on a target at every position: the last step (alpha_s
  = 1) draws the target whatever the canvas, at any K and block length."""
  target = np.array([7, 2, 9, 3])
  table = np.full((8, V), -30.0)
  table[1 + np.arange(4), target] = 30.0
  result = _ancestral(_position_stub(table), 3, 4, steps=steps,
                      block_length=block_length)
  np.testing.assert_array_equal(result.tokens, np.tile(target, (3, 1)))
  assert set(result.stats) == {"steps"}


@pytest.mark.parametrize("options, match", [
    (dict(t_min=1.5, t_max=1.0), "t_min"),
    (dict(t_max=float("inf")), "t_max"),
    (dict(kv_cache="dual"), "kv_cache"),
    (dict(steps=0), "steps")])
def test_ancestral_bad_options_raise_at_construction(options, match):
  with pytest.raises(ValueError, match=match):
    make_decoder("uniform_ancestral", output_length=8, **options)
