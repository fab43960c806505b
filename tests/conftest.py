"""Test-session setup, run by pytest before any test module imports JAX.

The tests run tiny models whose time goes to XLA compiling, not running, so
they compile without LLVM's optimisation passes
(`--xla_backend_optimization_level=0`): about half the compile time, the same
results (XLA keeps float semantics at every level; the stored expectations
and cross-process hashes hold). Subprocesses the tests start inherit it, so
the experiments' smoke runs in the tests use it too; their real runs never do.

The test session also shares one JAX persistent compilation cache (every
program, however fast it compiled): what one xdist worker or test subprocess
compiled, the other and later ones load instead of compiling again (a fifth
off the subprocess-heavy files on 2 cores). The directory is made fresh for
the session by the process that loads this file first (pytest itself, whose
xdist workers and subprocesses inherit its environment) and removed when
its session ends, so no entry outlives it. It has no size limit: with one,
JAX scans the whole directory on every write (thousands of entries here,
which made the suite slower than without a cache). Without the limit JAX
takes no lock, so a worker may read an entry the other is still writing;
JAX then warns and compiles the program itself. The test of determinism
across processes turns the cache off for its subprocess, which must compile
for itself.
"""

import os
import shutil
import tempfile

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

_OWN_CACHE = None  # the cache directory this process made, if it made one
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix="lm_decoding_tests_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
  """Removes the session's compilation cache (in the process that made it)."""
  del config
  if _OWN_CACHE is not None:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
