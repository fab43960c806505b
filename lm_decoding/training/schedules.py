"""Noise schedules of masked diffusion (absorbing-state) language models."""

from __future__ import annotations

import jax
import jax.numpy as jnp

EPS = 1e-3  # smallest masking fraction alpha avoids; MDLM samples t in [0, 1]


def log_linear_alpha(t: jax.Array, eps: float = EPS) -> jax.Array:
  """Signal level alpha_t = 1 - (1 - eps) t of the log-linear schedule.

  alpha_t is the probability that a token is still unmasked at time t in
  [0, 1] (Sahoo et al. 2024, MDLM; Lou et al. 2023, SEDD). alpha_0 = 1 and
  alpha_1 = eps.
  """
  return 1.0 - (1.0 - eps) * jnp.asarray(t, jnp.float32)


def log_linear_alpha_prime(t: jax.Array, eps: float = EPS) -> jax.Array:
  """d alpha_t / dt = -(1 - eps) (constant)."""
  return jnp.full_like(jnp.asarray(t, jnp.float32), -(1.0 - eps))
