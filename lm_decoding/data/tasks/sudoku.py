"""Sudoku: seeded generator of uniquely solvable puzzles, solver, metrics.

An n x n grid (n = box_rows * box_cols: 4 = 2 x 2, 6 = 2 x 3, 9 = 3 x 3) is
a tuple of n^2 ints in row-major order, 0 for an empty cell. A puzzle's
difficulty is its number of givens (fewer givens: harder), drawn uniformly
from [min_givens, max_givens]; the generator fills a random complete grid,
then empties cells in random order as long as the solution stays unique
(checked by `count_solutions`), until the drawn number of givens is reached
or no further cell can be emptied (its difficulty is then the givens left).

Layout (`layout`): prompt = the n^2 cells (BLANK or a digit), answer = the
n^2 cells of the solution; digit d is token FIRST_TASK_ID + d.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from lm_decoding.data.tasks.layout import EMPTY_ID, FIRST_TASK_ID, Score

BOXES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}


@dataclasses.dataclass(frozen=True)
class Puzzle:
  """givens and solution: tuples of n^2 ints (givens: 0 = empty)."""

  givens: tuple[int, ...]
  solution: tuple[int, ...]


def _units(size: int) -> list[list[int]]:
  """The rows, columns and boxes of a size x size grid, as cell indices."""
  box_rows, box_cols = BOXES[size]
  rows = [[r * size + c for c in range(size)] for r in range(size)]
  cols = [[r * size + c for r in range(size)] for c in range(size)]
  boxes = [[(br + r) * size + bc + c for r in range(box_rows)
            for c in range(box_cols)]
           for br in range(0, size, box_rows) for bc in range(0, size, box_cols)]
  return rows + cols + boxes


def _peers(size: int) -> list[set[int]]:
  peers = [set() for _ in range(size * size)]
  for unit in _units(size):
    for cell in unit:
      peers[cell].update(unit)
  for cell, p in enumerate(peers):
    p.discard(cell)
  return peers


def _check_grid(grid, size: int) -> list[int]:
  if size not in BOXES:
    raise ValueError(f"size={size!r} must be one of {sorted(BOXES)}")
  grid = [int(v) for v in grid]
  if len(grid) != size * size or not all(0 <= v <= size for v in grid):
    raise ValueError(f"grid must hold {size * size} values in [0, {size}]; "
                     f"got {len(grid)} values from {min(grid, default=0)} to "
                     f"{max(grid, default=0)}")
  return grid


def _search(grid: list[int], size: int, limit: int, rng=None):
  """Solutions of `grid` (up to `limit`), by backtracking on the cell with
  the fewest candidates; candidate order shuffled by `rng` if given."""
  peers = _peers(size)
  solutions = []

  def candidates(cell):
    used = {grid[p] for p in peers[cell]}
    return [v for v in range(1, size + 1) if v not in used]

  def solve():
    best, best_values = None, None
    for cell in range(size * size):
      if grid[cell] == 0:
        values = candidates(cell)
        if best is None or len(values) < len(best_values):
          best, best_values = cell, values
          if len(values) <= 1:
            break
    if best is None:
      solutions.append(tuple(grid))
      return
    if rng is not None:
      best_values = list(rng.permutation(best_values))
    for value in best_values:
      grid[best] = int(value)
      solve()
      if len(solutions) >= limit:
        break
    grid[best] = 0

  if is_consistent(grid, size):
    solve()
  return solutions


def is_consistent(grid, size: int) -> bool:
  """No digit twice in a row, column or box (empty cells ignored)."""
  grid = _check_grid(grid, size)
  for unit in _units(size):
    digits = [grid[c] for c in unit if grid[c]]
    if len(digits) != len(set(digits)):
      return False
  return True


def count_solutions(grid, size: int, limit: int = 2) -> int:
  """Number of solutions of `grid`, counted up to `limit` (2 decides
  uniqueness).

  Raises:
    ValueError: size not in BOXES, or grid not size^2 values in [0, size].
  """
  return len(_search(_check_grid(grid, size), size, limit))


def solve(grid, size: int) -> tuple[int, ...]:
  """The unique solution of `grid`.

  Raises:
    ValueError: as `count_solutions`, or a grid with no or several
      solutions.
  """
  solutions = _search(_check_grid(grid, size), size, limit=2)
  if len(solutions) != 1:
    raise ValueError(f"grid has {'no' if not solutions else 'several'} "
                     "solutions; a puzzle needs exactly one")
  return solutions[0]


def is_solved(grid, size: int) -> bool:
  """A complete grid breaking no rule (every unit holds 1..size once)."""
  grid = _check_grid(grid, size)
  return all(grid) and is_consistent(grid, size)


def generate(rng: np.random.Generator, size: int, min_givens: int,
             max_givens: int) -> Puzzle:
  """One puzzle with a unique solution (see the module docstring)."""
  solution = _search([0] * (size * size), size, limit=1, rng=rng)[0]
  target = int(rng.integers(min_givens, max_givens + 1))
  grid = list(solution)
  for cell in rng.permutation(size * size):
    if sum(1 for v in grid if v) <= target:
      break
    kept, grid[cell] = grid[cell], 0
    if len(_search(list(grid), size, limit=2)) != 1:
      grid[cell] = kept
  return Puzzle(givens=tuple(grid), solution=tuple(solution))


@dataclasses.dataclass(frozen=True)
class SudokuTask:
  """Sudoku of one size as a `layout.Task` (see the module docstring).

  Attributes:
    size: n, one of BOXES.
    min_givens, max_givens: the givens' range, 1 <= min <= max < n^2.
  """

  size: int = 4
  min_givens: int = 4
  max_givens: int = 10

  def __post_init__(self):
    if self.size not in BOXES:
      raise ValueError(f"size={self.size!r} must be one of {sorted(BOXES)}")
    cells = self.size * self.size
    if not 1 <= self.min_givens <= self.max_givens < cells:
      raise ValueError(f"min_givens={self.min_givens}, max_givens="
                       f"{self.max_givens} must satisfy 1 <= min <= max < "
                       f"{cells}")

  @property
  def name(self) -> str:
    return f"sudoku{self.size}"

  @property
  def prompt_length(self) -> int:
    return self.size * self.size

  answer_length = prompt_length

  @property
  def vocab_size(self) -> int:
    return FIRST_TASK_ID + 1 + self.size

  def generate(self, rng: np.random.Generator) -> Puzzle:
    return generate(rng, self.size, self.min_givens, self.max_givens)

  def key(self, puzzle: Puzzle):
    return puzzle.givens

  def encode(self, puzzle: Puzzle):
    prompt = np.array([FIRST_TASK_ID + v if v else EMPTY_ID
                       for v in puzzle.givens], np.int32)
    return prompt, np.array(puzzle.solution, np.int32) + FIRST_TASK_ID

  def digits(self, answer) -> list[int]:
    """Token ids -> digits (0 for an id that is not a digit)."""
    values = np.asarray(answer, np.int64) - FIRST_TASK_ID
    return [int(v) if 1 <= v <= self.size else 0 for v in values]

  def score(self, puzzle: Puzzle, answer) -> Score:
    grid = self.digits(answer)
    return Score(exact=tuple(grid) == puzzle.solution,
                 valid=is_solved(grid, self.size),
                 token_accuracy=float(np.mean(
                     np.array(grid) == np.array(puzzle.solution))))

  def difficulty(self, puzzle: Puzzle) -> int:
    return sum(1 for v in puzzle.givens if v)


def read_puzzles(path: str | pathlib.Path, size: int) -> list[Puzzle]:
  """Puzzles from a text file: one per line, size^2 characters, a digit
  1..size for a given and '.' or '0' for an empty cell; blank lines and
  lines starting with '#' are skipped. Each is solved by `solve`.

  Raises:
    ValueError: a missing file, no puzzle, a line of the wrong length or
      with another character (naming the line), or a puzzle without a
      unique solution.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"puzzle file {str(path)!r} does not exist")
  allowed = set(".0") | {str(d) for d in range(1, size + 1)}
  puzzles = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    if len(line) != size * size or not set(line) <= allowed:
      raise ValueError(
          f"{path}:{number}: a {size}x{size} puzzle is {size * size} "
          f"characters from '.0' and 1..{size}; got {line[:40]!r}")
    givens = tuple(0 if ch in ".0" else int(ch) for ch in line)
    try:
      puzzles.append(Puzzle(givens=givens, solution=solve(givens, size)))
    except ValueError as e:
      raise ValueError(f"{path}:{number}: {e}") from e
  if not puzzles:
    raise ValueError(f"puzzle file {str(path)!r} holds no puzzle")
  return puzzles
