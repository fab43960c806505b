"""The objective registry: the trainer names no objective, and a new one is
one `registry.Objective` entry (issue 37, item 4)."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lm_decoding.models import TransformerConfig, make_logits_fn
from lm_decoding.training import train
from lm_decoding.training import train_step
from lm_decoding.training.objectives import registry

TRAIN_PY = pathlib.Path(train.__file__)


def test_the_trainer_names_no_objective():
  """Every objective-specific choice is the registry's: no string constant
  of train.py's code (docstrings aside) is an objective name."""
  tree = ast.parse(TRAIN_PY.read_text())
  docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.FunctionDef,
                                     ast.ClassDef))
                and node.body and isinstance(node.body[0], ast.Expr)}
  named = sorted({node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant)
                  and id(node) not in docstrings
                  and node.value in registry.OBJECTIVES})
  assert named == []


def test_optional_keys_apply_where_they_did():
  assert {key: registry.accepting(key) for key in (
      "model.token_shift", "model.self_conditioning",
      "train.complementary_masks", "train.anneal_steps",
      "train.block_schedule", "train.scheduled_sampling")} == {
          "model.token_shift": ("mdlm", "bd3lm", "certainty_forcing"),
          "model.self_conditioning": ("mdlm", "uniform"),
          "train.complementary_masks": ("mdlm", "bd3lm", "certainty_forcing"),
          "train.anneal_steps": ("mdlm",),
          "train.block_schedule": ("bd3lm",),
          "train.scheduled_sampling": ("ar",)}
  with pytest.raises(ValueError, match=r"train.objective='nope'; allowed: "
                     r"\('ar', 'mdlm'"):
    registry.get("nope")


def _toy_loss(logits_fn, params, tokens, key, *, scale):
  """Mean logit times `scale`: something with a gradient."""
  del key
  logits = logits_fn(params, tokens, jnp.broadcast_to(
      jnp.arange(tokens.shape[1]), tokens.shape)).logits
  nll = scale * logits.mean() * tokens.size
  return nll / tokens.size, {"nll": nll, "tokens": jnp.float32(tokens.size)}


def _toy_bound(logits_fn, params, tokens, num_timesteps, *, scale):
  del num_timesteps
  return _toy_loss(logits_fn, params, tokens, None, scale=scale)[1]


def test_a_new_objective_is_one_entry(monkeypatch):
  """An entry added to the registry trains and evaluates through the
  trainer's own step and evaluation, its options bound, nothing else
  touched."""
  entry = registry.Objective("toy", _toy_loss, _toy_bound, "causal",
                             options=lambda config: {"scale": 2.0})
  monkeypatch.setitem(registry.OBJECTIVES, "toy", entry)
  model_cfg = TransformerConfig(vocab_size=16, d_model=16, num_layers=1,
                                num_heads=2, num_kv_heads=2, head_dim=8,
                                mlp_dim=32, max_len=8)
  optimizer = train_step.make_optimizer(
      ml_collections.ConfigDict(dict(
          learning_rate=1e-2, warmup_steps=0, num_steps=2, weight_decay=0.0,
          grad_clip_norm=1.0)))
  state = train_step.init_state(model_cfg, optimizer, jax.random.key(0))
  tokens = np.ones((2, 8), np.int32)
  eval_fn = train_step.make_eval_fn(model_cfg, "toy", 1, scale=2.0)
  nll, count = eval_fn(state.params, tokens)
  expected, _ = _toy_loss(make_logits_fn(model_cfg), state.params,
                          tokens, None, scale=2.0)
  np.testing.assert_allclose(nll / count, expected, rtol=1e-6)
  step = train_step.make_train_step(model_cfg, "toy", optimizer, scale=2.0)
  _, metrics = step(state, tokens, jax.random.key(1))
  np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-6)
