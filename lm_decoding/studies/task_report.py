"""Report of the exact-answer tasks: a Markdown table and two plots per task.

Rows are `task_scores.score_decoder` records with 'task' and 'model' (the
kind) added. `plot_accuracy_vs_nfe` draws exact match against NFE, one line
per (model, decoder) (AR decoders are single points at NFE = T);
`plot_by_difficulty` exact match against the difficulty bucket for each
decoder at its largest K. `markdown` is the table of every row.
"""

from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from lm_decoding.evaluation.report import markdown_table

COLUMNS = (
    ("model", "model", 0, "the model kind (AR, MDLM, BD3-LM; mdlm_from_ar: an MDLM adapted from the AR model), all one backbone"),
    ("decoder", "decoder", 0, "decoder/ordering (or rule)"),
    ("steps", "K", 0, "denoising steps of a parallel decoder (AR: none)"),
    ("exact", "exact", 3, "fraction of test problems solved exactly"),
    ("valid", "valid", 3, "fraction of well-formed answers (Sudoku: breaks no rule)"),
    ("token_accuracy", "token acc.", 3, "fraction of answer slots right"),
    ("nfe", "NFE", 0, "forward passes per batch (every row decodes together)"),
    ("ms_per_problem", "ms/problem", 2, "batch call time / problems, compile excluded"),
)


def markdown(rows: Sequence[dict]) -> str:
  """The table of `rows` (COLUMNS)."""
  return markdown_table(rows, COLUMNS)


def _series(rows):
  out = {}
  for r in rows:
    out.setdefault(f"{r['model']}: {r['decoder']}", []).append(r)
  return {k: sorted(v, key=lambda r: r["nfe"]) for k, v in out.items()}


def plot_accuracy_vs_nfe(rows: Sequence[dict], title: str, path: str) -> None:
  """Exact match against NFE (log scale), one line per model: decoder."""
  fig = Figure(figsize=(8, 5), layout="constrained")
  ax = fig.subplots()
  for label, points in _series(rows).items():
    ax.plot([p["nfe"] for p in points], [p["exact"] for p in points],
            marker="o", label=label)
  ax.set_xscale("log", base=2)
  _save(fig, ax, "NFE (forward passes)", title, path)


def plot_by_difficulty(rows: Sequence[dict], title: str, path: str,
                       difficulty: str) -> None:
  """Exact match per difficulty bucket ('exact@<d>' keys), one line per
  model: decoder at its largest NFE."""
  fig = Figure(figsize=(8, 5), layout="constrained")
  ax = fig.subplots()
  for label, points in _series(rows).items():
    row = points[-1]
    levels = sorted(int(k.split("@")[1]) for k in row if k.startswith("exact@"))
    ax.plot(levels, [row[f"exact@{d}"] for d in levels], marker="o",
            label=f"{label} (NFE {row['nfe']})")
  _save(fig, ax, difficulty, title, path)


def _save(fig, ax, xlabel: str, title: str, path: str) -> None:
  """Labels an exact-match plot and writes it to `path`."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel("exact match")
  ax.set_ylim(-0.02, 1.02)
  ax.set_title(title)
  ax.legend(fontsize=7, ncols=2)
  fig.savefig(path, dpi=110)
