"""A strongly dependent list task: output any permutation of the input.

The prompt is n distinct items drawn from an alphabet of m; every ordering
of them is a right answer, and the training answer is a uniformly random
one (the "shuffle" list operation of ParallelBench, Kang et al. 2025,
arXiv:2510.04767). The answer's tokens depend strongly on each other: each
item must appear exactly once, wherever it appears.

Closed form of parallel decoding's failure. Under the data distribution,
given the prompt and a set of committed answer slots holding distinct input
items, the exact conditional marginal at every masked slot is uniform over
the r items not yet committed (by the symmetry of a uniform permutation).
A decoder that commits s slots in one step draws them independently from
those marginals, so they are distinct with probability
r (r - 1) ... (r - s + 1) / r^s; if they are, the state is again a partial
permutation with r - s items left; if not, a committed repeat is never
repaired. Committing the n slots in steps of s_1, ..., s_K:

    P(valid) = prod_k  r_k! / ((r_k - s_k)! r_k^{s_k}),   r_k = n - s_1 - ... - s_{k-1}

One step (K = 1): n! / n^n (n = 8: 0.0024). One slot per step (K = n): 1.
This holds for any order of the slots (random or by confidence: every
marginal is the same uniform), for draws at temperature 1; a greedy decoder
commits the same argmax item at every slot of a step.

MDLM's ancestral sampler (log-linear schedule) draws the step sizes too:
with k steps left, each of the r masked slots is unmasked with probability
1 / k, so s ~ Binomial(r, 1 / k), and

    P(r, k) = sum_s Binom(s; r, 1/k) r! / ((r - s)! r^s) P(r - s, k - 1),

P(0, k) = 1 (`ancestral_success_probability`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from lm_decoding.data.tasks.layout import ListTask, Score


def success_probability(n: int, step_sizes: Sequence[int]) -> float:
  """P(valid) of committing n slots in steps of `step_sizes` from the exact
  conditional marginals (module docstring).

  Raises:
    ValueError: n < 1, a step size < 0, or sizes not summing to n.
  """
  if n < 1 or any(s < 0 for s in step_sizes) or sum(step_sizes) != n:
    raise ValueError(f"step_sizes={list(step_sizes)} must be counts >= 0 "
                     f"summing to n={n} >= 1")
  p, left = 1.0, n
  for s in step_sizes:
    p *= math.perm(left, s) / left ** s
    left -= s
  return p


def ancestral_success_probability(n: int, steps: int) -> float:
  """P(valid) of MDLM's ancestral sampler with `steps` steps on n slots
  from the exact marginals (module docstring).

  Raises:
    ValueError: n or steps < 1.
  """
  if n < 1 or steps < 1:
    raise ValueError(f"n={n} and steps={steps} must be >= 1")
  table = {0: 1.0}  # P(r, k) for the k done so far, by r
  for k in range(1, steps + 1):
    table = {r: sum(math.comb(r, s) * (1 / k) ** s * (1 - 1 / k) ** (r - s)
                    * math.perm(r, s) / r ** s * table[r - s]
                    for s in range(r + 1) if r - s in table)
             for r in range(n + 1)}
  return table[n]


@dataclasses.dataclass(frozen=True)
class Items:
  """items: the prompt, n distinct ints in [0, m); answer: a permutation."""

  items: tuple[int, ...]
  answer: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PermutationTask(ListTask):
  """The shuffle task as a `layout.Task` in the list tasks' layout
  (`layout.ListTask`). Difficulty: n (one bucket).

  Attributes:
    num_items: n >= 2.
    alphabet: m >= n items to draw from.
  """

  def __post_init__(self):
    if not 2 <= self.num_items <= self.alphabet:
      raise ValueError(f"num_items={self.num_items}, alphabet="
                       f"{self.alphabet} must satisfy 2 <= num_items <= "
                       "alphabet")

  name = "permutation"

  def generate(self, rng: np.random.Generator) -> Items:
    items = rng.choice(self.alphabet, self.num_items, replace=False)
    return Items(items=tuple(int(i) for i in items),
                 answer=tuple(int(i) for i in rng.permutation(items)))

  def score(self, problem: Items, answer) -> Score:
    wanted = set(self.item_ids(problem.items).tolist())
    seen, good = set(), 0
    for token in np.asarray(answer).tolist():
      good += token in wanted and token not in seen
      seen.add(token)
    valid = good == self.num_items
    return Score(exact=valid, valid=valid,
                 token_accuracy=good / self.num_items)

  def difficulty(self, problem: Items) -> int:
    return self.num_items
