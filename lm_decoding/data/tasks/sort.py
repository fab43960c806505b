"""A deterministic list task: output the input list sorted.

The prompt is n items drawn with repetition from an alphabet of m; the one
right answer is the same items in ascending order (the "sort" list
operation of ParallelBench, Kang et al. 2025, arXiv:2510.04767). It is the
permutation task's counterpart: there every ordering of the input is right,
so the answer cells depend strongly on each other and a step that commits
two of them from the exact marginals fails with the closed-form probability
of `permutation.success_probability`; here the answer is a function of the
prompt, so given the prompt every cell's exact conditional is a point mass
and the cells are independent. A model that has learned the task can commit
all n cells in one forward pass without losing exact match.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from lm_decoding.data.tasks.layout import ListTask, Score


@dataclasses.dataclass(frozen=True)
class Items:
  """items: the prompt, n ints in [0, m) (repeats allowed); answer: the
  items sorted ascending."""

  items: tuple[int, ...]
  answer: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SortTask(ListTask):
  """The sort task as a `layout.Task` in the list tasks' layout
  (`layout.ListTask`, as `permutation.PermutationTask`). Difficulty: the
  number of distinct items in the prompt (1 to min(n, m)).

  Attributes:
    num_items: n >= 2.
    alphabet: m >= 2 items to draw from (with repetition).
  """

  def __post_init__(self):
    if self.num_items < 2 or self.alphabet < 2:
      raise ValueError(f"num_items={self.num_items}, alphabet="
                       f"{self.alphabet} must both be >= 2")

  name = "sort"

  def generate(self, rng: np.random.Generator) -> Items:
    items = tuple(int(i) for i in rng.integers(0, self.alphabet,
                                               self.num_items))
    return Items(items=items, answer=tuple(sorted(items)))

  def score(self, problem: Items, answer) -> Score:
    """exact: the sorted list; valid: a rearrangement of the input (each
    item as often as in the prompt, as the permutation task's valid);
    token_accuracy: slots equal to the sorted list's."""
    answer = np.asarray(answer).tolist()
    wanted = self.item_ids(problem.answer).tolist()
    good = sum(a == w for a, w in zip(answer, wanted))
    return Score(exact=good == self.num_items,
                 valid=Counter(answer) == Counter(wanted),
                 token_accuracy=good / self.num_items)

  def difficulty(self, problem: Items) -> int:
    return len(set(problem.items))
