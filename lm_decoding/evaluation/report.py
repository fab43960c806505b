"""Writes the comparison: results.csv, report.md and its figures.

report.md opens with the verdict (`frontier`: per batch size the quality-cost
Pareto front and the fastest decoder within the tolerance of AR sampling),
the frontier figure (gen-PPL against ms per sequence, entropy as colour,
TPF per point) and the speed-up of every decoder over the baseline; then
the setup and the tables. It defines every column it shows, under its
table, so it reads on its own. Speeds are compared on minimum times (on a
shared machine interference only ever adds time; the median and the spread
are shown beside them).

The crossover is read off the measured rows: where a decoder's median
latency is below the baseline's minimum (`compare.baseline`, cached AR by
default) at the same B and T, and the break-even step count K* = (baseline ms per
sequence) / (ms per full forward pass over prompt + T positions, from the
full-pass row with the most NFE at that B and T): a decoder making fewer than
K* full passes beats the baseline there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lm_decoding.evaluation import frontier, records
from lm_decoding.evaluation.comparison import SPREAD_FLAG, Comparison

WORDS_SHOWN = 60  # words of each sample in report.md
TITLE = "Sequential vs parallel decoding"


def _forward_tokens(row: dict) -> str:
  return ", ".join(f"{r} {n:,}" for r, n in row["forward_tokens"].items())


def _spread(row: dict) -> str:
  return f"{row['spread']:.0%}" + (" !" if row["noisy"] else "")


# (key or formatter, header, digits, definition), one tuple per table.
COST_COLUMNS = (
    ("decoder", "decoder", 0, "the entry's label with the settings used at "
     "this T (K steps, block length, tau threshold, cache, ...)"),
    ("models", "models", 0, "role=member: which trained model each role of "
     "the decoder ran"),
    ("batch_size", "B", 0, "rows decoded together"),
    ("output_length", "T", 0, "output length: tokens generated per row"),
    ("nfe", "NFE", 0, "forward calls of all models for the batch (a prefill "
     "or a cache refill counts one)"),
    (_forward_tokens, "fwd tokens", 0, "token positions the model of each "
     "role processed, summed over its calls (B x positions per call: a full "
     "pass costs B x (P + T), a cached AR step B, a dual-cache step B x "
     "block length)"),
    ("ms_min", "ms min", 1, "fastest of the timed runs of the batch call, "
     "ms; every row finishes with the batch, so this is each sequence's "
     "latency"),
    ("ms_median", "ms median", 1, "median of the timed runs, ms"),
    (_spread, "spread", 0, f"interquartile range of the timed runs / median; "
     f"'!' above {SPREAD_FLAG:.0%} (the machine was busy: trust ms min)"),
    ("ms_per_token", "ms/token", 2, "ms min / T"),
    ("compile_s", "compile s", 2, "XLA compile time of the call, s (paid "
     "once per shape, not in the times above)"),
)
PREDICTED_COLUMNS = (
    ("predicted_ms", "pred ms", 1, "the cost model's latency of this row's "
     "forward calls (`cost_model.comparison_row_s`: roofline per call plus "
     "a fixed overhead, on the profile named in the header); '—' for call "
     "shapes it does not cost (speculative verification, cached blocks)"),
    ("measured_over_predicted", "meas/pred", 2, "ms min / pred ms"),
)
EOS_COLUMNS = (
    ("decoder", "decoder", 0, "as above"),
    ("batch_size", "B", 0, "as above"),
    ("output_length", "T", 0, "as above"),
    ("eos_tokens_per_row", "real tok/row", 1, "real tokens per row: up to "
     "and including the row's first EOS (T if none)"),
    ("real_tokens_per_s", "real tok/s", 0, "real tokens of all rows / EOS "
     "mode's minimum time, tokens/s, the same formula for every decoder"),
    ("eos_timed_apart", "timed apart", 0, "True when EOS mode made other "
     "forward calls than fixed length (e.g. an early exit) and was timed "
     "itself; else its time is the fixed-length time"),
    ("empty", "empty", 0, "rows whose first token is EOS"),
)
QUALITY_COLUMNS = (
    ("decoder", "decoder", 0, "as above"),
    ("output_length", "T", 0, "as above"),
    ("gen_ppl", "gen-PPL", 1, "perplexity of the EOS-mode samples (real "
     "tokens, given their prompt) under the evaluator model, which is never "
     "decoded; lower reads as more fluent, but only beside entropy"),
    ("entropy", "entropy", 2, "unigram entropy of each sample's tokens, nats, "
     "averaged over samples: repetitive, degenerate text has low entropy "
     "and a flattering gen-PPL"),
    ("rep_4", "rep-4", 3, "fraction of each sample's 4-grams repeating an "
     "earlier one, averaged"),
    ("distinct_2", "distinct-2", 3, "unique bigrams / bigrams over all "
     "samples"),
    ("judged_against", "judged against", 0, "the row the verdict holds "
     "this one's quality to: AR sampling (compare.baseline), or AR greedy "
     "(compare.greedy_baseline) for rows decoding at temperature 0"),
    ("greedy_agreement", "agree w/ greedy", 3, "fraction of the fixed-length "
     "tokens [B, T] equal to AR greedy's on the same prompts, position by "
     "position (greedy rows; '—' for samplers)"),
    ("self_correction", "self-corr", 3, "acceptances that replaced an "
     "earlier accepted token at the same position / acceptances, pooled over "
     "the samples (uniform_eb's stats 'revised' / 'accepted'); '—' for "
     "decoders that do not count it"),
    ("all_eos", "all-EOS", 0, "rows that are EOS at every position in fixed "
     "length mode"),
    ("empty", "empty", 0, "rows whose first token is EOS"),
)
CACHE_COLUMNS = (
    ("decoder", "decoder", 0, "as above"),
    ("batch_size", "B", 0, "as above"),
    ("output_length", "T", 0, "as above"),
    ("context", "context", 0, "the cache context that ran, by its record "
     "name (`lm_decoding/decoding/contexts.py`: prefix and dual are "
     "Fast-dLLM's approximate caches, blocks and sub_blocks BD3-LM's, "
     "canvas_prefix the uniform canvas's)"),
    ("speedup", "speed-up", 2, "ms min of the same decoder with "
     "kv_cache=none / this row's ms min ('—' when that decoder is not an "
     "entry)"),
    ("max_logit_error", "max logit error", 3, "largest |logit| difference "
     "between the cached window and an uncached pass over the same tokens, "
     "over all steps (measured at the largest B, untimed)"),
    ("agreement", "agreement", 3, "fraction of generated tokens equal to the "
     "kv_cache=none decoder's (same prompts and key, fixed length, largest "
     "B)"),
)

OMISSION_NOTE = (
    "Omission rate (reference content words missing from the output) is not "
    "reported for LM continuation: it measures overlap with one particular "
    "human continuation. On the Austen test split, with 64-token references, "
    "a second human continuation of the same paragraph omits 93% of the "
    "reference's content words and one of another paragraph 96%, so the "
    "column cannot separate decoders (and too few test paragraphs are long "
    "enough for longer references). It is kept for translation, where the "
    "reference is the target (`quality.omission_rate`).")


def _value(row: dict, key) -> object:
  return key(row) if callable(key) else row.get(key)


def _fmt(value, digits: int) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "—"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def markdown_table(rows: Sequence[dict], columns=COST_COLUMNS) -> str:
  """A Markdown table of `rows` with `columns` (see the *_COLUMNS tuples)."""
  lines = ["| " + " | ".join(c[1] for c in columns) + " |",
           "|" + "---|" * len(columns)]
  for r in rows:
    lines.append("| " + " | ".join(_fmt(_value(r, key), digits)
                                   for key, _, digits, _ in columns) + " |")
  return "\n".join(lines)


def definitions(columns) -> str:
  """One bullet per column: '**header**: definition'."""
  return "\n".join(f"- **{header}**: {text}"
                   for _, header, _, text in columns)


def _index(rows):
  return {(r["decoder"], r["batch_size"], r["output_length"]): r for r in rows}


def _baseline_rows(rows, baseline):
  return {(r["batch_size"], r["output_length"]): r for r in rows
          if baseline in r["series"]}


def crossover(rows: Sequence[dict], baseline: str
              ) -> dict[tuple[str, int], list[int]]:
  """{(decoder, B): output lengths T where it is faster than the baseline},
  for every row that is not the baseline's.

  Faster means its median time is below the baseline's minimum: a margin
  that noise between two decoders doing the same work rarely crosses.
  """
  base = _baseline_rows(rows, baseline)
  out = {}
  for r in rows:
    ref = base.get((r["batch_size"], r["output_length"]))
    if ref is None or ref is r:
      continue
    wins = out.setdefault((r["series"][0], r["batch_size"]), [])
    if r["ms_median"] < ref["ms_min"]:
      wins.append(r["output_length"])
  return out


def crossover_sentence(rows: Sequence[dict], baseline: str) -> str:
  """The crossover in one sentence."""
  wins = {k: ts for k, ts in crossover(rows, baseline).items() if ts}
  lengths = sorted({r["output_length"] for r in rows})
  batches = sorted({r["batch_size"] for r in rows})
  if not wins:
    return (f"No decoder was faster than {baseline} (its median time below "
            f"{baseline}'s minimum) at any "
            f"measured output length T in {lengths} and batch size B in "
            f"{batches}.")
  parts = [f"{label} at B={b} for T = {', '.join(map(str, ts))}"
           for (label, b), ts in wins.items()]
  return (f"Faster than {baseline} (median time below {baseline}'s "
          "minimum): " + "; ".join(parts)
          + f"; every other decoder, B in {batches} and T in {lengths}: "
          "never.")


def break_even_steps(rows: Sequence[dict], baseline: str
                     ) -> dict[tuple[int, int], float]:
  """{(B, T): K*}: full forward passes costing one baseline decode of T.

  K* = baseline ms min / (ms min / NFE) of the full-pass row (`full_pass`:
  every call over B x (P + T) positions) with the most NFE at that B, T.
  """
  base = _baseline_rows(rows, baseline)
  out = {}
  for (b, t), ref in base.items():
    full = [r for r in rows if r.get("full_pass") and r["batch_size"] == b
            and r["output_length"] == t and r is not ref]
    if full:
      most = max(full, key=lambda r: r["nfe"])
      out[b, t] = ref["ms_min"] / (most["ms_min"] / most["nfe"])
  return out


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


def _by_panel(found: Sequence[frontier.Verdict], baseline: str) -> dict:
  """{((T, greedy, reference), B): verdict}: one row of panels per T and
  reference, AR sampling's first."""
  return {((v.output_length, v.judged_against != baseline, v.judged_against),
           v.batch_size): v for v in found}


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
      ax.annotate(f"{p.label}\nTPF {p.tpf:.2f}", (p.ms, p.gen_ppl),
                  fontsize=6, xytext=(4, 3), textcoords="offset points")
    if v.front:
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
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
  fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap),
               ax=list(axes.values()), label="entropy, nats (hollow: more "
               f"than {tolerance.entropy:.2f} below the panel's reference)")
  fig.savefig(path, dpi=110)


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
  fig.savefig(path, dpi=110)


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
  fig.savefig(path, dpi=110)


