"""The answer layout shared by every exact-answer task, and its splits.

A problem is encoded as one fixed-length row [prompt (P tokens) | answer (T
tokens)] over the task's own small vocabulary, whose ids start after the
reserved ones (`special_tokens.RESERVED_IDS`): id FIRST_TASK_ID is BLANK (an
empty Sudoku cell, an unused slot), the task's symbols follow. P and T are
fixed per task, so a batch needs no padding and every decoder is called with
prompt_lengths = P and output_length = T.

Splits: `make_splits` draws problems from one seeded stream, drops any whose
key (the puzzle: Sudoku givens, Countdown numbers and target, the list to
permute) was drawn before, and deals them to test, valid and train in that
order, so no puzzle is in two splits and the test split does not change when
the train split grows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Protocol, Sequence

import numpy as np

from lm_decoding.special_tokens import RESERVED_IDS

FIRST_TASK_ID = len(RESERVED_IDS)
EMPTY_ID = FIRST_TASK_ID  # an empty cell or an unused answer slot (not the CTC blank)
SPLITS = ("train", "valid", "test")


@dataclasses.dataclass(frozen=True)
class Score:
  """One answer's exact metrics.

  Attributes:
    exact: the answer solves the problem (Sudoku: equals the unique
      solution; Countdown: a valid expression whose value is the target;
      permutation: a permutation of the input).
    valid: the answer is well formed (Sudoku: breaks no rule; Countdown: a
      well-formed expression over the given numbers; permutation: no item
      repeated, every item from the input).
    token_accuracy: fraction of the T answer slots that are right (Sudoku:
      cells equal to the solution; Countdown: tokens equal to the reference
      expression's; permutation: items from the input not repeated earlier).
  """

  exact: bool
  valid: bool
  token_accuracy: float


class Task(Protocol):
  """An exact-answer task: generator, layout and metrics."""

  name: str
  prompt_length: int   # P
  answer_length: int   # T
  vocab_size: int      # V, reserved ids included

  def generate(self, rng: np.random.Generator) -> Any:
    """One random problem (deterministic given the generator's state)."""

  def key(self, problem: Any) -> Hashable:
    """The puzzle's identity: two problems with one key are one puzzle."""

  def encode(self, problem: Any) -> tuple[np.ndarray, np.ndarray]:
    """(prompt int32[P], reference answer int32[T])."""

  def score(self, problem: Any, answer: np.ndarray) -> Score:
    """Scores answer int[T] (any ids, reserved ones included)."""

  def difficulty(self, problem: Any) -> int:
    """The difficulty bucket (Sudoku: givens; Countdown: numbers; ...)."""


@dataclasses.dataclass(frozen=True)
class ListTask:
  """The layout the list tasks share (`permutation.PermutationTask`,
  `sort.SortTask`): the prompt is n items from an alphabet of m, item i is
  token FIRST_TASK_ID + 1 + i (FIRST_TASK_ID is BLANK, unused here), the
  answer n slots; a problem has `items` (the prompt's, ints in [0, m)) and
  `answer` (the reference's), and its key is its items. Each task adds its
  checks, name, generator, metrics and difficulty.

  Attributes:
    num_items: n.
    alphabet: m.
  """

  num_items: int = 8
  alphabet: int = 16

  @property
  def prompt_length(self) -> int:
    return self.num_items

  answer_length = prompt_length

  @property
  def vocab_size(self) -> int:
    return FIRST_TASK_ID + 1 + self.alphabet

  def item_ids(self, items) -> np.ndarray:
    """int32 token ids of items (ints in [0, m))."""
    return np.asarray(items, np.int32) + FIRST_TASK_ID + 1

  def key(self, problem) -> tuple[int, ...]:
    return problem.items

  def encode(self, problem) -> tuple[np.ndarray, np.ndarray]:
    return self.item_ids(problem.items), self.item_ids(problem.answer)


@dataclasses.dataclass(frozen=True)
class Split:
  """Problems of one split and their rows.

  Attributes:
    problems: the problems, in generation order.
    prompts: int32[R, P].
    answers: int32[R, T] reference answers.
    difficulty: int32[R].
  """

  problems: tuple
  prompts: np.ndarray
  answers: np.ndarray
  difficulty: np.ndarray

  @property
  def rows(self) -> np.ndarray:
    """int32[R, P + T] training rows [prompt | answer]."""
    return np.concatenate([self.prompts, self.answers], axis=1)


def to_split(task: Task, problems: Sequence[Any]) -> Split:
  """Encodes `problems` (at least one) into a `Split`."""
  if not problems:
    raise ValueError("problems must hold at least one problem")
  pairs = [task.encode(p) for p in problems]
  return Split(problems=tuple(problems),
               prompts=np.stack([p for p, _ in pairs]).astype(np.int32),
               answers=np.stack([a for _, a in pairs]).astype(np.int32),
               difficulty=np.array([task.difficulty(p) for p in problems],
                                   np.int32))


def make_splits(task: Task, sizes: dict[str, int], seed: int,
                max_draws: int | None = None) -> dict[str, Split]:
  """Disjoint train / valid / test splits of distinct puzzles.

  Args:
    task: the task.
    sizes: {split: number of problems >= 1} for each of SPLITS.
    seed: seed of the one generator stream (numpy PCG64).
    max_draws: give up after this many draws (default 20 x the total).
  Returns:
    {split: Split}.
  Raises:
    ValueError: a size missing or below 1, a negative seed, or fewer
      distinct puzzles than asked within max_draws.
  """
  for split in SPLITS:
    size = sizes.get(split)
    if not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f"sizes[{split!r}]={size!r} must be an integer >= 1")
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed={seed!r} must be an integer >= 0")
  total = sum(sizes[s] for s in SPLITS)
  max_draws = max_draws or 20 * total
  rng = np.random.default_rng(seed)
  seen, problems = set(), []
  for _ in range(max_draws):
    if len(problems) == total:
      break
    problem = task.generate(rng)
    key = task.key(problem)
    if key not in seen:
      seen.add(key)
      problems.append(problem)
  if len(problems) < total:
    raise ValueError(f"task {task.name}: only {len(problems)} distinct "
                     f"puzzles in {max_draws} draws; asked for {total} "
                     f"(sizes={dict(sizes)})")
  out, start = {}, 0
  for split in ("test", "valid", "train"):
    out[split] = to_split(task, problems[start:start + sizes[split]])
    start += sizes[split]
  return out


def score_rows(task: Task, problems: Sequence[Any], answers: np.ndarray
               ) -> dict[str, np.ndarray]:
  """Per-problem metrics of decoded answers int[R, T].

  Returns:
    {'exact': bool[R], 'valid': bool[R], 'token_accuracy': float64[R]}.
  Raises:
    ValueError: answers not of shape [len(problems), T].
  """
  answers = np.asarray(answers)
  if answers.shape != (len(problems), task.answer_length):
    raise ValueError(f"answers must have shape ({len(problems)}, "
                     f"{task.answer_length}); got {answers.shape}")
  scores = [task.score(p, a) for p, a in zip(problems, answers)]
  return {"exact": np.array([s.exact for s in scores]),
          "valid": np.array([s.valid for s in scores]),
          "token_accuracy": np.array([s.token_accuracy for s in scores])}
