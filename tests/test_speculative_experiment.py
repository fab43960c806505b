"""experiments/speculative.py --smoke end to end on the shipped models.

It runs in a subprocess (its flags would collide with the other experiment
scripts' in one process). The smoke run keeps the self-drafting (jacobi,
prompt_lookup) and diffusion-draft rows, whose component timing once failed
on their non-cache draft states, and the router.
"""

import csv
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quick_run_writes_every_row_kind(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "speculative.py"),
       "--smoke", f"--out={out}", f"--workdir={tmp_path / 'work'}"],
      cwd=ROOT, capture_output=True, text=True, check=False,
      env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "speculative.csv") as f:
    rows = list(csv.DictReader(f))
  decoders = {r["decoder"] for r in rows}
  assert {"spec", "jacobi", "prompt_lookup"} <= decoders, decoders
  for r in rows:
    assert float(r["spec_ms"]) > 0 and 0 <= float(r["alpha"]) <= 1, r
    assert float(r["round_ms"]) > 0, r  # the component timing ran
  assert "SMOKE run (--smoke)" in (out / "speculative.md").read_text()
  assert (out / "router.csv").stat().st_size > 0
