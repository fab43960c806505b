"""The shipped task models (lm_decoding/pretrained/tasks): export and load
back, the recipe match that decides shipped or trained, and the shipped
models against their manifests."""

import json
import os
import sys

import jax
import numpy as np
import pytest

from lm_decoding.data import tasks
from lm_decoding.training import task_training
from lm_decoding.training.pretrained import recipes, store

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import tasks as tasks_config  # noqa: E402

SHIPPED = {"sudoku4": ("ar", "mdlm", "bd3lm"),
           "permutation": ("ar", "mdlm", "bd3lm"),
           "countdown": ("ar", "mdlm", "bd3lm")}


def tiny_config():
  """configs/tasks.py on a 4-item permutation task, a one-layer backbone
  and 2 training steps."""
  config = tasks_config.get_config()
  config.data.update(train_size=64, valid_size=8, test_size=8,
                     permutation_items=4, permutation_alphabet=6)
  config.model.update(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                      head_dim=16, mlp_dim=64, max_len=16)
  config.train.update(batch_size=8, warmup_steps=1, num_steps=2,
                      eval_every=2, block_length=2)
  return config


def tiny_task(config):
  return tasks.make_task("permutation",
                         **task_training.task_options(config, "permutation"))


def _splits(config, task):
  return tasks.make_splits(task, dict(train=config.data.train_size,
                                      valid=config.data.valid_size,
                                      test=config.data.test_size),
                           config.seed)


def _quiet(_):
  pass


def _find(task, kind, config):
  """`store.find` of `task`'s shipped `kind` model under the task config."""
  return store.find(task_training.train_config(task, kind, config), kind,
                    None, task_training.set_dir(task))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, task, splits, workdir, params) of a tiny MDLM trained 2 steps."""
  config, root = tiny_config(), tmp_path_factory.mktemp("trained")
  task = tiny_task(config)
  splits = _splits(config, task)
  workdir = str(root / "mdlm")
  params, _ = task_training.train_task_model(task, "mdlm", splits, config,
                                             workdir, progress=False)
  return config, task, splits, workdir, params


def test_export_then_find_loads_the_rounded_parameters(trained, tmp_path):
  config, task, _, workdir, params = trained
  member = task_training.export_task_model(task, "mdlm", config, workdir,
                                          "train it", "export it", tmp_path)
  assert member == tmp_path / "permutation" / "mdlm"
  loaded, reason = store.find(task_training.train_config(task, "mdlm", config),
                              "mdlm", None, tmp_path / "permutation")
  assert reason.startswith("pretrained 'mdlm' (commit"), reason
  rounded = jax.tree.map(
      lambda x: np.asarray(x.astype("bfloat16").astype("float32")), params)
  jax.tree.map(np.testing.assert_array_equal, rounded, loaded)
  assert any(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(params), jax.tree.leaves(loaded)))  # rounded for real
  manifest = json.loads((member / "manifest.json").read_text())
  curve = task_training.read_curve(workdir)
  assert manifest["command"] == "train it"
  assert manifest["export_command"] == "export it"
  assert manifest["stored_dtype"] == "bfloat16"
  assert manifest["curve"] == curve
  assert manifest["metrics"]["steps"] == 2
  assert manifest["metrics"]["valid_loss"] == curve[-1]["valid_loss"]
  assert manifest["recipe"]["task"] == {"name": "permutation",
                                        "num_items": 4, "alphabet": 6}


def test_get_or_train_loads_a_match_and_trains_on_a_mismatch(trained,
                                                             tmp_path):
  config, task, splits, workdir, _ = trained
  task_training.export_task_model(task, "mdlm", config, workdir, "c", "e",
                                  tmp_path)
  _, summary, curve = task_training.shipped_or_trained(
      task, "mdlm", splits, config, str(tmp_path / "unused"), log=_quiet,
      out_dir=tmp_path)
  assert summary["source"].startswith("pretrained 'mdlm'")
  assert curve == task_training.read_curve(workdir)
  assert not (tmp_path / "unused").exists()  # nothing trained

  other = tiny_config()
  other.train.budget_s = 60.0
  params, reason = store.find(task_training.train_config(task, "mdlm", other),
                              "mdlm", None, tmp_path / "permutation")
  assert params is None
  assert "train.budget_s: shipped 360.0, requested 60.0" in reason
  lines = []
  _, summary, _ = task_training.shipped_or_trained(
      task, "mdlm", splits, other, str(tmp_path / "trained"),
      log=lines.append, out_dir=tmp_path)
  assert summary["source"] == f"trained in {tmp_path / 'trained'}"
  assert "another config" in lines[0]
  assert (tmp_path / "trained" / "metrics.jsonl").exists()


def test_recipe_holds_only_what_sets_the_parameters():
  config, task = tiny_config(), tiny_task(tiny_config())
  config.train.eval_every = 7  # spaces checkpoints only
  config.eval.steps = "1"
  config.data.sudoku_max_givens = 9  # another task's option
  def recipe(kind, config):
    return recipes.recipe(task_training.train_config(task, kind, config))
  assert recipe("ar", config) == recipe("ar", tiny_config())
  assert "block_length" not in recipe("mdlm", config)["train"]
  assert recipe("bd3lm", config)["train"]["block_length"] == 2


def test_export_refuses_an_unfinished_run(trained, tmp_path):
  config, task, _, workdir, _ = trained
  longer = tiny_config()
  longer.train.num_steps = 4
  with pytest.raises(ValueError, match="stopped at step 2 .* has not ended"):
    task_training.export_task_model(task, "mdlm", longer, workdir, "c", "e",
                                    tmp_path)
  assert not (tmp_path / "permutation").exists()


def test_every_shipped_model_matches_configs_tasks():
  """experiments/tasks.py with configs/tasks.py (and --config.tasks=
  countdown) loads every shipped model rather than training it."""
  config = tasks_config.get_config()
  assert sorted(p.name for p in recipes.TASK_SET_DIR.iterdir()
                if p.is_dir()) == sorted(SHIPPED)
  for name, kinds in SHIPPED.items():
    task = tasks.make_task(name, **task_training.task_options(config, name))
    for kind in kinds:
      params, reason = _find(task, kind, config)
      assert params is not None, reason
      manifest = recipes.read_manifest(kind, task_training.set_dir(task))
      assert manifest["stored_dtype"] == "bfloat16"
      assert manifest["metrics"]["train_s"] >= config.train.budget_s
      assert manifest["command"].startswith("python experiments/tasks.py")


@pytest.mark.parametrize("name,kind", [("permutation", "ar"),
                                       ("sudoku4", "mdlm")])
def test_shipped_models_reproduce_their_valid_loss(name, kind):
  """The stored (bfloat16) parameters give the manifest's float32 valid
  loss on the valid split, regenerated (it does not depend on train_size)."""
  config = tasks_config.get_config()
  task = tasks.make_task(name, **task_training.task_options(config, name))
  params, reason = _find(task, kind, config)
  assert params is not None, reason
  valid = tasks.make_splits(task, dict(train=1, valid=config.data.valid_size,
                                       test=config.data.test_size),
                            config.seed)["valid"]
  loss = task_training.valid_loss_fn(task, kind, config, valid.rows)(params)
  expected = recipes.read_manifest(
      kind, task_training.set_dir(task))["metrics"]["valid_loss"]
  assert abs(loss - expected) < 0.005, (loss, expected)
