"""train.py wiring of the translation objectives (configs/translation.py)."""

import os
import sys

import jax
import numpy as np
import pytest

from lm_decoding.special_tokens import BOS_ID, EOS_ID
from lm_decoding.training import train
from lm_decoding.training import train_step
from lm_decoding.training.objectives import registry

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import translation  # noqa: E402


def _config(objective):
  config = translation.get_config()
  config.train.objective = objective
  config.data.vocab_size = 16
  config.data.max_source_tokens = 3
  config.data.max_target_tokens = 4
  config.model.update(d_model=16, num_heads=2, num_kv_heads=2, head_dim=8,
                      mlp_dim=32, max_len=16)
  return config


def test_model_config_per_objective():
  assert train.model_config(_config("cmlm")).length_classes == 4
  assert train.model_config(_config("ctc")).length_classes == 0
  assert train.model_config(_config("translation_ar")).attention == "causal"
  assert registry.get("ctc").sequence_length(_config("ctc")) == 3 + 1 + 2 * 3
  assert registry.get("cmlm").sequence_length(_config("cmlm")) == 3 + 4 + 2
  assert registry.get("ctc").options(_config("ctc")) == {"source_width": 3,
                                                      "upsample": 2}


def test_max_len_too_small_for_the_ctc_frames():
  config = _config("ctc")
  config.model.max_len = 9
  with pytest.raises(ValueError, match="ctc training sequence length 10 .* must be <= model.max_len=9"):
    train.model_config(config)


@pytest.mark.parametrize("objective", train.TRANSLATION_OBJECTIVES)
def test_one_step_lowers_the_loss_on_a_repeated_batch(objective):
  config = _config(objective)
  model_cfg = train.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  state = train_step.init_state(model_cfg, optimizer, jax.random.key(0))
  rows = np.array([[5, 6, BOS_ID, 7, 8, EOS_ID, 0, 0, 0],
                   [9, 10, 11, BOS_ID, 12, EOS_ID, 0, 0, 0]], np.int32)
  options = registry.get(objective).options(config)
  step = train_step.make_train_step(model_cfg, objective, optimizer, **options)
  eval_fn = train_step.make_eval_fn(model_cfg, objective, 1, **options)
  before = train_step.evaluate(eval_fn, state.params, rows[None])
  for i in range(5):
    state, metrics = step(state, rows, jax.random.key(i))
  after = train_step.evaluate(eval_fn, state.params, rows[None])
  assert np.isfinite(float(metrics["loss"])) and after < before


def test_stop_at_must_be_a_positive_step(tmp_path):
  with pytest.raises(ValueError, match="stop_at=0 must be an integer >= 1"):
    train.train(translation.get_config(), str(tmp_path / "run"), stop_at=0)
  assert not (tmp_path / "run").exists()