def _speedups(rows: Sequence[dict]) -> list[dict]:
  by_key = _index(rows)
  out = []
  for r in rows:
    if not r["cached"]:
      continue
    ref = by_key.get((r["reference"], r["batch_size"], r["output_length"]))
    out.append(dict(r, speedup=None if ref is None
                    else ref["ms_min"] / r["ms_min"]))
  return out


def _clip(text: str, words: int = WORDS_SHOWN) -> str:
  parts = text.replace("\n", " ").split()
  if len(parts) <= words:
    return " ".join(parts) or "(empty)"
  return " ".join(parts[:words]) + f" … (+{len(parts) - words} words)"


def _samples(comparison: Comparison) -> list[str]:
  if not comparison.samples:
    return []
  t = max(t for _, t in comparison.samples)
  lines = [f"EOS-mode continuations at T={t} (largest batch), the first "
           f"{WORDS_SHOWN} words of each:", ""]
  for i, prompt in enumerate(comparison.prompts):
    lines += [f"**Prompt {i + 1}:** {_clip(prompt)}", ""]
    for (label, length), texts in comparison.samples.items():
      if length == t and i < len(texts):
        lines.append(f"- *{label}*: {_clip(texts[i])}")
    lines.append("")
  return lines


def predicted_rows(rows: Sequence[dict],
                   predict_ms: Callable[[dict], float | None]) -> list[dict]:
  """The rows with a prediction, their "ms_min" the predicted ms."""
  out = []
  for r in rows:
    ms = predict_ms(r)
    if ms is not None:
      out.append(dict(r, ms_min=ms))
  return out


