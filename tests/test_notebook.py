"""colab/quickstart.ipynb: committed with outputs; runs top to bottom."""

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

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "colab" / "quickstart.ipynb"
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


def test_committed_notebook_has_outputs_and_no_local_paths():
  """It reads on GitHub without running: every code cell ran, in order."""
  raw = NOTEBOOK.read_text(encoding="utf-8")
  assert len(raw.encode()) < 1_000_000
  notebook = nbformat.reads(raw, as_version=4)
  code_cells = [c for c in notebook.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code_cells] == list(
      range(1, len(code_cells) + 1))
  assert all(c.outputs for c in code_cells)
  assert not [o for c in code_cells for o in c.outputs
              if o["output_type"] == "error"]
  assert len([o for c in code_cells for o in c.outputs
              if "image/png" in o.get("data", {})]) == 5  # 2 plots, 3 traces
  outputs = json.dumps([c.outputs for c in code_cells])
  for path in (PACKAGE_DIR, str(pathlib.Path.home()), "/tmp/"):
    assert path not in outputs
  assert not [c for c in code_cells if "execution" in c.metadata]


@pytest.mark.slow
def test_quickstart_runs_top_to_bottom(tmp_path, monkeypatch):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  run_dir, temp_dir = tmp_path / "run", tmp_path / "tmp"
  run_dir.mkdir()
  temp_dir.mkdir()
  monkeypatch.setenv("TMPDIR", str(temp_dir))  # the notebook's workdir goes here
  client = nbclient.NotebookClient(
      notebook, timeout=600, kernel_name=KERNEL,
      km=_kernel_manager(tmp_path),
      resources={"metadata": {"path": str(run_dir)}})
  client.execute()  # raises CellExecutionError if any cell fails

  code_cells = [c for c in notebook.cells if c.cell_type == "code"]
  assert all(c.execution_count for c in code_cells)
  errors = [o for c in code_cells for o in c.outputs
            if o["output_type"] == "error"]
  assert not errors
  text = "\n".join(_text(c) for c in code_cells)
  # The install cell found the installed package and cloned nothing.
  assert "lm_decoding is installed: nothing to clone" in _text(code_cells[0])
  assert not list(run_dir.iterdir())
  # Split sizes are printed, and no output names a path of this machine.
  assert re.search(r"^  test +\d+ documents +[\d,]+ tokens", text, re.M)
  assert str(tmp_path) not in text and PACKAGE_DIR not in text
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
  images = [o for c in code_cells for o in c.outputs
            if "image/png" in o.get("data", {})]
  assert len(images) == 5  # latency, quality, three commit orders
  assert re.search(r"^mdlm: shipped, validation perplexity bound \d+$", text,
                   re.M)
  reports = list(temp_dir.glob("lm_decoding_quickstart_*/report.md"))
  assert len(reports) == 1 and "## Crossover" in reports[0].read_text()
