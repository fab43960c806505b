"""experiments/speculative.py --smoke end to end on the shipped models.

It runs in a subprocess (its flags would collide with the other experiment
scripts' in one process). The smoke run keeps the self-drafting (jacobi,
prompt_lookup) and diffusion-draft rows, whose component timing once failed
on their non-cache draft states, and the router. Bad flags end it with one
line before anything is written.
"""

import csv
import os
import pathlib
import subprocess
import sys

import pytest

import stubs

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


_OUT = "--out={tmp}/out"  # speculative.py's record folder: must stay absent


@pytest.mark.parametrize("script, flags, message", [
    ("speculative.py", ["--config.compare.pretrained_set=nope", _OUT],
     r"^speculative: error: compare.pretrained_set='nope' must be '' "),
    ("speculative.py", ["--drafts=draft_huge", _OUT],
     r"^speculative: error: --drafts=draft_huge must be among the drafts "
     r"shipped in .*pretrained: \['draft_medium', 'draft_small'\]$"),
    ("speculative.py", ["--targets=mdlm", _OUT],
     r"^speculative: error: --targets=mdlm must be 'ar' and/or 'evaluator'$"),
    ("speculative.py", ["--targets=evaluator", _OUT],
     r"^speculative: error: the router \(part 2\) uses the fastest "
     r"speculative configuration of target 'ar' .* or pass --norouter$"),
], ids=["speculative-set", "speculative-drafts", "speculative-targets",
        "speculative-router"])
def test_entry_points_exit_with_one_line(script, flags, message, tmp_path):
  """What a user sees: one line, non-zero exit, no --out written (`{tmp}`
  in a flag is this test's folder)."""
  stubs.exits_with_one_line(script, flags, message, tmp_path)
