"""The files an experiment leaves: rows as CSV, a record as JSON, the
command line that made them and the machine they were measured on.

Every entry point writes through these functions, so every record names its
command the same way (`command()`: `python` and the arguments, shell-quoted,
as the script was started), every CSV flattens rows the same way (per-role
dicts as `<key>_<role>` columns, lists joined with "; "), and a record with
timings names its hardware the same way (`hardware()`: CPU model, cores,
memory, the measured matmul throughput and read bandwidth, the load
averages and whether other jobs shared the machine, the timed runs).
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
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


def shared(load_averages: Sequence[float], cores: int) -> bool:
  """Whether other jobs shared the machine during a run, from the 1-minute
  load averages taken at its start and end: the run alone keeps at most
  every core busy (a reading up to half a job above `cores` is still one
  run's, whose compile threads and the system's own tasks add to it)."""
  return max(load_averages) > cores + 0.5


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo's first `model name`, where there
  is one), else what `platform` knows of the processor."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
  """Physical memory of the machine, bytes (None where the OS does not
  say)."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def hardware(load_averages: Sequence[float], timed_runs: int,
             matmul_flops: float, bandwidth: float, device: str) -> dict:
  """What a record's timings were measured on, for its JSON.

  Args:
    load_averages: the 1-minute load averages at the run's start and end
      (`os.getloadavg()[0]`), two floats >= 0.
    timed_runs: timed runs per measured row, >= 1.
    matmul_flops: measured matmul throughput of the device, FLOP/s > 0
      (`cost.measure_peak_flops()`: float32, 2048 x 2048).
    bandwidth: measured read bandwidth of the device, bytes/s > 0
      (`cost.measure_bandwidth()`).
    device: the accelerator or CPU device jax ran on (e.g. "cpu x1").
  Returns:
    {"cpu_model", "cores", "memory_gib", "device", "matmul_gflops",
    "bandwidth_gb_s", "load_average_1min": [start, end], "shared": bool
    (`shared`), "timed_runs"}.
  Raises:
    ValueError: a value out of range (the message names the argument).
  """
  if len(load_averages) != 2 or min(load_averages) < 0:
    raise ValueError(f"load_averages={list(load_averages)} must be two "
                     "readings >= 0 (start, end)")
  if isinstance(timed_runs, bool) or not isinstance(timed_runs, int) or (
      timed_runs < 1):
    raise ValueError(f"timed_runs={timed_runs!r} must be an integer >= 1")
  for name, value in (("matmul_flops", matmul_flops),
                      ("bandwidth", bandwidth)):
    if not 0 < value < math.inf:
      raise ValueError(f"{name}={value} must be a finite number > 0")
  cores = os.cpu_count()
  memory = memory_bytes()
  return {"cpu_model": cpu_model(), "cores": cores,
          "memory_gib": None if memory is None else round(memory / 2**30, 1),
          "device": device,
          "matmul_gflops": round(matmul_flops / 1e9, 1),
          "bandwidth_gb_s": round(bandwidth / 1e9, 1),
          "load_average_1min": [round(x, 2) for x in load_averages],
          "shared": shared(load_averages, cores),
          "timed_runs": timed_runs}


def describe_hardware(record: dict) -> str:
  """One line of a report's setup from `hardware()`'s dict."""
  start, end = record["load_average_1min"]
  memory = ("memory unknown" if record["memory_gib"] is None
            else f"{record['memory_gib']} GiB")
  state = ("shared: other jobs were running, timings are noisy"
           if record["shared"] else "this run alone")
  return (f"{record['cpu_model']}, {record['cores']} cores, {memory}; "
          f"device {record['device']}; measured matmul "
          f"{record['matmul_gflops']} GFLOP/s (float32, 2048 x 2048), read "
          f"bandwidth {record['bandwidth_gb_s']} GB/s; 1-minute load average "
          f"{start:.1f} at the start and {end:.1f} at the end ({state}); "
          f"{record['timed_runs']} timed runs per row")
