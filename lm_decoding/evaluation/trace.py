"""Reading a denoising trace: which position was committed at which step.

`IterativeDecoder.denoise(..., trace=True)` returns the sequences after every
step, `states` int32[K, B, L]. `commit_steps` turns them into the step at which
each position took its final token, and `plot_commit_order` draws one row's
order of commits (the picture of a parallel decoder: left-to-right blocks for
LLaDA, a few wide steps for threshold decoding, scattered steps for MDLM).
"""

from __future__ import annotations

import numpy as np

from lm_decoding.special_tokens import MASK_ID


def commit_steps(initial_BxL, states_KxBxL, mask_id: int = MASK_ID):
  """int32[B, L]: the step after which each position holds its final token.

  Positions that were never masked (prompt, padding) get -1. A position
  re-masked and committed again (ReMDM) counts its last commit.

  Args:
    initial_BxL: int[B, L] the sequences before the first step.
    states_KxBxL: int[K, B, L] the sequences after each step.
    mask_id: the MASK id.
  Raises:
    ValueError: shapes that do not match, or a position still masked after
      the last step.
  """
  initial = np.asarray(initial_BxL)
  states = np.asarray(states_KxBxL)
  if states.ndim != 3 or states.shape[1:] != initial.shape:
    raise ValueError(f"states_KxBxL has shape {states.shape}; expected "
                     f"[K, {initial.shape[0]}, {initial.shape[1]}]")
  if np.any(states[-1] == mask_id):
    raise ValueError("a position is still masked after the last step")
  masked = np.concatenate([initial[None], states]) == mask_id  # [K + 1, B, L]
  ever = masked.any(0)
  # The last step k at which the position was masked before it: commit = k.
  last_masked = masked.shape[0] - 1 - np.argmax(masked[::-1], axis=0)
  return np.where(ever, last_masked, -1).astype(np.int32)


def plot_commit_order(steps_L, labels=None, title: str = ""):
  """A matplotlib Figure: one bar per position, its height the commit step.

  Args:
    steps_L: int[L] one row of `commit_steps` (-1 positions are skipped).
    labels: optional L strings (e.g. the decoded pieces) for the x axis.
    title: figure title.
  """
  # A Figure of its own, not pyplot's: no backend chosen, nothing global.
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

  steps_L = np.asarray(steps_L)
  shown = np.flatnonzero(steps_L >= 0)
  fig = Figure(figsize=(max(4.0, 0.25 * shown.size), 3.0))
  ax = fig.subplots()
  ax.bar(np.arange(shown.size), steps_L[shown] + 1, color="tab:blue")
  ax.set_xlabel("generated position")
  ax.set_ylabel("committed at step")
  if labels is not None:
    ax.set_xticks(np.arange(shown.size))
    ax.set_xticklabels([labels[i] for i in shown], rotation=90, fontsize=7)
  ax.set_title(title)
  fig.tight_layout()
  return fig
