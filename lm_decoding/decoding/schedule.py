"""Transfer schedules of parallel (masked-diffusion) decoding.

A transfer schedule says how many masked positions a decoder commits at each
of its steps. LLaDA (Nie et al. 2025) spreads the masked count of a block as
evenly as possible over the block's steps; MaskGIT (Chang et al. 2022) keeps
a cosine fraction of the positions masked after each step. MaskGIT keeps its
schedule in one pure function of (step, total) for the same reason this
module exists: the schedule is tested alone, apart from the decode loop.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


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
