"""experiments/benchmark_ar.py --smoke: runs both libraries, writes every
output, and the two decoders produce the same greedy tokens."""

import csv
import json
import pathlib
import subprocess
import sys

# The [peer] extra: without it this test fails at import, never skips.
import transformers  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_smoke_run_writes_results(tmp_path):
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "benchmark_ar.py"),
       "--smoke", f"--workdir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads((tmp_path / "results.json").read_text())
  decode, forward = out["rows"]
  assert (decode["kind"], decode["batch"], decode["new_tokens"]) == (
      "decode", 2, 6)
  assert decode["same_tokens"] is True
  assert decode["ours_tok_s"] > 0 and decode["hf_tok_s"] > 0
  assert decode["ours_x_roofline"] > 0 and forward["ours_pct_peak"] > 0
  assert decode["ours_floor_ms"] > 0 and decode["hf_floor_ms"] > 0
  with open(tmp_path / "results.csv") as f:
    assert len(list(csv.DictReader(f))) == 2
  markdown = (tmp_path / "results.md").read_text()
  assert "--smoke" in markdown and "| tiny | 2 | 10 |" in markdown
  assert (tmp_path / "tokens_per_s.png").stat().st_size > 0
