"""Accuracy against parallelism: one curve per commit rule, and its AUP.

A self-paced commit rule (threshold tau, Fast-dLLM's factor, the entropy
bound) trades tokens per forward (TPF = T / NFE) for quality. Its curve is
its settings' (TPF, accuracy) points; accuracy is whatever the study scores
exactly: exact match on a task with one answer, agreement with AR greedy's
tokens (in %) for free text decoded greedily.

AUP, accuracy under parallelism (d3LLM, Qian et al. 2026, arXiv
2601.07568), sums a curve into one number that rewards parallelism only
while accuracy holds. With the points sorted by TPF rho_1 < ... < rho_m,
accuracies y_i in percent, the best accuracy y_max of all the curves
compared and a penalty alpha (3 by default):

  W(y) = min(exp(-alpha (1 - y / y_max)), 1)
  AUP  = rho_1 y_1 + sum_{i >= 2} (rho_i - rho_{i-1})
                       (W(y_i) y_i + W(y_{i-1}) y_{i-1}) / 2

over the points whose accuracy is at most `drop` (5 points) below y_1, the
accuracy at the lowest TPF. A rule at one token per forward and y_max scores
y_max; each extra token per forward at y_max adds y_max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def aup(tpf: Sequence[float], accuracy: Sequence[float], best: float,
        alpha: float = 3.0, drop: float = 5.0) -> float:
  """d3LLM's AUP of one curve (see the module docstring).

  Args:
    tpf: tokens per forward of each point, > 0.
    accuracy: its accuracy in percent, [0, 100].
    best: y_max, the best accuracy of every curve compared, > 0.
    alpha: the penalty of accuracy below `best`, >= 0.
    drop: points more than this many percentage points below the accuracy
      at the lowest TPF are left out, >= 0.
  Returns:
    The area, in percent x tokens per forward.
  Raises:
    ValueError: no point, lengths that differ, a TPF <= 0, an accuracy
      outside [0, 100], best <= 0, alpha or drop < 0.
  """
  if not tpf or len(tpf) != len(accuracy):
    raise ValueError(f"tpf and accuracy must be non-empty and of one length; "
                     f"got {len(tpf)} and {len(accuracy)}")
  if any(not 0 < r < math.inf for r in tpf):
    raise ValueError(f"tpf={list(tpf)} must all be in (0, inf)")
  if any(not 0 <= y <= 100 for y in accuracy):
    raise ValueError(f"accuracy={list(accuracy)} must all be in [0, 100] "
                     "(percent)")
  if not 0 < best <= 100 or alpha < 0 or drop < 0:
    raise ValueError(f"best={best!r} must be in (0, 100], alpha={alpha!r} "
                     f"and drop={drop!r} >= 0")
  points = sorted(zip(tpf, accuracy))
  floor = points[0][1] - drop
  points = [(r, y) for r, y in points if y >= floor]

  def weighted(y: float) -> float:
    return min(math.exp(-alpha * (1 - y / best)), 1.0) * y

  area = points[0][0] * points[0][1]
  for (r0, y0), (r1, y1) in zip(points, points[1:]):
    area += (r1 - r0) * (weighted(y1) + weighted(y0)) / 2
  return area


def curves(rows: Sequence[dict], accuracy_key: str
           ) -> dict[tuple[str, str], list[tuple[float, float, dict]]]:
  """{(model, rule): [(TPF, accuracy %, row)] by TPF} of a comparison's rows.

  Args:
    rows: rows of `comparison.run` (or their results.csv) whose decoder
      label reads "<member> <rule> ..." (configs/rules.py) and that carry
      `accuracy_key` (a fraction in [0, 1], e.g. "greedy_agreement");
      others are left out.
    accuracy_key: the column scored as accuracy.
  """
  out: dict[tuple[str, str], list] = {}
  for r in rows:
    value = r.get(accuracy_key)
    if value in (None, ""):
      continue
    member, rule = str(r["decoder"]).split()[:2]
    tpf = int(r["output_length"]) / int(r["nfe"])
    out.setdefault((member, rule), []).append((tpf, 100 * float(value), r))
  return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def per_call_histogram(results: Sequence) -> list[int]:
  """How many tokens each decoding step committed, over decodes of one row
  each.

  counts[n] is the number of steps that committed n tokens
  (`DecodeResult.committed`). A step that commits none is not told apart
  from a step not run (both hold 0), so neither is counted and counts[0]
  is 0: exact for the rules that commit at least one token a step (AR, the
  threshold rule), not for e.g. 'ancestral', whose steps may commit none.
  Steps are not calls: a decode's NFE also counts its prefill and a cached
  block decoder's block-end writes, and not the steps that reuse logits,
  so tokens / NFE (TPF) is not this histogram's mean. For a
  draft-and-verify decoder whose stats hold `accept_counts`
  (`self_speculative`, `speculative`), counts[n] is the number of
  verifying rounds that accepted n draft tokens (its acceptance-length
  histogram; counts[0] counts).

  Args:
    results: `DecodeResult`s, each of the rows decoded alone (B = 1), all
      of one decoder.
  Returns:
    counts[0..n_max], ints.
  Raises:
    ValueError: a step whose net commit is negative (a re-masking rule:
      no bin holds it).
  """
  if "accept_counts" in results[0].stats:
    return np.sum([np.asarray(r.stats["accept_counts"]).sum(0)
                   for r in results], 0).astype(int).tolist()
  for i, r in enumerate(results):
    committed_KxB = np.asarray(r.committed)
    if (committed_KxB < 0).any():
      step, row = np.argwhere(committed_KxB < 0)[0]
      raise ValueError(f"step {step} of result {i} committed "
                       f"{int(committed_KxB[step, row])} tokens net "
                       "(re-masking): no bin holds it")
  steps = np.concatenate([np.asarray(r.committed).ravel() for r in results])
  return np.bincount(steps[steps > 0]).tolist()
