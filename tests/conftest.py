"""Test-session setup, run by pytest before any test module imports JAX.

The tests run tiny models whose time goes to XLA compiling, not running, so
they compile without LLVM's optimisation passes
(`--xla_backend_optimization_level=0`): about half the compile time, the same
results (XLA keeps float semantics at every level; the stored expectations
and cross-process hashes hold). Subprocesses the tests start inherit it.
Benchmarks and experiments never run under it.
"""

import os

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
