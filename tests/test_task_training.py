"""Task objectives (the prompt given, never masked nor scored), task models
trained by train.train (resume, budget, adaptation), the decoder grid, and
the task entry point's refusal of bad options."""

import math
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.data import tasks
from lm_decoding.studies import task_scores
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID
from lm_decoding.training import task_training
from lm_decoding.training.objectives import tasks as task_objectives

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import tasks as tasks_config  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
V = 12


class Recorder:
  """Zero logits (uniform over V); keeps every call's tokens."""

  def __init__(self):
    self.seen = []

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    self.seen.append(np.asarray(tokens))
    return ModelOutput(jnp.zeros(tokens.shape + (V,)), cache)


def rows(batch=6, prompt=4, answer=4):
  rng = np.random.default_rng(0)
  return jnp.asarray(rng.integers(5, V, (batch, prompt + answer)), jnp.int32)


def test_ar_loss_scores_only_the_answer():
  stub = Recorder()
  loss, metrics = task_objectives.task_ar_loss(stub, None, rows(),
                                               jax.random.key(0),
                                               prompt_length=4)
  assert float(metrics["tokens"]) == 6 * 4
  assert float(loss) == pytest.approx(math.log(V), rel=1e-6)
  assert stub.seen[0].shape == (6, 7)  # inputs: all but the last token


@pytest.mark.parametrize("kind", ["mdlm", "bd3lm"])
def test_diffusion_losses_never_mask_the_prompt(kind):
  stub, tokens = Recorder(), rows()
  options = dict(prompt_length=4)
  if kind == "bd3lm":
    options["block_length"] = 2
  loss, metrics = task_objectives.TASK_LOSSES[kind](
      stub, None, tokens, jax.random.key(1), **options)
  assert float(metrics["tokens"]) == 6 * 4
  noisy = stub.seen[0][:, :8]
  np.testing.assert_array_equal(noisy[:, :4], tokens[:, :4])
  masked = noisy[:, 4:] == MASK_ID
  assert masked.any()
  # SUBS with zero logits: each masked token costs log(V - 1) / t; the
  # weights are >= 1, so the loss is at least masked * log(V - 1) / tokens.
  assert float(loss) >= masked.sum() * math.log(V - 1) / 24 - 1e-5
  if kind == "bd3lm":  # the clean half follows the noisy one
    np.testing.assert_array_equal(stub.seen[0][:, 8:], tokens)


def test_bd3lm_loss_needs_aligned_blocks():
  with pytest.raises(ValueError, match="must divide prompt_length=3"):
    task_objectives.task_bd3lm_loss(Recorder(), None, rows(prompt=3, answer=3),
                                    jax.random.key(0), prompt_length=3,
                                    block_length=2)
  with pytest.raises(ValueError, match="prompt_length=8"):
    task_objectives.task_mdlm_loss(Recorder(), None, rows(), jax.random.key(0),
                                   prompt_length=8)


def task_config(num_steps, alphabet=6):
  """configs/tasks.py on a 4-item permutation task, a one-layer backbone
  and `num_steps` steps."""
  config = tasks_config.get_config()
  config.data.update(train_size=64, valid_size=8, test_size=8,
                     permutation_items=4, permutation_alphabet=alphabet)
  config.model.update(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                      head_dim=16, mlp_dim=64, max_len=16)
  config.train.update(batch_size=8, learning_rate=1e-3, warmup_steps=1,
                      num_steps=num_steps, budget_s=1e9, weight_decay=0.0,
                      eval_every=2, block_length=2)
  return config


def task_and_splits(config):
  task = tasks.make_task("permutation",
                         **task_training.task_options(config, "permutation"))
  return task, tasks.make_splits(task, dict(train=64, valid=8, test=8),
                                 seed=0)


def test_trainer_resumes_to_the_same_state(tmp_path):
  """A task model trains through train.train: a run stopped at step 2 and
  resumed to 4 ends where the straight run does, the curve holding the
  untrained step 0 and each evaluation once."""
  task, splits = task_and_splits(task_config(4))
  whole, summary = task_training.train_task_model(
      task, "mdlm", splits, task_config(4), str(tmp_path / "a"),
      progress=False)
  task_training.train_task_model(task, "mdlm", splits, task_config(2),
                                 str(tmp_path / "b"), progress=False)
  resumed, resumed_summary = task_training.train_task_model(
      task, "mdlm", splits, task_config(4), str(tmp_path / "b"),
      progress=False)
  assert summary["steps"] == 4
  jax.tree.map(np.testing.assert_allclose, whole, resumed)
  curve = task_training.read_curve(str(tmp_path / "b"))
  assert [r["step"] for r in curve] == [0, 2, 4]
  # train_s runs on over the resume: the log's seconds of both calls.
  assert curve[-1]["train_s"] == pytest.approx(resumed_summary["train_s"])
  # The logged valid loss is valid_loss_fn's: the objective on the whole
  # valid split at a fixed key.
  loss = task_training.valid_loss_fn(task, "mdlm", task_config(4),
                                     splits["valid"].rows)(whole)
  assert loss == pytest.approx(summary["valid_loss"], rel=1e-5)


