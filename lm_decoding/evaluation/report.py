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

import math
import os
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


def _as_above(*keys: str) -> tuple:
  """COST_COLUMNS' columns of `keys`, in that order, defined "as above" (a
  later table repeats them)."""
  by_key = {c[0]: c for c in COST_COLUMNS}
  return tuple(by_key[k][:3] + ("as above",) for k in keys)


_EMPTY = ("empty", "empty", 0, "rows whose first token is EOS")
EOS_COLUMNS = (
    *_as_above("decoder", "batch_size", "output_length"),
    ("eos_tokens_per_row", "real tok/row", 1, "real tokens per row: up to "
     "and including the row's first EOS (T if none)"),
    ("real_tokens_per_s", "real tok/s", 0, "real tokens of all rows / EOS "
     "mode's minimum time, tokens/s, the same formula for every decoder"),
    ("eos_timed_apart", "timed apart", 0, "True when EOS mode made other "
     "forward calls than fixed length (e.g. an early exit) and was timed "
     "itself; else its time is the fixed-length time"),
    _EMPTY,
)
QUALITY_COLUMNS = (
    *_as_above("decoder", "output_length"),
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
    _EMPTY,
)
CACHE_COLUMNS = (
    *_as_above("decoder", "batch_size", "output_length"),
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
           "", markdown_table(rows, EOS_COLUMNS), "",
           definitions(EOS_COLUMNS), ""]
  cached = _speedups(rows)
  if cached:
    lines += ["## KV caches against recomputation", "",
              "Decoders with a KV cache (kv_cache other than none) against "
              "the same decoder recomputing every pass.", "",
              markdown_table(cached, CACHE_COLUMNS), "",
              definitions(CACHE_COLUMNS), ""]
  scored = [r for r in rows if r.get("gen_ppl") is not None]
  return lines + [
      f"## Quality (B={scored[0]['batch_size'] if scored else '—'}, "
      "EOS mode)", "", markdown_table(scored, QUALITY_COLUMNS), "",
      definitions(QUALITY_COLUMNS),
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
