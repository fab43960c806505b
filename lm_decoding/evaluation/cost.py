"""Cost of a jitted computation: wall time, XLA's FLOP/byte counts, memory.

Compile time is measured apart from run time by ahead-of-time compilation
(`jax.jit(fn).lower(*args).compile()`); the compiled executable is then warmed
up and timed over several runs, each ended by `jax.block_until_ready`. The
bytes roofline bounds a memory-bound decode step below: every step must read
the parameters and the live KV cache at least once (Pope et al. 2022,
"Efficiently Scaling Transformer Inference").

`decode_cost` turns one decoder's timing and `DecodeResult` into the record
the comparison harness tabulates, defined identically for AR and parallel
decoders.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding.base import DecodeResult
from lm_decoding.evaluation import records


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall-clock time of one jitted call, seconds.

  Attributes:
    compile_s: trace + lower + XLA compile time (paid once per shape bucket).
    median_s: median of `runs_s`.
    runs_s: the timed runs, in order, after warm-up.
  """

  compile_s: float
  median_s: float
  runs_s: tuple[float, ...]

  @property
  def min_s(self) -> float:
    return min(self.runs_s)

  @property
  def max_s(self) -> float:
    return max(self.runs_s)

  @property
  def iqr_s(self) -> float:
    """Interquartile range of the runs (linear interpolation)."""
    q1, q3 = np.percentile(self.runs_s, [25, 75])
    return float(q3 - q1)


def compile_timed(fn: Callable[..., Any], args: tuple,
                  compiler_options: dict | None = None) -> tuple[Any, float]:
  """(compiled executable, compile seconds) of fn at args, ahead of time.

  A `jax.jit`-ed fn is lowered as is (keeping its shardings and static
  arguments), anything else is wrapped in `jax.jit`; `compiler_options`
  (XLA flags as a dict) go to `.compile`. Nothing is run.
  """
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile(compiler_options)
  return compiled, time.perf_counter() - start


def measure(fn: Callable[..., Any], args: tuple, warmup: int,
            runs: int, carry: bool = False) -> tuple[Timing, Any, Any]:
  """(Timing, compiled executable, output of the last run) of fn(*args).

  As `time_fn`, which returns only the Timing. With `carry`, fn returns
  (carry, out) and every call takes the previous call's carry as its first
  argument, so that argument may be donated (a train state: `fn(state,
  batch, key) -> (state, metrics)`); the output returned is then the last
  (carry, out).

  Raises:
    ValueError: if warmup < 0 or runs < 1.
  """
  if warmup < 0:
    raise ValueError(f"warmup={warmup} must be >= 0")
  if runs < 1:
    raise ValueError(f"runs={runs} must be >= 1")
  compiled, compile_s = compile_timed(fn, args)

  def call():
    nonlocal args
    out = jax.block_until_ready(compiled(*args))
    if carry:
      args = (out[0],) + tuple(args[1:])
    return out

  for _ in range(warmup):
    call()
  runs_s = []
  for _ in range(runs):
    start = time.perf_counter()
    out = call()
    runs_s.append(time.perf_counter() - start)
  timing = Timing(compile_s=compile_s, median_s=float(np.median(runs_s)),
                  runs_s=tuple(runs_s))
  return timing, compiled, out


def time_fn(fn: Callable[..., Any], *args: Any, warmup: int = 1,
            runs: int = 5) -> Timing:
  """Times fn(*args): compile once, warm up, then `runs` timed calls.

  `fn` is compiled ahead of time: a `jax.jit`-ed function is lowered as is
  (keeping its shardings), anything else is wrapped in `jax.jit`. All `args`
  are traced, so bind static arguments (a `logits_fn`, a decoder config)
  with `functools.partial` first, and do not donate `args`: every run
  reuses them.

  Args:
    fn: the function to time.
    *args: its arguments (pytrees of arrays).
    warmup: untimed calls after compiling, >= 0.
    runs: timed calls, >= 1.
  Returns:
    A `Timing`.
  Raises:
    ValueError: if warmup < 0 or runs < 1.
  """
  return measure(fn, args, warmup, runs)[0]


@dataclasses.dataclass(frozen=True)
class CostAnalysis:
  """XLA's static estimates for one compiled executable.

  XLA's cost model counts the body of a while loop (`lax.scan`,
  `lax.fori_loop`) once, not once per trip, so for a looped decoder these
  are per-program counts, not totals over steps.

  Attributes:
    flops: floating-point operations, or None if XLA gives none.
    bytes_accessed: bytes read and written by all ops, or None.
    peak_memory_bytes: peak device memory of a call (arguments, outputs and
      temporaries), or None if the backend has no memory analysis.
    temp_bytes: temporary buffers, bytes, or None.
  """

  flops: float | None
  bytes_accessed: float | None
  peak_memory_bytes: int | None
  temp_bytes: int | None


