"""Transfer schedules of parallel (masked-diffusion) decoding.

A transfer schedule says how many masked positions a decoder commits at each
of its steps. LLaDA (Nie et al. 2025) spreads the masked count of a block as
evenly as possible over the block's steps; MaskGIT (Chang et al. 2022) keeps
a cosine fraction of the positions masked after each step; Dream (Ye et al.
2025) commits a fraction 1 - s / t of the positions still masked, t and s
consecutive points of a linear time grid. MaskGIT keeps its
schedule in one pure function of (step, total) for the same reason this
module exists: the schedule is tested alone, apart from the decode loop.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _check(num_masked, steps: int) -> None:
  if steps < 1:
    raise ValueError(f"steps={steps} must be >= 1")
  if not isinstance(num_masked, jax.core.Tracer) and int(num_masked) < 0:
    raise ValueError(f"num_masked={int(num_masked)} must be >= 0")


def transfer_schedule(num_masked: jax.Array | int, steps: int) -> jax.Array:
  """Spreads `num_masked` commits over `steps` steps, larger counts first.

  Every count is `num_masked // steps` or one more; the `num_masked % steps`
  larger counts come first, so the counts are non-increasing and sum exactly
  to `num_masked`. Worked example: 5 masks over 3 steps -> [2, 2, 1]; 2 over
  4 -> [1, 1, 0, 0].

  Args:
    num_masked: int[] masked positions to commit (>= 0); may be a traced
      int32 (e.g. one row's count inside `jax.vmap`).
    steps: static number of steps (>= 1).
  Returns:
    int32[steps] tokens to commit at each step.
  Raises:
    ValueError: steps < 1, or a concrete num_masked < 0.
  """
  _check(num_masked, steps)
  num_masked = jnp.asarray(num_masked, jnp.int32)
  base, larger = jnp.divmod(num_masked, steps)
  return base + (jnp.arange(steps, dtype=jnp.int32) < larger).astype(jnp.int32)


def cosine_schedule(num_masked: jax.Array | int, steps: int) -> jax.Array:
  """MaskGIT's cosine schedule: commits per step, front-loaded gently.

  After step k of K, floor(n cos(pi/2 (k + 1) / K)) of the n initially
  masked positions stay masked (none after the last step), and every step
  commits at least one while any is left. Worked example: 8 over 4 ->
  [1, 2, 2, 3] (7, 5, 3, then 0 left).

  Args:
    num_masked: int[] masked positions at the start (>= 0; may be traced).
    steps: static number of steps (>= 1).
  Returns:
    int32[steps] tokens to commit at each step; sums to num_masked.
  Raises:
    ValueError: steps < 1, or a concrete num_masked < 0.
  """
  _check(num_masked, steps)
  n = jnp.asarray(num_masked, jnp.int32)
  ratio = jnp.arange(1, steps + 1, dtype=jnp.float32) / steps
  left = jnp.floor(n * jnp.cos(0.5 * math.pi * ratio)).astype(jnp.int32)
  left = left.at[-1].set(0)

  def step(masked, left_k):
    count = jnp.minimum(masked, jnp.maximum(masked - left_k, 1))
    return masked - count, count

  return jax.lax.scan(step, n, left)[1]


def _linspace_float32(start: float, stop: float, num: int) -> np.ndarray:
  """float32[num] evenly spaced from start to stop, rounded as
  `torch.linspace` rounds them in float32 (the first half counted from
  start, the second from stop, each point rounded once from float64), so
  that Dream's grid is reproduced to the bit."""
  start32, stop32 = np.float32(start), np.float32(stop)
  step = np.float32((stop32 - start32) / np.float32(num - 1))
  index = np.arange(num)
  from_start = np.float64(start32) + np.float64(step) * index
  from_stop = np.float64(stop32) - np.float64(step) * (num - 1 - index)
  return np.where(index < num // 2, from_start, from_stop).astype(np.float32)


def dream_schedule(num_masked: jax.Array | int, steps: int,
                   eps: float = 1e-3) -> jax.Array:
  """Dream's schedule (`diffusion_generate` with a confidence `alg`): at
  step k of K, floor(n_k (1 - s / t)) of the n_k positions still masked,
  every one at the last step.

  t and s are points k and k + 1 of linspace(1, eps, K + 1); the product is
  taken in float32 as Dream's generate takes it, so the counts match its
  commits exactly (a count may be 0: early steps of a long grid commit
  nothing). Worked example: 64 over 8 -> [7, 8, 8, 8, 8, 8, 8, 9] (the
  remaining 64, 57, ... shrink while 1 - s / t grows to 1).

  Args:
    num_masked: int[] masked positions at the start (>= 0; may be traced).
    steps: static number of steps K (>= 1).
    eps: the grid's end time (Dream's `eps`, default 1e-3), in (0, 1).
  Returns:
    int32[steps] tokens to commit at each step; sums to num_masked.
  Raises:
    ValueError: steps < 1, a concrete num_masked < 0, or eps outside (0, 1).
  """
  _check(num_masked, steps)
  if not 0 < eps < 1:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  t = _linspace_float32(1.0, eps, steps + 1)
  fraction_K = jnp.asarray(np.float32(1) - t[1:] / t[:-1])
  last_K = jnp.arange(steps) == steps - 1

  def step(masked, inputs):
    fraction, last = inputs
    count = jnp.where(last, masked, jnp.floor(
        masked.astype(jnp.float32) * fraction).astype(jnp.int32))
    return masked - count, count

  return jax.lax.scan(step, jnp.asarray(num_masked, jnp.int32),
                      (fraction_K, last_K))[1]
