r"""Certainty-forcing self-distillation of a shipped task MDLM, measured.

  python experiments/task_distill.py --config=configs/tasks.py \
      --out=experiments/results/tasks_distill/sudoku4_a1

The shipped MDLM of `config.distill.task` (and its AR model when the teacher
is 'ar'), or that of the task sets' folder --models (as in
experiments/task_rules.py), answers the first `distill.puzzles` training
puzzles greedily (one cell a step in an adaptive ordering, or AR greedy;
'reference': the puzzles' own answers, no teacher); the answers
`distill.keep` selects fine-tune the MDLM for `distill.num_steps` steps of
`training.task_distillation.fine_tune` (cross-entropy + weight x the
entropy of softmax(logits / temperature) on the masked cells already right;
a `train.train` run in --workdir, which it resumes).
Then the student decodes the test split with every rule of `config.rules`
(`studies.task_rules`), beside the teacher's points of --baseline (a
rules.csv of experiments/task_rules.py). Writes to --out: student.csv, student_summary.csv,
student.md (the command, commit, machine, the data and training figures,
both tables) and student.png.

Bad options end the run in its first seconds with one line
`task_distill: error: ...`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from lm_decoding.checks import is_count
from lm_decoding.data import tasks
from lm_decoding.decoding.base import bind, make_decoder
from lm_decoding.decoding.rules import ORDERINGS
from lm_decoding.evaluation import records
from lm_decoding.models import make_logits_fn
from lm_decoding.studies import task_rules
from lm_decoding.studies.task_scores import GREEDY
from lm_decoding.training import self_distillation
from lm_decoding.training import task_distillation, task_training
from lm_decoding.training.pretrained import recipes

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tasks.py",
                                          "the task config file")
_OUT = flags.DEFINE_string("out", None, "The record's folder.", required=True)
_DATA = flags.DEFINE_string(
    "data", "", "A folder for the kept teacher answers: read when it holds "
    "them for this task, teacher, keep, puzzles and seed, else written.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "", "The fine-tune's checkpoints and metrics.jsonl (resumed "
    "when they are this run's); '' for a temporary folder removed at the "
    "end.")
_BASELINE = flags.DEFINE_string(
    "baseline", "", "A rules.csv of experiments/task_rules.py: its rows of "
    "the task's shipped MDLM (the teacher) join the record, beside the "
    "student's.")
_MODELS = flags.DEFINE_string(
    "models", str(recipes.TASK_SET_DIR), "The task sets' folder the teacher "
    "is read from ({models}/{task}/{kind}), as experiments/task_rules.py's.")
DECODE_BATCH = 256  # puzzles per teacher decode call


def check(config) -> tasks.Task:
  """The distilled task, after every distill option is checked.

  Raises:
    ValueError: naming the option and its allowed values.
  """
  d = config.distill
  if d.task not in tasks.TASKS:
    raise ValueError(f"distill.task={d.task!r}; allowed: "
                     f"{sorted(tasks.TASKS)}")
  kind, _, ordering = d.teacher.partition(":")
  if not (d.teacher in ("ar", "reference")
          or (kind == "mdlm" and ordering in ORDERINGS)):
    raise ValueError(f"distill.teacher={d.teacher!r}; allowed: 'ar', "
                     f"'reference' or 'mdlm:<ordering>' with an ordering of "
                     f"{ORDERINGS}")
  if d.keep not in task_distillation.KEEP:
    raise ValueError(f"distill.keep={d.keep!r}; allowed: "
                     f"{task_distillation.KEEP}")
  for key in ("puzzles", "num_steps", "warmup_steps"):
    if not is_count(d[key], minimum=0 if key == "warmup_steps" else 1):
      raise ValueError(f"distill.{key}={d[key]!r} must be an integer >= 1")
  if d.puzzles > config.data.train_size:
    raise ValueError(f"distill.puzzles={d.puzzles} must be <= "
                     f"data.train_size={config.data.train_size}")
  return tasks.make_task(d.task, **task_training.task_options(config, d.task))


def _shipped(task, kind, config):
  params, source = task_training.find(task, kind, config, _MODELS.value)
  if params is None:
    sys.exit(f"task_distill: error: {source}")
  return bind(make_logits_fn(task_training.model_config(task, kind, config)), params), source


def _distillation_rows(config, task, splits, mdlm):
  """(rows int32[R, P + T], manifest): the kept teacher answers, read from
  --data when it holds them for this teacher, else made (and written there
  when --data is set, `self_distillation.write_distillation_set`)."""
  d = config.distill
  wanted = dict(task=task.name, teacher=d.teacher, keep=d.keep,
                puzzles=d.puzzles, seed=config.seed)
  if _DATA.value and os.path.isfile(os.path.join(_DATA.value,
                                                 "manifest.json")):
    rows, manifest = self_distillation.read_distillation_set(_DATA.value)
    if {k: manifest.get(k) for k in wanted} != wanted:
      sys.exit(f"task_distill: error: --data={_DATA.value} holds "
               f"{ {k: manifest.get(k) for k in wanted} }, not {wanted}")
    return rows, manifest
  puzzles = tasks.to_split(task, splits["train"].problems[:d.puzzles])
  t = dict(output_length=task.answer_length, eos_ids=(), sampling=GREEDY)
  tick = time.time()
  if d.teacher == "reference":
    rows = puzzles.rows
  else:
    if d.teacher == "ar":
      teacher = _shipped(task, "ar", config)[0]
      decoder = make_decoder("ar", **t)
    else:
      teacher = mdlm
      decoder = make_decoder("llada", **t, steps=task.answer_length,
                             remasking=d.teacher.partition(":")[2])
    rows, kept = task_distillation.teacher_rows(
        task, puzzles, decoder, teacher["model"], jax.random.key(config.seed),
        DECODE_BATCH, d.keep)
    rows = rows[kept]
  manifest = dict(wanted, seconds=time.time() - tick, rows=len(rows),
                  command=records.command())
  print(f"teacher {d.teacher}: {len(rows)} of {d.puzzles} answers kept "
        f"({d.keep}), {manifest['seconds']:.0f} s", flush=True)
  if _DATA.value:
    self_distillation.write_distillation_set(_DATA.value, rows, manifest)
  return rows, manifest


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)
  config = _CONFIG.value
  try:
    task = check(config)
    task_rules.settings(config.rules)
    teacher_points = (task_rules.read_points(_BASELINE.value, task.name,
                                             "mdlm")
                      if _BASELINE.value else [])
  except (ValueError, OSError) as e:
    sys.exit(f"task_distill: error: {e}")
  d, start, load = config.distill, time.time(), os.getloadavg()[0]
  splits = tasks.make_splits(task, dict(
      train=config.data.train_size, valid=config.data.valid_size,
      test=config.data.test_size), config.seed)
  mdlm, source = _shipped(task, "mdlm", config)
  rows, data = _distillation_rows(config, task, splits, mdlm)
  train = ml_collections.ConfigDict(dict(
      config.train.to_dict(), learning_rate=d.learning_rate,
      warmup_steps=d.warmup_steps, num_steps=d.num_steps))
  with contextlib.ExitStack() as stack:
    workdir = _WORKDIR.value or stack.enter_context(
        tempfile.TemporaryDirectory(prefix="task_distill_"))
    params, summary = task_distillation.fine_tune(
        task, mdlm["model"].params, rows, splits["valid"].rows,
        config, train, config.seed, workdir, d.weight, d.temperature)
  student = bind(mdlm["model"].logits_fn, params)
  grid = task_rules.rule_grid("mdlm", task.answer_length,
                              config.train.block_length,
                              **task_rules.settings(config.rules))
  rows_out = task_rules.measure(task, splits["test"], "student", grid,
                                student, config.seed)
  figures = dict(teacher=d.teacher, keep=d.keep, puzzles=d.puzzles,
                 kept=data["rows"], data_s=round(data["seconds"], 1),
                 weight=d.weight, temperature=d.temperature,
                 learning_rate=d.learning_rate, **summary)
  header = [
      f"# Certainty-forcing self-distillation: {task.name} MDLM", "",
      f"Command: `{records.command()}`", "",
      f"Commit: {recipes.current_commit()}; start: {source}", "",
      f"Machine: {records.cpu_model()}, {os.cpu_count()} cores; 1-minute "
      f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at "
      f"the end (shared with other jobs); {(time.time() - start) / 60:.1f} "
      "min.", "", "Data and training: `" + json.dumps(figures) + "`", "",
      "Columns as experiments/results/tasks_rules/rules.md."]
  rows_out = teacher_points + rows_out
  task_rules.write_record(rows_out, _OUT.value, header, name="student")
  with open(os.path.join(_OUT.value, "student.md")) as f:
    print(f.read())


if __name__ == "__main__":
  app.run(main)
