"""Training the exact-answer task models: AR, MDLM and BD3-LM on one backbone.

One model per (task, kind) on the rows of `data.tasks` splits, with the
train step of `train.make_train_step` (AdamW, warmup + cosine, clipping) on
the loss of `objectives.tasks`. Batches are drawn with replacement from the
train split by a generator seeded with (seed, step), so a resumed run draws
the batches the uninterrupted one would. The run stops at train.num_steps
or once train.budget_s seconds of training steps have run (the budget, the
same for every model); it checkpoints every train.eval_every steps under
`workdir` (orbax, `checkpoints.Checkpoints`) and resumes from there; each
evaluation appends {step, loss, valid_loss, train_s} to
`{workdir}/metrics.jsonl` (the curve). valid_loss is the objective on the
valid split with a fixed key (nats per answer token; an upper bound for the
diffusion models).

Adaptation (issue 25 on a task): `init_from` names another task model's
workdir (e.g. the AR model of the same task); a fresh run starts from its
latest parameters (the optimizer, its warmup and the step count start
fresh), after `parent_fits` has compared the parent's stored shapes with
this model's (the vocabulary, the backbone) from the checkpoint's metadata
alone, before anything is compiled. A resumed run ignores it.
"""

from __future__ import annotations

import functools
import json
import os
import time

import jax
import ml_collections
import numpy as np

from lm_decoding.data.tasks import Split, Task
from lm_decoding.models import TransformerConfig, count_params, make_logits_fn
from lm_decoding.training.objectives import tasks as task_objectives
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints
from lm_decoding.training.train import (
    abstract_state, init_state, make_optimizer, make_train_step, unbox)

KINDS = tuple(task_objectives.TASK_LOSSES)


def model_config(task: Task, kind: str, model: dict) -> TransformerConfig:
  """The backbone of `kind` for `task`: `model`'s sizes, the task's
  vocabulary, causal attention for 'ar', bidirectional otherwise.

  Raises:
    ValueError: unknown kind, max_len below P + T, or a bad model option.
  """
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r}; allowed: {KINDS}")
  length = task.prompt_length + task.answer_length
  if model.get("max_len", 0) < length:
    raise ValueError(f"model.max_len={model.get('max_len')} must be >= "
                     f"P + T = {length} for task {task.name}")
  return TransformerConfig(vocab_size=task.vocab_size,
                           attention="causal" if kind == "ar"
                           else "bidirectional", **model)


def loss_options(task: Task, kind: str, block_length: int) -> dict:
  """The task objective's static options (BD3-LM: its block length)."""
  options = {"prompt_length": task.prompt_length}
  if kind == "bd3lm":
    options["block_length"] = block_length
  return options


def _loss(task: Task, kind: str, block_length: int):
  """`kind`'s task objective with its static options bound."""
  return functools.partial(task_objectives.TASK_LOSSES[kind],
                           **loss_options(task, kind, block_length))


def valid_loss_fn(task: Task, kind: str, model: dict, block_length: int,
                  rows: np.ndarray):
  """The jitted valid loss of `kind`'s parameters on `rows` int32[R, P + T]:
  the objective with a fixed key (nats per answer token, a float32
  scalar), as training logs it.

  Raises:
    ValueError: as `model_config`.
  """
  loss = _loss(task, kind, block_length)
  logits_fn = make_logits_fn(model_config(task, kind, model))
  return jax.jit(lambda p: loss(logits_fn, p, rows, jax.random.key(0))[0])


def read_curve(workdir: str) -> list[dict]:
  """The training curve of the task model trained in `workdir`: the
  records of its metrics.jsonl ({step, loss, valid_loss, train_s}), in
  order.

  Raises:
    ValueError: no metrics.jsonl in `workdir`.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} holds no metrics.jsonl: no task model "
                     "trained there")
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def finished_params(task: Task, kind: str, model: dict,
                    train: ml_collections.ConfigDict, workdir: str):
  """The parameters and curve of a task model whose training under
  `workdir` (`train_task_model` with these options) has ended.

  Returns:
    (params, curve): the latest checkpoint's parameters (unboxed) and
    `read_curve(workdir)`, whose last record is that checkpoint's.
  Raises:
    ValueError: no checkpoint or curve in `workdir`; the latest checkpoint
      is not the curve's last record; or the run has not ended (below
      train.num_steps steps and train.budget_s seconds: resume it first).
    CheckpointError: the checkpoint does not fit `model` and `kind` (as
      `Checkpoints.restore`).
  """
  step = _latest_step(workdir)
  if step is None:
    raise ValueError(f"{workdir} holds no checkpoint of a task model")
  curve = read_curve(workdir)
  last = curve[-1] if curve else {}
  if last.get("step") != step:
    raise ValueError(f"{workdir}: the latest checkpoint is step {step}, the "
                     f"curve's last record step {last.get('step')}")
  if step < train.num_steps and last["train_s"] < train.budget_s:
    raise ValueError(
        f"{workdir}: stopped at step {step} after {last['train_s']:.0f} s, "
        f"below train.num_steps={train.num_steps} and train.budget_s="
        f"{train.budget_s}: its training has not ended")
  abstract = abstract_state(model_config(task, kind, model),
                            make_optimizer(train))
  with Checkpoints(os.path.join(workdir, "checkpoints"), keep=1) as ckpt:
    state, _ = ckpt.restore(abstract, step)
  return unbox(state.params), curve


def parent_fits(init_from: str, state) -> dict:
  """Checks that the task model saved under the workdir `init_from` has
  `state`'s structure, shapes and dtypes (a TrainState or its abstract
  shapes), reading only the checkpoint's metadata.

  Returns:
    {'init_from', 'parent_steps', 'parent_train_s'}: the parent's training
    steps and seconds of training steps.
  Raises:
    ValueError: naming init_from: no checkpoint there, or a parent of
      another vocabulary, width or any other shape (each leaf that differs).
  """
  folder = os.path.join(init_from, "checkpoints")
  if not os.path.isdir(folder):
    raise ValueError(f"init_from={init_from!r} is not a task model's workdir "
                     "(no checkpoints/ folder)")
  with Checkpoints(folder, keep=1) as ckpt:
    step = ckpt.latest_step()
    if step is None:
      raise ValueError(f"init_from={init_from!r} holds no complete checkpoint")
    try:
      ckpt.check_fits(state, step)
    except CheckpointError as e:
      raise ValueError(f"init_from={init_from!r}: the parent does not fit "
                       f"this model: {e}") from e
    train_s = ckpt.read_meta(step).get("train_s")
  return {"init_from": init_from, "parent_steps": step,
          "parent_train_s": train_s}


def _latest_step(workdir: str) -> int | None:
  """The latest complete checkpoint step under `workdir`, creating
  nothing."""
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return None
  with Checkpoints(folder, keep=1) as ckpt:
    return ckpt.latest_step()


def _parent_params(init_from: str, state):
  """The parameters of `init_from`'s latest checkpoint, restored onto
  `state`'s shapes (checked by `parent_fits` first)."""
  with Checkpoints(os.path.join(init_from, "checkpoints"), keep=1) as ckpt:
    parent, _ = ckpt.restore(state)
  return parent.params