def interleaved(calls: dict[str, Callable[[], Any]], runs: int,
                warmup: int = 0
                ) -> tuple[dict[str, list[float]], dict[str, Any]]:
  """Times zero-argument calls in turns (A, B, A, B, ...), `runs` rounds.

  The project's one A/B timer. On a shared machine interference drifts;
  timing the systems in turns spreads it over all of them, so their
  per-round ratios are robust. Each call should be compiled already
  (`compile_timed`); `warmup` untimed rounds run first; each call is ended
  by `jax.block_until_ready`. A call may carry state from round to round
  (a donated train state) in its closure.

  Returns:
    ({name: [wall seconds per round]}, {name: the last round's output}).
  Raises:
    ValueError: runs < 1, warmup < 0 or no calls.
  """
  if runs < 1 or warmup < 0 or not calls:
    raise ValueError(f"runs={runs} must be >= 1, warmup={warmup} >= 0 and "
                     "calls non-empty")
  for _ in range(warmup):
    for call in calls.values():
      jax.block_until_ready(call())
  times = {name: [] for name in calls}
  outputs = {}
  for _ in range(runs):
    for name, call in calls.items():
      start = time.perf_counter()
      outputs[name] = jax.block_until_ready(call())
      times[name].append(time.perf_counter() - start)
  return times, outputs


def load_summary(load_averages: Sequence[float]) -> str:
  """The 1-minute load averages taken at a run's start and end (in that
  order), and what they say about its timings (`records.shared` on
  os.cpu_count() cores)."""
  start, end = load_averages
  if records.shared(load_averages, os.cpu_count()):
    note = ("more than half a job above the core count: other jobs were "
            "running, timings are noisy")
  else:
    note = "at most the core count + 0.5: this run alone"
  return (f"1-minute load average {start:.1f} at the start and {end:.1f} at "
          f"the end on {os.cpu_count()} cores ({note})")


def cost_analysis(compiled: Any) -> CostAnalysis:
  """FLOPs, bytes and memory of a `jax.stages.Compiled` (from `.compile()`).

  On jax 0.10 `compiled.cost_analysis()` is a dict (older versions return a
  list with one dict per program, summed here); either may be None or lack
  a key on some backends.
  """
  costs = compiled.cost_analysis()
  if isinstance(costs, dict):
    costs = [costs]
  costs = costs or []

  def total(key):
    values = [c[key] for c in costs if key in c]
    return float(sum(values)) if values else None

  memory = compiled.memory_analysis()
  peak = temp = None
  if memory is not None:
    temp = int(memory.temp_size_in_bytes)
    peak = getattr(memory, "peak_memory_in_bytes", None)
    if peak is None:
      peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes
              - memory.alias_size_in_bytes + temp)
    peak = int(peak)
  return CostAnalysis(flops=total("flops"),
                      bytes_accessed=total("bytes accessed"),
                      peak_memory_bytes=peak, temp_bytes=temp)


