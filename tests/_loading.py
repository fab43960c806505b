"""Loads a script (an experiment or a config file) as a module, once.

An experiment defines absl flags at import; loading it twice in one process
(two test modules in one xdist worker) would define them twice. So a module
is loaded once per name and shared.
"""

from __future__ import annotations

import importlib.util
import sys


def load(name: str, path) -> object:
  """The module `name` from the file `path` (cached in sys.modules)."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses look it up
    try:
      spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[name]
      raise
  return sys.modules[name]
