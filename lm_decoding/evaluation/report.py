"""Writes the comparison: results.csv, report.md and its figures.

report.md opens with the verdict (`frontier`: per batch size the quality-cost
Pareto front and the fastest decoder within the tolerance of AR sampling),
the frontier figure (gen-PPL against ms per sequence, entropy as colour,
TPF per point) and the speed-up of every decoder over the baseline; then
the setup and the tables, the crossover and K* (`crossover`) among them. It
defines every column it shows, under its table, so it reads on its own.
Speeds are compared on minimum times (on a shared machine interference only
ever adds time; the median and the spread are shown beside them). The
figures are drawn by `report_plots`.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence

from lm_decoding.evaluation import crossover, frontier, records, report_plots
from lm_decoding.evaluation.comparison import Comparison
from lm_decoding.evaluation.comparison_rows import SPREAD_FLAG

WORDS_SHOWN = 60  # words of each sample in report.md
TITLE = "Sequential vs parallel decoding"


def _forward_tokens(row: dict) -> str:
  return ", ".join(f"{r} {n:,}" for r, n in row["forward_tokens"].items())


def _spread(row: dict) -> str:
  return f"{row['spread']:.0%}" + (" !" if row["noisy"] else "")


# The formatters a column of `COLUMNS_FILE` names by key.
_FORMATTERS = {"forward_tokens": _forward_tokens, "spread": _spread}
COLUMNS_FILE = pathlib.Path(__file__).with_name("report_columns.tsv")
TABLES = ("cost", "predicted", "eos", "quality", "cache")  # report.md's


@functools.cache
def table_columns(table: str) -> tuple[tuple, ...]:
  """The columns of report.md's table `table` (one of TABLES), as
  `markdown_table` takes them: (key or formatter, header, digits,
  definition), one tuple a column, read from `COLUMNS_FILE` (one line a
  column; a line with no header nor digits is the cost table's column of
  that key, defined "as above" because a later table repeats it).

  Raises:
    ValueError: `table` not in TABLES.
  """
  if table not in TABLES:
    raise ValueError(f"table={table!r}; allowed: {TABLES}")
  lines = [line for line in COLUMNS_FILE.read_text("utf-8").splitlines()
           if line and not line.startswith("#")]
  fields = [line.split("\t") for line in lines[1:]]  # under the header
  cost = {key: (header, digits)
          for name, key, header, digits, _ in fields if name == "cost"}
  flag = f"{SPREAD_FLAG:.0%}"
  out = []
  for name, key, header, digits, text in fields:
    if name == table:
      header, digits = (header, digits) if header else cost[key]
      out.append((_FORMATTERS.get(key, key), header, int(digits),
                  text.replace("{SPREAD_FLAG}", flag)))
  return tuple(out)


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


def markdown_table(rows: Sequence[dict], columns=None) -> str:
  """A Markdown table of `rows` with `columns`: (key or formatter, header,
  digits, definition) tuples (e.g. `table_columns`; None: the cost
  table's, `table_columns("cost")`, as the notebooks show `comparison.run`'s
  rows)."""
  columns = table_columns("cost") if columns is None else columns
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
      get the predicted table's columns (`table_columns`).
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
  cost_columns = table_columns("cost")
  if predict_ms is not None:
    rows = _with_predictions(rows, predict_ms)
    cost_columns += table_columns("predicted")
  os.makedirs(workdir, exist_ok=True)
  paths = {k: os.path.join(workdir, f) for k, f in (
      ("csv", "results.csv"), ("report", "report.md"),
      ("frontier", "frontier.png"), ("latency", "latency.png"),
      ("quality", "quality.png"))}
  summary = frontier.summarize(rows, baseline, tolerance)
  records.write_csv(rows, paths["csv"])
  report_plots.plot_frontier(summary.verdicts, summary.points, baseline,
                             tolerance, paths["frontier"])
  report_plots.plot_speedup(summary.verdicts, summary.points, baseline,
                            tolerance, paths["latency"])
  report_plots.plot_quality(rows, comparison.human, paths["quality"])
  lines = (_verdict_lines(summary) + ["## Setup", "", header, ""]
           + _cost_lines(rows, cost_columns, comparison.merged)
           + _crossover_lines(rows, baseline)
           + _eos_cache_quality_lines(rows, comparison.human)
           + ["## Samples", ""] + _samples(comparison)
           + _elsewhere_lines(rows, baseline, tolerance, elsewhere or {},
                              workdir, paths)
           + ["![quality](quality.png)", ""])
  with open(paths["report"], "w") as f:
    f.write("\n".join(lines))
  return paths


def _verdict_lines(summary: frontier.Summary) -> list[str]:
  """report.md's opening: the verdict and its two figures."""
  return [f"# {TITLE}", "", "## Verdict", "",
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
          "![speed-up over the baseline](latency.png)", ""]


