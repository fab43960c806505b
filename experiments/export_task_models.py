r"""Exports trained task models into the shipped task set.

  python experiments/export_task_models.py --config=configs/tasks.py \
      --workdir=/tmp/tasks --command='python experiments/tasks.py ...' \
      [--config.tasks=countdown] [--out_dir=lm_decoding/pretrained/tasks]

For each task of `config.tasks` and kind of `config.kinds`, the model
`experiments/tasks.py` trained under {workdir}/{task}/{kind} with this
config (its training ended: the budget or the step count reached) is
written to {out_dir}/{task}/{kind} (`task_training.export_task_model`:
parameters as bfloat16, manifest with --command, the recipe, steps,
train_s, valid loss and curve) and loaded back through the recipe match
`experiments/tasks.py` uses. Give the config overrides the training had:
the recipe is read from this config. Errors end the run with one line,
`export_task_models: error: ...`.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from lm_decoding.data import tasks
from lm_decoding.evaluation import records
from lm_decoding.training import task_training
from lm_decoding.training.pretrained import recipes, store
from lm_decoding.training.checkpoints import CheckpointError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tasks.py",
                                          "the task config of the training")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The training run's --workdir ({workdir}/{task}/{kind}).",
    required=True)
_COMMAND = flags.DEFINE_string(
    "command", None, "The command that trained the models (the record's), "
    "for the manifests.", required=True)
_OUT_DIR = flags.DEFINE_string("out_dir", str(recipes.TASK_SET_DIR),
                               "The task set's folder.")


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)  # orbax logs every checkpoint
  config = _CONFIG.value
  try:
    for name in (n.strip() for n in config.tasks.split(",") if n.strip()):
      task = tasks.make_task(name, **task_training.task_options(config, name))
      for kind in (k.strip() for k in config.kinds.split(",") if k.strip()):
        member = task_training.export_task_model(
            task, kind, config, os.path.join(_WORKDIR.value, name, kind),
            _COMMAND.value, records.command(), _OUT_DIR.value)
        task_set = task_training.set_dir(task, _OUT_DIR.value)
        params, reason = store.find(task_training.train_config(
            task, kind, config), kind, None, task_set)
        if params is None:
          raise ValueError(f"{member} does not load back: {reason}")
        metrics = recipes.read_manifest(kind, task_set)["metrics"]
        print(f"{member}: {metrics['steps']} steps, {metrics['train_s']:.0f}"
              f" s, valid loss {metrics['valid_loss']:.4f}", flush=True)
  except (ValueError, CheckpointError) as e:
    sys.exit(f"export_task_models: error: {e}")


if __name__ == "__main__":
  app.run(main)