def _with_predictions(rows, predict_ms):
  out = []
  for r in rows:
    ms = predict_ms(r)
    out.append(dict(r, predicted_ms=ms, measured_over_predicted=(
        None if ms is None else r["ms_min"] / ms)))
  return out


def write(comparison: Comparison, header: str, baseline: str,
          workdir: str, tolerance: frontier.Tolerance = frontier.Tolerance(),
          predict_ms: Callable[[dict], float | None] | None = None,
          elsewhere: Mapping[str, Callable[[dict], float | None]] | None = None
          ) -> dict[str, str]:
  """Writes results.csv, report.md, frontier.png, latency.png, quality.png
  and frontier_<name>.png per entry of `elsewhere`.

  report.md opens with the verdict (`frontier.summarize`) and the frontier
  and speed-up figures, then `header` and the tables.

  Args:
    comparison: the measured comparison.
    header: Markdown of the setup (device, models, grid), put under the
      verdict and its figures.
    baseline: the label the verdict and the crossover compare against.
    workdir: the output folder.
    tolerance: the quality tolerance of the verdict.
    predict_ms: a row's predicted ms (or None), e.g. from
      `cost_model.comparison_row_s`; when given, the cost table and the CSV
      get `PREDICTED_COLUMNS`.
    elsewhere: {hardware name: a row's predicted ms or None}: the verdict
      and the frontier again with those latencies (`predicted_rows`), e.g.
      `cost_model.comparison_row_ms` on a published profile.
  Returns:
    {kind: path} of the written files.
  Raises:
    ValueError: the baseline has no scored row (or no prediction).
  """
  rows = sorted(comparison.rows,
                key=lambda r: (r["output_length"], r["batch_size"]))
  cost_columns = COST_COLUMNS
  if predict_ms is not None:
    rows = _with_predictions(rows, predict_ms)
    cost_columns = COST_COLUMNS + PREDICTED_COLUMNS
  os.makedirs(workdir, exist_ok=True)
  paths = {k: os.path.join(workdir, f) for k, f in (
      ("csv", "results.csv"), ("report", "report.md"),
      ("frontier", "frontier.png"), ("latency", "latency.png"),
      ("quality", "quality.png"))}
  summary = frontier.summarize(rows, baseline, tolerance)
  records.write_csv(rows, paths["csv"])
  plot_frontier(summary.verdicts, summary.points, baseline, tolerance,
                paths["frontier"])
  plot_speedup(summary.verdicts, summary.points, baseline, tolerance,
               paths["latency"])
  plot_quality(rows, comparison.human, paths["quality"])
  scored = [r for r in rows if r.get("gen_ppl") is not None]
  noisy = [r for r in rows if r["noisy"]]
  lines = [f"# {TITLE}", "", "## Verdict", "",
           *[f"- {line}" for line in summary.lines], "",
           "![frontier](frontier.png)", "",
           "Each panel: gen-PPL of a decoder's samples against its ms per "
           "sequence, entropy as colour (hollow: below the entropy "
           "tolerance), the Pareto front as a step line, TPF = T / NFE "
           "(tokens per forward call) beside each point. Quality is "
           "scored on the largest batch's samples only: speculative "
           "sampling and prompt lookup sample the AR model's own "
           "distribution with other random draws, so their gap to the "
           "baseline's gen-PPL and entropy is sampling noise alone and "
           "shows its size.", "",
           "![speed-up over the baseline](latency.png)", "",
           "## Setup", "", header, "",
           "## Cost, fixed length", "",
           "Every decoder emits exactly T tokens (EOS ignored), so every row "
           "decodes the same amount of text.", "",
           markdown_table(rows, cost_columns), "", definitions(cost_columns),
           ""]
  if noisy:
    lines += [f"Noisy rows (spread above {SPREAD_FLAG:.0%}): "
              + "; ".join(f"{r['decoder']} B={r['batch_size']} "
                          f"T={r['output_length']}" for r in noisy), ""]
  if comparison.merged:
    lines += ["Entries that are the same decoder at some T ran once there:",
              ""]
    lines += [f"- T={t}: row '{label}' stands for " + ", ".join(
        f"'{s}'" for s in series) for t, label, series in comparison.merged]
    lines.append("")
  lines += ["## Crossover", "", crossover_sentence(rows, baseline), "",
            f"Break-even K* (a decoder making fewer than K* full forward "
            f"passes beats {baseline} there):", "", "| B | T | K* |",
            "|---|---|---|"]
  lines += [f"| {b} | {t} | {k:.1f} |"
            for (b, t), k in sorted(break_even_steps(rows, baseline).items())]
  lines += ["", "- **K\\***: " + baseline + " ms min / (ms min / NFE of the "
            "row whose every call is a full pass over B x (P + T) positions, "
            "the one with the most NFE at that B and T)", ""]
  lines += ["## EOS mode", "",
            "The same decoders with EOS ending a row (what a reader gets).",
            "", markdown_table(rows, EOS_COLUMNS), "",
            definitions(EOS_COLUMNS), ""]
  cached = _speedups(rows)
  if cached:
    lines += ["## KV caches against recomputation", "",
              "Decoders with a KV cache (kv_cache other than none) against "
              "the same decoder recomputing every pass.", "",
              markdown_table(cached, CACHE_COLUMNS), "",
              definitions(CACHE_COLUMNS), ""]
  lines += [f"## Quality (B={scored[0]['batch_size'] if scored else '—'}, "
            "EOS mode)", "", markdown_table(scored, QUALITY_COLUMNS), "",
            definitions(QUALITY_COLUMNS),
            f"- human text: the held-out continuations of the same prompts "
            f"({comparison.human['length']:.0f} tokens on average) score "
            f"gen-PPL {comparison.human['gen_ppl']:.1f} at entropy "
            f"{comparison.human['entropy']:.2f}", "", OMISSION_NOTE, ""]
  lines += ["## Samples", ""] + _samples(comparison)
  if elsewhere:
    lines += ["## The frontier predicted on other hardware", "",
              "The cost model (`cost_model.comparison_row_s`: roofline per "
              "call plus a fixed overhead, the models' shapes and dtype as "
              "measured here) costs each row's measured forward calls on a "
              "published profile; quality and TPF are the measured ones. "
              "Rows whose calls it does not cost (speculative verification, "
              "cached blocks, BD3-LM) are left out.", ""]
  for name, predict in (elsewhere or {}).items():
    predicted = predicted_rows(rows, predict)
    found = frontier.summarize(predicted, baseline, tolerance)
    kind = f"frontier_{name}"
    paths[kind] = os.path.join(workdir, f"{kind}.png")
    plot_frontier(found.verdicts, found.points, baseline, tolerance,
                  paths[kind])
    left_out = sorted({r["decoder"] for r in rows} - {r["decoder"]
                                                      for r in predicted})
    lines += [f"### {name}", "", *[f"- {line}" for line in found.lines[1:]],
              f"- not costed: {', '.join(left_out) or 'none'}", "",
              f"![frontier on {name}]({kind}.png)", ""]
  lines += ["![quality](quality.png)", ""]
  with open(paths["report"], "w") as f:
    f.write("\n".join(lines))
  return paths
