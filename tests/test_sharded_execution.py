"""Sharded decoding and training equal one device's, on 8 fake CPU devices.

The checks run in two subprocesses (`_sharded_execution.py`; the device
count is fixed when JAX starts), which print a `CHECK <name> OK|FAIL` line
per check; a failing test names every failed check and its message. Fewer than 8 devices in the
subprocess is a failure of every check, never a skip. What each check
compares, and the train step's tolerance and why, are in that script.
"""

import os
import pathlib
import subprocess
import sys

import pytest

import _sharded_execution  # imports no JAX devices

SCRIPT = pathlib.Path(__file__).with_name("_sharded_execution.py")


def _parts() -> dict[str, list[str]]:
  """The checks in two halves of similar cost, each one subprocess (and one
  test, so that pytest-xdist runs the halves side by side, never one twice):
  the four meshes (parameters, cache, train step, AR and beam decoding,
  the orbax reshard), and every other decoder on the GQA mesh."""
  checks = _sharded_execution.checks()
  gqa = _sharded_execution._mesh_name(_sharded_execution.GQA_MESH)
  others = [c for c in checks if c.startswith("decode/") and c.endswith(
      "/" + gqa) and c.split("/")[1] not in _sharded_execution.ALL_MESH_DECODERS]
  return {"meshes": [c for c in checks if c not in others],
          "decoders_on_gqa_mesh": others}


@pytest.mark.parametrize("part", list(_parts()))
def test_sharded_equals_single_device(part):
  names = _parts()[part]
  # Exact names as prefixes: `main` runs the checks starting with one of them.
  proc = subprocess.run([sys.executable, str(SCRIPT), *names],
                        env=dict(os.environ),  # main adds the 8 devices
                        capture_output=True, text=True, timeout=1800)
  lines = {}
  for line in proc.stdout.splitlines():
    if line.startswith("CHECK "):
      _, name, status, detail = (line.split(" ", 3) + [""])[:4]
      lines[name] = (status, detail)
  failed = {n: lines.get(n, ("MISSING", "did not run")) for n in names
            if lines.get(n, ("",))[0] != "OK"}
  assert not failed and list(lines) == names, (
      f"{len(failed)} of {len(names)} checks failed (exit "
      f"{proc.returncode}): {failed}\nstderr:\n{proc.stderr[-3000:]}")
  assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]


def test_the_parts_hold_every_check_once():
  parts = _parts()
  assert sorted(sum(parts.values(), [])) == sorted(
      _sharded_execution.checks())
  assert all(parts.values())
