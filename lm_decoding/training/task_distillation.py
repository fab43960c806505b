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
  params, summary = fine_tune(task, params, rows[kept], valid_rows, model,
                              train, seed)

The train step is the trainer's (`train_step.make_train_step` with the loss as a
callable objective); batches are drawn with replacement by a generator
seeded with (seed, step), as `task_training` draws them.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm_decoding.checks import is_count
from lm_decoding.data.tasks import Split, Task, score_rows
from lm_decoding.models import Model
from lm_decoding.training import task_training
from lm_decoding.training.objectives.certainty_forcing import (
    CERTAINTY_TEMPERATURE, CERTAINTY_WEIGHT, answer_certainty_forcing_loss)
from lm_decoding.training.objectives import registry
from lm_decoding.training.self_distillation import teacher_continuations
from lm_decoding.training.train_step import (
    TrainState, make_optimizer, make_train_step, unbox)

KEEP = ("exact", "valid", "all")  # which teacher answers train the student

# The trainer's objective: the registry's certainty forcing, its loss the
# one-block answer loss (bidirectional, no BD3-LM blocks).
ANSWER_CERTAINTY_FORCING = dataclasses.replace(
    registry.get("certainty_forcing"), name="answer_certainty_forcing",
    loss=answer_certainty_forcing_loss, attention="bidirectional",
    blocks=False)


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


def fine_tune(task: Task, params, rows: np.ndarray, valid_rows: np.ndarray,
              config: ml_collections.ConfigDict,
              train: ml_collections.ConfigDict, seed: int,
              weight: float = CERTAINTY_WEIGHT,
              temperature: float = CERTAINTY_TEMPERATURE, log=print):
  """Fine-tunes the task MDLM `params` on `rows` with certainty forcing.

  Args:
    task: the task (its P and vocabulary).
    params: the MDLM's parameters (float32, unboxed), the start.
    rows: int32[R, P + T] training rows (`teacher_rows`' kept rows).
    valid_rows: int32[R', P + T] rows of the MDLM NELBO reported (the valid
      split's reference answers).
    config: the task config (configs/tasks.py): the MDLM's backbone.
    train: batch_size, learning_rate, warmup_steps, num_steps (the steps
      run and the cosine's length), weight_decay, grad_clip_norm,
      eval_every.
    seed: batch and mask seed.
    weight, temperature: the certainty term's beta and softmax temperature.
    log: called with one line per evaluation.
  Returns:
    (params, summary {steps, train_s, rows, valid_nelbo (nats per answer
    cell, the MDLM bound on valid_rows), loss, ce, entropy, correct (the
    last step's)}).
  Raises:
    ValueError: no row, num_steps or batch_size below 1, or as
      `answer_certainty_forcing_loss` (before anything is compiled: the
      loss checks its options when traced, at the first step).
  """
  if len(rows) < 1:
    raise ValueError("rows must hold at least one training row")
  for name in ("num_steps", "batch_size", "eval_every"):
    if not is_count(train[name]):
      raise ValueError(f"train.{name}={train[name]!r} must be an integer "
                       ">= 1")
  model_cfg = task_training.model_config(task, "mdlm", config)
  optimizer = make_optimizer(train)
  step_fn = make_train_step(model_cfg, ANSWER_CERTAINTY_FORCING,
                            optimizer, prompt_length=task.prompt_length,
                            weight=weight, temperature=temperature)
  valid = task_training.valid_loss_fn(task, "mdlm", config, valid_rows)
  params = jax.tree.map(jnp.array, params)  # a copy: the step donates it
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params))
  train_s, metrics = 0.0, {}
  for step in range(train.num_steps):
    rng = np.random.default_rng((seed, step))
    batch = rows[rng.integers(0, len(rows), train.batch_size)]
    tick = time.time()
    state, metrics = step_fn(state, batch,
                             jax.random.fold_in(jax.random.key(seed), step))
    metrics = {k: float(metrics[k]) for k in ("loss", "ce", "entropy",
                                              "correct")}
    train_s += time.time() - tick
    if (step + 1) % train.eval_every == 0 or step + 1 == train.num_steps:
      log(f"{task.name}/student step {step + 1}: " + ", ".join(
          f"{k} {v:.3f}" for k, v in metrics.items()) + f", {train_s:.0f} s")
  params = unbox(state.params)
  return params, {"steps": train.num_steps, "train_s": train_s,
                  "rows": len(rows), "valid_nelbo": float(valid(params)),
                  **metrics}
