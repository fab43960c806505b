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


def test_hardware_names_the_machine_and_whether_it_was_shared(monkeypatch):
  monkeypatch.setattr(records.os, "cpu_count", lambda: 2)
  monkeypatch.setattr(records, "cpu_model", lambda: "Test CPU 9000")
  monkeypatch.setattr(records, "memory_bytes", lambda: 8 * 2**30)
  alone = records.hardware([1.9, 2.5], 3, 95.04e9, 17.26e9, "cpu x1")
  assert alone == {
      "cpu_model": "Test CPU 9000", "cores": 2, "memory_gib": 8.0,
      "device": "cpu x1", "matmul_gflops": 95.0, "bandwidth_gb_s": 17.3,
      "load_average_1min": [1.9, 2.5], "shared": False, "timed_runs": 3}
  assert records.describe_hardware(alone) == (
      "Test CPU 9000, 2 cores, 8.0 GiB; device cpu x1; measured matmul 95.0 "
      "GFLOP/s (float32, 2048 x 2048), read bandwidth 17.3 GB/s; 1-minute "
      "load average 1.9 at the start and 2.5 at the end (this run alone); 3 "
      "timed runs per row")
  busy = records.hardware([0.4, 2.6], 5, 1e9, 1e9, "cpu x1")
  assert busy["shared"] and records.describe_hardware(busy).count("shared:")
  assert records.shared([2.5, 0.0], 2) is False
  assert records.shared([0.0, 2.51], 2) is True


@pytest.mark.parametrize("args, match", [
    (([1.0], 3, 1e9, 1e9), "load_averages"),
    (([1.0, -0.1], 3, 1e9, 1e9), "load_averages"),
    (([1.0, 1.0], 0, 1e9, 1e9), "timed_runs"),
    (([1.0, 1.0], 2.0, 1e9, 1e9), "timed_runs"),
    (([1.0, 1.0], 3, 0.0, 1e9), "matmul_flops"),
    (([1.0, 1.0], 3, 1e9, math.inf), "bandwidth"),
])
def test_hardware_refuses_bad_values(args, match):
  with pytest.raises(ValueError, match=match):
    records.hardware(*args, device="cpu x1")


def test_cpu_model_and_memory_are_read_from_this_machine():
  assert isinstance(records.cpu_model(), str) and records.cpu_model()
  memory = records.memory_bytes()
  assert memory is None or memory > 2**20
