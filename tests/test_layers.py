"""Imports run only downward (docs/layers.md), read from the source with `ast`.

Nothing here imports the package: each file is parsed and its import
statements (top level and inside functions) are checked against the layer
table below, so a new upward edge fails here before anything runs.
"""

import ast
import itertools
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lm_decoding"

# The layer of each part of the package, bottom (0) to top; docs/layers.md
# states the rule in prose. A module may import its own layer or below.
LAYERS = {
    "lm_decoding": 0,  # the package's __init__
    "lm_decoding.special_tokens": 0,
    "lm_decoding.debug": 0,
    "lm_decoding.checks": 0,
    "lm_decoding.models": 1,
    "lm_decoding.data": 1,
    "lm_decoding.checkpoints": 1,
    "lm_decoding.parallel": 2,
    "lm_decoding.decoding": 3,
    "lm_decoding.training": 4,
    "lm_decoding.evaluation": 4,
    "lm_decoding.studies": 5,
    "lm_decoding.config_reference": 6,
    "lm_decoding.record_figures": 6,
}



def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
  """The LAYERS key a module belongs to (its subpackage or top module)."""
  parts = module.split(".")
  key = ".".join(parts[:2])
  if key not in LAYERS:
    raise KeyError(f"{module}: not in LAYERS; give it a layer (and a line "
                   "in docs/layers.md)")
  return key


def imported_modules(path: pathlib.Path) -> set[str]:
  """Every module named by an absolute import in the file, anywhere in it;
  `from a import b` names a.b as well as a (b may be a module)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      out.add(node.module)
      out.update(f"{node.module}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      raise AssertionError(f"{path}: relative import; write it absolute")
  return out


def package_edges() -> dict[str, set[str]]:
  """{module: the lm_decoding modules it imports} over the whole package."""
  edges = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    edges[module_name(path)] = {
        m for m in imported_modules(path)
        if m == "lm_decoding" or m.startswith("lm_decoding.")}
  return edges


def upward(edges: dict[str, set[str]]) -> list[str]:
  """'a -> b' for every import of a higher layer, by the part each is in."""
  out = []
  for source, targets in edges.items():
    for target in targets:
      key = ".".join(target.split(".")[:2])
      if key not in LAYERS:  # `from lm_decoding.x import Name`'s Name
        continue
      if LAYERS[key] > LAYERS[part_of(source)]:
        out.append(f"{source} -> {target}")
  return sorted(out)


def part_cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
  """Cycles between parts (subpackages), as their member lists."""
  graph = {}
  for source, targets in edges.items():
    for target in targets:
      key = ".".join(target.split(".")[:2])
      if key in LAYERS and key != part_of(source):
        graph.setdefault(part_of(source), set()).add(key)
  return [pair for pair in itertools.combinations(sorted(graph), 2)
          if reaches(graph, pair[0], pair[1])
          and reaches(graph, pair[1], pair[0])]


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
  seen, todo = set(), list(graph.get(start, ()))
  while todo:
    node = todo.pop()
    if node == goal:
      return True
    if node not in seen:
      seen.add(node)
      todo.extend(graph.get(node, ()))
  return False


def test_every_part_of_the_package_has_a_layer():
  for module in package_edges():
    if module.startswith("lm_decoding.pretrained"):
      continue
    part_of(module)  # raises KeyError naming an unplaced module


def test_the_package_imports_only_its_own_layer_or_below():
  assert upward(package_edges()) == []


def test_no_cycle_between_subpackages():
  assert part_cycles(package_edges()) == []


def test_the_checks_catch_an_upward_edge_and_a_cycle():
  edges = {"lm_decoding.models.x": {"lm_decoding.decoding.base"},
           "lm_decoding.decoding.y": {"lm_decoding.models.x"},
           "lm_decoding.training.z": {"lm_decoding.evaluation.cost"},
           "lm_decoding.evaluation.w": {"lm_decoding.training.z"}}
  assert upward(edges) == ["lm_decoding.models.x -> lm_decoding.decoding.base"]
  assert part_cycles(edges) == [
      ("lm_decoding.decoding", "lm_decoding.models"),
      ("lm_decoding.evaluation", "lm_decoding.training")]


def script_imports(path: pathlib.Path) -> list[str]:
  """What a script imports that is another experiment script or a test
  module: an import of a sibling script's or a test file's name, of the
  `experiments`/`tests` folders, or a load by path from experiments/."""
  scripts = {p.stem for p in (REPO / "experiments").rglob("*.py")}
  tests = {p.stem for p in (REPO / "tests").glob("*.py")}
  named = scripts | tests | {"experiments", "tests"}
  out = [m for m in imported_modules(path) if m.split(".")[0] in named]
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("spec_from_file_location", "run_path")
        and any(isinstance(c, ast.Constant) and c.value == "experiments"
                for arg in node.args for c in ast.walk(arg))):
      out.append(f"{node.func.attr}(experiments/...)")
  return sorted(out)


SCRIPTS = sorted(str(p.relative_to(REPO))
                 for p in (REPO / "experiments").rglob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_script_imports_another_script_or_a_test(script):
  found = script_imports(REPO / script)
  assert found == [], f"{script} imports {found}"


def test_results_folders_hold_records_not_scripts():
  """One-off scripts live in benchmarks/<topic>/ beside their records."""
  assert sorted(str(p.relative_to(REPO)) for p in
                (REPO / "experiments" / "results").rglob("*.py")) == []


def import_time_effects(source: str) -> list[str]:
  """What the module-level statements of `source` do to global state: a
  matplotlib backend chosen (`matplotlib.use`), pyplot imported (its figure
  manager and backend), an absl flag defined (`flags.DEFINE_*`), or an
  attribute of another module assigned (a monkeypatch). Statements inside
  functions, classes and `if __name__ == "__main__"` run only when called."""
  out = []
  for node in ast.parse(source).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.If)):
      continue
    for sub in ast.walk(node):
      if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
        owner = getattr(sub.func.value, "id", "")
        if (owner, sub.func.attr) == ("matplotlib", "use"):
          out.append("matplotlib.use")
        if owner == "flags" and sub.func.attr.startswith("DEFINE"):
          out.append(f"flags.{sub.func.attr}")
      if isinstance(sub, (ast.Import, ast.ImportFrom)) and any(
          "matplotlib.pyplot" in (getattr(sub, "module", "") or "") + "."
          + alias.name for alias in sub.names):
        out.append("import matplotlib.pyplot")
      if isinstance(sub, ast.Assign) and any(
          isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
          for t in sub.targets):
        out.append("module attribute assigned")
  return out


def test_importing_the_package_changes_no_global_state():
  """Issue 37: `matplotlib.use` at import of two modules, absl flags
  defined on import of `claims.py` (now `studies/claims.py`)."""
  found = {module_name(p): import_time_effects(p.read_text())
           for p in sorted(PACKAGE.rglob("*.py"))}
  assert {m: e for m, e in found.items() if e} == {}


def test_the_import_time_check_sees_each_effect():
  source = ("import matplotlib\nmatplotlib.use('Agg')\n"
            "import matplotlib.pyplot as plt\nfrom absl import flags\n"
            "X = flags.DEFINE_string('x', '', 'x')\nimport m\nm.f = g\n"
            "def f():\n  matplotlib.use('Agg')\n")
  assert import_time_effects(source) == [
      "matplotlib.use", "import matplotlib.pyplot", "flags.DEFINE_string",
      "module attribute assigned"]
