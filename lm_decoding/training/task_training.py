"""The exact-answer task models: AR, MDLM and BD3-LM on one backbone, trained
by `train.train` like every other model.

A task model is a `train.train` config (`train_config`) of data.source
'task' (`data_sources`): its objective is the kind ('ar', 'mdlm', 'bd3lm')
conditioned on the task's prompt (`objectives.tasks`: the prompt is never
masked nor scored; train.prompt_length = P), its rows the task's splits
[prompt (P) | answer (T)] passed in memory (`data_sources.task_rows`), its
vocabulary the task's. The trainer's loop, resume, checkpoints and
metrics.jsonl are the LM models': the run stops at train.num_steps or once
train.budget_s seconds of training steps have run (the budget, the same for
every model), validates and checkpoints every train.eval_every steps and at
its end, and resumes from its workdir. Its validation measure is the
objective on the whole valid split at a fixed key (nats per answer token;
an upper bound for the diffusion models, `valid_loss_fn`); the curve
(`read_curve`) is the log's records that hold it.

Adaptation (issue 25 on a task): `init_from` names another task model's
workdir (e.g. the AR model of the same task); a fresh run starts from its
latest parameters (the optimizer, its warmup and the step count start
fresh) after `loading.parent_params` has compared the parent's recorded
data and backbone with this model's, before anything is compiled.

The shipped task models are one pretrained set per task,
`recipes.TASK_SET_DIR/{task}/` (no tokenizer: a task's ids are its own),
member `{kind}` stored as `STORED_DTYPE`, written by `store.export` and
found by `store.find` like every other member: a task model's recipe is
`recipes.recipe` of its `train_config` (the task and its options, the split
sizes, the backbone, the train options that set the parameters, the seed).
`shipped_or_trained` loads the shipped model when that recipe matches,
else trains (or resumes) it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import ml_collections
import numpy as np

from lm_decoding.data.tasks import Split, Task
from lm_decoding.models import TransformerConfig, abstract_params
from lm_decoding.models import count_params
from lm_decoding.training import data_sources
from lm_decoding.training import train as train_lib
from lm_decoding.training import train_step
from lm_decoding.training.checkpoints import Checkpoints
from lm_decoding.training.objectives import registry
from lm_decoding.training.objectives import tasks as task_objectives
from lm_decoding.training.pretrained import loading, recipes, store

KINDS = tuple(task_objectives.TASK_LOSSES)
STORED_DTYPE = "bfloat16"  # 0.79M parameters: 1.6 MB a model (3.2 in float32)
# The task config's train options a task model reads (eval_every spaces
# its evaluations and checkpoints).
_TRAIN_KEYS = ("batch_size", "learning_rate", "warmup_steps", "num_steps",
               "budget_s", "weight_decay", "grad_clip_norm", "eval_every")
_DATA_KEYS = ("train_size", "valid_size", "test_size", "puzzle_file")


def task_options(config: ml_collections.ConfigDict, name: str) -> dict:
  """The options of task `name`'s dataclass from config.data."""
  if name.startswith("sudoku"):
    return dict(min_givens=config.data.sudoku_min_givens,
                max_givens=config.data.sudoku_max_givens)
  if name == "permutation":
    return dict(num_items=config.data.permutation_items,
                alphabet=config.data.permutation_alphabet)
  if name == "sort":
    return dict(num_items=config.data.sort_items,
                alphabet=config.data.sort_alphabet)
  return {}


def set_dir(task: Task, out_dir=recipes.TASK_SET_DIR) -> pathlib.Path:
  """The pretrained set of `task`'s models in the task sets' `out_dir`."""
  return pathlib.Path(out_dir) / task.name


