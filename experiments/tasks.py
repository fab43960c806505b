r"""Tasks with exact answers: AR, MDLM and BD3-LM, every decoder, exact match.

  python experiments/tasks.py --config=configs/tasks.py --workdir=/tmp/tasks \
      [--out=experiments/results/tasks]

For each task of `config.tasks` (`lm_decoding.data.tasks`): disjoint seeded
splits (or, with data.puzzle_file, a Sudoku test split read from a file and
kept out of train and valid); one model per kind of `config.kinds` on one
backbone (`config.model`) and one budget (`config.train.budget_s` seconds of
training steps): the shipped one of lm_decoding/pretrained/tasks when its
recipe matches (`training.task_training.shipped_or_trained`), else (or with
--retrain) trained or resumed by `train.train` under {workdir}/{task}/{kind}
(curves in its metrics.jsonl); the parent of an adapted model always trains there,
where its child starts from. Each adapted
model of `config.adapt` ('mdlm:ar': an MDLM started from the task's AR
model, `config.train.adapt_budget_s` seconds) under
{workdir}/{task}/{kind}_from_{parent}; then every
applicable decoder (`studies.task_scores.decoder_grid`) decodes the whole
test split in one batch. Writes to --out (default --workdir, the run's
folder):

  results.csv                    every row: task, model, decoder, K, exact,
                                 valid, token accuracy, NFE, ms/problem,
                                 exact per difficulty
  report.md                      the table per task, the training summary,
                                 the permutation task's closed form
  accuracy_vs_nfe_{task}.png     exact match against NFE per decoder
  accuracy_by_difficulty_{task}.png
  curves/{task}_{kind}.jsonl     each model's training curve (metrics.jsonl)

Bad options (unknown task or kind, sizes, a puzzle file in the wrong
format) end the run in its first seconds with one line,
`tasks: error: ...`, before any model is built.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from lm_decoding.data import tasks
from lm_decoding.data.tasks import permutation, sudoku
from lm_decoding.checks import is_count
from lm_decoding.decoding.base import bind
from lm_decoding.evaluation import records, report
from lm_decoding.studies import task_report, task_scores
from lm_decoding.models import make_logits_fn
from lm_decoding.training import task_training

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tasks.py",
                                          "the task config file")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run's folder: outputs and the models trained here "
    "({workdir}/{task}/{kind}).", required=True)
_RETRAIN = flags.DEFINE_bool(
    "retrain", False, "Train (or resume) every model under --workdir, "
    "ignoring the shipped task models of lm_decoding/pretrained/tasks.")
_OUT = flags.DEFINE_string("out", "", "The record's folder (e.g. "
                           "experiments/results/tasks); '' = --workdir.")


def _names(value: str, allowed, what: str) -> list[str]:
  names = [n.strip() for n in value.split(",") if n.strip()]
  unknown = [n for n in names if n not in allowed]
  if not names or unknown:
    raise ValueError(f"{what}={value!r}: unknown {unknown}; allowed: "
                     f"{sorted(allowed)}")
  return names


def adaptations(config) -> list[tuple[str, str]]:
  """config.adapt as [(kind, parent kind)].

  Raises:
    ValueError: a pair not 'kind:parent' of task_training.KINDS.
  """
  pairs = []
  for pair in (p.strip() for p in config.adapt.split(",") if p.strip()):
    kind, _, parent = pair.partition(":")
    if kind not in task_training.KINDS or parent not in task_training.KINDS:
      raise ValueError(f"adapt={config.adapt!r}: {pair!r} is not "
                       f"'kind:parent' with both in {task_training.KINDS}")
    pairs.append((kind, parent))
  return pairs


def check(config) -> list[tuple[tasks.Task, list | None]]:
  """Every option, before anything is built: [(task, file puzzles or None)].

  Raises:
    ValueError: naming the option and its allowed values.
  """
  names = _names(config.tasks, tasks.TASKS, "tasks")
  _names(config.kinds, task_training.KINDS, "kinds")
  for key in ("train_size", "valid_size", "test_size"):
    if not is_count(config.data[key]):
      raise ValueError(f"data.{key}={config.data[key]!r} must be an integer "
                       ">= 1")
  for key in ("batch_size", "num_steps", "eval_every", "block_length"):
    if not is_count(config.train[key]):
      raise ValueError(f"train.{key}={config.train[key]!r} must be an "
                       "integer >= 1")
  for key in ("budget_s", "adapt_budget_s"):
    if not config.train[key] > 0:
      raise ValueError(f"train.{key}={config.train[key]!r} must be > 0")
  adaptations(config)
  steps = [s.strip() for s in str(config.eval.steps).split(",")]
  if not all(s.isdigit() and int(s) >= 1 for s in steps):
    raise ValueError(f"eval.steps={config.eval.steps!r} must be integers "
                     ">= 1, comma-separated")
  out, block = [], config.train.block_length
  for name in names:
    task = tasks.make_task(name, **task_training.task_options(config, name))
    for length, what in ((task.prompt_length, "P"), (task.answer_length, "T")):
      if length % block:
        raise ValueError(f"train.block_length={block} must divide {what}="
                         f"{length} of task {name}")
    task_training.model_config(task, "ar", config)
    puzzles = None
    if config.data.puzzle_file:
      if not isinstance(task, tasks.SudokuTask):
        raise ValueError(f"data.puzzle_file is for Sudoku tasks; tasks="
                         f"{config.tasks!r} holds {name}")
      puzzles = sudoku.read_puzzles(config.data.puzzle_file, task.size)
    out.append((task, puzzles))
  return out


def check_parents(config, plan, workdir: str) -> None:
  """Every adapted model's parent is trained in this run (in config.kinds)
  or was trained before under {workdir}/{task}/{parent}.

  Raises:
    ValueError: naming the missing parent.
  """
  kinds = _names(config.kinds, task_training.KINDS, "kinds")
  for task, _ in plan:
    for _, parent in adaptations(config):
      folder = os.path.join(workdir, task.name, parent, "checkpoints")
      if parent not in kinds and not os.path.isdir(folder):
        raise ValueError(f"adapt={config.adapt!r}: the parent {parent!r} is "
                         f"not in kinds={config.kinds!r} and {folder} does "
                         "not exist")


def make_splits(config, task, puzzles) -> dict[str, tasks.Split]:
  """Generated splits; file puzzles replace test and leave train/valid."""
  sizes = dict(train=config.data.train_size, valid=config.data.valid_size,
               test=config.data.test_size)
  splits = tasks.make_splits(task, sizes, config.seed)
  if puzzles is None:
    return splits
  held = {task.key(p) for p in puzzles}
  for split in ("train", "valid"):
    kept = [p for p in splits[split].problems if task.key(p) not in held]
    splits[split] = tasks.to_split(task, kept)
  splits["test"] = tasks.to_split(task, puzzles)
  return splits


def closed_form_rows(task, rows) -> list[dict]:
  """For the permutation task: the valid rate of the MDLM model under
  MDLM's ancestral sampler (temperature 1) beside its closed form
  (`permutation.ancestral_success_probability`) and 3 standard errors."""
  out = []
  for r in rows:
    if r["decoder"] != "mdlm" or r["model"] != "mdlm":
      continue
    p = permutation.ancestral_success_probability(task.answer_length,
                                                  r["steps"])
    se = (p * (1 - p) / r["problems"]) ** 0.5
    out.append(dict(steps=r["steps"], measured=r["valid"], closed_form=p,
                    standard_error=se,
                    within_3_se=abs(r["valid"] - p) <= 3 * se))
  return out


def run_task(config, task, puzzles, workdir: str, out_dir: str
             ) -> tuple[list, list]:
  splits = make_splits(config, task, puzzles)
  print(f"{task.name}: " + ", ".join(f"{s} {len(splits[s].problems)}"
                                     for s in tasks.SPLITS), flush=True)
  rows, summaries = [], []
  steps = [int(s) for s in str(config.eval.steps).split(",")]
  adapt_config = ml_collections.ConfigDict(config.to_dict())
  adapt_config.train.budget_s = config.train.adapt_budget_s
  parents = {parent for _, parent in adaptations(config)}
  models = [(kind, kind, None)
            for kind in _names(config.kinds, task_training.KINDS, "kinds")]
  models += [(f"{kind}_from_{parent}", kind,
              os.path.join(workdir, task.name, parent))
             for kind, parent in adaptations(config)]
  for name, kind, init_from in models:
    model_dir = os.path.join(workdir, task.name, name)
    if init_from is None:
      params, summary, curve = task_training.shipped_or_trained(
          task, kind, splits, config, model_dir, skip_shipped=(
              "--retrain" if _RETRAIN.value else "the parent of an adapted "
              "model" if kind in parents else ""))
    else:
      params, summary = task_training.train_task_model(
          task, kind, splits, adapt_config, model_dir, init_from=init_from)
      summary["source"] = f"trained in {model_dir}"
      curve = task_training.read_curve(model_dir)
    print(f"{task.name}/{name}: {summary['steps']} steps, valid loss "
          f"{summary['valid_loss']:.3f} ({summary['source']})", flush=True)
    summaries.append(dict(summary, task=task.name, kind=name))
    os.makedirs(os.path.join(out_dir, "curves"), exist_ok=True)
    with open(os.path.join(out_dir, "curves", f"{task.name}_{name}.jsonl"),
              "w") as f:
      f.writelines(json.dumps(record) + "\n" for record in curve)
    bound = bind(make_logits_fn(task_training.model_config(
        task, kind, config)), params)
    for entry in task_scores.decoder_grid(
        kind, task.answer_length, steps, config.train.block_length,
        config.eval.num_beams, config.eval.threshold, config.eval.factor):
      row = dict(task=task.name, model=name, **task_scores.score_decoder(
          task, splits["test"], entry, bound, config.seed))
      print(json.dumps(row), flush=True)
      rows.append(row)
  return rows, summaries


def _parent(summary: dict) -> str:
  """An adapted model's parent: its workdir, steps and seconds; else —."""
  if "init_from" not in summary:
    return "—"
  return (f"{os.path.basename(summary['init_from'])} "
          f"({summary['parent_steps']} steps, "
          f"{summary['parent_train_s']:.0f} s)")


