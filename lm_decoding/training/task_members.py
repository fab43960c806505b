"""The exact-answer task models: shipped when their recipe matches, else
trained.

The shipped task set is `SET_DIR` (`lm_decoding/pretrained/tasks/`), one
pretrained set per task: model `kind` of task `task` is the member
`SET_DIR/{task}/{kind}/` (manifest.json and params/, stored as
`STORED_DTYPE`), written by `pretrained.write_member` and read back by
`pretrained.load_member`. The set holds no tokenizer: a task's vocabulary is
the task's own (`data.tasks`), and the recipe names the task.

A model's recipe (`recipe`) is what determines its parameters: the task and
its options, the data sizes (the splits are dealt test, valid, train from
one stream), the backbone, the train options the trainer reads (BD3-LM's
block length only for BD3-LM) and the seed. A shipped model is used only
when its manifest's recipe equals the requested one; `get_or_train` else
trains (or resumes) it under the workdir (`task_training`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import ml_collections

from lm_decoding.data.tasks import Split, Task
from lm_decoding.models import count_params
from lm_decoding.training import pretrained, task_training

SET_DIR = pretrained.DEFAULT_DIR / "tasks"
STORED_DTYPE = "bfloat16"  # 0.79M parameters: 1.6 MB a model (3.2 in float32)
# The train options `task_training.train_task_model` reads (eval_every only
# spaces checkpoints and the curve; block_length: BD3-LM's, added for it).
_TRAIN_KEYS = ("batch_size", "learning_rate", "warmup_steps", "num_steps",
               "budget_s", "weight_decay", "grad_clip_norm")
_DATA_KEYS = ("train_size", "valid_size", "test_size", "puzzle_file")


def task_options(config: ml_collections.ConfigDict, name: str) -> dict:
  """The options of task `name`'s dataclass from config.data."""
  if name.startswith("sudoku"):
    return dict(min_givens=config.data.sudoku_min_givens,
                max_givens=config.data.sudoku_max_givens)
  if name == "permutation":
    return dict(num_items=config.data.permutation_items,
                alphabet=config.data.permutation_alphabet)
  return {}


def recipe(task: Task, kind: str, config: ml_collections.ConfigDict) -> dict:
  """Everything that determines the parameters of `task`'s `kind` model
  under the task config `config` (configs/tasks.py), as JSON values."""
  train = {key: config.train[key] for key in _TRAIN_KEYS}
  if kind == "bd3lm":
    train["block_length"] = config.train.block_length
  return json.loads(json.dumps({
      "seed": config.seed, "kind": kind,
      "task": {"name": task.name, **dataclasses.asdict(task)},
      "data": {key: config.data[key] for key in _DATA_KEYS},
      "model": config.model.to_dict(), "train": train}))


def read_manifest(task: Task, kind: str,
                  out_dir: str | pathlib.Path = SET_DIR) -> dict:
  """The manifest of the shipped `kind` model of `task`.

  Raises:
    CheckpointError: as `pretrained.read_manifest`.
  """
  return pretrained.read_manifest(kind, pathlib.Path(out_dir) / task.name)


def export(task: Task, kind: str, config: ml_collections.ConfigDict,
           workdir: str, command: str, export_command: str,
           out_dir: str | pathlib.Path = SET_DIR) -> pathlib.Path:
  """Writes the task model trained in `workdir` into the set `out_dir`, as
  member `out_dir/{task}/{kind}`, parameters stored as `STORED_DTYPE`.

  The manifest holds `command` (the one that trained it), the commit and
  `export_command` of this export, `recipe(task, kind, config)`, the
  metrics of the float32 parameters at the checkpoint (num_params, steps,
  train_s, valid_loss: the curve's last record) and the curve.

  Returns:
    The member folder.
  Raises:
    ValueError: the training in `workdir` has not ended or does not match
      (`task_training.finished_params`), or `kind` is not a plain folder
      name (`pretrained.check_export`).
    CheckpointError: its checkpoint does not fit the config's backbone.
  """
  params, curve = task_training.finished_params(
      task, kind, config.model.to_dict(), config.train, workdir)
  last = curve[-1]
  manifest = {"name": kind, "command": command,
              "commit": pretrained.current_commit(),
              "export_command": export_command,
              "recipe": recipe(task, kind, config),
              "metrics": {"num_params": count_params(params),
                          "steps": last["step"], "train_s": last["train_s"],
                          "valid_loss": last["valid_loss"]},
              "curve": curve}
  return pretrained.write_member(
      kind, params,
      task_training.model_config(task, kind, config.model.to_dict()),
      manifest, pathlib.Path(out_dir) / task.name, STORED_DTYPE)


def find(task: Task, kind: str, config: ml_collections.ConfigDict,
         out_dir: str | pathlib.Path = SET_DIR):
  """Loads the shipped `kind` model of `task` if its recipe matches.

  Returns:
    (params, reason): params (float32, `model.param_dtype`) or None when
    the model is not shipped or was trained with another recipe, `reason`
    saying which settings differ.
  Raises:
    CheckpointError: the recipe matches but the manifest is corrupt or the
      parameters are unreadable (`pretrained.load_member`).
  """
  member = pathlib.Path(out_dir) / task.name / kind
  if not (member / pretrained.MANIFEST_FILE).exists():
    return None, f"no shipped {task.name}/{kind} in {out_dir}"
  manifest = read_manifest(task, kind, out_dir)
  shipped = manifest.get("recipe")
  differences = pretrained.recipe_differences(
      shipped if isinstance(shipped, dict) else {},
      recipe(task, kind, config))
  if differences:
    return None, (f"the shipped {task.name}/{kind} was trained with another "
                  "recipe (" + "; ".join(differences) + ")")
  params = pretrained.load_member(member, manifest, task_training.model_config(
      task, kind, config.model.to_dict()))
  return params, f"shipped {member}"


def get_or_train(task: Task, kind: str, splits: dict[str, Split],
                 config: ml_collections.ConfigDict, workdir: str,
                 skip_shipped: str = "", log=print,
                 out_dir: str | pathlib.Path = SET_DIR):
  """The `kind` model of `task`: shipped (`find`) if its recipe matches,
  else trained or resumed in `workdir` (`task_training.train_task_model`
  with config.model, config.train and config.seed).

  Args:
    skip_shipped: '' to look in the set first; else why not (e.g.
      '--retrain'), said when training starts.
    log: called with the reason a model trains and each evaluation line.
  Returns:
    (params, summary, curve): summary as `train_task_model`'s ({kind,
    num_params, steps, train_s, valid_loss}; a shipped model's from its
    manifest) plus 'source' (where the parameters came from); curve: the
    training curve (`task_training.read_curve`, or the manifest's).
  Raises:
    ValueError, CheckpointError: as `find` and `train_task_model`.
  """
  params, reason = None, skip_shipped
  if not skip_shipped:
    params, reason = find(task, kind, config, out_dir)
  if params is not None:
    manifest = read_manifest(task, kind, out_dir)
    return (params, dict(manifest["metrics"], kind=kind, source=reason),
            manifest["curve"])
  log(f"{task.name}/{kind}: {reason}; training in {workdir}")
  params, summary = task_training.train_task_model(
      task, kind, splits, config.model.to_dict(), config.train, config.seed,
      workdir, log=log)
  return (params, dict(summary, source=f"trained in {workdir}"),
          task_training.read_curve(workdir))