def measure_bandwidth(num_bytes: int = 1 << 28, runs: int = 5) -> float:
  """Measured read bandwidth of the default device, bytes/s.

  Times a jitted sum over a float32 array of `num_bytes` (median of `runs`).
  Use an array much larger than the caches (the default is 256 MiB; about
  16-20 GB/s on a 2-core CPU at 1 GiB).

  Raises:
    ValueError: if num_bytes < 4 or runs < 1.
  """
  if num_bytes < 4:
    raise ValueError(f"num_bytes={num_bytes} must be >= 4")
  x = jnp.ones((num_bytes // 4,), jnp.float32)
  return x.nbytes / time_fn(jnp.sum, x, runs=runs).median_s


def measure_peak_flops(size: int | Sequence[int] = 2048, runs: int = 5,
                       dtype: Any = jnp.float32) -> float:
  """Measured matmul throughput of the default device, FLOP/s: the best of
  `runs` back-to-back jnp.dot calls at each of the sizes.

  Each size n times the product of two n x n matrices of `dtype` (2 n^3
  FLOPs, compiled and warmed up first) `runs` times in a row; the peak is
  the highest FLOP/s of any run at any size. A best, not a median: a
  call slowed by another process says nothing about the device, and a
  median of a few calls moved by half from call to call on a shared 2-core
  host (331-494 GFLOP/s, issue 37). Give several sizes where the size that
  fills the device is not known (the trainer measures (256, 512, 1024)).
  The matrices hold random normal values, not constants, which let a GPU's
  matrix units run faster than on real data. About 100 GFLOP/s in float32
  on an idle 2-core CPU; give the model's compute dtype (e.g. 'bfloat16' on
  a GPU or TPU) and a size that fills the device (8192 on an H100 / H200).

  Raises:
    ValueError: a size < 1, no size, or runs < 1.
  """
  sizes = (size,) if isinstance(size, int) else tuple(size)
  if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
    raise ValueError(f"size={size} must be an integer >= 1 or a non-empty "
                     "sequence of them")
  best = 0.0
  for n in sizes:
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    best = max(best, 2 * n ** 3 / time_fn(jnp.dot, a, a, runs=runs).min_s)
  return best


def flop_utilisation(flops: float, seconds: float, peak_flops: float
                     ) -> float:
  """Model FLOP utilisation: flops / seconds / peak_flops, a fraction.

  Args:
    flops: the model FLOPs of the work timed (e.g.
      `cost_model.objective_flops`), >= 0.
    seconds: its wall time, > 0.
    peak_flops: the device's peak, FLOP/s (`measure_peak_flops`), > 0.
  Raises:
    ValueError: a value out of range (the message names it).
  """
  if not flops >= 0:
    raise ValueError(f"flops={flops} must be >= 0")
  for name, value in (("seconds", seconds), ("peak_flops", peak_flops)):
    if not value > 0:
      raise ValueError(f"{name}={value} must be > 0")
  return flops / seconds / peak_flops


def _tiny_scan(x_8x8, steps):
  def body(carry_8x8, _):  # a dot and an elementwise op: two kernels a trip
    return jnp.tanh(carry_8x8 @ x_8x8), None
  return jax.lax.scan(body, x_8x8, None, length=steps)[0]


def measure_step_overhead(steps: int = 10000, runs: int = 5) -> float:
  """Measured fixed cost of one trip of a jitted `lax.scan`, seconds.

  Times a scan of `steps` trips whose body is tiny (an 8 x 8 matmul and a
  tanh), so the time is loop control and kernel dispatch: the median over
  `runs`, divided by `steps`.

  Raises:
    ValueError: if steps < 1 or runs < 1.
  """
  if steps < 1:
    raise ValueError(f"steps={steps} must be >= 1")
  fn = functools.partial(_tiny_scan, steps=steps)
  x = jnp.full((8, 8), 0.1, jnp.float32)
  return time_fn(fn, x, runs=runs).median_s / steps


def tree_bytes(params: Any) -> int:
  """Bytes of all leaves of a parameter tree (arrays or ShapeDtypeStructs)."""
  return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(params)))


def roofline_s(param_bytes: float, kv_cache_bytes: float,
               bandwidth: float) -> float:
  """Bytes lower bound of one decode step, seconds.

  A step reads every parameter and the live KV cache at least once:
  (param_bytes + kv_cache_bytes) / bandwidth. For a parallel decoder's
  full forward pass without a cache use kv_cache_bytes = 0.

  Args:
    param_bytes: parameter bytes (`tree_bytes(params)`), >= 0.
    kv_cache_bytes: bytes of the KV cache live at this step (all rows), >= 0.
    bandwidth: memory bandwidth, bytes/s (`measure_bandwidth()`), > 0.
  Raises:
    ValueError: on negative bytes or non-positive bandwidth.
  """
  if param_bytes < 0 or kv_cache_bytes < 0:
    raise ValueError(f"param_bytes={param_bytes} and kv_cache_bytes="
                     f"{kv_cache_bytes} must be >= 0")
  if bandwidth <= 0:
    raise ValueError(f"bandwidth={bandwidth} must be > 0")
  return (param_bytes + kv_cache_bytes) / bandwidth


def ar_decode_roofline_s(param_bytes: float, kv_bytes_per_token: float,
                         prompt_length: int, new_tokens: int,
                         bandwidth: float) -> float:
  """Bytes lower bound of a whole AR decode, seconds.

  Step t = 0 .. new_tokens - 1 reads the parameters and a cache of
  prompt_length + t tokens: the sum of `roofline_s` over the steps.

  Args:
    param_bytes: parameter bytes, >= 0.
    kv_bytes_per_token: KV-cache bytes per token position over the whole
      batch (`KVCache.bytes_per_slot() * batch_size`), >= 0.
    prompt_length: prompt tokens, >= 0.
    new_tokens: generated tokens (decode steps), >= 0.
    bandwidth: bytes/s, > 0.
  Raises:
    ValueError: on a negative count or the errors of `roofline_s`.
  """
  if prompt_length < 0 or new_tokens < 0:
    raise ValueError(f"prompt_length={prompt_length} and new_tokens="
                     f"{new_tokens} must be >= 0")
  cached = new_tokens * prompt_length + new_tokens * (new_tokens - 1) / 2
  return roofline_s(new_tokens * param_bytes, kv_bytes_per_token * cached,
                    bandwidth)


