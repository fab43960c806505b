"""Sharded decoding and training equal one device's, on 8 fake CPU devices.

All checks run in ONE subprocess (`_sharded_execution.py`; the device count
is fixed when JAX starts, and one process compiles the single-device
references once), which prints a `CHECK <name> OK|FAIL` line per check; each
check is reported here as its own test. Fewer than 8 devices in the
subprocess is a failure of every check, never a skip. What each check
compares, and the train step's tolerance and why, are in that script.
"""

import os
import pathlib
import subprocess
import sys

import pytest

import _sharded_execution  # imports no JAX devices

# Its module-scoped fixture is expensive: all its tests run in one xdist
# worker (setup.cfg: --dist loadgroup), so the fixture runs once.
pytestmark = pytest.mark.xdist_group("test_sharded_execution")

SCRIPT = pathlib.Path(__file__).with_name("_sharded_execution.py")


@pytest.fixture(scope="module")
def results():
  env = dict(os.environ)  # _sharded_execution.main adds the 8 devices
  proc = subprocess.run([sys.executable, str(SCRIPT)], env=env,
                        capture_output=True, text=True, timeout=1800)
  lines = {}
  for line in proc.stdout.splitlines():
    if line.startswith("CHECK "):
      _, name, status, detail = (line.split(" ", 3) + [""])[:4]
      lines[name] = (status, detail)
  return proc, lines


@pytest.mark.parametrize("check", _sharded_execution.checks())
def test_sharded_equals_single_device(results, check):
  proc, lines = results
  assert check in lines, (
      f"check {check} did not run (exit {proc.returncode}); stderr:\n"
      f"{proc.stderr[-3000:]}")
  status, detail = lines[check]
  assert status == "OK", detail


def test_every_check_ran(results):
  proc, lines = results
  assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
  assert list(lines) == _sharded_execution.checks()
