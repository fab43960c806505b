"""experiments/ holds thin entry points: no script imports another script or
a test module (their shared logic lives in the library), and none grows
past ~300 lines."""

import ast
import pathlib
from pathlib import Path

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for folder in ("experiments", "benchmarks")
                 for p in (ROOT / folder).rglob("*.py")
                 if "results" not in p.relative_to(ROOT).parts)
SCRIPT_NAMES = {p.stem for p in SCRIPTS}
# The reproduction scripts' shared flags and record (a helper module, not an
# entry point), imported as a sibling.
HELPERS = {"claim_record"}
MAX_LINES = 320
LOADERS = {"spec_from_file_location", "import_module", "load_experiment",
           "__import__"}


def _imported(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module.split(".")[0])
    elif isinstance(node, ast.Call) and _called(node) in LOADERS:
      # A file or module loaded by name: importlib, claim_record's old
      # `load_experiment("speculative")` workaround.
      names.update(Path(c.value).stem for c in ast.walk(node)
                   if isinstance(c, ast.Constant)
                   and isinstance(c.value, str))
  return names


def _called(node: ast.Call) -> str:
  func = node.func
  return func.attr if isinstance(func, ast.Attribute) else getattr(
      func, "id", "")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(
    p.relative_to(ROOT)))
def test_no_script_imports_another_script_or_a_test(path):
  imported = _imported(path)
  scripts = (imported & SCRIPT_NAMES) - HELPERS - {path.stem}
  assert not scripts, f"{path.name} imports the scripts {sorted(scripts)}"
  tests = {n for n in imported if n in ("tests", "stubs", "_loading",
                                        "conftest")}
  assert not tests, f"{path.name} imports test modules {sorted(tests)}"


@pytest.mark.parametrize("path", [p for p in SCRIPTS
                                  if p.parent.name == "experiments"],
                         ids=lambda p: p.name)
def test_entry_points_stay_thin(path):
  lines = len(path.read_text().splitlines())
  assert lines <= MAX_LINES, (
      f"{path.name}: {lines} lines; move its reusable logic into the library")
