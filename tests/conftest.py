"""Test-session setup, run by pytest before any test module imports JAX.

The tests run tiny models whose time goes to XLA compiling, not running, so
they compile without LLVM's optimisation passes
(`--xla_backend_optimization_level=0`): about half the compile time, the same
results (XLA keeps float semantics at every level; the stored expectations
and cross-process hashes hold). Subprocesses the tests start inherit it.
Benchmarks and experiments never run under it.

They also share JAX's persistent compilation cache (`_CACHE`, every program
however fast it compiled): what one xdist worker or test subprocess
compiled, the other and later ones load instead of compiling again (a fifth
off the subprocess-heavy files on 2 cores). The entries are keyed by the
program, flags and JAX version, so a stale entry is never used. The test of
determinism across processes turns it off for its subprocess, which must
compile for itself.
"""

import os
import tempfile

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

_CACHE = os.path.join(tempfile.gettempdir(),
                      f"lm_decoding_tests_xla_cache_{os.getuid()}")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
