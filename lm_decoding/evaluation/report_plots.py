"""The comparison's figures: the quality-cost frontier, the speed-up over the
baseline and quality against entropy (`report.write` draws them).

Each figure is a `matplotlib.figure.Figure` drawn by Agg on its own canvas:
nothing global (no pyplot state, no backend switch) changes when one is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import adjustText
import matplotlib
import matplotlib.ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lm_decoding.evaluation import frontier


def _series(rows):
  return list(dict.fromkeys(s for r in rows for s in r["series"]))


def _colors(labels):
  """{label: colour}: 20 distinct colours (tab20), so the 19 default series
  do not share one."""
  palette = matplotlib.colormaps["tab20"].colors
  return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _figure(**options) -> Figure:
  """A Figure drawn by Agg on its own canvas: nothing global (no pyplot
  state, no backend switch) changes when a report is drawn."""
  fig = Figure(**options)
  FigureCanvasAgg(fig)
  return fig


def _panels(keys, width=6.0, height=4.8):
  """A figure with one panel per (down, across) key: (T, B), or ((T,
  reference), B) for one row of panels per reference."""
  lengths = sorted({t for t, _ in keys})
  batches = sorted({b for _, b in keys})
  fig = _figure(figsize=(width * len(batches), height * len(lengths)),
                layout="constrained")
  axes = fig.subplots(len(lengths), len(batches), squeeze=False)
  return fig, {(t, b): axes[i][j] for i, t in enumerate(lengths)
               for j, b in enumerate(batches)}


def _plain_log_ticks(axis) -> None:
  """Labels a log axis at 1, 2 and 5 times each power of ten, written
  plainly (200, not 2 x 10^2), and no minor tick: the minor labels of a
  range under a decade overlap."""
  axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  axis.set_major_formatter(matplotlib.ticker.FuncFormatter(
      lambda value, _: f"{value:g}"))
  axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _by_panel(found: Sequence[frontier.Verdict], baseline: str) -> dict:
  """{((T, greedy, reference), B): verdict}: one row of panels per T and
  reference, AR sampling's first."""
  return {((v.reference.output_length, v.judged_against != baseline,
            v.judged_against), v.reference.batch_size): v for v in found}


def _title(key, baseline: str) -> str:
  (t, _, ref), b = key
  return f"T={t}, batch {b}" + ("" if ref == baseline else
                                f", greedy vs {ref}")


def plot_frontier(found: Sequence[frontier.Verdict],
                  all_points: Sequence[frontier.Point], baseline: str,
                  tolerance: frontier.Tolerance, path: str) -> None:
  """gen-PPL against ms per sequence, one panel per (T, B).

  Entropy is the colour (one scale for all panels); decoders outside the
  entropy tolerance are hollow (they cannot be on the front); the Pareto
  front is a step line; each point is annotated with its label and TPF;
  the dashed line is the gen-PPL tolerance above the panel's reference (the
  baseline, AR sampling; a second row of panels holds the greedy decoders
  against AR greedy).
  """
  by_key = _by_panel(found, baseline)
  fig, axes = _panels(by_key, width=7.5, height=5.5)
  entropies = [p.entropy for p in all_points]
  norm = matplotlib.colors.Normalize(min(entropies), max(entropies))
  cmap = matplotlib.colormaps["viridis"]
  for key, ax in axes.items():
    v = by_key.get(key)
    if v is None:
      ax.set_visible(False)
      continue
    ref = v.reference
    for p in v.group:
      kept = tolerance.keeps_entropy(p, ref)
      ax.scatter([p.ms], [p.gen_ppl], s=60, zorder=3,
                 marker="*" if p is ref else "o",
                 facecolors=cmap(norm(p.entropy)) if kept else "none",
                 edgecolors=cmap(norm(p.entropy)), linewidths=1.5)
    if len(v.front) > 1:  # one point draws no line (the star marks AR)
      xs = [p.ms for p in v.front]
      ys = [p.gen_ppl for p in v.front]
      ax.step(xs, ys, where="post", color="black", alpha=0.6,
              label="Pareto front")
    ax.axhline(ref.gen_ppl * (1 + tolerance.gen_ppl), ls="--", color="grey",
               label=f"{ref.label} gen-PPL +{tolerance.gen_ppl:.0%}")
    ax.set(xscale="log", yscale="log",
           xlabel="ms per sequence (min of runs; log)",
           ylabel="gen-PPL under the evaluator (log)",
           title=_title(key, baseline))
    for axis in (ax.xaxis, ax.yaxis):
      _plain_log_ticks(axis)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    # Labels moved apart once the axes are final (adjustText), each joined
    # to its point by a line; only drawn points are labelled (one at a
    # non-finite or non-positive value, which log axes cannot show, would
    # move every label of the panel to NaN).
    drawn = [p for p in v.group
             if all(0 < x < math.inf for x in (p.ms, p.gen_ppl))]
    adjustText.adjust_text(
        [ax.text(p.ms, p.gen_ppl, f"{p.label}\nTPF {p.tpf:.2f}", fontsize=6)
         for p in drawn], x=[p.ms for p in drawn],
        y=[p.gen_ppl for p in drawn], expand=(1.3, 1.6), ax=ax,
        arrowprops=dict(arrowstyle="-", color="grey", lw=0.5))
  fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap),
               ax=list(axes.values()), label="entropy, nats (hollow: more "
               f"than {tolerance.entropy:.2f} below the panel's reference)")
  fig.savefig(path, dpi=110, bbox_inches="tight")


