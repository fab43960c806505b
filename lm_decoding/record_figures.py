"""Tables in README.md and docs/*.md, rendered from the records they cite.

A table whose figures come from a committed `results.csv` sits right under a
marker line that names the record:

  <!-- record: experiments/results/base_cpu_2core/results.csv T=256 -->
  | decoder | B | NFE | forward tokens | ms min | gen-PPL | entropy |
  |---|---|---|---|---|---|---|

and `render_page` rewrites the table's rows from that record, so the table
cannot drift from it. After the path, shell-quoted options:
  - `B=8`, `T=256`: keep the record's rows at that batch size / output
    length;
  - `B=1/8`: one table row per decoder, each per-batch cell the values at
    B = 1 and 8 joined with " / " (quality cells come from the scored row);
  - `decoders="label 1; label 2"`: these decoders of the record, in this
    order (default: every row kept, in the record's order).
A column is filled from the record when its header (less a trailing
parenthesis: "decoder (T = 128)", "gen-PPL (B = 8)") is a key of `COLUMNS`;
any other column is written by hand and keeps its cells, row by row.

Usage:
  python -m lm_decoding.record_figures   # rewrite the tables of README.md and docs/*.md
(`tests/test_record_figures.py` fails when a committed page differs from
its rendering, and checks the figures quoted in the prose against their
records.)
"""

from __future__ import annotations

import csv
import dataclasses
import pathlib
import re
import shlex
import sys
from collections.abc import Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- record: (.+?) -->$")
OPTIONS = ("B", "T", "decoders")


def read_rows(path: str | pathlib.Path) -> list[dict]:
  """The rows of a results.csv, numbers as floats, empty fields as None.

  Raises:
    ValueError: no such file.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"record {path}: no such file")
  with open(path, newline="") as f:
    return [{k: _value(v) for k, v in row.items()}
            for row in csv.DictReader(f)]


def _value(text: str) -> float | str | None:
  if text == "":
    return None
  try:
    return float(text)
  except ValueError:
    return text


def find(rows: Sequence[dict], decoder: str, batch_size: int,
         output_length: int) -> dict:
  """The one row of `decoder` at (B, T).

  Raises:
    ValueError: no such row (the message lists the decoders there are).
  """
  for row in rows:
    if (row["decoder"] == decoder and row["batch_size"] == batch_size
        and row["output_length"] == output_length):
      return row
  raise ValueError(
      f"no row {decoder!r} at B={batch_size} T={output_length}; decoders: "
      f"{sorted({r['decoder'] for r in rows})}")


def _roles(row: dict) -> str:
  """'model 2,168' or 'draft 3,528, target 3,528': forward tokens per role,
  in the record's column order."""
  return ", ".join(f"{key[len('forward_tokens_'):]} {int(value):,}"
                   for key, value in row.items()
                   if key.startswith("forward_tokens_") and value is not None)


def _fixed(key: str, digits: int) -> Callable[[dict], str]:
  return lambda row: ("" if row.get(key) is None
                      else f"{row[key]:.{digits}f}")


def _integer(key: str) -> Callable[[dict], str]:
  return lambda row: f"{int(row[key])}"


@dataclasses.dataclass(frozen=True)
class Column:
  """How one table column reads a record row.

  Attributes:
    cell: the cell's text from one row of the record.
    per_batch: True: one value per batch size (joined with " / " under
      `B=1/8`); False: read from the scored row (quality, at the largest B)
      or the same at every B.
  """

  cell: Callable[[dict], str]
  per_batch: bool = True


def _speedup(row: dict, first: dict) -> str:
  return f"{first['ms_min'] / row['ms_min']:#.3g}"


COLUMNS = {
    "decoder": Column(lambda row: row["decoder"], per_batch=False),
    "B": Column(_integer("batch_size")),
    "T": Column(_integer("output_length"), per_batch=False),
    "NFE": Column(_integer("nfe")),
    "TPF": Column(lambda row: f"{row['output_length'] / row['nfe']:.2f}"),
    "forward tokens": Column(_roles),
    "fwd tokens": Column(_roles),
    "ms min": Column(_fixed("ms_min", 1)),
    "ms median": Column(_fixed("ms_median", 1)),
    "spread": Column(_fixed("spread", 2)),
    "gen-PPL": Column(_fixed("gen_ppl", 1), per_batch=False),
    "entropy": Column(_fixed("entropy", 2), per_batch=False),
    "rep-4": Column(_fixed("rep_4", 3), per_batch=False),
    "self-corr": Column(_fixed("self_correction", 3), per_batch=False),
    "gen-PPL / entropy": Column(
        lambda row: f"{row['gen_ppl']:.1f} / {row['entropy']:.2f}",
        per_batch=False),
}
SPEEDUP = "x row 1"  # ms min of the table's first row over this row's


