"""records: the one command line, CSV writer and JSON writer."""

import csv
import json
import math

import numpy as np
import pytest

from lm_decoding.evaluation import records


def test_command_quotes_arguments():
  assert records.command(["experiments/x.py", "--a=1", "--b=two words"]) == (
      "python experiments/x.py --a=1 '--b=two words'")


def test_write_csv_flattens_and_unions_columns(tmp_path):
  path = tmp_path / "rows.csv"
  records.write_csv([{"name": "a", "calls": {"target": 3, "draft": 4},
                      "lengths": [1, 2]},
                     {"name": "b", "extra": 1.5}], path)
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  assert rows == [
      {"name": "a", "calls_target": "3", "calls_draft": "4",
       "lengths": "1; 2", "extra": ""},
      {"name": "b", "calls_target": "", "calls_draft": "", "lengths": "",
       "extra": "1.5"}]
  assert [records.number(rows[1]["extra"]), records.number("b")] == [1.5, "b"]
  with pytest.raises(ValueError, match="rows"):
    records.write_csv([], path)


def test_write_json_names_the_command_and_is_json_safe(tmp_path):
  path = tmp_path / "record.json"
  written = records.write_json(
      {"x": float("nan"), "y": np.float32(2.5), "z": (1, math.inf)}, path,
      cmd="python run.py")
  on_disk = json.loads(path.read_text())
  assert on_disk == written == {"command": "python run.py", "x": None,
                                "y": 2.5, "z": [1, None]}
  assert records.write_json({}, path)["command"].startswith("python ")