def plot_speedup(found: Sequence[frontier.Verdict],
                 all_points: Sequence[frontier.Point], baseline: str,
                 tolerance: frontier.Tolerance, path: str) -> None:
  """Speed-up over the reference per decoder as bars, one panel per (T, B)
  and reference (AR sampling; AR greedy for the greedy decoders).

  Bars of decoders within the quality tolerance are filled, the others
  hatched; the line at 1 is the reference.
  """
  by_key = _by_panel(found, baseline)
  labels = list(dict.fromkeys(p.label for p in all_points))
  fig, axes = _panels(by_key, width=6.5, height=0.3 * len(labels) + 1.5)
  for key, ax in axes.items():
    v = by_key.get(key)
    if v is None:
      ax.set_visible(False)
      continue
    pts = {p.label: p for p in v.group}
    shown = [label for label in labels if label in pts]
    for y, label in enumerate(shown):
      p = pts[label]
      good = tolerance.within(p, v.reference)
      ax.barh(y, v.speedup(p), color="tab:green" if good else "white",
              edgecolor="tab:green" if good else "tab:red",
              hatch=None if good else "//")
      ax.annotate(f"{v.speedup(p):.2f}x", (v.speedup(p), y), fontsize=7,
                  xytext=(3, -3), textcoords="offset points")
    ax.axvline(1.0, color="black", lw=1)
    speedups = [v.speedup(pts[x]) for x in shown]
    ax.set_yticks(range(len(shown)), shown, fontsize=7)
    ax.invert_yaxis()
    # Bars start at 0, off a log axis: both limits are set after the scale,
    # or the left one collapses towards 0 and every bar looks full.
    ax.set(xscale="log", xlabel=f"{v.judged_against} ms / decoder ms "
           "(log; > 1 is faster)", title=_title(key, baseline))
    ax.set_xlim(0.5 * min(1.0, *speedups), 1.6 * max(1.0, *speedups))
    ax.grid(True, axis="x", which="both", alpha=0.3)
  fig.suptitle(f"Speed-up over each panel's reference; filled: within the "
               f"quality tolerance of it (gen-PPL at most {tolerance.gen_ppl:.0%} "
               f"above, entropy at most {tolerance.entropy:.2f} nats below), "
               "hatched: outside it", fontsize=9)
  fig.savefig(path, dpi=110, bbox_inches="tight")


def plot_quality(rows: Sequence[dict], human: dict, path: str) -> None:
  """gen-PPL against entropy at the scored batch size, marker size ~ T.

  Degenerate, repetitive decoders sit at the left (low entropy) however low
  their gen-PPL; real text (the human references) is marked for scale.
  """
  scored = [r for r in rows if r.get("gen_ppl") is not None]
  fig = _figure(figsize=(11, 5.5))
  ax = fig.subplots()
  for label, color in _colors(_series(scored)).items():
    pts = sorted((r["output_length"], r["entropy"], r["gen_ppl"])
                 for r in scored if label in r["series"])
    ax.plot([p[1] for p in pts], [p[2] for p in pts], "-", alpha=0.3,
            color=color)
    ax.scatter([p[1] for p in pts], [p[2] for p in pts],
               s=[10 + p[0] / 3 for p in pts], color=color, label=label)
  ax.scatter([human["entropy"]], [human["gen_ppl"]], marker="*", s=250,
             c="black", label=f"human text ({human['length']:.0f} tokens)")
  ax.set(yscale="log", xlabel="entropy of a sample's tokens (nats; higher = "
         "less repetitive)", ylabel="gen-PPL under the evaluator (log)",
         title=f"quality, batch {scored[0]['batch_size'] if scored else '?'}"
         " (marker size ~ T)")
  ax.grid(True, which="both", alpha=0.3)
  # Beside the axes, where it hides no point.
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