def train_task_model(task: Task, kind: str, splits: dict[str, Split],
                     model: dict, train: ml_collections.ConfigDict,
                     seed: int, workdir: str, log=print,
                     init_from: str | None = None):
  """Trains (or resumes) one task model; returns (params, summary).

  Args:
    task, kind: the task and one of KINDS.
    splits: `make_splits` output (train and valid used).
    model: `TransformerConfig` options (sizes).
    train: batch_size, learning_rate, warmup_steps, num_steps, weight_decay,
      grad_clip_norm, eval_every, budget_s (seconds of training steps),
      block_length (BD3-LM's W).
    seed: initialisation and batch seed.
    workdir: checkpoints and metrics.jsonl.
    log: called with one line per evaluation.
    init_from: a parent task model's workdir (module docstring), or None
      for a random initialisation.
  Returns:
    params, {kind, num_params, steps, train_s, valid_loss}; an adapted
    model's also {init_from, parent_steps, parent_train_s} (train_s is its
    own steps' seconds, the parent's not included).
  Raises:
    ValueError: as `model_config`, or a parent that does not fit
      (`parent_fits`; before anything is compiled).
  """
  model_cfg = model_config(task, kind, model)
  loss = _loss(task, kind, train.block_length)
  optimizer = make_optimizer(train)
  lineage = {}
  if init_from and _latest_step(workdir) is None:
    lineage = parent_fits(init_from, abstract_state(model_cfg, optimizer))
  step_fn = make_train_step(model_cfg, loss, optimizer)
  eval_fn = valid_loss_fn(task, kind, model, train.block_length,
                          splits["valid"].rows)
  rows = splits["train"].rows
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, "metrics.jsonl")
  state = init_state(model_cfg, optimizer, jax.random.key(seed))
  train_s = 0.0
  with Checkpoints(os.path.join(workdir, "checkpoints"), keep=1) as ckpt:
    if ckpt.latest_step() is not None:
      state, meta = ckpt.restore(state)
      train_s = meta["train_s"]
      lineage = {k: meta[k] for k in ("init_from", "parent_steps",
                                      "parent_train_s") if k in meta}
      log(f"{task.name}/{kind}: resuming at step {int(state.step)}")
    elif lineage:
      state = state.replace(params=_parent_params(init_from, state))
      log(f"{task.name}/{kind}: from {init_from} (step "
          f"{lineage['parent_steps']})")
    step = int(state.step)
    while step < train.num_steps and train_s < train.budget_s:
      rng = np.random.default_rng((seed, step))
      batch = rows[rng.integers(0, len(rows), train.batch_size)]
      tick = time.time()
      state, metrics = step_fn(state, batch,
                               jax.random.fold_in(jax.random.key(seed), step))
      train_loss = float(metrics["loss"])
      train_s += time.time() - tick
      step += 1
      if step % train.eval_every == 0 or step == train.num_steps or (
          train_s >= train.budget_s):
        valid_loss = float(eval_fn(state.params))
        record = {"step": step, "loss": train_loss, "valid_loss": valid_loss,
                  "train_s": train_s}
        with open(log_path, "a") as f:
          f.write(json.dumps(record) + "\n")
        ckpt.save(step, state, {"train_s": train_s, **lineage})
        log(f"{task.name}/{kind}: {json.dumps(record)}")
  params = unbox(state.params)
  return params, {"kind": kind, "num_params": count_params(params),
                  "steps": step, "train_s": train_s,
                  "valid_loss": float(eval_fn(state.params)), **lineage}
