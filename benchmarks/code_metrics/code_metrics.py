r"""Size figures of the package: functions over 60 lines, modules over 400.

  python benchmarks/code_metrics/code_metrics.py            # the whole package
  python benchmarks/code_metrics/code_metrics.py lm_decoding/decoding

Counts every function and method by its `def` line to its last line
(docstring included) and every module by its lines. Duplicate pairs come from
the `duplicates` command (`duplicates --repo lm_decoding/decoding`).
"""

import ast
import pathlib
import sys


def main(root: str) -> None:
  long_functions, long_modules = [], []
  for path in sorted(pathlib.Path(root).rglob("*.py")):
    text = path.read_text()
    if len(text.splitlines()) > 400:
      long_modules.append((str(path), len(text.splitlines())))
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        size = node.end_lineno - node.lineno + 1
        if size > 60:
          long_functions.append((f"{path}:{node.name}", size))
  print(f"{root}: functions over 60 lines: {len(long_functions)}; modules "
        f"over 400 lines: {len(long_modules)}")
  for name, size in long_functions + long_modules:
    print(f"  {name} {size}")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "lm_decoding")