def train_config(task: Task, kind: str, config: ml_collections.ConfigDict,
                 valid_rows: int = 1, init_from: str | None = None
                 ) -> ml_collections.ConfigDict:
  """The `train.train` config of `task`'s `kind` model under the task
  config `config` (configs/tasks.py): its model sizes and seed, the task's
  vocabulary and P + T positions, the split sizes, train options
  (_TRAIN_KEYS and BD3-LM's block_length), validation in one batch of
  `valid_rows` rows, a checkpoint at every evaluation.

  Raises:
    ValueError: unknown kind, or model.max_len below P + T.
  """
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r}; allowed: {KINDS}")
  length = task.prompt_length + task.answer_length
  if config.model.get("max_len", 0) < length:
    raise ValueError(f"model.max_len={config.model.get('max_len')} must be "
                     f">= P + T = {length} for task {task.name}")
  train = {key: config.train[key] for key in _TRAIN_KEYS}
  train.update(objective=kind, prompt_length=task.prompt_length,
               checkpoint_every=config.train.eval_every, keep_checkpoints=1,
               eval_batches=1, eval_batch_size=valid_rows,
               mdlm_eval_timesteps=1)
  if kind == "bd3lm":
    train["block_length"] = config.train.block_length
  if init_from:
    train["init_from"] = init_from
  data = {key: config.data[key] for key in _DATA_KEYS}
  data.update(source=data_sources.TASK, seq_len=length,
              vocab_size=task.vocab_size,
              task={"name": task.name, **dataclasses.asdict(task)})
  return ml_collections.ConfigDict({"seed": config.seed, "data": data,
                                    "model": config.model.to_dict(),
                                    "train": train})


def model_config(task: Task, kind: str, config: ml_collections.ConfigDict
                 ) -> TransformerConfig:
  """The backbone of `kind` for `task` (`train.model_config` of its
  `train_config`): causal attention for 'ar', bidirectional otherwise.

  Raises:
    ValueError: as `train_config`, or a bad model option.
  """
  return train_lib.model_config(train_config(task, kind, config))


def valid_loss_fn(task: Task, kind: str, config: ml_collections.ConfigDict,
                  rows: np.ndarray):
  """params -> the valid loss of `kind`'s parameters on `rows`
  int32[R, P + T] (nats per answer token, a float), as training logs it:
  the objective at a fixed key over the rows in one batch.

  Raises:
    ValueError: as `train_config`.
  """
  run = train_config(task, kind, config, valid_rows=len(rows))
  entry = registry.of_config(run)
  eval_fn = train_step.make_eval_fn(
      train_lib.model_config(run), entry, 1, run.train.get("block_length"),
      **entry.options(run))
  return lambda params: train_step.evaluate(eval_fn, params,
                                            np.asarray(rows)[None])


