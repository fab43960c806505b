"""Certainty-forcing self-distillation of an exact-answer task's MDLM.

dParallel's recipe (Chen et al. 2025, arXiv:2509.26488) on a task (issue 36,
item 3): a teacher decoder (the MDLM itself one cell a step, or the task's AR
model greedily) answers training puzzles; the answers the task scores
correct are kept (sequence-level distillation, Kim and Rush 2016, with
rejection of wrong answers, which an exact task can check); the MDLM is then
fine-tuned on them with `objectives.certainty_forcing.
answer_certainty_forcing_loss` (cross-entropy + 2.0 x the entropy of
softmax(logits / 0.5) on the masked cells it already predicts right), so
that a threshold rule commits several cells per forward pass.

  rows, kept = teacher_rows(task, split, decoder, models, key, batch_size)
  params, summary = fine_tune(task, params, rows[kept], valid_rows, config,
                              train, seed, workdir)

The fine-tune is a `train.train` run (`distill_config`) like every other
model's: the task MDLM's config (`task_training.train_config`) with
objective 'certainty_forcing' on the task data source (the registry's
task entry, `registry.TASK_OBJECTIVES`: the loss above with complementary
rows, validated by the MDLM's NELBO of the valid answers at a fixed key),
the kept rows passed in memory (`data_sources.task_rows`), started from the
given parameters; it checkpoints and resumes in its workdir.
"""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np

from lm_decoding.data.tasks import Split, Task, score_rows
from lm_decoding.models import Model
from lm_decoding.training import data_sources, task_training
from lm_decoding.training import train as train_lib
from lm_decoding.training.objectives.certainty_forcing import (
    CERTAINTY_TEMPERATURE, CERTAINTY_WEIGHT, check_certainty_term)
from lm_decoding.training.pretrained import store
from lm_decoding.training.self_distillation import teacher_continuations

KEEP = ("exact", "valid", "all")  # which teacher answers train the student
# The fine-tune's train options (`fine_tune`'s `train`); the task config's
# budget_s does not apply: the fine-tune runs its num_steps.
TRAIN_KEYS = ("batch_size", "learning_rate", "warmup_steps", "num_steps",
              "weight_decay", "grad_clip_norm", "eval_every")


def teacher_rows(task: Task, split: Split, decoder, teacher: Model,
                 key: jax.Array, batch_size: int, keep: str = "exact"
                 ) -> tuple[np.ndarray, np.ndarray]:
  """The teacher's answers to `split`'s puzzles and which of them to keep.

  Args:
    task, split: the task and the puzzles answered (e.g. a training split).
    decoder: a registered decoder config of role 'model' and output_length
      T (e.g. `llada` with K = T, or `ar` greedy on the AR model).
    teacher: the model it decodes with.
    key: PRNG key (unused by greedy decoders).
    batch_size: puzzles per decode call, >= 1.
    keep: 'exact' (answers the task scores exact), 'valid' (well formed)
      or 'all'.
  Returns:
    (rows int32[R, P + T] [prompt | the teacher's answer], kept bool[R]).
  Raises:
    ValueError: keep not in KEEP, or as `teacher_continuations`.
  """
  if keep not in KEEP:
    raise ValueError(f"keep={keep!r}; allowed: {KEEP}")
  rows = teacher_continuations(decoder, teacher, split.prompts, key,
                               batch_size)
  if keep == "all":
    return rows, np.ones(len(rows), bool)
  scores = score_rows(task, split.problems, rows[:, task.prompt_length:])
  return rows, np.asarray(scores[keep], bool)


def distill_config(task: Task, config: ml_collections.ConfigDict,
                   train: ml_collections.ConfigDict, seed: int,
                   weight: float, temperature: float, valid_rows: int
                   ) -> ml_collections.ConfigDict:
  """The `train.train` config of the fine-tune: the task MDLM's
  (`task_training.train_config` of kind 'mdlm') with objective
  'certainty_forcing' (complementary rows; train.certainty_weight =
  `weight`, train.certainty_temperature = `temperature`), `train`'s
  TRAIN_KEYS, no time budget, seed `seed`, a checkpoint at every
  evaluation, and validation in one batch of `valid_rows` rows.

  Raises:
    ValueError: a TRAIN_KEYS option missing from `train`, or as
      `certainty_forcing.check_certainty_term` (weight, temperature) and
      `task_training.train_config`.
  """
  missing = [key for key in TRAIN_KEYS if key not in train]
  if missing:
    raise ValueError(f"train lacks {missing}; it must hold {TRAIN_KEYS}")
  check_certainty_term(weight, temperature)
  run = task_training.train_config(task, "mdlm", config, valid_rows)
  options = {key: train[key] for key in TRAIN_KEYS}
  del run.train["budget_s"]
  run.train.update(objective="certainty_forcing", complementary_masks=True,
                   certainty_weight=float(weight),
                   certainty_temperature=float(temperature),
                   checkpoint_every=options["eval_every"], **options)
  run.seed = seed
  return run


def fine_tune(task: Task, params, rows: np.ndarray, valid_rows: np.ndarray,
              config: ml_collections.ConfigDict,
              train: ml_collections.ConfigDict, seed: int, workdir: str,
              weight: float = CERTAINTY_WEIGHT,
              temperature: float = CERTAINTY_TEMPERATURE,
              progress: bool = True):
  """Fine-tunes the task MDLM `params` on `rows` with certainty forcing:
  `train.train` of `distill_config`, started from `params` (or resumed in
  `workdir`).

  Args:
    task: the task (its P and vocabulary).
    params: the MDLM's parameters (float32, unboxed), the start; not
      changed (the run trains a copy).
    rows: int32[R, P + T] training rows (`teacher_rows`' kept rows), R >=
      train.batch_size (batches are drawn by epochs, `pipeline.batches`).
    valid_rows: int32[R', P + T] rows of the MDLM NELBO reported (the valid
      split's reference answers).
    config: the task config (configs/tasks.py): the MDLM's backbone.
    train: TRAIN_KEYS: batch_size, learning_rate, warmup_steps, num_steps
      (the steps run and the cosine's length), weight_decay,
      grad_clip_norm, eval_every (validation and checkpoint spacing).
    seed: batch and mask seed.
    workdir: the run's checkpoints and metrics.jsonl.
    weight, temperature: the certainty term's beta and softmax temperature.
    progress: `train.train`'s progress bar and lines.
  Returns:
    (params, summary {steps, train_s, rows, valid_nelbo (nats per answer
    cell, the MDLM bound on valid_rows), loss, ce, entropy, correct (the
    last step's)}).
  Raises:
    ValueError: as `distill_config`, or rows the task source refuses or
      fewer than train.batch_size (before anything is compiled).
    CheckpointError: a checkpoint in `workdir` of another run.
  """
  run = distill_config(task, config, train, seed, weight, temperature,
                       len(valid_rows))
  summary = train_lib.train(
      run, workdir, progress=progress, init_params=params,
      data=data_sources.task_rows(task.name, task.vocab_size, rows,
                                  valid_rows))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    last = json.loads(f.readlines()[-1])
  return store.load_trained_params(run, workdir), {
      "steps": summary["steps"], "train_s": summary["train_s"],
      "rows": len(rows), "valid_nelbo": summary["valid_loss"],
      **{key: last[key] for key in ("loss", "ce", "entropy", "correct")}}
