"""The int8 experiment end to end on tiny random models (`--smoke`)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_smoke_run_writes_every_result(tmp_path):
  subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "quantization.py"),
       "--smoke", f"--workdir={tmp_path}"],  # --out: the workdir
      check=True, cwd=ROOT, capture_output=True, text=True,
      env={**os.environ, "PYTHONPATH": str(ROOT)})
  for name in ("results.json", "timing.csv", "quality.csv", "drift.csv",
               "drift.png", "report.md"):
    assert (tmp_path / name).stat().st_size > 0, name
  result = json.loads((tmp_path / "results.json").read_text())
  variants = ["f32", "int8 weights", "int8 KV", "both"]
  assert [r["variant"] for r in result["timing"]] == variants
  kl = {r["variant"]: r["kl_to_f32_nats"] for r in result["teacher_forced"]}
  assert kl["f32"] == 0.0
  assert all(0 < kl[v] < 0.1 for v in variants[1:]), kl
  bytes_ = {r["variant"]: (r["param_bytes"], r["cache_bytes"])
            for r in result["timing"]}
  assert bytes_["int8 weights"][0] < bytes_["f32"][0] / 3
  assert bytes_["int8 KV"][1] < bytes_["f32"][1] / 2
  assert [r["variant"] for r in result["gen_ppl"]] == variants + ["f32"]
  assert all(np.isfinite(r["gen_ppl"]) for r in result["gen_ppl"])
  drift = result["drift"]
  assert sorted(drift["variants"]) == sorted(variants[1:])
  assert all(len(v["kl_per_bucket"]) == len(drift["bucket_starts"])
             for v in drift["variants"].values())
  assert result["command"] in (tmp_path / "report.md").read_text()
