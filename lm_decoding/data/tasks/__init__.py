"""Tasks with exact answers: Sudoku, Countdown, two list tasks.

Each task is a frozen dataclass implementing `layout.Task` (a seeded
generator, the puzzle's key, a fixed-length [prompt | answer] layout over a
small vocabulary, exact metrics); `layout.make_splits` deals disjoint
splits. `make_task(name, **options)` builds one by name:

  sudoku4, sudoku6, sudoku9   `sudoku.SudokuTask` (difficulty: givens)
  countdown                   `countdown.CountdownTask` (3 and 4 numbers)
  permutation                 `permutation.PermutationTask` (closed-form
                              failure of one-step parallel decoding)
  sort                        `sort.SortTask` (its deterministic
                              counterpart: the input sorted)
"""

from __future__ import annotations

import dataclasses
import functools

from lm_decoding.checks import is_integer
from lm_decoding.data.tasks.countdown import CountdownTask
from lm_decoding.data.tasks.layout import (
    EMPTY_ID, FIRST_TASK_ID, SPLITS, Score, Split, Task, make_splits,
    score_rows, to_split)
from lm_decoding.data.tasks.permutation import PermutationTask
from lm_decoding.data.tasks.sort import SortTask
from lm_decoding.data.tasks.sudoku import SudokuTask

TASKS = {"sudoku4": functools.partial(SudokuTask, size=4),
         "sudoku6": functools.partial(SudokuTask, size=6),
         "sudoku9": functools.partial(SudokuTask, size=9),
         "countdown": CountdownTask,
         "permutation": PermutationTask,
         "sort": SortTask}


def make_task(name: str, **options) -> Task:
  """The task registered as `name`, with its dataclass `options`.

  Raises:
    ValueError: unknown name (listing TASKS), an unknown option, an option
      whose default is an integer given as another type (2.5, 3.0, True),
      or a bad option value (the task's own check).
  """
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; allowed: {sorted(TASKS)}")
  task = TASKS[name]
  for field in dataclasses.fields(getattr(task, "func", task)):
    if (is_integer(field.default) and field.name in options
        and not is_integer(options[field.name])):
      raise ValueError(f"task {name!r}: {field.name}="
                       f"{options[field.name]!r} must be an integer")
  try:
    return TASKS[name](**options)
  except TypeError as e:
    raise ValueError(f"task {name!r}: {e}") from e


__all__ = ["EMPTY_ID", "FIRST_TASK_ID", "SPLITS", "Score", "Split", "Task",
           "TASKS", "CountdownTask", "PermutationTask", "SortTask",
           "SudokuTask", "make_splits", "make_task", "score_rows", "to_split"]
