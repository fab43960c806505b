"""Counts how often following the trainer's config re-enters train.py.

Starting from `train(config, ...)` in lm_decoding/training/train.py, follows
every call whose argument is the config or one of its sections (`config`,
`config.train`, `config.get("mesh")`, or a local bound to one) to a function
defined in train.py, and from there the same way (the callee's parameter
that received it now holds the config). Values read from the config (a
number, a model config built from it) do not count.
Prints the number of distinct functions of train.py so entered and each
(caller -> callee) edge. Issue 37's goal: at most 4 (16 at 056e33d).

  python benchmarks/code_shape/config_reentries.py [path/to/train.py]
"""

import ast
import sys


SECTIONS = {"train", "data", "model", "mesh", "translate"}


def config_names(fn: ast.FunctionDef, params: set[str]) -> set[str]:
  """`params` and every local bound to the config or one of its sections
  (`x = config.train`, `a, b = config.train, ...`)."""
  names = set(params)
  for node in ast.walk(fn):
    if not isinstance(node, ast.Assign):
      continue
    for target in node.targets:
      pairs = ([(target, node.value)] if not isinstance(target, ast.Tuple)
               else list(zip(target.elts, getattr(node.value, "elts", []))))
      for t, v in pairs:
        if isinstance(t, ast.Name) and _mentions(v, names):
          names.add(t.id)
  return names


def _mentions(expr: ast.AST, names: set[str]) -> bool:
  """Whether `expr` is the config or a section of it."""
  if isinstance(expr, ast.Name):
    return expr.id in names
  if isinstance(expr, ast.Attribute):
    return expr.attr in SECTIONS and _mentions(expr.value, names)
  if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
      and expr.func.attr == "get" and expr.args
      and isinstance(expr.args[0], ast.Constant)):
    return expr.args[0].value in SECTIONS and _mentions(expr.func.value, names)
  return False


def main(path: str) -> None:
  tree = ast.parse(open(path).read())
  functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
  entered, edges = set(), []
  todo = [("train", {"config"})]
  seen = set()
  while todo:
    name, params = todo.pop()
    if (name, frozenset(params)) in seen:
      continue
    seen.add((name, frozenset(params)))
    fn = functions[name]
    names = config_names(fn, params)
    for call in ast.walk(fn):
      if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
              and call.func.id in functions):
        continue
      callee = functions[call.func.id]
      args = [a.arg for a in callee.args.args]
      got = set()
      for i, arg in enumerate(call.args):
        if i < len(args) and _mentions(arg, names):
          got.add(args[i])
      for kw in call.keywords:
        if kw.arg and _mentions(kw.value, names):
          got.add(kw.arg)
      if got:
        entered.add(callee.name)
        edges.append(f"{name} -> {callee.name} ({', '.join(sorted(got))})")
        todo.append((callee.name, got))
  print(f"{len(entered)} functions of {path} entered with the config")
  for edge in sorted(set(edges)):
    print("  " + edge)


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "lm_decoding/training/train.py")
