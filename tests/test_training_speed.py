"""Training speed: the FLOP count of each objective by hand and against
XLA's, losses of a fixed seed and batch unchanged by the speed changes, the
MFU in the training log, and the benchmark's smoke run."""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.evaluation import cost, cost_model as cm
from lm_decoding.models import TransformerConfig
from lm_decoding.training import throughput
from lm_decoding.training import run_log
from lm_decoding.training import train as train_lib
from lm_decoding.training import train_step
from test_training import data_dir, fresh_workdir, read_metrics, tiny_config  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]

# V 10, D 4, one layer, H 2 query heads, Hkv 1, Dh 2, F 6, SwiGLU.
TINY = TransformerConfig(vocab_size=10, d_model=4, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=2, mlp_dim=6, max_len=32)
# Matmul parameters N: query 4*2*2 = 16, key 4*1*2 = 8, value 8, out
# 2*2*4 = 16, MLP 3*4*6 = 72, LM head (tied) 4*10 = 40: 160.
# Attention per layer and position over S keys: 4 S H Dh = 16 S FLOPs.
# Forward per position: 2 N + 16 S = 320 + 16 S.


def test_matmul_params_by_hand():
  assert cm.matmul_params(TINY) == 160
  assert cm.matmul_params(TINY.replace(mlp_activation="gelu")) == 160 - 24
  assert cm.matmul_params(TINY.replace(num_layers=2)) == 160 + 120


@pytest.mark.parametrize("objective, flops", [
    # B 2, L 6. ar: P = 5 positions attending to 5: 3 * 2 * 5 * (320 + 80).
    ("ar", 3 * 2 * 5 * 400),
    # mdlm: P = 6: 3 * 2 * 6 * (320 + 96).
    ("mdlm", 3 * 2 * 6 * 416),
    # bd3lm: [x_t ; x_0], P = 12: 3 * 2 * 12 * (320 + 192).
    ("bd3lm", 3 * 2 * 12 * 512),
])
def test_objective_flops_by_hand(objective, flops):
  assert cm.objective_flops(TINY, objective, 2, 6) == flops
  assert cm.objective_flops(TINY, objective, 2, 6, backward=False) == (
      flops // 3)


def test_objective_flops_is_6n_plus_attention():
  config = TransformerConfig(vocab_size=100, d_model=16, num_layers=3,
                             num_heads=2, num_kv_heads=2, head_dim=8,
                             mlp_dim=32, max_len=64)
  n = cm.matmul_params(config)
  length = 16
  per_position = 6 * n + 12 * config.num_layers * length * 2 * 8
  assert cm.objective_flops(config, "mdlm", 3, length) == (
      3 * length * per_position)


@pytest.mark.parametrize("objective", ["ar", "mdlm", "bd3lm"])
def test_objective_flops_close_to_xla_count(objective):
  # XLA also counts the optimizer, norms, softmax and the loss: a little
  # above the model's matmuls and attention.
  config = tiny_config(objective)
  model_cfg = train_lib.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  step = train_step.make_train_step(model_cfg, objective, optimizer,
                                   block_length=8)
  batch, length = 4, 32
  compiled = step.lower(train_step.abstract_state(model_cfg, optimizer),
                        jax.ShapeDtypeStruct((batch, length), jnp.int32),
                        jax.random.key(0)).compile()
  xla = cost.cost_analysis(compiled).flops
  ours = cm.objective_flops(model_cfg, objective, batch, length)
  assert ours <= xla <= 1.3 * ours


@pytest.mark.parametrize("call, match", [
    (lambda: cm.objective_flops(TINY, "ctc", 1, 4), "objective='ctc'"),
    (lambda: cm.objective_flops(TINY, "ar", 0, 4), "batch_size=0"),
    (lambda: cm.objective_flops(TINY, "ar", 1, 1), "seq_len=1"),
    (lambda: cost.flop_utilisation(-1.0, 1.0, 1.0), "flops=-1"),
    (lambda: cost.flop_utilisation(1.0, 0.0, 1.0), "seconds=0"),
    (lambda: cost.flop_utilisation(1.0, 1.0, 0.0), "peak_flops=0"),
])
def test_bad_inputs_name_the_argument(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_flop_utilisation():
  assert cost.flop_utilisation(50.0, 0.5, 200.0) == pytest.approx(0.5)


# One step of configs/tiny.py (d128, 2 layers, vocab 4096) at B 4, L 32
# (bd3lm blocks of 8), seed 0, key 1, seeded tokens with a PAD tail:
# (loss, grad_norm) computed at commit bd54893, before any speed change.
# float32 sums over thousands of terms in another order (other matmul
# blocking, fused reductions) differ by a few ulps per term, about 1e-6
# relative here: a tolerance of 1e-5 relative admits that and nothing a
# changed formula would give.
BEFORE = {"ar": (8.303877830505371, 0.24624817073345184),
          "mdlm": (6.9075422286987305, 0.32919588685035706),
          "bd3lm": (6.792466163635254, 0.4175754487514496)}


@pytest.mark.parametrize("objective", sorted(BEFORE))
def test_speed_changes_keep_the_loss_of_a_fixed_batch(objective):
  config = tiny_config(objective)
  config.model.update(dict(d_model=128, num_layers=2, num_heads=4,
                           num_kv_heads=4, head_dim=32, mlp_dim=512,
                           max_len=320))
  config.data.vocab_size = 4096
  model_cfg = train_lib.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  step = train_step.make_train_step(model_cfg, objective, optimizer,
                                   block_length=8)
  state = train_step.init_state(model_cfg, optimizer, jax.random.key(0))
  tokens = np.random.RandomState(0).randint(5, 4096, (4, 32))
  tokens[-1, -8:] = 0
  _, metrics = step(state, jnp.asarray(tokens, jnp.int32), jax.random.key(1))
  loss, grad_norm = BEFORE[objective]
  assert float(metrics["loss"]) == pytest.approx(loss, rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(grad_norm, rel=1e-5)


def test_training_log_records_tokens_per_s_and_mfu(data_dir, tmp_path):
  config = tiny_config("mdlm", num_steps=2)
  config.peak_flops = 1e9
  workdir = fresh_workdir(data_dir, tmp_path, "mfu")
  summary = train_lib.train(config, workdir, progress=False)
  model_cfg = train_lib.model_config(config)
  per_token = cm.objective_flops(model_cfg, "mdlm", 16, 64) / (16 * 64)
  records = [r for r in read_metrics(workdir) if r["step"] > 0]
  assert len(records) == 2
  for r in records:
    assert r["mfu"] == pytest.approx(per_token * r["tokens_per_s"] / 1e9)
  assert summary["flops_per_token"] == per_token
  assert summary["peak_flops"] == 1e9
  assert summary["mfu"] == pytest.approx(
      per_token * summary["train_tokens_per_s"] / 1e9)


def test_training_measures_the_peak_when_not_given(data_dir, tmp_path):
  config = tiny_config("ar", num_steps=1)
  summary = train_lib.train(config, fresh_workdir(data_dir, tmp_path, "p"),
                            progress=False)
  assert 1e8 < summary["peak_flops"] < 1e16
  assert 0 < summary["mfu"] < 1


def test_bad_peak_flops_raises_before_compiling(tmp_path):
  config = tiny_config()
  config.peak_flops = -1.0
  with pytest.raises(ValueError, match="peak_flops=-1.0"):
    train_lib.train(config, str(tmp_path / "w"), progress=False)


def test_benchmark_smoke_run_writes_its_files(tmp_path):
  workdir = tmp_path / "bench"
  subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "benchmark_training.py"),
       "--smoke", "--objectives=mdlm", f"--workdir={workdir}",
       f"--config={ROOT / 'configs' / 'tiny.py'}"],
      check=True, cwd=ROOT, capture_output=True)
  table = (workdir / "results.md").read_text()
  assert "| mdlm | train step | 2 | 16 |" in table
  assert "| mdlm | forward | 2 | 16 |" in table
  rows = (workdir / "results.csv").read_text().splitlines()
  assert rows[0].startswith("objective,program,batch_size,seq_len")
  assert len(rows) == 3
  assert (workdir / "mfu.png").stat().st_size > 0


