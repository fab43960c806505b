"""Countdown: reach a target from 3 or 4 numbers with + - * /.

Each number must be used exactly once; every intermediate value must be a
positive integer (division only when exact), as in the Countdown game and
the task of Gandhi et al. 2024 ("Stream of Search") used by Ye et al. 2024
(arXiv:2410.14157). The generator draws the numbers, then a random
expression tree over all of them with random operators, and keeps it if
every value is a positive integer and the result is <= max_target: the
target is its value, the expression the reference answer. Many expressions
may reach one target: an answer is scored by evaluating it, not by
comparing it with the reference.

Layout: prompt = [4 number slots (BLANK when 3 numbers), BLANK x 3,
target] (P = 8); answer = the expression in postfix (reverse Polish)
notation, 2c - 1 tokens for c numbers, then BLANK to T = 8. Values 0..
max_target are one token each (number v is token FIRST_TASK_ID + 1 + v),
then the four operators.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from lm_decoding.data.tasks.layout import EMPTY_ID, FIRST_TASK_ID, Score

OPERATORS = ("+", "-", "*", "/")
PROMPT_LENGTH = ANSWER_LENGTH = 8


@dataclasses.dataclass(frozen=True)
class Problem:
  """numbers (in prompt order), target, and a reference postfix expression
  (numbers as ints, operators as strings)."""

  numbers: tuple[int, ...]
  target: int
  expression: tuple


def apply(op: str, a: int, b: int) -> int | None:
  """a op b if it is a positive integer, else None."""
  if op == "+":
    return a + b
  if op == "*":
    return a * b
  if op == "-":
    return a - b if a > b else None
  return a // b if b and a % b == 0 else None


def evaluate(expression: Sequence) -> int | None:
  """The value of a postfix expression, or None if it is not well formed
  (a stack underflow, leftovers, an unknown symbol) or a value is not a
  positive integer."""
  stack = []
  for symbol in expression:
    if isinstance(symbol, str):
      if symbol not in OPERATORS or len(stack) < 2:
        return None
      b, a = stack.pop(), stack.pop()
      value = apply(symbol, a, b)
      if value is None:
        return None
      stack.append(value)
    else:
      stack.append(int(symbol))
  return stack[0] if len(stack) == 1 else None


def _tree(rng, numbers: list[int]):
  """A random postfix expression over `numbers` (all used), or None."""
  if len(numbers) == 1:
    return [numbers[0]]
  cut = int(rng.integers(1, len(numbers)))
  left, right = _tree(rng, numbers[:cut]), _tree(rng, numbers[cut:])
  if left is None or right is None:
    return None
  expression = left + right + [OPERATORS[int(rng.integers(4))]]
  return expression if evaluate(expression) is not None else None


@dataclasses.dataclass(frozen=True)
class CountdownTask:
  """Countdown as a `layout.Task` (module docstring). Difficulty: the count
  of numbers.

  Attributes:
    counts: the numbers per problem, each 3 or 4, drawn uniformly.
    max_number: numbers are drawn from [1, max_number] (with repeats).
    max_target: targets are in [1, max_target].
  """

  counts: tuple[int, ...] = (3, 4)
  max_number: int = 12
  max_target: int = 60

  def __post_init__(self):
    if not self.counts or not set(self.counts) <= {3, 4}:
      raise ValueError(f"counts={self.counts!r} must be a non-empty tuple "
                       "of 3s and 4s")
    if not 2 <= self.max_number <= self.max_target:
      raise ValueError(f"max_number={self.max_number}, max_target="
                       f"{self.max_target} must satisfy 2 <= max_number <= "
                       "max_target")

  name = "countdown"
  prompt_length = PROMPT_LENGTH
  answer_length = ANSWER_LENGTH

  @property
  def vocab_size(self) -> int:
    return FIRST_TASK_ID + 1 + self.max_target + 1 + len(OPERATORS)

  def token(self, symbol) -> int:
    if isinstance(symbol, str):
      return FIRST_TASK_ID + 2 + self.max_target + OPERATORS.index(symbol)
    return FIRST_TASK_ID + 1 + int(symbol)

  def symbols(self, answer) -> list | None:
    """Answer ids -> postfix symbols up to the first BLANK, or None when a
    non-BLANK follows a BLANK or an id is neither number nor operator."""
    ids = [int(t) for t in np.asarray(answer)]
    length = ids.index(EMPTY_ID) if EMPTY_ID in ids else len(ids)
    if any(t != EMPTY_ID for t in ids[length:]):
      return None
    out = []
    for t in ids[:length]:
      value = t - FIRST_TASK_ID - 1
      if 0 <= value <= self.max_target:
        out.append(value)
      elif 0 <= value - self.max_target - 1 < len(OPERATORS):
        out.append(OPERATORS[value - self.max_target - 1])
      else:
        return None
    return out

  def generate(self, rng: np.random.Generator) -> Problem:
    count = int(rng.choice(self.counts))
    while True:
      numbers = [int(v) for v in rng.integers(1, self.max_number + 1, count)]
      expression = _tree(rng, list(rng.permutation(numbers)))
      if expression is not None and evaluate(expression) <= self.max_target:
        return Problem(numbers=tuple(numbers), target=evaluate(expression),
                       expression=tuple(expression))

  def key(self, problem: Problem):
    return tuple(sorted(problem.numbers)), problem.target

  def encode(self, problem: Problem):
    slots = [self.token(v) for v in problem.numbers]
    prompt = slots + [EMPTY_ID] * (PROMPT_LENGTH - 1 - len(slots)) + [
        self.token(problem.target)]
    answer = [self.token(s) for s in problem.expression]
    answer += [EMPTY_ID] * (ANSWER_LENGTH - len(answer))
    return np.array(prompt, np.int32), np.array(answer, np.int32)

  def score(self, problem: Problem, answer) -> Score:
    symbols = self.symbols(answer)
    value = None if symbols is None else evaluate(symbols)
    used = sorted(s for s in symbols or [] if not isinstance(s, str))
    valid = value is not None and used == sorted(problem.numbers)
    _, reference = self.encode(problem)
    return Score(exact=valid and value == problem.target, valid=valid,
                 token_accuracy=float(np.mean(np.asarray(answer)
                                              == reference)))

  def difficulty(self, problem: Problem) -> int:
    return len(problem.numbers)