def _cost_lines(rows: Sequence[dict], columns, merged) -> list[str]:
  """The fixed-length cost table, its noisy rows and merged entries."""
  lines = ["## Cost, fixed length", "",
           "Every decoder emits exactly T tokens (EOS ignored), so every row "
           "decodes the same amount of text.", "",
           markdown_table(rows, columns), "", definitions(columns), ""]
  noisy = [r for r in rows if r["noisy"]]
  if noisy:
    lines += [f"Noisy rows (spread above {SPREAD_FLAG:.0%}): "
              + "; ".join(f"{r['decoder']} B={r['batch_size']} "
                          f"T={r['output_length']}" for r in noisy), ""]
  if merged:
    lines += ["Entries that are the same decoder at some T ran once there:",
              ""]
    lines += [f"- T={t}: row '{label}' stands for " + ", ".join(
        f"'{s}'" for s in series) for t, label, series in merged]
    lines.append("")
  return lines


def _crossover_lines(rows: Sequence[dict], baseline: str) -> list[str]:
  """The crossover sentence and the break-even K* table."""
  lines = ["## Crossover", "", crossover.sentence(rows, baseline), "",
           f"Break-even K* (a decoder making fewer than K* full forward "
           f"passes beats {baseline} there):", "", "| B | T | K* |",
           "|---|---|---|"]
  k_star = crossover.break_even_steps(rows, baseline)
  lines += [f"| {b} | {t} | {k:.1f} |" for (b, t), k in sorted(k_star.items())]
  return lines + ["", "- **K\\***: " + baseline + " ms min / (ms min / NFE "
                  "of the row whose every call is a full pass over B x (P + "
                  "T) positions, the one with the most NFE at that B and T)",
                  ""]


def _eos_cache_quality_lines(rows: Sequence[dict], human: dict) -> list[str]:
  """The EOS-mode table, the KV caches' table (when a row is cached) and the
  quality table with the human text's scores."""
  lines = ["## EOS mode", "",
           "The same decoders with EOS ending a row (what a reader gets).",
           "", markdown_table(rows, table_columns("eos")), "",
           definitions(table_columns("eos")), ""]
  cached = _speedups(rows)
  if cached:
    lines += ["## KV caches against recomputation", "",
              "Decoders with a KV cache (kv_cache other than none) against "
              "the same decoder recomputing every pass.", "",
              markdown_table(cached, table_columns("cache")), "",
              definitions(table_columns("cache")), ""]
  scored = [r for r in rows if r.get("gen_ppl") is not None]
  return lines + [
      f"## Quality (B={scored[0]['batch_size'] if scored else '—'}, "
      "EOS mode)", "", markdown_table(scored, table_columns("quality")), "",
      definitions(table_columns("quality")),
      f"- human text: the held-out continuations of the same prompts "
      f"({human['length']:.0f} tokens on average) score "
      f"gen-PPL {human['gen_ppl']:.1f} at entropy "
      f"{human['entropy']:.2f}", "", OMISSION_NOTE, ""]


def _elsewhere_lines(rows: Sequence[dict], baseline: str,
                     tolerance: frontier.Tolerance,
                     elsewhere: Mapping[str, Callable[[dict], float | None]],
                     workdir: str, paths: dict[str, str]) -> list[str]:
  """The verdict and the frontier predicted on each profile of `elsewhere`;
  draws frontier_<name>.png and adds its path to `paths`."""
  if not elsewhere:
    return []
  lines = ["## The frontier predicted on other hardware", "",
           "The cost model (`cost_model.comparison_row_s`: roofline per "
           "call plus a fixed overhead, the models' shapes and dtype as "
           "measured here) costs each row's measured forward calls on a "
           "published profile; quality and TPF are the measured ones. "
           "Rows whose calls it does not cost (speculative verification, "
           "cached blocks, BD3-LM) are left out.", ""]
  for name, predict in elsewhere.items():
    predicted = predicted_rows(rows, predict)
    found = frontier.summarize(predicted, baseline, tolerance)
    kind = f"frontier_{name}"
    paths[kind] = os.path.join(workdir, f"{kind}.png")
    report_plots.plot_frontier(found.verdicts, found.points, baseline,
                               tolerance, paths[kind])
    left_out = sorted({r["decoder"] for r in rows} - {r["decoder"]
                                                      for r in predicted})
    lines += [f"### {name}", "", *[f"- {line}" for line in found.lines[1:]],
              f"- not costed: {', '.join(left_out) or 'none'}", "",
              f"![frontier on {name}]({kind}.png)", ""]
  return lines