def test_throughput_rejects_bad_input_before_compiling():
  config = tiny_config("ctc")
  with pytest.raises(ValueError, match="train.objective='ctc'"):
    throughput.measure(config)
  with pytest.raises(ValueError, match="runs=0"):
    throughput.measure(tiny_config("ar"), runs=0)


def test_target_log_probs_equal_the_gathered_log_softmax_and_subs():
  from lm_decoding.models.diffusion import subs_log_probs
  from lm_decoding.training import objectives
  key_logits, key_targets = jax.random.split(jax.random.key(0))
  logits = 4 * jax.random.normal(key_logits, (2, 5, 11))
  targets = jax.random.randint(key_targets, (2, 5), 0, 11)
  np.testing.assert_allclose(
      objectives.target_log_probs(logits, targets),
      objectives.common.gather(jax.nn.log_softmax(logits), targets), rtol=1e-6)
  masked = jnp.full((2, 5), 4)  # every position MASK (id 4): SUBS excludes it
  targets = jnp.where(targets == 4, 5, targets)
  np.testing.assert_allclose(
      objectives.target_log_probs(logits, targets, excluded=4),
      objectives.common.gather(subs_log_probs(logits, masked, 4), targets),
      rtol=1e-6)
  grad = lambda f: jax.grad(lambda x: f(x).sum())(logits)
  np.testing.assert_allclose(
      grad(lambda x: objectives.target_log_probs(x, targets, excluded=4)),
      grad(lambda x: objectives.common.gather(subs_log_probs(x, masked, 4),
                                        targets)), atol=1e-6)


def test_the_peak_is_every_device_s_and_translation_has_no_mfu():
  config = tiny_config("ar")
  config.peak_flops = 1e9
  model_cfg = train_lib.model_config(config)
  flops, peak = run_log.step_flops_and_peak(model_cfg, "ar", 16, 64, 4,
                                               config.peak_flops)
  assert flops == cm.objective_flops(model_cfg, "ar", 16, 64)
  assert peak == 4e9
  assert run_log.step_flops_and_peak(model_cfg, "ctc", 16, 64, 1,
                                        config.peak_flops) == (None, None)
