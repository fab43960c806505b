"""Scheduled sampling (objectives.ar_scheduled_sampling_loss and its schedule,
train.scheduled_sampling and the train step that uses it)."""

from __future__ import annotations

import pathlib

import jax
import ml_collections
import numpy as np
import pytest

import _loading
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training import objectives
from lm_decoding.training import train as train_lib
from lm_decoding.training import train_step
from lm_decoding.training.objectives import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
CFG = TransformerConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2,
                        num_kv_heads=2, head_dim=16, mlp_dim=64, max_len=32,
                        attention="causal")


@pytest.fixture(scope="module")
def model():
  logits_fn = make_logits_fn(CFG)
  return logits_fn, init_params(CFG, jax.random.key(0))


def _tokens(batch=4, length=16, pad_from=12):
  tokens = jax.random.randint(jax.random.key(1), (batch, length), 5, 64)
  return tokens.at[0, pad_from:].set(PAD_ID)  # one right-padded row


def test_probability_zero_is_teacher_forcing_exactly(model):
  logits_fn, params = model
  tokens = _tokens()
  plain, plain_metrics = objectives.ar_loss(logits_fn, params, tokens,
                                            jax.random.key(2))
  loss, metrics = objectives.ar_scheduled_sampling_loss(
      logits_fn, params, tokens, jax.random.key(2), probability=0.0)
  assert float(loss) == float(plain)
  assert float(metrics["nll"]) == float(plain_metrics["nll"])
  assert float(metrics["tokens"]) == float(plain_metrics["tokens"])
  assert float(metrics["replaced"]) == 0.0


def test_positive_probability_changes_the_loss_and_its_gradient(model):
  logits_fn, params = model
  tokens = _tokens()
  plain, _ = objectives.ar_loss(logits_fn, params, tokens, jax.random.key(2))
  loss, metrics = objectives.ar_scheduled_sampling_loss(
      logits_fn, params, tokens, jax.random.key(2), probability=0.5)
  assert float(metrics["replaced"]) > 0.2
  assert abs(float(loss) - float(plain)) > 1e-4
  # The same targets are scored: only the inputs changed.
  assert float(metrics["tokens"]) == float((tokens[:, 1:] != PAD_ID).sum())
  grads = jax.grad(lambda p: objectives.ar_scheduled_sampling_loss(
      logits_fn, p, tokens, jax.random.key(2), probability=0.5)[0])(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_replaced_fraction_matches_probability_and_takes_predictions():
  batch, length, vocab, p = 64, 256, 16, 0.3
  inputs = jax.random.randint(jax.random.key(3), (batch, length), 5, vocab)
  inputs = inputs.at[:8, 200:].set(PAD_ID)
  # One-hot logits: the model predicts (input + 1) mod V at every position,
  # so a replaced input i >= 1 must equal (input[i - 1] + 1) mod V.
  logits = 1e4 * jax.nn.one_hot((inputs + 1) % vocab, vocab)
  mixed, replaced = objectives.scheduled_sampling_inputs(
      jax.random.key(4), inputs, logits, p)
  mixed, replaced, inputs = map(np.asarray, (mixed, replaced, inputs))
  eligible = inputs != PAD_ID
  eligible[:, 0] = False
  assert not replaced[~eligible].any()  # position 0 and PAD kept
  n = eligible.sum()
  fraction = replaced.sum() / n
  assert abs(fraction - p) < 3 * np.sqrt(p * (1 - p) / n)
  shifted = np.concatenate([inputs[:, :1], (inputs[:, :-1] + 1) % vocab], 1)
  np.testing.assert_array_equal(mixed, np.where(replaced, shifted, inputs))


def test_schedule_is_a_linear_ramp_to_p_max():
  values = [float(objectives.scheduled_sampling_probability(s, 0.4, 100))
            for s in (0, 25, 100, 1000)]
  np.testing.assert_allclose(values, [0.0, 0.1, 0.4, 0.4], rtol=1e-6)
  assert float(objectives.scheduled_sampling_probability(0, 0.4, 0)) == \
      pytest.approx(0.4)


def _config(objective="ar", **section):
  config = _loading.load("tiny_config", ROOT / "configs" / "tiny.py"
                         ).get_config()
  config.train.objective = objective
  if section:
    config.train.scheduled_sampling = ml_collections.ConfigDict(section)
  return config


def test_check_config_accepts_absent_and_valid_sections():
  assert registry.scheduled_sampling(_config()) is None
  config = _config(p_max=0.25, ramp_steps=100)
  assert registry.scheduled_sampling(config) == (0.25, 100)
  train_lib.check_config(config)
  # The section is part of the checkpoint fingerprint only when present.
  assert "scheduled_sampling" not in registry.fingerprint(_config())
  assert registry.fingerprint(config)["scheduled_sampling"] == [0.25, 100]


@pytest.mark.parametrize("objective,section,message", [
    ("ar", dict(p_max=1.5, ramp_steps=10), "scheduled_sampling.p_max"),
    ("ar", dict(p_max=-0.1, ramp_steps=10), "scheduled_sampling.p_max"),
    ("ar", dict(p_max=True, ramp_steps=10), "scheduled_sampling.p_max"),
    ("ar", dict(p_max=0.2, ramp_steps=-1), "scheduled_sampling.ramp_steps"),
    ("ar", dict(p_max=0.2, ramp_steps=2.5), "scheduled_sampling.ramp_steps"),
    ("ar", dict(p_max=0.2), "keys p_max and ramp_steps"),
    ("mdlm", dict(p_max=0.2, ramp_steps=10), r"objective in \('ar',\); got 'mdlm'"),
])
def test_check_config_rejects_bad_sections(objective, section, message):
  with pytest.raises(ValueError, match=message):
    train_lib.check_config(_config(objective, **section))


def test_train_step_uses_the_schedule(model):
  del model
  optimizer = train_step.make_optimizer(ml_collections.ConfigDict(dict(
      learning_rate=1e-3, warmup_steps=0, num_steps=10, weight_decay=0.0,
      grad_clip_norm=1.0)))
  tokens = _tokens()
  losses = {}
  for name, scheduled in (("plain", None), ("off", (0.0, 0)),
                          ("on", (0.5, 0))):
    step = train_step.make_train_step(CFG, "ar", optimizer,
                                     scheduled=scheduled)
    state = train_step.init_state(CFG, optimizer, jax.random.key(0))
    _, metrics = step(state, tokens, jax.random.key(7))
    losses[name] = float(metrics["loss"])
    if scheduled is not None:
      expected = 0.0 if name == "off" else 0.5
      assert abs(float(metrics["replaced"]) - expected) < 0.25
  assert losses["off"] == losses["plain"]
  assert losses["on"] != losses["plain"]
