"""Tests for lm_decoding/evaluation/router.py: exact choices on synthetic
cost curves, and the difficulty signal against a direct computation."""

import numpy as np
import pytest

import stubs
from lm_decoding.evaluation import cost_model, router
from lm_decoding.evaluation.router import CostCurve, RouterConfig
from lm_decoding.models import Model, TransformerConfig

# Synthetic curves (ms at T = 32, 128): AR linear, parallel flat and worse,
# speculative lossless and a little faster than AR.
AR = CostCurve("ar", "ar", (32, 128), (40.0, 160.0), gen_ppl=100.0)
MDLM = CostCurve("mdlm", "parallel", (32, 128), (30.0, 50.0), gen_ppl=180.0)
SPEC = CostCurve("spec", "speculative", (32, 128), (32.0, 128.0),
                 gen_ppl=100.0)
CURVES = (AR, MDLM, SPEC)
EASY, HARD = 2.0, 6.0  # difficulty (nats) around the default threshold 4


def test_latency_interpolates_and_extrapolates_linearly():
  curve = CostCurve("x", "ar", (32, 128, 256), (40.0, 160.0, 200.0), 1.0)
  assert curve.latency_at(32) == 40.0
  assert curve.latency_at(80) == 100.0  # inside the first segment
  assert curve.latency_at(192) == 180.0  # inside the second
  assert curve.latency_at(16) == 20.0  # first segment extended
  assert curve.latency_at(512) == 280.0  # last segment extended
  falling = CostCurve("y", "parallel", (32, 64), (50.0, 10.0), 1.0)
  assert falling.latency_at(128) == 0.0  # clamped at 0


@pytest.mark.parametrize("length, budget, difficulty, expected", [
    (32, 1000.0, EASY, "spec"),  # all fit: best PPL, tie AR/spec -> faster
    (128, 1000.0, EASY, "spec"),
    (128, 140.0, EASY, "spec"),  # AR (160) over budget, spec (128) fits
    (128, 100.0, EASY, "mdlm"),  # only the parallel decoder fits
    (128, 10.0, EASY, "mdlm"),  # nothing fits: the fastest
    (32, 35.0, EASY, "spec"),  # spec 32 fits, AR 40 does not
    (32, 1000.0, HARD, "ar"),  # hard: spec 48 ms now slower than AR 40
    (128, 140.0, HARD, "mdlm"),  # hard: spec 192 over budget, AR too
    (80, 1000.0, EASY, "spec"),  # interpolated: spec 80 < AR 100
])
def test_route_exact_choices(length, budget, difficulty, expected):
  assert router.route(CURVES, length, budget, difficulty) == expected


def test_difficulty_flips_parallel_choice():
  # Parallel slightly worse than AR but much faster: with a budget that
  # fits both, the quality winner is AR; a cheap parallel decoder that is
  # better on easy prompts loses on hard ones (gen-PPL x 1.5).
  good_parallel = CostCurve("par", "parallel", (32, 128), (10.0, 20.0), 90.0)
  curves = (AR, good_parallel)
  assert router.route(curves, 128, 1000.0, EASY) == "par"
  assert router.route(curves, 128, 1000.0, HARD) == "ar"
  assert router.route(curves, 128, 1000.0, HARD,
                      RouterConfig(hard_entropy=10.0)) == "par"


def test_predicted_applies_the_hard_rule_per_kind():
  config = RouterConfig(hard_quality_penalty=2.0, hard_latency_factor=3.0)
  assert router.predicted(AR, 128, HARD, config) == (160.0, 100.0)
  assert router.predicted(MDLM, 128, HARD, config) == (50.0, 360.0)
  assert router.predicted(SPEC, 128, HARD, config) == (384.0, 100.0)
  assert router.predicted(SPEC, 128, EASY, config) == (128.0, 100.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="beam"), "kind"),
    (dict(lengths=(32,), latency_ms=(1.0,)), "lengths"),
    (dict(lengths=(64, 32)), "lengths"),
    (dict(latency_ms=(1.0, float("nan"))), "latency_ms"),
    (dict(latency_ms=(1.0,)), "latency_ms"),
    (dict(gen_ppl=0.0), "gen_ppl"),
])
def test_bad_curves_raise(kwargs, match):
  fields = dict(name="x", kind="ar", lengths=(32, 64), latency_ms=(1.0, 2.0),
                gen_ppl=10.0)
  with pytest.raises(ValueError, match=match):
    CostCurve(**{**fields, **kwargs})