def read_curve(workdir: str) -> list[dict]:
  """The training curve of the task model trained in `workdir`: the
  records of its metrics.jsonl that hold a valid_loss (the untrained
  step 0, then each evaluation with its loss and train_s), in order.

  Raises:
    ValueError: no metrics.jsonl in `workdir`.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} holds no metrics.jsonl: no task model "
                     "trained there")
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if "valid_loss" in r]


def finished_curve(train: ml_collections.ConfigDict, workdir: str
                   ) -> list[dict]:
  """`read_curve(workdir)` of a task model whose training under `workdir`
  (with the train options `train`) has ended at its latest checkpoint.

  Raises:
    ValueError: no checkpoint or curve in `workdir`; the latest checkpoint
      is not the curve's last record; or the run has not ended (below
      train.num_steps steps and train.budget_s seconds: resume it first).
  """
  folder, step = os.path.join(workdir, "checkpoints"), None
  if os.path.isdir(folder):
    with Checkpoints(folder, keep=1) as ckpt:
      step = ckpt.latest_step()
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
  return curve


def train_task_model(task: Task, kind: str, splits: dict[str, Split],
                     config: ml_collections.ConfigDict, workdir: str,
                     progress: bool = True, init_from: str | None = None):
  """Trains (or resumes) one task model with `train.train`; returns
  (params, summary).

  Args:
    task, kind: the task and one of KINDS.
    splits: `make_splits` output (train and valid used).
    config: the task config (configs/tasks.py): seed, model sizes, train
      options (batch_size, learning_rate, warmup_steps, num_steps,
      weight_decay, grad_clip_norm, eval_every, budget_s: seconds of
      training steps, block_length: BD3-LM's W), split sizes.
    workdir: checkpoints and metrics.jsonl.
    progress: `train.train`'s progress bar and lines.
    init_from: a parent task model's workdir (module docstring), or None
      for a random initialisation; a resume must name the same.
  Returns:
    params, {kind, num_params, steps, train_s, valid_loss}; an adapted
    model's also {init_from, parent_steps, parent_train_s} (train_s is its
    own steps' seconds, the parent's not included).
  Raises:
    ValueError: as `train_config`, or a parent that does not fit
      (`loading.parent_params`; before anything is compiled).
    CheckpointError: a checkpoint in `workdir` of another recipe.
  """
  valid = splits["valid"].rows
  run = train_config(task, kind, config, len(valid), init_from)
  parent, record = loading.parent_params(run, None)
  summary = train_lib.train(
      run, workdir, progress=progress, init_params=parent,
      data=data_sources.task_rows(task.name, task.vocab_size,
                                  splits["train"].rows, valid))
  params = store.load_trained_params(run, workdir)
  out = {"kind": kind, "num_params": count_params(params),
         "steps": summary["steps"], "train_s": summary["train_s"],
         "valid_loss": summary["valid_loss"]}
  if record is not None:
    out.update(init_from=init_from, parent_steps=record["steps"],
               parent_train_s=read_curve(init_from)[-1]["train_s"])
  return params, out


def find(task: Task, kind: str, config: ml_collections.ConfigDict,
         out_dir=recipes.TASK_SET_DIR):
  """(params, reason): the shipped `kind` model of `task` (`store.find` in
  `set_dir(task, out_dir)`) if its recipe is `train_config`'s, else None
  and why not.

  Raises:
    CheckpointError: as `store.find`.
  """
  return store.find(train_config(task, kind, config), kind, None,
                    set_dir(task, out_dir))


def shipped_or_trained(task: Task, kind: str, splits: dict[str, Split],
                       config: ml_collections.ConfigDict, workdir: str,
                       skip_shipped: str = "", log=print,
                       out_dir=recipes.TASK_SET_DIR):
  """The `kind` model of `task`: the shipped one (`store.find` in
  `set_dir(task, out_dir)`) if its recipe matches, else trained or resumed
  in `workdir` (`train_task_model`).

  Args:
    skip_shipped: '' to look in the set first; else why not (e.g.
      '--retrain'), said when training starts.
    log: called with the reason a model trains.
  Returns:
    (params, summary, curve): summary as `train_task_model`'s ({kind,
    num_params, steps, train_s, valid_loss}; a shipped model's from its
    manifest) plus 'source' (where the parameters came from); curve: the
    training curve (`read_curve`, or the manifest's).
  Raises:
    ValueError, CheckpointError: as `store.find` and `train_task_model`.
  """
  params, reason = None, skip_shipped
  if not skip_shipped:
    params, reason = find(task, kind, config, out_dir)
  if params is not None:
    manifest = recipes.read_manifest(kind, set_dir(task, out_dir))
    return (params, dict(manifest["metrics"], kind=kind, source=reason),
            manifest["curve"])
  log(f"{task.name}/{kind}: {reason}; training in {workdir}")
  params, summary = train_task_model(task, kind, splits, config, workdir)
  return (params, dict(summary, source=f"trained in {workdir}"),
          read_curve(workdir))


def export_task_model(task: Task, kind: str,
                      config: ml_collections.ConfigDict, workdir: str,
                      command: str, export_command: str,
                      out_dir=recipes.TASK_SET_DIR) -> pathlib.Path:
  """`store.export` of the task model trained in `workdir` into
  `set_dir(task, out_dir)` as member `kind`, stored as `STORED_DTYPE`; the
  manifest also holds `export_command` and the curve, its metrics the
  curve's last record (num_params, steps, train_s, valid_loss of the
  float32 parameters).

  Returns:
    The member folder.
  Raises:
    ValueError: the training in `workdir` has not ended or does not match
      (`finished_curve`), or as `store.export`.
    CheckpointError: its checkpoint does not fit the config's backbone.
  """
  curve = finished_curve(config.train, workdir)
  run, last = train_config(task, kind, config), curve[-1]
  metrics = {"num_params": count_params(abstract_params(
                 train_lib.model_config(run))),
             "steps": last["step"], "train_s": last["train_s"],
             "valid_loss": last["valid_loss"]}
  return store.export(run, workdir, kind, None, command, metrics,
                      set_dir(task, out_dir), STORED_DTYPE,
                      extra={"export_command": export_command,
                             "curve": curve})
