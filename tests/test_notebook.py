"""colab/quickstart.ipynb and colab/frontier.ipynb: committed with outputs;
both run top to bottom in the suite at the small size their
`LM_DECODING_NOTEBOOK_SMALL=1` selects (about a minute each on 2 cores), the
quickstart also at full size under `-m slow`."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import jupyter_client.kernelspec
import nbclient
import nbformat
import pytest
from ipykernel import kernelspec as ipykernel_kernelspec

import lm_decoding

COLAB = pathlib.Path(__file__).resolve().parent.parent / "colab"
NOTEBOOK = COLAB / "quickstart.ipynb"
FRONTIER = COLAB / "frontier.ipynb"
# Figures a committed run shows: the quickstart's latency and quality plots
# and three denoising traces; the frontier notebook's frontier and speed-up.
IMAGES = {NOTEBOOK: 5, FRONTIER: 2}
PACKAGE_DIR = lm_decoding.__path__[0]
KERNEL = "python3"
# jupyter_client launches these argv[0] names with the launching interpreter.
_SELF_NAMES = {"python", f"python{sys.version_info[0]}",
               "python{}.{}".format(*sys.version_info[:2])}


def _kernel_manager(tmp_dir: pathlib.Path):
  """A KernelManager for `KERNEL` whose kernel runs this interpreter.

  The installed 'python3' kernelspec is used when it resolves to
  sys.executable; otherwise a kernelspec for this interpreter is written with
  ipykernel into `tmp_dir` (nothing installed globally).
  """
  specs = jupyter_client.kernelspec.KernelSpecManager()
  try:
    argv0 = specs.get_kernel_spec(KERNEL).argv[0]
  except jupyter_client.kernelspec.NoSuchKernel:
    argv0 = None
  if argv0 not in _SELF_NAMES | {sys.executable}:
    ipykernel_kernelspec.write_kernel_spec(str(tmp_dir / "kernels" / KERNEL))
    specs = jupyter_client.kernelspec.KernelSpecManager(
        kernel_dirs=[str(tmp_dir / "kernels")])
  return jupyter_client.KernelManager(kernel_name=KERNEL,
                                      kernel_spec_manager=specs)


def _text(cell) -> str:
  """Everything a code cell printed or displayed, as text."""
  parts = []
  for output in cell.get("outputs", []):
    if output["output_type"] == "stream":
      parts.append(output["text"])
    elif "data" in output:
      parts.append(output["data"].get("text/markdown", ""))
      parts.append(output["data"].get("text/plain", ""))
  return "\n".join(parts)


@pytest.mark.parametrize("path", [NOTEBOOK, FRONTIER], ids=lambda p: p.stem)
def test_committed_notebook_has_outputs_and_no_local_paths(path):
  """It reads on GitHub without running: every code cell ran, in order."""
  raw = path.read_text(encoding="utf-8")
  assert len(raw.encode()) < 1_000_000
  notebook = nbformat.reads(raw, as_version=4)
  code_cells = [c for c in notebook.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code_cells] == list(
      range(1, len(code_cells) + 1))
  assert all(c.outputs for c in code_cells)
  assert not [o for c in code_cells for o in c.outputs
              if o["output_type"] == "error"]
  assert len([o for c in code_cells for o in c.outputs
              if "image/png" in o.get("data", {})]) == IMAGES[path]
  outputs = json.dumps([c.outputs for c in code_cells])
  for path in (PACKAGE_DIR, str(pathlib.Path.home()), "/tmp/"):
    assert path not in outputs
  assert not [c for c in code_cells if "execution" in c.metadata]


def _execute(path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch,
             small: bool) -> str:
  """Runs the notebook at `path` in a fresh kernel (cwd an empty folder,
  TMPDIR `tmp_path/tmp`); returns what its code cells printed, as text.

  Raises:
    nbclient.exceptions.CellExecutionError: a cell failed.
  """
  notebook = nbformat.read(path, as_version=4)
  run_dir, temp_dir = tmp_path / "run", tmp_path / "tmp"
  run_dir.mkdir()
  temp_dir.mkdir()
  monkeypatch.setenv("TMPDIR", str(temp_dir))  # the notebook's workdir goes here
  if small:
    monkeypatch.setenv("LM_DECODING_NOTEBOOK_SMALL", "1")
  else:
    monkeypatch.delenv("LM_DECODING_NOTEBOOK_SMALL", raising=False)
  client = nbclient.NotebookClient(
      notebook, timeout=600, kernel_name=KERNEL,
      km=_kernel_manager(tmp_path),
      resources={"metadata": {"path": str(run_dir)}})
  client.execute()
  code_cells = [c for c in notebook.cells if c.cell_type == "code"]
  assert all(c.execution_count for c in code_cells)
  assert not [o for c in code_cells for o in c.outputs
              if o["output_type"] == "error"]
  # The install cell found the installed package and fetched nothing.
  assert re.match(r"lm_decoding is installed: nothing to (clone|install)\n",
                  _text(code_cells[0]))
  assert not list(run_dir.iterdir())
  text = "\n".join(_text(c) for c in code_cells)
  assert str(tmp_path) not in text and PACKAGE_DIR not in text
  images = [o for c in code_cells for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) == IMAGES[path]
  return text


def _reports(tmp_path: pathlib.Path, prefix: str) -> list[pathlib.Path]:
  return list((tmp_path / "tmp").glob(f"{prefix}_*/report.md"))


def test_quickstart_runs_at_the_small_size(tmp_path, monkeypatch):
  text = _execute(NOTEBOOK, tmp_path, monkeypatch, small=True)
  for decoder, models in (("AR cached", "model=ar"), ("MDLM K=4", "model=mdlm"),
                          ("MDLM K=8", "model=mdlm")):  # K = T = 8
    assert f"| {decoder} | {models} | 2 | 8 |" in text
  assert re.search(r"^crossover: ", text, re.M)
  assert re.search(r"^break-even: B=2 T=8: K\* = \d+\.\d$", text, re.M)
  assert re.search(r"^mdlm: trained here, validation perplexity bound \d+$",
                   text, re.M)
  assert len(_reports(tmp_path, "lm_decoding_quickstart")) == 1


def test_frontier_notebook_draws_the_frontier_at_the_small_size(
    tmp_path, monkeypatch):
  """Prints its devices, measures the shrunk grid, writes the report and
  states its verdict."""
  text = _execute(FRONTIER, tmp_path, monkeypatch, small=True)
  assert re.search(r"^\[CpuDevice\(id=0\)\]$", text, re.M)
  assert "size: small (the test suite's)" in text
  assert "3 measurements" in text  # 3 decoders at B = 2
  assert re.search(r"^Verdict: 'within tolerance' of AR sampling", text, re.M)
  assert re.search(r"^T=8 B=2: Pareto front: \S", text, re.M)
  assert re.search(r"^T=8 B=2: fastest within tolerance: ", text, re.M)
  reports = _reports(tmp_path, "lm_decoding_frontier")
  assert len(reports) == 1
  assert "## Verdict" in reports[0].read_text()
  assert (reports[0].parent / "frontier.png").stat().st_size > 0


@pytest.mark.slow
def test_quickstart_runs_top_to_bottom(tmp_path, monkeypatch):
  text = _execute(NOTEBOOK, tmp_path, monkeypatch, small=False)
  # Split sizes are printed.
  assert re.search(r"^  test +\d+ documents +[\d,]+ tokens", text, re.M)
  assert re.search(r"^ar +[\d,]+ parameters, trained here, validation "
                   r"perplexity \d+$", text, re.M)
  assert "| decoder | models | B | T | NFE | fwd tokens | ms min |" in text
  for t in (16, 32):  # the label shows K = T as used
    for decoder, models in (("AR cached", "model=ar"),
                            ("MDLM K=4", "model=mdlm"),
                            (f"MDLM K={t}", "model=mdlm")):
      assert f"| {decoder} | {models} | 4 | {t} |" in text
  assert re.search(r"^crossover: (No decoder was faster than AR cached|Faster "
                   r"than AR cached \(minimum times\): MDLM)", text, re.M)
  assert re.search(r"^break-even: B=4 T=32: K\* = \d+\.\d$", text, re.M)
  assert re.search(r"^mdlm: shipped, validation perplexity bound \d+$", text,
                   re.M)
  reports = _reports(tmp_path, "lm_decoding_quickstart")
  assert len(reports) == 1 and "## Crossover" in reports[0].read_text()
