"""The files an experiment leaves: rows as CSV, a record as JSON, and the
command line that made them.

Every entry point writes through these three functions, so every record
names its command the same way (`command()`: `python` and the arguments,
shell-quoted, as the script was started) and every CSV flattens rows the same
way (per-role dicts as `<key>_<role>` columns, lists joined with "; ").
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any


def command(argv: Sequence[str] | None = None) -> str:
  """`python <argv>` shell-quoted (default: this process's sys.argv), the
  line to paste to make the same files again."""
  return "python " + shlex.join(sys.argv if argv is None else argv)


def _flat(row: dict) -> dict:
  """A row with its dict values as `<key>_<inner key>` columns and its lists
  joined with '; '."""
  flat = {}
  for key, value in row.items():
    if isinstance(value, dict):
      flat.update({f"{key}_{role}": v for role, v in value.items()})
    elif isinstance(value, list):
      flat[key] = "; ".join(map(str, value))
    else:
      flat[key] = value
  return flat


def write_csv(rows: Sequence[dict], path: str | os.PathLike) -> None:
  """Writes `rows` (flattened, `_flat`) to the CSV file `path`, the columns
  the union of the rows' keys in first-seen order (a missing value is an
  empty field).

  Raises:
    ValueError: rows is empty.
  """
  if not rows:
    raise ValueError("rows must be non-empty")
  flat = [_flat(r) for r in rows]
  columns = list(dict.fromkeys(k for row in flat for k in row))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(flat)


def number(text: str) -> float | str:
  """A CSV field read back: a float where it parses as one, else the text."""
  try:
    return float(text)
  except ValueError:
    return text


def finite(value: Any) -> Any:
  """`value` made JSON-safe: NaN and infinities as None, numpy scalars as
  Python numbers, tuples as lists (recursively through dicts and lists)."""
  if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite(v) for v in value]
  return value


def write_json(record: dict, path: str | os.PathLike,
               cmd: str | None = None) -> dict:
  """Writes {"command": cmd (default `command()`), **record} to `path`
  (`finite`, indented; other objects as their str) and returns what it
  wrote."""
  out = finite({"command": command() if cmd is None else cmd, **record})
  with open(path, "w") as f:
    json.dump(out, f, indent=2, default=str)
    f.write("\n")
  return out