def test_budget_ends_the_run_at_a_validated_checkpoint(tmp_path):
  config = task_config(50)
  config.train.budget_s = 1e-9  # the first step spends it
  task, splits = task_and_splits(config)
  _, summary = task_training.train_task_model(
      task, "ar", splits, config, str(tmp_path / "ar"), progress=False)
  assert summary["steps"] == 1
  curve = task_training.finished_curve(config.train, str(tmp_path / "ar"))
  assert [r["step"] for r in curve] == [0, 1]


def test_adapted_model_starts_from_its_parent(tmp_path):
  task, splits = task_and_splits(task_config(2))
  parent, _ = task_training.train_task_model(
      task, "ar", splits, task_config(2), str(tmp_path / "ar"),
      progress=False)
  still = task_config(2)
  still.train.learning_rate = 1e-30  # AdamW at ~0: the parameters stay put
  child, summary = task_training.train_task_model(
      task, "mdlm", splits, still, str(tmp_path / "mdlm"), progress=False,
      init_from=str(tmp_path / "ar"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-20),
               parent, child)
  assert summary["steps"] == 2 and summary["parent_steps"] == 2
  assert summary["init_from"] == str(tmp_path / "ar")
  _, resumed = task_training.train_task_model(  # resumed: lineage kept
      task, "mdlm", splits, still, str(tmp_path / "mdlm"), progress=False,
      init_from=str(tmp_path / "ar"))
  assert resumed["parent_steps"] == 2


def test_adaptation_refuses_a_parent_of_another_vocabulary(tmp_path):
  small, small_splits = task_and_splits(task_config(2))
  task_training.train_task_model(small, "ar", small_splits, task_config(2),
                                 str(tmp_path / "ar"), progress=False)
  large, splits = task_and_splits(task_config(2, alphabet=8))
  with pytest.raises(ValueError, match=r"the parent .* differs from this "
                     r"model in .*data.vocab_size: parent 12, requested 14"):
    task_training.train_task_model(
        large, "mdlm", splits, task_config(2, alphabet=8),
        str(tmp_path / "mdlm"), progress=False,
        init_from=str(tmp_path / "ar"))
  assert not (tmp_path / "mdlm").exists()  # refused before any work
  with pytest.raises(ValueError, match="nor a training workdir"):
    task_training.train_task_model(
        large, "mdlm", splits, task_config(2, alphabet=8),
        str(tmp_path / "mdlm"), progress=False,
        init_from=str(tmp_path / "nowhere"))


def test_decoder_grid_covers_every_family():
  labels = {kind: {e.label for e in task_scores.decoder_grid(
      kind, 8, (1, 2, 4, 8, 16), 4, 4, 0.9, 1.0)} for kind in
      ("ar", "mdlm", "bd3lm")}
  assert labels["ar"] == {"ar/greedy", "ar/sample", "ar_beam/4"}
  assert {"mdlm", "llada/random", "llada/low_confidence", "llada/margin",
          "llada/entropy", "threshold/0.9", "factor/1.0",
          "remdm"} == labels["mdlm"]
  steps = [e.steps for e in task_scores.decoder_grid(
      "bd3lm", 8, (1, 2, 4, 8, 16), 4, 4, 0.9, 1.0)]
  assert steps == [2, 4, 8, 2, 4, 8]  # multiples of the 2 blocks, <= T
  with pytest.raises(ValueError, match="kind"):
    task_scores.decoder_grid("cmlm", 8, (1,), 4, 4, 0.9, 1.0)


def _bad_file(tmp_path):
  path = tmp_path / "puzzles.txt"
  path.write_text("1....4....43...1\n12345\n")
  return str(path)


@pytest.mark.parametrize("flags,message", [
    (["--config.tasks=sudoku4,chess"], r"tasks='sudoku4,chess': unknown \['chess'\]"),
    (["--config.data.train_size=0"], r"data.train_size=0 must be an integer >= 1"),
    (["--config.data.sudoku_max_givens=16"], r"max_givens=16 must satisfy"),
    (["--config.data.puzzle_file={bad}"], r"puzzles.txt:2: a 4x4 puzzle is 16 characters"),
    (["--config.adapt=mdlm:gpt"], r"adapt='mdlm:gpt': 'mdlm:gpt' is not 'kind:parent'"),
    (["--config.kinds=mdlm", "--config.adapt=mdlm:ar"], r"the parent 'ar' is not in kinds='mdlm'"),
], ids=["task", "size", "givens", "puzzle-file", "adapt", "parent"])
def test_entry_point_refuses_bad_options(flags, message, tmp_path):
  workdir = tmp_path / "work"
  flags = [f.format(bad=_bad_file(tmp_path)) for f in flags]
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "tasks.py"),
       f"--workdir={workdir}", *flags], capture_output=True, text=True,
      timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert proc.returncode != 0
  lines = [line for line in (proc.stdout + proc.stderr).splitlines()
           if line.strip()]
  assert len(lines) == 1, lines
  assert lines[0].startswith("tasks: error: ")
  assert re.search(message, lines[0]), lines[0]
  assert not workdir.exists()
