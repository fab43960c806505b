"""Test-session setup, run by pytest before any test module imports JAX.

The tests run tiny models whose time goes to XLA compiling, not running, so
they compile without LLVM's optimisation passes
(`--xla_backend_optimization_level=0`): about half the compile time, the same
results (XLA keeps float semantics at every level; the stored expectations
and cross-process hashes hold). Subprocesses the tests start inherit it, so
the experiments' smoke runs in the tests use it too; their real runs never do.
The few tests whose time goes to running a program, not to compiling many
small ones (the shipped members' validation bound, 600 train steps), compile
it at XLA's default level instead (the `optimized` fixture): at level 0 the
bound took about twice the CPU time.

No persistent compilation cache is shared between the xdist workers: with
a size limit JAX locks the directory but scans it on every write, which was
slower than no cache, and without one two workers write it unlocked.

Compiled programs are released (`jax.clear_caches()`) after any test that
leaves the worker holding more than 20,000 memory mappings: XLA:CPU maps
three regions per compiled kernel and keeps them while the program is
cached, so a worker grew past 25,000 mappings by the middle of the suite
(one module alone past 30,000) towards the kernel's limit
(`vm.max_map_count`, 65,530), where compiling segfaulted (in two of two CI
runs on 2026-12-03, inside `backend_compile_and_load`). Releasing only past
the threshold keeps the programs a module's tests share compiled.
"""

import gc
import os

import pytest

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()


@pytest.fixture
def optimized():
  """compile(jitted, *args): `jitted` (a `jax.jit` function) compiled for
  `args` at XLA's default optimisation level (3, with LLVM's passes), for a
  test that runs a large program many times; call the result with `args`'
  shapes."""
  def compile_(jitted, *args):
    return jitted.lower(*args).compile(
        compiler_options={"xla_backend_optimization_level": 3})
  return compile_


_MAX_MAPPINGS = 20_000


def _mappings() -> int:
  """The process's memory mappings (0 where /proc is absent)."""
  try:
    with open("/proc/self/maps", "rb") as maps:
      return sum(1 for _ in maps)
  except OSError:
    return 0


def pytest_runtest_teardown(item, nextitem):
  """Drops every cached executable once the mappings pass the threshold."""
  del item, nextitem
  if _mappings() > _MAX_MAPPINGS:
    import jax  # pylint: disable=g-import-not-at-top (after XLA_FLAGS is set)
    jax.clear_caches()
    gc.collect()