def write_results(config, all_rows, summaries, closed, out_dir, seconds):
  os.makedirs(out_dir, exist_ok=True)
  records.write_csv(all_rows, os.path.join(out_dir, "results.csv"))
  lines = ["# Exact-answer tasks", "",
           f"Command: `{records.command()}`", "",
           f"Budget per model: {config.train.budget_s:.0f} s of training "
           f"steps (batch {config.train.batch_size}); backbone "
           f"d_model {config.model.d_model}, {config.model.num_layers} "
           f"layers; run took {seconds / 60:.1f} min.", "",
           "## Models", "",
           "| task | model | params | steps | train s | valid loss | from "
           "| source |",
           "|---|---|---|---|---|---|---|---|"]
  lines += [f"| {s['task']} | {s['kind']} | {s['num_params']} | {s['steps']}"
            f" | {s['train_s']:.0f} | {s['valid_loss']:.3f} | {_parent(s)} "
            f"| {s['source']} |" for s in summaries]
  for name in dict.fromkeys(r["task"] for r in all_rows):
    rows = [r for r in all_rows if r["task"] == name]
    lines += ["", f"## {name}", "", task_report.markdown(rows)]
    task_report.plot_accuracy_vs_nfe(
        rows, name, os.path.join(out_dir, f"accuracy_vs_nfe_{name}.png"))
    task_report.plot_by_difficulty(
        rows, name, os.path.join(out_dir, f"accuracy_by_difficulty_{name}.png"),
        "givens" if name.startswith("sudoku") else "difficulty")
  if closed:
    lines += ["", "## permutation: MDLM's ancestral sampler against the closed form",
              "", "| K | measured valid | closed form | 3 SE | within |",
              "|---|---|---|---|---|"]
    lines += [f"| {c['steps']} | {c['measured']:.3f} | {c['closed_form']:.4f}"
              f" | {3 * c['standard_error']:.4f} | {c['within_3_se']} |"
              for c in closed]
  lines += ["", "Columns:", "", report.definitions(task_report.COLUMNS)]
  with open(os.path.join(out_dir, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)  # orbax logs every checkpoint
  config, workdir = _CONFIG.value, _WORKDIR.value
  start = time.time()
  try:
    plan = check(config)
    check_parents(config, plan, workdir)
  except ValueError as e:
    sys.exit(f"tasks: error: {e}")
  out_dir = _OUT.value or workdir
  all_rows, summaries, closed = [], [], []
  for task, puzzles in plan:
    rows, summary = run_task(config, task, puzzles, workdir, out_dir)
    all_rows += rows
    summaries += summary
    if task.name == "permutation":
      closed = closed_form_rows(task, rows)
  write_results(config, all_rows, summaries, closed, out_dir,
                time.time() - start)


if __name__ == "__main__":
  app.run(main)
