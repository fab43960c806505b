"""The config reference (docs/config_reference.md), rendered from configs/*.py.

Every key of a config file's `get_config()` is a command-line flag
(`--config.compare.batch_sizes='(1,8)'`). This module reads each file twice:
it runs `get_config()` for the values, and parses the source (`ast` and
`tokenize`) for the comments that explain them, so the reference cannot
drift from the files:
  - a key's comment is the comment on the line that sets it (`config.a.b = 1
    # why`, or a keyword of `config.a.update(dict(b=1,  # why`), else the
    block of comment lines right above that statement;
  - a section's comment (`config.compare = ml_collections.ConfigDict()`) is
    the comment block above it.
`configs/tiny.py`, `configs/translation.py` and `configs/tasks.py` stand
alone and get a full table per section (key / default / comment). The
others start from tiny.py's `get_config()` and get one table of the keys
whose value differs
from tiny's, with tiny's value beside theirs. Values longer than
MAX_INLINE characters (the decoder grid, the sharding rules) are listed
under their table, one item a line.

Usage:
  python -m lm_decoding.config_reference > docs/config_reference.md
(`tests/test_docs.py` checks that the committed page equals `render()`.)
"""

from __future__ import annotations

import ast
import importlib.util
import io
import pathlib
import sys
import tokenize
from typing import Any, Iterator

import ml_collections

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"
STANDALONE = ("tiny.py", "translation.py", "tasks.py")  # the others start from tiny.py
BASE = "tiny.py"
MAX_INLINE = 60  # characters of a value shown inside a table cell


def load_config(path: pathlib.Path, preset: str = "") -> ml_collections.ConfigDict:
  """`get_config(preset)` of the config file at `path` (`preset` as after
  the ':' of `--config=configs/x.py:preset`; '' calls `get_config()`)."""
  spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset) if preset else module.get_config()


SIZES = ("tiny", "base")  # the shipped sets a study config can start from


def load_sized(config_file: str, size: str) -> ml_collections.ConfigDict:
  """`configs/<size>.py` beside `config_file` (a study's config, e.g.
  configs/rules.py), the start of a config that takes `:tiny` or `:base`.

  Raises:
    ValueError: `size` not in SIZES, naming `configs/<file>:<size>`.
  """
  path = pathlib.Path(config_file)
  if size not in SIZES:
    raise ValueError(f"configs/{path.name}:<size> must be one of {SIZES}, "
                     f"got {size!r}")
  return load_config(path.with_name(f"{size}.py"))


def flatten(config: ml_collections.ConfigDict,
            prefix: str = "") -> dict[str, Any]:
  """{'compare.batch_sizes': (1, 8), ...}: every leaf key of `config`
  (sorted, as ConfigDict keeps them), dotted as the flags spell them."""
  flat = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def _attribute_path(node: ast.AST) -> str | None:
  """'compare.batch_sizes' for the expression `config.compare.batch_sizes`."""
  names = []
  while isinstance(node, ast.Attribute):
    names.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name) and node.id == "config":
    return ".".join(reversed(names))
  return None


def _dict_keywords(node: ast.AST) -> list[ast.keyword]:
  """The keywords of a `dict(...)` call, possibly wrapped in ConfigDict(...)."""
  if isinstance(node, ast.Call) and node.args and not node.keywords:
    node = node.args[0]
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
      and node.func.id == "dict"):
    return list(node.keywords)
  return []


def _comments(source: str) -> dict[int, str]:
  """{line number: comment text without '#'} for every comment of `source`."""
  comments = {}
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      comments[token.start[0]] = token.string.lstrip("#").strip()
  return comments


def _block_above(line: int, comments: dict[int, str],
                 lines: list[str]) -> str:
  """The comment lines right above line `line` (1-based), joined."""
  block = []
  line -= 1
  while line >= 1 and lines[line - 1].strip().startswith("#"):
    block.append(comments[line])
    line -= 1
  return " ".join(reversed(block))


def _set_statements(tree: ast.AST) -> Iterator[tuple[str, ast.AST, ast.AST]]:
  """(key, the node that sets it, its statement) for each config key a
  statement of `tree` sets, including keywords of `.update(dict(...))`."""
  for statement in ast.walk(tree):
    if isinstance(statement, ast.Assign):
      for target in statement.targets:
        path = _attribute_path(target)
        if path is None:
          continue
        yield path, statement, statement
        for keyword in _dict_keywords(statement.value):
          yield f"{path}.{keyword.arg}", keyword, statement
    elif (isinstance(statement, ast.Expr)
          and isinstance(statement.value, ast.Call)
          and isinstance(statement.value.func, ast.Attribute)
          and statement.value.func.attr == "update"):
      path = _attribute_path(statement.value.func.value)
      if path is not None and statement.value.args:
        for keyword in _dict_keywords(statement.value.args[0]):
          yield f"{path}.{keyword.arg}", keyword, statement


