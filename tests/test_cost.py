"""Tests of lm_decoding.evaluation.cost: structure, exact formulas, sanity.

No wall-clock thresholds: timings are only checked for consistency.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding.base import DecodeResult
from lm_decoding.evaluation import cost
from lm_decoding.models import (
    TransformerConfig, count_params, init_params)

M, N, K = 64, 48, 32


def operands():
  return jnp.ones((M, K), jnp.float32), jnp.ones((K, N), jnp.float32)


def check_timing(timing, runs):
  assert isinstance(timing, cost.Timing)
  assert timing.compile_s >= 0
  assert len(timing.runs_s) == runs
  assert all(r >= 0 for r in timing.runs_s)
  assert timing.min_s <= timing.median_s <= timing.max_s
  assert timing.iqr_s >= 0


def test_time_fn_structure_plain_and_jitted():
  a, b = operands()
  check_timing(cost.time_fn(jnp.matmul, a, b, runs=3), 3)
  check_timing(cost.time_fn(jax.jit(jnp.matmul), a, b, warmup=0, runs=1), 1)
  scaled = functools.partial(lambda s, x, y: s * (x @ y), 2.0)
  check_timing(cost.time_fn(scaled, a, b, runs=2), 2)


def test_time_fn_errors():
  a, b = operands()
  with pytest.raises(ValueError, match="runs=0"):
    cost.time_fn(jnp.matmul, a, b, runs=0)
  with pytest.raises(ValueError, match="warmup=-1"):
    cost.time_fn(jnp.matmul, a, b, warmup=-1)


def test_timing_statistics():
  t = cost.Timing(compile_s=0.0, median_s=0.2, runs_s=(0.4, 0.1, 0.2))
  assert (t.min_s, t.max_s) == (0.1, 0.4)
  assert t.iqr_s == pytest.approx(0.3 - 0.15)


def test_cost_analysis_matmul():
  compiled = jax.jit(jnp.matmul).lower(*operands()).compile()
  c = cost.cost_analysis(compiled)
  # XLA:CPU (where the suite runs) reports all three; None is for backends
  # that give no analysis (test_cost_analysis_list_form_and_missing_memory).
  assert c.flops == pytest.approx(2 * M * N * K, rel=0.1)
  assert c.bytes_accessed == pytest.approx(4 * (M * K + K * N + M * N),
                                           rel=0.1)
  assert c.peak_memory_bytes >= 4 * M * N
  assert c.temp_bytes >= 0


class _FakeCompiled:
  """Older jax: cost_analysis() is a list of dicts; no memory analysis."""

  def cost_analysis(self):
    return [{"flops": 10.0, "bytes accessed": 4.0}, {"flops": 5.0}]

  def memory_analysis(self):
    return None


def test_cost_analysis_list_form_and_missing_memory():
  c = cost.cost_analysis(_FakeCompiled())
  assert c == cost.CostAnalysis(flops=15.0, bytes_accessed=4.0,
                                peak_memory_bytes=None, temp_bytes=None)


def test_measure_peak_flops_is_the_best_run_at_any_size(monkeypatch):
  """The peak is the fastest of the back-to-back runs over every size, not
  a median (issue 37: a median of 3 read 331-494 GFLOP/s call to call)."""
  runs_s = {10: (1.0, 0.5, 2.0), 20: (2.0, 8.0, 8.0)}
  monkeypatch.setattr(cost, "time_fn", lambda fn, a, b, runs: cost.Timing(
      compile_s=0.0, median_s=float(np.median(runs_s[a.shape[0]])),
      runs_s=runs_s[a.shape[0]][:runs]))
  assert cost.measure_peak_flops((10, 20), runs=3) == 2 * 20**3 / 2.0
  assert cost.measure_peak_flops(10, runs=3) == 2 * 10**3 / 0.5
  for bad in ((), (10, 0), 0):
    with pytest.raises(ValueError, match="size="):
      cost.measure_peak_flops(bad)


def test_measure_peak_flops_and_step_overhead_positive():
  assert 0 < cost.measure_peak_flops(size=64, runs=2) < math.inf
  assert 0 < cost.measure_peak_flops(size=(32, 64), runs=2) < math.inf
  assert 0 < cost.measure_step_overhead(steps=10, runs=2) < math.inf
  with pytest.raises(ValueError, match="size=0"):
    cost.measure_peak_flops(size=0)
  with pytest.raises(ValueError, match="steps=0"):
    cost.measure_step_overhead(steps=0)
  with pytest.raises(ValueError, match="runs=0"):
    cost.measure_step_overhead(steps=1, runs=0)


def test_measure_bandwidth_positive():
  bandwidth = cost.measure_bandwidth(num_bytes=1 << 20, runs=2)
  assert math.isfinite(bandwidth) and bandwidth > 0
  with pytest.raises(ValueError, match="num_bytes"):
    cost.measure_bandwidth(num_bytes=0)


def test_param_bytes_exact():
  tree = {"a": jnp.zeros((3, 4), jnp.float32),
          "b": [jnp.zeros((5,), jnp.bfloat16)],
          "c": jax.ShapeDtypeStruct((2, 2), jnp.int8)}
  assert cost.tree_bytes(tree) == 48 + 10 + 4
  config = TransformerConfig(vocab_size=32, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=16)
  params = init_params(config, jax.random.key(0))
  assert cost.tree_bytes(params) == 4 * count_params(params)


def test_roofline_exact():
  assert cost.roofline_s(100, 300, 200) == 2.0
  steps = [cost.roofline_s(1000, 8 * (5 + t), 50.0) for t in range(7)]
  assert cost.ar_decode_roofline_s(1000, 8, 5, 7, 50.0) == pytest.approx(
      sum(steps))
  assert cost.ar_decode_roofline_s(1000, 8, 5, 0, 50.0) == 0.0
  assert cost.roofline_ratio(3.0, 2.0) == 1.5
  with pytest.raises(ValueError, match="bandwidth"):
    cost.roofline_s(1, 1, 0)
  with pytest.raises(ValueError, match="must be >= 0"):
    cost.roofline_s(-1, 1, 1)
  with pytest.raises(ValueError, match="new_tokens"):
    cost.ar_decode_roofline_s(1, 1, 1, -1, 1)
  with pytest.raises(ValueError, match="bound_s"):
    cost.roofline_ratio(1.0, 0.0)


def stub_result(lengths, nfe, steps):
  b = len(lengths)
  return DecodeResult(tokens=jnp.zeros((b, 6), jnp.int32),
                      lengths=jnp.asarray(lengths, jnp.int32),
                      nfe=jnp.asarray(nfe, jnp.int32),
                      committed=jnp.zeros((steps, b), jnp.int32))


def test_decode_record_exact():
  timing = cost.Timing(compile_s=0.5, median_s=0.2, runs_s=(0.1, 0.2, 0.4))
  costs = cost.CostAnalysis(flops=7.0, bytes_accessed=9.0,
                            peak_memory_bytes=11, temp_bytes=1)
  r = cost.decode_record(timing, stub_result([4, 2], 3, 6), costs, ttft_s=0.05)
  assert (r.batch_size, r.steps, r.nfe, r.generated_tokens) == (2, 6, 3, 6)
  assert r.compile_s == 0.5
  assert r.ms_per_sequence == pytest.approx(200.0)
  assert r.ms_per_token == pytest.approx(200.0 / 3)
  assert r.tokens_per_s == pytest.approx(30.0)
  assert r.tokens_per_forward == pytest.approx(1.0)  # mean(4/3, 2/3)
  assert r.iqr_ms == pytest.approx(150.0)
  assert r.ttft_ms == pytest.approx(50.0)
  assert (r.flops, r.bytes_accessed, r.peak_memory_bytes) == (7.0, 9.0, 11)
  bare = cost.decode_record(timing, stub_result([0, 0], 1, 2))
  assert math.isnan(bare.ms_per_token) and bare.tokens_per_forward == 0.0
  assert bare.flops is None and bare.ttft_ms is None
  with pytest.raises(ValueError, match="nfe"):
    cost.decode_record(timing, stub_result([1], 0, 1))


def fake_decode(params, prompts, key):
  """A 'parallel decoder': 2 forward passes, rows of 5 and 3 tokens."""
  del key
  tokens = jnp.tanh(prompts @ params).astype(jnp.int32)
  return DecodeResult(tokens=tokens, lengths=jnp.array([5, 3], jnp.int32),
                      nfe=jnp.array(2, jnp.int32),
                      committed=jnp.zeros((2, 2), jnp.int32))


def test_decode_cost_structure():
  args = (jnp.ones((4, 6)), jnp.ones((2, 4)), jax.random.key(0))
  r = cost.decode_cost(fake_decode, *args, runs=3, ttft_s=0.001)
  assert isinstance(r, cost.DecodeCost)
  assert (r.batch_size, r.steps, r.nfe, r.generated_tokens) == (2, 2, 2, 8)
  assert r.tokens_per_forward == pytest.approx(2.0)
  assert r.compile_s >= 0 and r.ms_per_sequence >= 0 and r.iqr_ms >= 0
  assert r.tokens_per_s == pytest.approx(8 / (r.ms_per_sequence / 1e3))
  assert r.ms_per_token == pytest.approx(r.ms_per_sequence / 4)
  assert r.ttft_ms == pytest.approx(1.0)
  with pytest.raises(TypeError, match="DecodeResult"):
    cost.decode_cost(lambda x: x + 1, jnp.ones(3), runs=1)


def test_interleaved_times_the_calls_in_turns_and_keeps_the_last_outputs():
  order = []

  def call(name):
    def run():
      order.append(name)
      return jnp.asarray(len(order))
    return run

  times, outputs = cost.interleaved({"a": call("a"), "b": call("b")}, 3)
  assert order == ["a", "b"] * 3
  assert {n: len(t) for n, t in times.items()} == {"a": 3, "b": 3}
  assert all(s >= 0 for t in times.values() for s in t)
  assert (int(outputs["a"]), int(outputs["b"])) == (5, 6)
  with pytest.raises(ValueError, match="runs=0 must be >= 1"):
    cost.interleaved({"a": call("a")}, 0)
  order.clear()
  times, _ = cost.interleaved({"a": call("a"), "b": call("b")}, 2, warmup=1)
  assert order == ["a", "b"] * 3 and len(times["a"]) == 2  # warm-up untimed
  with pytest.raises(ValueError, match="warmup=-1"):
    cost.interleaved({"a": call("a")}, 1, warmup=-1)


def test_compile_timed_compiles_without_running():
  calls = []

  def fn(x):
    calls.append(1)  # runs while tracing only
    return x * 2

  compiled, seconds = cost.compile_timed(fn, (jnp.arange(3.0),))
  assert seconds >= 0 and calls == [1]
  assert compiled(jnp.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
  jitted = jax.jit(lambda x, n: x * n, static_argnums=1)
  compiled, _ = cost.compile_timed(jitted, (jnp.ones(2), 3))
  assert compiled(jnp.ones(2)).tolist() == [3.0, 3.0]  # static arg bound


def test_load_summary_says_whether_other_jobs_shared_the_cores(monkeypatch):
  monkeypatch.setattr(cost.os, "cpu_count", lambda: 2)
  assert cost.load_summary([1.9, 2.5]) == (
      "1-minute load average 1.9 at the start and 2.5 at the end on 2 cores "
      "(at most the core count + 0.5: this run alone)")
  assert cost.load_summary([0.4, 2.6]).endswith(
      "(more than half a job above the core count: other jobs were running, "
      "timings are noisy)")
