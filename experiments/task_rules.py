r"""The commit rules on the shipped task models: TPF against exact match.

  python experiments/task_rules.py --config=configs/tasks.py \
      --out=experiments/results/tasks_rules

For each task of `config.tasks` and each kind of `config.rules.kinds`, the
shipped model of lm_decoding/pretrained/tasks, or of the task sets' folder
--models (written by experiments/export_task_models.py --out_dir; its
recipe must match the config: `training.task_training.find`), decodes the
test split greedily with every rule setting of `config.rules` and one cell
a step in each adaptive ordering (`studies.task_rules.rule_grid`). Writes
to --out: rules.csv (every point), rules_summary.csv (one row per task x
model x rule: highest TPF, exact match there, highest TPF within one SE of
one cell a step, AUP), rules.md (the command, commit, machine, and both
tables) and rules.png.

Bad options end the run before any model is built, with one line
`task_rules: error: ...`.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from lm_decoding.data import tasks
from lm_decoding.decoding.base import bind
from lm_decoding.evaluation import records
from lm_decoding.models import make_logits_fn
from lm_decoding.studies import task_rules
from lm_decoding.training import task_training
from lm_decoding.training.pretrained import recipes

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tasks.py",
                                          "the task config file")
_OUT = flags.DEFINE_string("out", None, "The record's folder.", required=True)
_MODELS = flags.DEFINE_string(
    "models", str(recipes.TASK_SET_DIR), "The task sets' folder the models "
    "are read from ({models}/{task}/{kind}): the shipped one, or one "
    "experiments/export_task_models.py --out_dir wrote.")


def check(config) -> tuple[list, list[str], dict]:
  """(tasks, kinds, rule settings) of the config.

  Raises:
    ValueError: naming the option and its allowed values.
  """
  names = [n.strip() for n in config.tasks.split(",") if n.strip()]
  kinds = [k.strip() for k in config.rules.kinds.split(",") if k.strip()]
  if not names or any(n not in tasks.TASKS for n in names):
    raise ValueError(f"tasks={config.tasks!r}; allowed: {sorted(tasks.TASKS)}")
  if not kinds or any(k not in ("mdlm", "bd3lm") for k in kinds):
    raise ValueError(f"rules.kinds={config.rules.kinds!r}; allowed: mdlm, "
                     "bd3lm")
  if config.data.puzzle_file:
    raise ValueError("data.puzzle_file: the shipped models' test split is "
                     "the generated one; leave it ''")
  settings = task_rules.settings(config.rules)
  plan = [tasks.make_task(n, **task_training.task_options(config, n))
          for n in names]
  return plan, kinds, settings


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)
  config = _CONFIG.value
  try:
    plan, kinds, settings = check(config)
  except ValueError as e:
    sys.exit(f"task_rules: error: {e}")
  start, load = time.time(), os.getloadavg()[0]
  rows, sources = [], []
  for task in plan:
    splits = tasks.make_splits(task, dict(
        train=config.data.train_size, valid=config.data.valid_size,
        test=config.data.test_size), config.seed)
    for kind in kinds:
      params, source = task_training.find(task, kind, config, _MODELS.value)
      if params is None:
        sys.exit(f"task_rules: error: {source} (train it with "
                 "experiments/tasks.py and export it)")
      sources.append(f"{task.name}/{kind}: {source}")
      bound = bind(make_logits_fn(task_training.model_config(task, kind, config)), params)
      grid = task_rules.rule_grid(kind, task.answer_length,
                                  config.train.block_length, **settings)
      rows += task_rules.measure(task, splits["test"], kind, grid, bound,
                                 config.seed)
  header = [
      "# The commit rules on the task models", "",
      f"Command: `{records.command()}`", "",
      f"Commit: {recipes.current_commit()}; models: " + "; ".join(sources),
      "", f"Machine: {records.cpu_model()}, {os.cpu_count()} cores; 1-minute "
      f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at "
      f"the end (shared with other jobs); {(time.time() - start) / 60:.1f} "
      "min.", "",
      "Greedy decoding of the test split in one batch. TPF = T / row_nfe "
      "(the forward passes a row takes decoded alone); batch_tpf = T / the "
      "batch's NFE. exact_se: one binomial standard error. Reference: one "
      "cell a step (K = T) in the best adaptive ordering; "
      "max_tpf_within_1se: the highest TPF whose exact match is at least the "
      "reference's minus its SE (0: none). AUP: d3LLM's, exact match in %, "
      "y_max the model's best exact match."]
  task_rules.write_record(rows, _OUT.value, header)
  with open(os.path.join(_OUT.value, "rules.md")) as f:
    print(f.read())


if __name__ == "__main__":
  app.run(main)
