"""Shape suffixes (`logits_BxLxV`) use only the letters of docs/glossary.md.

Read from the source with `ast`, nothing imported: every variable,
argument and attribute name of `lm_decoding/` whose last `_` part is a
shape suffix is split at `x` into axes, and each axis must be glossary
letters side by side (a product, `BM`) or with numbers (`Bx1`, `2L`).
"""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lm_decoding"
GLOSSARY = REPO / "docs" / "glossary.md"

# name_SUFFIX, SUFFIX = axis ('x' axis)*, an axis opening with a capital or
# a digit: tokens_BxL, q_BxLxHkvxHgxDh, rows_BM, ids_Bx1.
SUFFIX = re.compile(r"[a-z][a-z0-9_]*?_([A-Z0-9][A-Za-z0-9]*"
                    r"(?:x[A-Z0-9][A-Za-z0-9]*)*)")


def glossary_letters() -> tuple[str, ...]:
  """The letters of the glossary table, in the order written."""
  return tuple(re.findall(r"^\| `(\w+)` \|", GLOSSARY.read_text(), re.M))


def axis_pattern(letters) -> re.Pattern:
  longest_first = sorted(letters, key=len, reverse=True)
  return re.compile(r"(?:\d+|" + "|".join(longest_first) + r")+")


def suffix_problem(name: str, pattern: re.Pattern) -> str | None:
  """Why the shape suffix of `name` breaks the glossary, or None (also for
  a name without a shape suffix: `key_t`, `n`, `MAX_LEN`)."""
  match = SUFFIX.fullmatch(name)
  if match is None or not re.search(r"[A-Z]", match.group(1)):
    return None
  bad = [axis for axis in match.group(1).split("x")
         if not pattern.fullmatch(axis)]
  return f"{name}: axes {bad} not in the glossary" if bad else None


def names(tree: ast.AST):
  """(line, name) of every variable, argument and attribute in `tree`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      yield node.lineno, node.id
    elif isinstance(node, ast.arg):
      yield node.lineno, node.arg
    elif isinstance(node, ast.Attribute):
      yield node.lineno, node.attr
    elif isinstance(node, ast.keyword) and node.arg:
      yield node.lineno, node.arg


def test_each_letter_has_one_meaning():
  letters = glossary_letters()
  assert len(letters) >= 20, letters  # the table was read
  assert len(letters) == len(set(letters)), letters


def test_every_shape_suffix_uses_glossary_letters():
  pattern = axis_pattern(glossary_letters())
  problems = set()
  for path in sorted(PACKAGE.rglob("*.py")):
    tree = ast.parse(path.read_text(), str(path))
    for line, name in names(tree):
      problem = suffix_problem(name, pattern)
      if problem:
        problems.add(f"{path.relative_to(REPO)}:{line}: {problem}")
  assert not problems, "\n".join(sorted(problems))


def test_the_checker_flags_letters_outside_the_glossary():
  pattern = axis_pattern(("B", "L", "V", "Hkv", "Dh", "G1", "M"))
  for good in ("logits_BxLxV", "ids_Bx1", "rows_BM", "k_BxHkvxLxDh",
               "p_BxG1xV", "x_Bx2L", "key_t", "n", "MAX_LEN"):
    assert suffix_problem(good, pattern) is None, good
  assert suffix_problem("tokens_BxW", pattern) == (
      "tokens_BxW: axes ['W'] not in the glossary")
  assert suffix_problem("q_BxLxKxGxD", pattern) == (
      "q_BxLxKxGxD: axes ['K', 'G', 'D'] not in the glossary")
  assert suffix_problem("heads_BxHk", pattern) is not None
