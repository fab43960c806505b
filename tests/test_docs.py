"""The README and docs/*.md name only things that exist.

Read from the Markdown (inline code, fenced bash/python blocks, link targets):
  - file paths: a path starting at a top-level entry of the repository must
    exist there; a shorter path (`machine_b/`, `iterative.py`) must be the end
    of some path in the tree, or (a bare file name) a name the code reads or
    writes, i.e. a string in its source (`metrics.jsonl`); `<name>` stands for
    any name (its folder must exist); absolute paths (`/tmp/...`) are outputs
    and are not checked;
  - links: the target exists (relative to the page) and its `#anchor` is a
    heading of the target page;
  - modules: `lm_decoding.x.y` is a module of the package, or a name defined
    at the top level of one;
  - flags: `--config.a.b` is a key (or a section) of the config file the same
    command names with `--config=configs/x.py[:preset]`, else of some config.
And the README's commands are the ones `.ci/run` and the default config use;
docs/config_reference.md is what `lm_decoding.config_reference.render()` makes.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
import subprocess

import pytest

from lm_decoding import config_reference

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
INSTALL = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test,peer]"'
TEST_COMMAND = "python -m pytest -n 2 tests"
MAIN_JOB = ("python experiments/compare_decoding.py --config=configs/tiny.py "
            "--workdir=/tmp/compare")
EXTENSIONS = (".py", ".md", ".sh", ".json", ".jsonl", ".txt", ".png", ".csv",
              ".ipynb", ".gz", ".toml", ".cfg", ".model", ".tsv", ".log",
              ".safetensors", ".npy")
SOURCE_DIRS = ("lm_decoding", "experiments", "configs", "tests")


@functools.cache
def tree() -> tuple[str, ...]:
  """Every path of the repository (git's tracked and untracked, not ignored),
  with every folder above a file as 'folder/'."""
  out = subprocess.run(
      ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
      cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  paths = set(out)
  for path in out:
    parts = path.split("/")
    for i in range(1, len(parts)):
      paths.add("/".join(parts[:i]) + "/")
  return tuple(sorted(paths))


@functools.cache
def source_strings() -> frozenset[str]:
  """String constants of the package, experiments, configs and tests."""
  strings = set()
  for path in tree():
    if path.endswith(".py") and path.startswith(SOURCE_DIRS):
      for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
          strings.add(node.value)
  return frozenset(strings)


@functools.cache
def config_keys(name: str, preset: str = "") -> frozenset[str]:
  """Leaf keys and sections of configs/{name}.py's get_config(preset)."""
  flat = config_reference.flatten(
      config_reference.load_config(ROOT / "configs" / f"{name}.py", preset))
  keys = set(flat)
  for key in flat:
    parts = key.split(".")
    keys.update(".".join(parts[:i]) for i in range(1, len(parts)))
  return frozenset(keys)


def all_config_keys() -> frozenset[str]:
  return frozenset().union(*(config_keys(p.stem)
                             for p in (ROOT / "configs").glob("*.py")))


def slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
  return {slug(m.group(1)) for m in
          re.finditer(r"^#+ (.+)$", strip_fences(page.read_text()), re.M)}


def strip_fences(text: str) -> str:
  return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def commands(text: str) -> list[str]:
  """The units that name things: each command of a bash or python block
  (backslash continuations and open quotes joined) and each inline code span."""
  units = []
  for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
    if block.group(1) not in ("bash", "python"):
      continue
    current = ""
    for line in block.group(2).splitlines():
      current = f"{current} {line}" if current else line
      if current.rstrip().endswith("\\") or current.count("'") % 2:
        current = current.rstrip().rstrip("\\")
        continue
      units.append(current)
      current = ""
    if current:
      units.append(current)
  units += re.findall(r"`([^`\n]+)`", strip_fences(text))
  return units


def path_problem(token: str) -> str | None:
  """Why the path `token` (as written in a page) does not exist, or None."""
  token = token.rstrip(".,:;)")
  if token.startswith("/") or "://" in token or token.startswith("gs:"):
    return None  # an output location
  if "<" in token:  # a placeholder: the folder it goes in must exist
    token = token[:token.index("<")].rpartition("/")[0] + "/"
    if token == "/" or token in tree():
      return None
    return f"{token}: no such folder"
  pattern = re.escape(token).replace(r"\*", "[^/]*")
  anchored = token.split("/")[0] + "/" in tree() or token in tree()
  if anchored:
    if any(re.fullmatch(pattern + "/?", path) for path in tree()):
      return None
    return f"{token}: no such path"
  if any(re.fullmatch(r"(?:.*/)?" + pattern + "/?", path) for path in tree()):
    return None
  if "/" not in token and token in source_strings():
    return None  # a file the code reads or writes
  module, _, attribute = token.rpartition(".")
  if (module and not token.endswith(EXTENSIONS)
      and any(p.endswith(module + ".py") for p in tree())):
    return None  # models/quantization.quantize_params
  return f"{token}: not the end of any path in the tree"


def path_tokens(unit: str) -> list[str]:
  tokens = []
  top = {path.split("/")[0] for path in tree()}
  for token in re.findall(r"[\w.<>*{}/-]+", unit):
    token = token.rstrip(".")
    if "{" in token or token.startswith("-"):
      continue
    if (token.split("/")[0] in top and "/" in token
        or token.endswith(EXTENSIONS + ("/",)) and re.search(r"[A-Za-z]", token)
        or re.search(r"\w/\w+\.\w", token)):
      tokens.append(token)
  return tokens


@functools.cache
def defined_names(module_file: pathlib.Path) -> frozenset[str]:
  names = set()
  for node in ast.parse(module_file.read_text()).body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names.update(t.id for t in targets if isinstance(t, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split(".")[0] for a in node.names)
  return frozenset(names)


def module_problem(dotted: str) -> str | None:
  path = ROOT
  parts = dotted.split(".")
  for i, part in enumerate(parts):
    if (path / part).is_dir() and (path / part / "__init__.py").exists():
      path = path / part
      continue
    if (path / f"{part}.py").exists():
      rest = parts[i + 1:]
      if rest and rest[0] not in defined_names(path / f"{part}.py"):
        return f"{dotted}: {rest[0]} is not defined in {part}.py"
      return None
    if i and part in defined_names(path / "__init__.py"):
      return None
    return f"{dotted}: no module {part} in {path.relative_to(ROOT)}"
  return None


def flag_problems(unit: str) -> list[str]:
  named = re.findall(r"--config=configs/(\w+)\.py(?::(\w+))?", unit)
  keys = (frozenset().union(*(config_keys(n, p) for n, p in named)) if named
          else all_config_keys())
  where = f"configs/{named[0][0]}.py" if named else "any config"
  return [f"--config.{flag}: not a key of {where}" for flag in
          re.findall(r"--config\.([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)",
                     unit) if flag not in keys]


def link_problems(page: pathlib.Path, text: str) -> list[str]:
  problems = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if "://" in target or target.startswith("mailto:"):
      continue
    file, _, anchor = target.partition("#")
    resolved = (page.parent / file).resolve() if file else page
    if not resolved.exists():
      problems.append(f"link {target}: no such file")
    elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
      problems.append(f"link {target}: no heading #{anchor}")
  return problems


def problems_of(page: pathlib.Path, text: str) -> list[str]:
  """Every name of `text` (the Markdown of `page`) that does not exist."""
  problems = link_problems(page, text)
  for unit in commands(text):
    problems += flag_problems(unit)
    problems += filter(None, map(path_problem, path_tokens(unit)))
  for dotted in set(re.findall(r"\blm_decoding(?:\.[A-Za-z_]\w*)+", text)):
    problems.append(module_problem(dotted))
  return sorted(set(filter(None, problems)))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_name_in_the_page_exists(page):
  assert problems_of(page, page.read_text()) == []


def test_the_checker_flags_what_does_not_exist():
  page = ROOT / "docs" / "metrics.md"
  bogus = """
```bash
python experiments/no_such_script.py --config=configs/tiny.py --config.model.no_such_key=1
python experiments/train.py --config=configs/translation.py --config.compare.batch_sizes='(1,)'
```
See `lm_decoding/decoding/no_such_decoder.py`, `no_such_file_anywhere.md`,
`lm_decoding.decoding.no_such_module`, `lm_decoding.data.corpus.no_such_function`,
[a page](no_such_page.md), [a heading](results.md#no-such-heading), `--config.nothere.x`.
Fine: `lm_decoding/decoding/iterative.py`, `machine_b/`, `metrics.jsonl`, `/tmp/x.txt`,
`lm_decoding.data.corpus.split_documents`, [results](results.md#run-times).
"""
  assert problems_of(page, bogus) == sorted([
      "--config.compare.batch_sizes: not a key of configs/translation.py",
      "--config.model.no_such_key: not a key of configs/tiny.py",
      "--config.nothere.x: not a key of any config",
      "experiments/no_such_script.py: no such path",
      "lm_decoding.data.corpus.no_such_function: no_such_function is not "
      "defined in corpus.py",
      "lm_decoding.decoding.no_such_module: no module no_such_module in "
      "lm_decoding/decoding",
      "lm_decoding/decoding/no_such_decoder.py: no such path",
      "link no_such_page.md: no such file",
      "link results.md#no-such-heading: no heading #no-such-heading",
      "no_such_file_anywhere.md: not the end of any path in the tree",
  ])


def test_readme_commands_are_the_ones_ci_and_the_default_config_use():
  readme = (ROOT / "README.md").read_text()
  lines = readme.splitlines()
  assert len(lines) <= 150
  for command in (INSTALL, TEST_COMMAND, MAIN_JOB):
    assert command in lines, command
  ci = (ROOT / ".ci" / "run").read_text().splitlines()
  assert TEST_COMMAND in ci
  assert any(line.endswith('pip install -e ".[test,peer]"') for line in ci)
  main_job = (ROOT / "experiments" / "compare_decoding.py").read_text()
  default = re.search(r'DEFINE_config_file\(\s*"config",.{0,80}?"configs",'
                      r'\s*"(\w+\.py)"', main_job, re.S)
  assert default and f"--config=configs/{default.group(1)}" in MAIN_JOB


def test_config_reference_is_generated_from_the_configs():
  committed = (ROOT / "docs" / "config_reference.md").read_text()
  assert committed == config_reference.render(), (
      "docs/config_reference.md is stale: python -m lm_decoding.config_reference"
      " > docs/config_reference.md")


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_every_page_opens_with_its_commands(page):
  """A title, then the commands the page explains (stub pages of branches
  not merged yet say which issue fills them instead)."""
  lines = page.read_text().splitlines()
  assert lines[0].startswith("# ") and lines[1] == ""
  assert lines[2] == "```bash" or lines[2].startswith("Filled by issue")
