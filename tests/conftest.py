"""Test-session setup, run by pytest before any test module imports JAX.

The tests run tiny models whose time goes to XLA compiling, not running, so
they compile without LLVM's optimisation passes
(`--xla_backend_optimization_level=0`): about half the compile time, the same
results (XLA keeps float semantics at every level; the stored expectations
and cross-process hashes hold). Subprocesses the tests start inherit it, so
the experiments' smoke runs in the tests use it too; their real runs never do.

No persistent compilation cache is shared between the xdist workers: with
two workers writing one unlocked cache directory, a worker aborted inside
JAX's cache write (`put_executable_and_time`, a fatal error that takes the
worker and its test down) in two of two full runs on 2026-12-03; with a size
limit JAX locks the directory but scans it on every write, which was slower
than no cache.
"""

import os

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