@pytest.mark.parametrize("args, match", [
    (((), 32, 10.0, 1.0), "curves"),
    (((AR, AR), 32, 10.0, 1.0), "curves"),
    ((CURVES, 0, 10.0, 1.0), "output_length"),
    ((CURVES, 32, 0.0, 1.0), "budget_ms"),
    ((CURVES, 32, 10.0, float("nan")), "difficulty"),
])
def test_bad_requests_raise(args, match):
  with pytest.raises(ValueError, match=match):
    router.route(*args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(hard_entropy=-1.0), "hard_entropy"),
    (dict(hard_quality_penalty=0.5), "hard_quality_penalty"),
    (dict(hard_latency_factor=float("inf")), "hard_latency_factor"),
])
def test_bad_router_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    RouterConfig(**kwargs)


def test_prompt_entropy_matches_direct_computation():
  vocab = 5
  fn = stubs.TableLogitsFn.random(seed=3, vocab_size=vocab, max_len=8)
  prompts = np.array([[1, 2, 3, 4], [4, 1, 0, 0]], np.int32)
  lengths = np.array([4, 2], np.int32)
  got = np.asarray(router.prompt_entropy(Model(fn, None), prompts, lengths))
  for b in range(2):
    entropies = []
    for p in range(lengths[b]):
      previous = prompts[b, p - 1] if p > 0 else 0
      log_p = fn.next_log_probs(b, p, previous, prompts[b, p])
      entropies.append(-(np.exp(log_p) * log_p).sum())
    np.testing.assert_allclose(got[b], np.mean(entropies), rtol=1e-5)


def test_prompt_entropy_checks_lengths():
  fn = stubs.TableLogitsFn.random(seed=0, vocab_size=4, max_len=4)
  with pytest.raises(ValueError, match="prompt_lengths"):
    router.prompt_entropy(Model(fn, None), np.zeros((1, 3), np.int32),
                          np.array([4], np.int32))


def test_predicted_curves_come_from_the_cost_model():
  config = TransformerConfig(vocab_size=10, d_model=4, num_layers=1,
                             num_heads=2, num_kv_heads=1, head_dim=2,
                             mlp_dim=6, max_len=16)
  unit = cost_model.HardwareProfile("unit", 1000.0, 100.0, 0.5, "test")
  ar = router.predicted_curve("ar", "ar", 50.0, (1, 2, 3), config, 1, 2,
                              unit)
  assert ar.latency_ms == pytest.approx(
      [1e3 * cost_model.ar_decode_s(config, 1, 2, t, unit) for t in (1, 2, 3)])
  # 8.66 s, 17.24 s and 26.14 s (tests/test_cost_model.py works them out).
  assert ar.latency_ms == pytest.approx((8660.0, 17240.0, 26140.0))
  par = router.predicted_curve("mdlm", "parallel", 80.0, (2, 3), config, 1, 2,
                               unit, steps=2)
  assert par.latency_ms == pytest.approx((2 * 9620.0, 2 * 10180.0))
  # T = 3 within 25 s: only the parallel decoder fits.
  assert router.route((ar, par), 3, 25000.0, EASY) == "mdlm"
  with pytest.raises(ValueError, match="speculative"):
    router.predicted_curve("s", "speculative", 1.0, (1, 2), config, 1, 2,
                           unit)
  with pytest.raises(ValueError, match="steps=None"):
    router.predicted_curve("p", "parallel", 1.0, (1, 2), config, 1, 2, unit)


def test_measured_curves_win_over_predicted_ones():
  predicted_ar = CostCurve("ar", "ar", (32, 128), (1.0, 2.0), 100.0)
  curves = router.with_predictions((AR, SPEC), (predicted_ar, MDLM))
  assert curves == (AR, SPEC, MDLM)
