"""experiments/ holds thin entry points: none grows past ~300 lines (their
reusable logic lives in the library). That no script imports another script
or a test module is checked in test_layers.py."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 320


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.py")),
                         ids=lambda p: p.name)
def test_entry_points_stay_thin(path):
  lines = len(path.read_text().splitlines())
  assert lines <= MAX_LINES, (
      f"{path.name}: {lines} lines; move its reusable logic into the library")