def roofline_ratio(measured_s: float, bound_s: float) -> float:
  """measured_s / bound_s: how many times slower than the roofline (>= 1).

  Raises:
    ValueError: if bound_s <= 0.
  """
  if bound_s <= 0:
    raise ValueError(f"bound_s={bound_s} must be > 0")
  return measured_s / bound_s


@dataclasses.dataclass(frozen=True)
class DecodeCost:
  """Cost of one decoder on one batch (a row of the comparison table).

  Attributes:
    batch_size: rows B.
    steps: decoding steps S (`committed.shape[0]`).
    nfe: forward passes for the batch.
    generated_tokens: real generated tokens, all rows (sum of lengths).
    compile_s: compile time, seconds.
    ms_per_sequence: median wall time of the batch call, ms; every row
      finishes with the batch, so this is each sequence's latency.
    ms_per_token: ms_per_sequence / mean real tokens per row: the per-row
      token latency (NaN if no token was generated).
    tokens_per_s: generated_tokens / median time: batch throughput.
    tokens_per_forward: mean over rows of (row's real tokens / nfe), the
      same formula for AR (about 1) and parallel decoders.
    iqr_ms: interquartile range of the timed runs, ms.
    ttft_ms: time to first token, ms, as measured by the caller, or None.
    flops, bytes_accessed, peak_memory_bytes: from `CostAnalysis` (None if
      unavailable; loops counted once, see there).
  """

  batch_size: int
  steps: int
  nfe: int
  generated_tokens: int
  compile_s: float
  ms_per_sequence: float
  ms_per_token: float
  tokens_per_s: float
  tokens_per_forward: float
  iqr_ms: float
  ttft_ms: float | None
  flops: float | None
  bytes_accessed: float | None
  peak_memory_bytes: int | None


def decode_record(timing: Timing, result: DecodeResult,
                  costs: CostAnalysis | None = None,
                  ttft_s: float | None = None) -> DecodeCost:
  """A `DecodeCost` from measurements already taken (pure).

  Args:
    timing: the decode call's `Timing`.
    result: the `DecodeResult` the call returned.
    costs: its `CostAnalysis`, or None.
    ttft_s: time to first token, seconds (e.g. the median of a
      prefill + first-token call), or None.
  Raises:
    ValueError: if nfe < 1.
  """
  lengths = np.asarray(result.lengths)
  nfe = int(result.nfe)
  if nfe < 1:
    raise ValueError(f"result.nfe={nfe} must be >= 1")
  mean_tokens = float(lengths.mean())
  ms = timing.median_s * 1e3
  return DecodeCost(
      batch_size=int(lengths.shape[0]),
      steps=int(result.committed.shape[0]),
      nfe=nfe,
      generated_tokens=int(lengths.sum()),
      compile_s=timing.compile_s,
      ms_per_sequence=ms,
      ms_per_token=ms / mean_tokens if mean_tokens else float("nan"),
      tokens_per_s=float(lengths.sum()) / timing.median_s,
      tokens_per_forward=mean_tokens / nfe,
      iqr_ms=timing.iqr_s * 1e3,
      ttft_ms=None if ttft_s is None else ttft_s * 1e3,
      flops=None if costs is None else costs.flops,
      bytes_accessed=None if costs is None else costs.bytes_accessed,
      peak_memory_bytes=None if costs is None else costs.peak_memory_bytes)


def decode_cost(fn: Callable[..., DecodeResult], *args: Any, warmup: int = 1,
                runs: int = 5, ttft_s: float | None = None) -> DecodeCost:
  """Compiles, times and costs a decode call fn(*args) -> DecodeResult.

  E.g. `decode_cost(functools.partial(decoder.decode, logits_fn), params,
  prompts, prompt_lengths, key)`. See `time_fn` for how `fn` and `args` are
  compiled and timed; the record's tokens and NFE come from the last run.

  Raises:
    TypeError: if fn does not return a `DecodeResult`.
    ValueError: as `time_fn` and `decode_record`.
  """
  timing, compiled, result = measure(fn, args, warmup, runs)
  if not isinstance(result, DecodeResult):
    raise TypeError(f"fn must return a DecodeResult, got {type(result)}")
  return decode_record(timing, result, cost_analysis(compiled), ttft_s)
