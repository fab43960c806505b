"""Tests of lm_decoding/evaluation/cost_model.py: the formulas on a config
small enough to count by hand, the crossovers, profiles, bad inputs, the
report columns, and the validation and recommendation scripts end to end
(smoke sizes, in subprocesses)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import stubs
from lm_decoding.decoding import base, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import checklist, cost, cost_model as cm, report, router
from lm_decoding.models import (
    KVCache, TransformerConfig, abstract_params, count_params, init_params,
    make_logits_fn)

ROOT = pathlib.Path(__file__).resolve().parents[1]

# V 10, D 4, one layer, H 2 query heads, Hkv 1, Dh 2, F 6, SwiGLU, RMSNorm,
# tied embeddings, RoPE, float32.
TINY = TransformerConfig(vocab_size=10, d_model=4, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=2, mlp_dim=6, max_len=16)
# Parameters: embedding 10*4 = 40; layer: query 4*2*2 = 16, key 4*1*2 = 8,
# value 8, out 2*2*4 = 16, MLP 3*4*6 = 72, two RMSNorm scales 2*4 = 8, so
# 128; final norm 4. Total 40 + 128 + 4 = 172, 688 bytes in float32.
TINY_PARAMS = 40 + (16 + 8 + 8 + 16 + 72 + 8) + 4
# KV bytes per slot: 2 (k, v) * 1 layer * 1 kv head * 2 dims * 4 bytes = 16.
# FLOPs per position attending to S slots: qkv 2*4*(2 + 2*1)*2 = 64,
# out 2*2*2*4 = 32, attention 4*S*2*2 = 16 S, MLP 2*3*4*6 = 144, head
# 2*4*10 = 80: 320 + 16 S.
# A unit profile: 1000 FLOP/s, 100 bytes/s, 0.5 s a step.
UNIT = cm.HardwareProfile("unit", 1000.0, 100.0, 0.5, "test")


def flops_per_position(slots):
  return 320 + 16 * slots


def test_param_count_by_hand_and_against_the_model():
  assert TINY_PARAMS == 172
  assert cm.param_count(TINY) == TINY_PARAMS
  assert cm.param_bytes(TINY) == 688
  assert cm.param_bytes(TINY.replace(param_dtype="bfloat16")) == 344
  for config in (
      TINY, TransformerConfig(),
      TINY.replace(norm="layernorm", positional="learned",
                   mlp_activation="gelu", tie_embeddings=False,
                   length_classes=3),
      TINY.replace(use_bias=True), TINY.replace(qkv_bias=True),
      TINY.replace(use_bias=True, mlp_activation="gelu")):
    assert cm.param_count(config) == count_params(abstract_params(config))


def test_kv_bytes_per_slot_by_hand_and_against_the_cache():
  assert cm.kv_bytes_per_slot(TINY) == 16
  int8_cache = TINY.replace(kv_cache_dtype="int8")
  assert cm.kv_bytes_per_slot(int8_cache) == 2 * (1 * 1 * (2 + 4))
  for config in (TINY, TransformerConfig(num_kv_heads=2),
                 TINY.replace(dtype="bfloat16"), int8_cache,
                 TransformerConfig(num_kv_heads=2, kv_cache_dtype="int8")):
    assert (cm.kv_bytes_per_slot(config)
            == KVCache.init(config, 1, 4).bytes_per_slot())


def test_forward_flops_and_bytes_by_hand():
  # B 2, L 3, S 5: 2*3*(320 + 80) = 2400 FLOPs; bytes: parameters 688,
  # cache 2*5*16 = 160, logits 2*3*10*4 = 240: 1088.
  assert cm.forward_flops(TINY, 2, 3, 5) == 2 * 3 * flops_per_position(5)
  assert cm.forward_flops(TINY, 2, 3, 5) == 2400
  assert cm.forward_bytes(TINY, 2, 3, 5) == 688 + 160 + 240
  gelu = TINY.replace(mlp_activation="gelu")  # MLP 2*2*4*6 = 96, not 144
  assert cm.forward_flops(gelu, 1, 1, 1) == flops_per_position(1) - 48


def test_forward_flops_close_to_xla_count():
  # XLA also counts norms, RoPE, softmax: a little above the matmuls.
  config = TransformerConfig(vocab_size=256, d_model=64, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=16,
                             mlp_dim=128, max_len=32)
  logits_fn = make_logits_fn(config)
  tokens = jnp.zeros((2, 32), jnp.int32)
  compiled = jax.jit(lambda p, x: logits_fn(p, x, x).logits).lower(
      init_params(config, jax.random.key(0)), tokens).compile()
  xla = cost.cost_analysis(compiled).flops
  ours = cm.forward_flops(config, 2, 32, 32)
  assert ours <= xla <= 1.25 * ours


def test_step_is_the_roofline_max_plus_overhead():
  # Bytes-bound: max(2400 / 1000, 1088 / 100) + 0.5 = 11.38 s.
  assert cm.step_s(TINY, 2, 3, 5, UNIT) == pytest.approx(11.38)
  flop_bound = cm.HardwareProfile("f", 100.0, 1e6, 0.5, "test")
  assert cm.step_s(TINY, 2, 3, 5, flop_bound) == pytest.approx(24.5)


def test_ar_decode_and_denoising_step_by_hand():
  # B 1, P 2, T 3: cache S = 5 slots, 80 bytes per row.
  # Prefill over 2 positions: FLOPs 2*400 = 800 -> 0.8 s; bytes
  # 688 + 80 + 2*40 = 848 -> 8.48 s; + 0.5 = 8.98 s.
  # AR step over 1 position: FLOPs 400 -> 0.4 s; bytes 688 + 80 + 40 = 808
  # -> 8.08 s; + 0.5 = 8.58 s. Decode: 8.98 + (3 - 1) * 8.58 = 26.14 s.
  assert cm.prefill_s(TINY, 1, 2, 3, UNIT) == pytest.approx(8.98)
  assert cm.ar_step_s(TINY, 1, 2, 3, UNIT) == pytest.approx(8.58)
  assert cm.ar_decode_s(TINY, 1, 2, 3, UNIT) == pytest.approx(26.14)
  # Denoising step over 5 positions: FLOPs 5*400 = 2000 -> 2 s; bytes
  # 688 + 80 + 5*40 = 968 -> 9.68 s; + 0.5 = 10.18 s.
  assert cm.denoise_step_s(TINY, 1, 2, 3, UNIT) == pytest.approx(10.18)
  assert cm.parallel_decode_s(TINY, 1, 2, 3, 4, UNIT) == pytest.approx(
      4 * 10.18)
  # K* = 26.14 / 10.18: two steps beat AR, three do not.
  assert cm.crossover_steps(TINY, 1, 2, 3, UNIT) == pytest.approx(
      26.14 / 10.18)


def test_block_parallel_decode_by_hand():
  # B 1, P 2, T 4, W 2: 2 blocks, S = 6 (96 cache bytes a row).
  # Full pass over 6: FLOPs 6*(320 + 96 + 80) = 2976 -> 2.976 s; bytes
  # 688 + 96 + 6*40 = 1024 -> 10.24 s; + 0.5 = 10.74 s.
  # Block step over 2: FLOPs 992 -> 0.992 s; bytes 688 + 96 + 80 = 864 ->
  # 8.64 s; + 0.5 = 9.14 s. K = 4: 2 * 10.74 + 4 * 9.14 = 58.04 s.
  assert cm.parallel_decode_s(TINY, 1, 2, 4, 4, UNIT,
                              block_length=2) == pytest.approx(58.04)
  with pytest.raises(ValueError, match="block_length"):
    cm.parallel_decode_s(TINY, 1, 2, 4, 4, UNIT, block_length=3)
  with pytest.raises(ValueError, match="steps"):
    cm.parallel_decode_s(TINY, 1, 2, 4, 3, UNIT, block_length=2)


def test_crossover_length_by_hand():
  # B 1, P 2, K 1. T = 1 (S = 3): AR is the prefill alone, bytes
  # 688 + 48 + 80 = 816 -> 8.66 s; one pass over 3: 688 + 48 + 120 = 856
  # -> 9.06 s: AR wins. T = 2 (S = 4): AR 8.82 + 8.42 = 17.24 s; one pass
  # over 4: 688 + 64 + 160 = 912 -> 9.62 s: parallel wins, T* = 2.
  assert cm.ar_decode_s(TINY, 1, 2, 1, UNIT) == pytest.approx(8.66)
  assert cm.parallel_decode_s(TINY, 1, 2, 1, 1, UNIT) == pytest.approx(9.06)
  assert cm.ar_decode_s(TINY, 1, 2, 2, UNIT) == pytest.approx(17.24)
  assert cm.crossover_length(TINY, 1, 2, 1, UNIT, 10) == 2
  # K 2: at T = 2, 2 * 9.62 = 19.24 > 17.24; at T = 3, 2 * 10.18 = 20.36
  # < 26.14: T* = 3.
  assert cm.crossover_length(TINY, 1, 2, 2, UNIT, 10) == 3
  assert cm.crossover_length(TINY, 1, 2, 2, UNIT, 2) is None


def test_profiles_load_and_cite():
  assert set(cm.PROFILE_NAMES) == {"cpu", "h100_sxm", "h200", "tpu_v5e",
                                   "tpu_v4"}
  h100, v5e = cm.load_profile("h100_sxm"), cm.load_profile("tpu_v5e")
  assert (h100.peak_flops, h100.bandwidth) == (989e12, 3.35e12)
  assert (v5e.peak_flops, v5e.bandwidth) == (197e12, 819e9)
  assert "datasheet" in h100.source and "TPU v5e" in v5e.source


def test_cpu_profile_round_trips_through_json(tmp_path):
  path = tmp_path / "cpu.json"
  path.write_text(json.dumps(dict(
      name="cpu", peak_flops=1e11, bandwidth=2e10, step_overhead_s=1e-6,
      source="here", runs=5)))
  assert cm.load_profile("cpu", str(path)) == cm.HardwareProfile(
      "cpu", 1e11, 2e10, 1e-6, "here")
  path.write_text(json.dumps(dict(name="cpu", peak_flops=1e11)))
  with pytest.raises(ValueError, match="bandwidth"):
    cm.load_profile("cpu", str(path))
  with pytest.raises(ValueError, match="measure_cpu_profile"):
    cm.load_profile("cpu", str(tmp_path / "absent.json"))


def test_committed_cpu_profile_loads():
  profile = cm.load_profile("cpu")
  assert profile.name == "cpu" and "measure_cpu_profile" in profile.source


@pytest.mark.parametrize("call, match", [
    (lambda: cm.load_profile("a100"), "name='a100'"),
    (lambda: cm.ar_decode_s(TINY, -1, 2, 3, UNIT), "batch_size=-1"),
    (lambda: cm.ar_decode_s(TINY, 1, 0, 3, UNIT), "prompt_length=0"),
    (lambda: cm.denoise_step_s(TINY, 1, 2, 0, UNIT), "output_length=0"),
    (lambda: cm.parallel_decode_s(TINY, 1, 2, 3, 0, UNIT), "steps=0"),
    (lambda: cm.forward_flops(TINY, 1, 1, 0), "key_length=0"),
    (lambda: cm.crossover_length(TINY, 1, 2, 2, UNIT, 0), "max_length=0"),
    (lambda: cm.HardwareProfile("x", 0.0, 1.0, 0.0, ""), "peak_flops"),
    (lambda: cm.HardwareProfile("x", 1.0, -1.0, 0.0, ""), "bandwidth"),
    (lambda: cm.HardwareProfile("x", 1.0, 1.0, -1.0, ""), "step_overhead_s"),
])
def test_bad_inputs_name_the_argument(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def _row(models, calls, tokens, b=1, t=3):
  return dict(models=models, batch_size=b, output_length=t, calls=calls,
              forward_tokens=tokens, ms_min=1.0)


def test_comparison_rows_are_costed_by_their_call_shapes():
  configs = {"ar": TINY, "mdlm": TINY.replace(attention="bidirectional")}
  # AR, P 2, T 3: 3 calls over 1 * (2 + 3 - 1) = 4 positions.
  ar = _row("model=ar", {"model": 3}, {"model": 4})
  assert cm.comparison_row_s(ar, configs, 2, UNIT) == pytest.approx(26.14)
  # 4 full passes over B (P + T) = 5 positions each.
  mdlm = _row("model=mdlm", {"model": 4}, {"model": 20})
  assert cm.comparison_row_s(mdlm, configs, 2, UNIT) == pytest.approx(
      4 * 10.18)
  spec = _row("draft=ar, target=ar", {"draft": 3, "target": 2},
              {"draft": 7, "target": 9})
  assert cm.comparison_row_s(spec, configs, 2, UNIT) is None
  with pytest.raises(ValueError, match="member='bd3lm'"):
    cm.comparison_row_s(_row("model=bd3lm", {"model": 1}, {"model": 5}),
                        configs, 2, UNIT)


def test_report_predicted_columns():
  rows = report._with_predictions(  # pylint: disable=protected-access
      [_row("model=ar", {}, {}), _row("model=x", {}, {})],
      lambda r: 4.0 if r["models"] == "model=ar" else None)
  table = report.markdown_table(rows, report.table_columns("predicted"))
  assert table.splitlines()[2:] == ["| 4.0 | 0.25 |", "| — | — |"]


def _run(script, *args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, str(ROOT / "experiments" / script),
                         *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def test_validation_script_smoke(tmp_path):
  profile = tmp_path / "cpu.json"
  profile.write_text(json.dumps(dict(
      name="cpu", peak_flops=1e11, bandwidth=2e10, step_overhead_s=1e-6,
      source="test")))
  out = _run("validate_cost_model.py", "--smoke", f"--workdir={tmp_path}",
             f"--profile_path={profile}")
  assert "kind=ar" in out and "kind=denoise_step" in out
  text = (tmp_path / "report.md").read_text()
  assert "validate_cost_model.py --smoke" in text
  for name in ("h100_sxm", "h200", "tpu_v5e"):
    assert f"| {name} |" in text
  lines = (tmp_path / "results.csv").read_text().splitlines()
  assert len(lines) == 3 and "predicted_ms" in lines[0]
  assert (tmp_path / "predicted_vs_measured.png").stat().st_size > 0


def test_recommend_script_smoke(tmp_path):
  out = _run("recommend.py", "--profile=h100_sxm", "--batch_size=8",
             "--length_predictable", "--typical_length=256",
             "--latency_limit_ms=5", "--structural_metric",
             f"--workdir={tmp_path}")
  assert out.splitlines()[0] == "recommendation: parallel K=32"
  assert "crossover: K=32 parallel steps beat AR from T* = 35" in out
  assert (tmp_path / "latency.png").stat().st_size > 0


@pytest.mark.parametrize("predictable, limit, metric, hybrid, max_steps, "
                         "expected", [
    (False, 0.0, True, True, 32, "AR"),  # EOS needed, no limit
    (False, 50.0, True, True, 32, "speculative"),  # EOS needed, AR too slow
    (True, 200.0, False, False, 32, "AR"),  # AR (100 ms) meets the limit
    (True, 0.0, True, False, 64, "AR"),  # 64 steps cost more than K* = 50
    (True, 0.0, True, False, 32, "parallel K=32"),  # faster, checkable
    (True, 0.0, False, True, 32, "hybrid K=32"),  # faster, no metric
    (True, 0.0, False, False, 32, "speculative"),  # no metric, no hybrid
    (True, 50.0, True, False, 32, "parallel K=25"),  # 25 steps of 2 ms fit
    (True, 1.0, True, True, 32, "speculative"),  # not one step fits
])
def test_checklist_answers(predictable, limit, metric, hybrid, max_steps,
                           expected):
  # AR 1 ms per token, a parallel step 2 ms at any T: at T = 100, K* = 50.
  curves = checklist.Curves(
      ar=router.CostCurve("ar", "ar", (1, 1000), (1.0, 1000.0), 1.0),
      parallel_step=router.CostCurve("p", "parallel", (1, 1000), (2.0, 2.0),
                                     1.0), source="test")
  choice = checklist.recommend(curves, predictable, 100, limit, metric, hybrid,
                         max_steps)
  assert str(choice) == expected
  assert choice.reasons[0].startswith("AR at T=100: 100.00 ms")
  assert checklist.crossover_from_curves(curves, 32, 1000) == 65  # 64 ms = 64 ms: tie


def test_recommend_reads_measured_curves(tmp_path):
  path = tmp_path / "results.csv"
  path.write_text("decoder,batch_size,output_length,nfe,ms_min\n"
                  "AR cached,1,32,32,40.0\nAR cached,1,128,128,160.0\n"
                  "MDLM K=32,1,32,32,64.0\nMDLM K=32,1,128,32,96.0\n"
                  "AR cached,8,32,32,99.0\n")
  curves = checklist.measured_curves(str(path), 1, "AR cached", "MDLM K=32")
  assert curves.ar_ms(64) == 80.0
  # Per step 64 / 32 = 2 ms at T = 32, 96 / 32 = 3 ms at 128: 2 + 1/3 at 64.
  assert curves.parallel_ms(64, 10) == pytest.approx(10 * (2 + 1 / 3))
  with pytest.raises(ValueError, match="1 rows labelled .AR cached. at batch_size=8"):
    checklist.measured_curves(str(path), 8, "AR cached", "MDLM K=32")


@pytest.mark.parametrize("token_shift", [False, True])
def test_block_decode_s_costs_the_calls_a_cached_bd3lm_decode_makes(
    token_shift):
  """From a real decode's NFE (threshold commits, the exact prefix cache):
  under a FLOP-bound profile the prediction is the FLOPs of the positions
  the decode processed (`forward_tokens`: the prefill, the block-end
  writes, W + 1 positions a denoising call under a token shift) plus the
  overhead of each counted call."""
  config = TransformerConfig(
      vocab_size=32, d_model=32, num_layers=2, num_heads=2, num_kv_heads=2,
      head_dim=16, mlp_dim=64, max_len=40, attention="bidirectional",
      token_shift=token_shift)
  decoder = make_decoder("bd3lm", output_length=16, steps=16, block_length=4,
                         remasking="threshold", threshold=0.2,
                         kv_cache="prefix",
                         sampling=SamplingConfig(temperature=0.0))
  out = decoder.decode(
      base.bind(make_logits_fn(config), stubs.random_params(config)),
      jnp.asarray([[3, 4, 5, 6, 7]]), jnp.asarray([5]), jax.random.key(0))
  calls, positions = int(out.nfe), int(out.forward_tokens["model"])
  flop_bound = cm.HardwareProfile("f", 1.0, 1e30, 0.5, "test")
  got = cm.block_decode_s(config, 1, 5, 16, 4, calls, flop_bound)
  assert got == pytest.approx(
      cm.forward_flops(config, 1, positions, 21) + 0.5 * calls)
  with pytest.raises(ValueError, match=r"calls=7 must be at least 8"):
    cm.block_decode_s(config, 1, 5, 16, 4, 7, flop_bound)
  with pytest.raises(ValueError, match="block_length=3 must divide"):
    cm.block_decode_s(config, 1, 5, 16, 3, calls, flop_bound)