def key_comments(path: pathlib.Path) -> dict[str, str]:
  """{key or section: comment} from the source of the config file `path`
  (the rules of this module's docstring; the first statement that sets a key
  speaks for it, and the first keyword of a `dict(...)` without a comment of
  its own takes its statement's); keys without one are absent."""
  source = path.read_text()
  lines = source.splitlines()
  comments = _comments(source)
  found, seen, explained = {}, set(), set()
  ordered = sorted(_set_statements(ast.parse(source)),
                   key=lambda item: (item[2].lineno, item[1] is item[2],
                                     item[1].lineno))
  for key, node, statement in ordered:
    if key in seen:
      continue
    seen.add(key)
    text = comments.get(node.lineno, "")
    if not text and id(statement) not in explained:
      text = (comments.get(statement.lineno, "")
              or _block_above(statement.lineno, comments, lines))
    explained.add(id(statement))
    if text:
      found[key] = text
  return found


def _format(value: Any) -> str:
  return repr(value)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _value_cell(key: str, value: Any, long_values: list[tuple[str, Any]]) -> str:
  text = _format(value)
  if len(text) <= MAX_INLINE:
    return f"`{_cell(text)}`"
  long_values.append((key, value))
  count = f"{len(value)} items" if isinstance(value, (tuple, list)) else "long"
  return f"({count}, listed below)"


def _long_listing(long_values: list[tuple[str, Any]]) -> list[str]:
  out = []
  for key, value in long_values:
    items = value if isinstance(value, (tuple, list)) else (value,)
    out += ["", f"`{key}`:", "", "```"]
    out += [_format(item) for item in items]
    out.append("```")
  return out


def _summary(path: pathlib.Path) -> str:
  """The first paragraph of the config file's docstring, on one line."""
  doc = ast.get_docstring(ast.parse(path.read_text())) or ""
  return " ".join(doc.split("\n\n")[0].split())


def _standalone_section(path: pathlib.Path) -> list[str]:
  config = load_config(path)
  comments = key_comments(path)
  out = []
  for section, value in config.items():
    out += ["", f"### `{path.stem}`: `{section}`", ""]
    if comments.get(section):
      out += [comments[section], ""]
    flat = (flatten(value, f"{section}.")
            if isinstance(value, ml_collections.ConfigDict)
            else {section: value})
    out += ["| key | default | comment |", "|---|---|---|"]
    long_values = []
    for key, leaf in flat.items():
      out.append(f"| `{key}` | {_value_cell(key, leaf, long_values)} | "
                 f"{_cell(comments.get(key, ''))} |")
    out += _long_listing(long_values)
  return out


def _derived_section(path: pathlib.Path, base: dict[str, Any]) -> list[str]:
  flat = flatten(load_config(path))
  comments = key_comments(path)
  out = ["", f"### `configs/{path.name}`", "", _summary(path), "",
         f"| key | value | in {BASE} | comment in {path.name} |",
         "|---|---|---|---|"]
  long_values = []
  for key, value in flat.items():
    if key in base and base[key] == value:
      continue
    if key not in base:
      before = "(absent)"
    elif len(_format(base[key])) <= MAX_INLINE:
      before = f"`{_cell(_format(base[key]))}`"
    else:
      before = f"(see `configs/{BASE}`)"
    out.append(f"| `{key}` | {_value_cell(key, value, long_values)} | "
               f"{before} | {_cell(comments.get(key, ''))} |")
  return out + _long_listing(long_values)


def render(config_dir: pathlib.Path = CONFIG_DIR) -> str:
  """The Markdown of docs/config_reference.md for the files in `config_dir`."""
  files = sorted(config_dir.glob("*.py"))
  out = [
      "# Config reference",
      "",
      "```bash",
      "python -m lm_decoding.config_reference > docs/config_reference.md"
      "   # regenerate this page",
      "python experiments/compare_decoding.py --config=configs/tiny.py "
      "--workdir=/tmp/compare --config.compare.batch_sizes='(1,8,32)'",
      "```",
      "",
      "Generated from `configs/*.py` by `lm_decoding/config_reference.py` "
      "(do not edit by hand; `tests/test_docs.py` fails when it is stale). "
      "Every key is a flag: `--config.SECTION.KEY=VALUE`. "
      f"{' and '.join(f'`configs/{n}`' for n in STANDALONE)} stand alone and are listed in full; "
      f"the other files start from `configs/{BASE}` and list only the keys "
      "they change. Comments are the config files' own (a key's comment in "
      f"`{BASE}` still applies where a derived file gives none).",
  ]
  for name in STANDALONE:
    out += ["", f"## `configs/{name}`", "", _summary(config_dir / name)]
    out += _standalone_section(config_dir / name)
  base = flatten(load_config(config_dir / BASE))
  out += ["", f"## Configs derived from `configs/{BASE}`"]
  for path in files:
    if path.name not in STANDALONE:
      out += _derived_section(path, base)
  return "\n".join(out) + "\n"


if __name__ == "__main__":
  sys.stdout.write(render())
