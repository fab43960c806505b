"""Top-n selection: the commit rule of confidence-ordered parallel decoding.

Mask-Predict (Ghazvininejad et al. 2019), MaskGIT (Chang et al. 2022) and
LLaDA's low-confidence remasking (Nie et al. 2025) unmask, at each step, the
n masked positions the model is most sure of; CMLM training (the same paper
as Mask-Predict) masks n random positions by the same rule over random
scores. The decoders (`decoding.iterative` and its family,
`decoding.mask_predict`) and the objective (`training.objectives.translation`)
share this one function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_n(score_W: jax.Array, allowed_W: jax.Array, n: jax.Array) -> jax.Array:
  """bool[W]: the n allowed positions with the highest score.

  Args:
    score_W: float[W] scores (higher is chosen first).
    allowed_W: bool[W] the positions that may be chosen.
    n: int32[] how many to choose; n above the allowed count selects all.
  Ties go to the leftmost position. Traceable; `jax.vmap` it over rows.
  """
  score = jnp.where(allowed_W, score_W, -jnp.inf)
  order = jnp.argsort(score, descending=True, stable=True)
  first_n = jnp.arange(score_W.shape[0]) < n
  return allowed_W & jnp.zeros_like(allowed_W).at[order].set(first_n)