def _options(spec: str) -> tuple[pathlib.Path, dict]:
  words = shlex.split(spec)
  options = dict(word.split("=", 1) for word in words[1:] if "=" in word)
  bad = [w for w in words[1:] if "=" not in w or w.split("=")[0] not in OPTIONS]
  if not words or bad:
    raise ValueError(f"record marker {spec!r}: give a path, then options "
                     f"{OPTIONS} as key=value (not {bad})")
  return pathlib.Path(words[0]), options


def _groups(rows: Sequence[dict], options: dict) -> list[list[dict]]:
  """The record rows behind each table row: one row each, or under `B=1/8`
  a decoder's rows at those batch sizes."""
  sizes = [float(b) for b in options.get("B", "").split("/") if b]
  kept = [r for r in rows
          if (not sizes or r["batch_size"] in sizes)
          and ("T" not in options or r["output_length"] == float(options["T"]))]
  labels = [d.strip() for d in options.get("decoders", "").split(";")
            if d.strip()]
  combine = len(sizes) > 1
  if not labels:
    if not combine:
      return [[r] for r in kept]
    labels = list(dict.fromkeys(r["decoder"] for r in kept))
  groups = []
  for label in labels:
    group = [r for r in kept if r["decoder"] == label]
    if not group or (not combine and len(group) > 1):
      raise ValueError(f"decoder {label!r}: {len(group)} rows of the record "
                       f"match {options}; decoders there: "
                       f"{sorted({r['decoder'] for r in kept})}")
    groups.append(sorted(group, key=lambda r: sizes.index(r["batch_size"]))
                  if combine else group)
  return groups


def _cells(line: str) -> list[str]:
  return [c.strip() for c in line.strip().strip("|").split("|")]


def render_table(spec: str, table: Sequence[str], root: pathlib.Path = ROOT
                 ) -> list[str]:
  """The lines of `table` (header, separator, rows) with its rows rendered
  from the record the marker `spec` names (relative to `root`).

  Raises:
    ValueError: a bad marker, a missing record, a decoder not in it, or a
      table without a recognised column.
  """
  path, options = _options(spec)
  rows = read_rows(root / path)
  header = _cells(table[0])
  names = [re.sub(r"\s*\(.*\)$", "", h) for h in header]
  if not any(n in COLUMNS or n == SPEEDUP for n in names):
    raise ValueError(f"record table under {spec!r}: no column of the record "
                     f"among {header}; known: {[*COLUMNS, SPEEDUP]}")
  old = [_cells(line) for line in table[2:]]
  groups = _groups(rows, options)
  out = list(table[:2])
  for i, group in enumerate(groups):
    scored = next((r for r in group if r.get("gen_ppl") is not None), group[-1])
    cells = []
    for j, name in enumerate(names):
      if name == SPEEDUP:
        values = [_speedup(r, groups[0][k]) for k, r in enumerate(group)]
      elif name in COLUMNS:
        column = COLUMNS[name]
        values = ([column.cell(r) for r in group] if column.per_batch
                  else [column.cell(scored)])
      else:
        values = [old[i][j] if i < len(old) and j < len(old[i]) else ""]
      cells.append(" / ".join(values))
    out.append("| " + " | ".join(cells) + " |")
  return out


def render_page(text: str, root: pathlib.Path = ROOT) -> str:
  """`text` (a Markdown page) with the table under every record marker
  rendered from its record; the rest unchanged."""
  lines = text.split("\n")
  out, i = [], 0
  while i < len(lines):
    out.append(lines[i])
    match = MARKER.match(lines[i])
    i += 1
    if match:
      end = i
      while end < len(lines) and lines[end].startswith("|"):
        end += 1
      if end - i < 2:
        raise ValueError(f"record marker {match.group(1)!r}: no table under it")
      out += render_table(match.group(1), lines[i:end], root)
      i = end
  return "\n".join(out)


def pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  """README.md and docs/*.md."""
  return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def main(argv: Sequence[str]) -> None:
  del argv
  for page in pages():
    text = page.read_text()
    rendered = render_page(text)
    if rendered != text:
      page.write_text(rendered)
      print(f"rewrote {page.relative_to(ROOT)}")


if __name__ == "__main__":
  main(sys.argv)
