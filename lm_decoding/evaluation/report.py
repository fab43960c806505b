"""Writes the comparison: results.csv, report.md and PNG plots.

The crossover is read off the measured rows: for each batch size, the output
lengths at which a parallel decoder's latency (ms per sequence) is below
cached AR's, and the break-even step count K* = (cached AR ms per sequence) /
(the masked-diffusion model's ms per forward pass): a parallel decoder with
fewer than K* forward passes beats sequential decoding at that length.
"""

from __future__ import annotations

import csv
import math
import os
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

AR_LABEL = "AR cached"


def write_csv(rows: Sequence[dict], path: str) -> None:
  """All rows, with the union of their keys as columns."""
  columns = list(dict.fromkeys(k for row in rows for k in row))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)


def _index(rows):
  return {(r["decoder"], r["batch_size"], r["output_length"]): r for r in rows}


def break_even_steps(rows: Sequence[dict]) -> dict[tuple[int, int], float]:
  """{(B, T): K*}: forward passes of the parallel model that cost as much as
  one cached AR decode of T tokens (from the parallel row with most NFE)."""
  by_key = _index(rows)
  out = {}
  for (label, b, t), ar in by_key.items():
    if label != AR_LABEL:
      continue
    parallel = [r for r in rows if r["family"] == "parallel"
                and r["batch_size"] == b and r["output_length"] == t]
    if parallel:
      ref = max(parallel, key=lambda r: r["nfe"])
      out[b, t] = ar["ms_per_sequence"] / (ref["ms_per_sequence"] / ref["nfe"])
  return out


def crossover(rows: Sequence[dict]) -> dict[tuple[str, int], list[int]]:
  """{(parallel decoder, B): output lengths where it is faster than cached AR}."""
  by_key = _index(rows)
  out = {}
  for r in rows:
    if r["family"] != "parallel":
      continue
    ar = by_key.get((AR_LABEL, r["batch_size"], r["output_length"]))
    wins = out.setdefault((r["decoder"], r["batch_size"]), [])
    if ar and r["ms_per_sequence"] < ar["ms_per_sequence"]:
      wins.append(r["output_length"])
  return out


def _fmt(value, digits=1):
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "—"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


TABLE_COLUMNS = (
    ("decoder", "decoder", 0), ("batch_size", "B", 0),
    ("output_length", "T", 0), ("nfe", "NFE", 0),
    ("tokens_per_forward", "tok/fwd", 2), ("ms_per_sequence", "ms/seq", 1),
    ("ms_per_position", "ms/pos", 2), ("ttft_ms", "TTFT ms", 1),
    ("tokens_per_s", "tok/s", 0), ("compile_s", "compile s", 2),
    ("roofline_ratio", "x roofline", 2), ("gen_ppl", "gen-PPL", 1),
    ("entropy", "entropy", 2), ("rep_4", "rep-4", 3),
    ("distinct_2", "distinct-2", 3), ("omission", "omission", 3),
    ("empty", "empty", 0), ("all_eos", "all-EOS", 0))


def markdown_table(rows: Sequence[dict], columns=TABLE_COLUMNS) -> str:
  lines = ["| " + " | ".join(c[1] for c in columns) + " |",
           "|" + "---|" * len(columns)]
  for r in rows:
    lines.append("| " + " | ".join(_fmt(r.get(k), d) for k, _, d in columns)
                 + " |")
  return "\n".join(lines)


def plot_latency(rows: Sequence[dict], path: str) -> None:
  """ms per sequence vs output length, one panel per batch size."""
  batch_sizes = sorted({r["batch_size"] for r in rows})
  fig, axes = plt.subplots(1, len(batch_sizes), figsize=(6 * len(batch_sizes), 4.5),
                           squeeze=False)
  for ax, b in zip(axes[0], batch_sizes):
    for label in dict.fromkeys(r["decoder"] for r in rows):
      pts = sorted((r["output_length"], r["ms_per_sequence"]) for r in rows
                   if r["decoder"] == label and r["batch_size"] == b)
      style = "-" if any(r["family"] == "sequential" for r in rows
                         if r["decoder"] == label) else "--"
      ax.plot(*zip(*pts), style, marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="output length T (tokens)",
           ylabel="latency (ms per sequence)", title=f"batch {b}")
    lengths = sorted({r["output_length"] for r in rows})
    ax.set_xticks(lengths, [str(t) for t in lengths])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
  fig.tight_layout(rect=(0, 0.1, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_quality(rows: Sequence[dict], path: str) -> None:
  """gen-PPL vs latency at the scored batch size (marker size grows with T)."""
  scored = [r for r in rows if r.get("gen_ppl") is not None]
  fig, ax = plt.subplots(figsize=(7, 5))
  for label in dict.fromkeys(r["decoder"] for r in scored):
    pts = sorted((r["output_length"], r["ms_per_sequence"], r["gen_ppl"])
                 for r in scored if r["decoder"] == label)
    ax.plot([p[1] for p in pts], [p[2] for p in pts], "-", alpha=0.4)
    ax.scatter([p[1] for p in pts], [p[2] for p in pts],
               s=[12 + p[0] / 2 for p in pts], label=label)
  ax.set(xscale="log", yscale="log", xlabel="latency (ms per sequence)",
         ylabel="gen-PPL under the evaluator (lower is better)",
         title=f"quality vs cost, batch {scored[0]['batch_size'] if scored else '?'}"
               " (marker size ~ T)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write(rows: Sequence[dict], extras: dict, header: str, workdir: str,
          samples_per_decoder: int = 2) -> dict[str, str]:
  """Writes results.csv, report.md, latency.png and quality.png.

  Returns:
    {kind: path} of the written files.
  """
  os.makedirs(workdir, exist_ok=True)
  paths = {k: os.path.join(workdir, f) for k, f in (
      ("csv", "results.csv"), ("report", "report.md"),
      ("latency", "latency.png"), ("quality", "quality.png"))}
  write_csv(rows, paths["csv"])
  plot_latency(rows, paths["latency"])
  plot_quality(rows, paths["quality"])
  lines = [header, "", "## Results", "", markdown_table(rows), ""]
  lines += ["## Crossover", "",
            "Output lengths T at which a parallel decoder's latency is below "
            "cached AR's:", "", "| decoder | B | faster than AR cached at T |",
            "|---|---|---|"]
  for (label, b), ts in crossover(rows).items():
    lines.append(f"| {label} | {b} | {', '.join(map(str, ts)) or 'never'} |")
  lines += ["", "Break-even step count K* (a parallel decoder with fewer "
            "forward passes beats cached AR at that length):", "",
            "| B | T | K* |", "|---|---|---|"]
  for (b, t), k in sorted(break_even_steps(rows).items()):
    lines.append(f"| {b} | {t} | {k:.1f} |")
  lines += ["", "## Samples", ""]
  for label, by_length in extras["samples"].items():
    t = max(by_length)
    lines.append(f"**{label}** (T={t}):")
    lines.append("")
    for text in by_length[t][:samples_per_decoder]:
      lines.append("> " + (text.replace("\n", " ").strip() or "(empty)"))
      lines.append("")
  lines += ["", "![latency](latency.png)", "", "![quality](quality.png)", ""]
  with open(paths["report"], "w") as f:
    f.write("\n".join(lines))
  return paths
