"""Rotary position embedding (Su et al. 2021) and its context scalings.

`rotary(x, positions, base, scaling)` rotates each head's half-split pairs
(dimension j with j + Dh/2) by position * inv_freq[j]. The scalings change
only the inverse frequencies (and, for YaRN, scale the rotated vectors), so
they are fixed functions of the position and cached keys stay valid:

  linear  (Chen et al. 2023, position interpolation): inv_freq / factor.
  llama3  (Llama 3.1): wavelengths 2 pi / inv_freq above
          original_max_len / low_freq_factor are divided by factor, those
          below original_max_len / high_freq_factor kept, those between
          interpolated with s = (original_max_len / wavelength -
          low_freq_factor) / (high_freq_factor - low_freq_factor):
          (1 - s) * inv_freq / factor + s * inv_freq.
  yarn    (Peng et al. 2023): dimensions rotating fewer than beta_slow
          times over original_max_len are interpolated (/ factor), more than
          beta_fast times kept, a linear ramp between (in dimension index,
          the bounds floored/ceiled when `truncate`); q and k are multiplied
          by attention_factor (default 0.1 ln(factor) + 1), so the scores
          by its square.

Dynamic NTK scaling needs no kind here: it changes the frequencies only
for calls longer than the model's context (`transformers` recomputes them
from the call's length), which is the imported model's max_len, so within
it the frequencies are the default ones (`hf_rope.rope_from_hf`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

SCALINGS = ("linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """A RoPE context-extension scaling (module docstring). Hashable.

  Attributes:
    kind: one of SCALINGS.
    factor: the context extension factor, > 0.
    original_max_len: the pre-training context (llama3, yarn), >= 1.
    low_freq_factor, high_freq_factor: llama3's wavelength bounds,
      high > low > 0.
    beta_fast, beta_slow: yarn's rotation-count bounds of the ramp.
    attention_factor: yarn's scale of q and k; None: 0.1 ln(factor) + 1
      (1 for factor <= 1).
    truncate: yarn: floor/ceil the ramp's dimension bounds.
  Raises:
    ValueError: a kind outside SCALINGS or a value out of range, named.
  """

  kind: str
  factor: float
  original_max_len: int = 0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float | None = None
  truncate: bool = True

  def __post_init__(self):
    if self.kind not in SCALINGS:
      raise ValueError(f"rope scaling kind={self.kind!r}; allowed: "
                       f"{SCALINGS}")
    if not self.factor > 0:
      raise ValueError(f"rope scaling factor={self.factor} must be > 0")
    if self.kind != "linear" and self.original_max_len < 1:
      raise ValueError(f"rope scaling original_max_len="
                       f"{self.original_max_len} must be >= 1 for "
                       f"{self.kind!r}")
    if self.kind == "llama3" and not (
        self.high_freq_factor > self.low_freq_factor > 0):
      raise ValueError(f"rope scaling high_freq_factor="
                       f"{self.high_freq_factor} must exceed "
                       f"low_freq_factor={self.low_freq_factor} > 0")

  @property
  def magnitude(self) -> float:
    """The factor q and k are multiplied by (yarn's attention factor; 1)."""
    if self.kind != "yarn":
      return 1.0
    if self.attention_factor is not None:
      return float(self.attention_factor)
    return yarn_magnitude(self.factor)


def yarn_magnitude(factor: float, mscale: float = 1.0) -> float:
  """YaRN's scale of q and k for a context `factor`: 0.1 mscale ln(factor)
  + 1, 1 for factor <= 1 (Peng et al. 2023)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def inverse_frequencies(head_dim: int, base: float,
                        scaling: RopeScaling | None = None) -> jax.Array:
  """float32[head_dim // 2]: the rotation rate of each pair (rad / position).

  Unscaled: base ** (-j / (head_dim / 2)); `scaling` as in the module
  docstring.
  """
  half = head_dim // 2
  index = jnp.arange(half, dtype=jnp.float32)
  freq = 1.0 / (base ** (index / half))
  if scaling is None:
    return freq
  factor = scaling.factor
  if scaling.kind == "linear":
    return freq / factor
  context = scaling.original_max_len
  if scaling.kind == "llama3":
    wavelength = 2 * math.pi / freq
    low_wavelength = context / scaling.low_freq_factor
    high_wavelength = context / scaling.high_freq_factor
    smooth = ((context / wavelength - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    between = (1 - smooth) * freq / factor + smooth * freq
    return jnp.where(wavelength > low_wavelength, freq / factor,
                     jnp.where(wavelength < high_wavelength, freq, between))
  # yarn: the dimension index at which a pair turns `turns` times over the
  # original context.
  def dimension(turns):
    return (head_dim * math.log(context / (turns * 2 * math.pi))
            / (2 * math.log(base)))
  low, high = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
  if scaling.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, head_dim - 1)
  if low == high:
    high += 0.001
  keep = 1 - jnp.clip((index - low) / (high - low), 0, 1)
  return freq / factor * (1 - keep) + freq * keep


def rotary(x_BxLxHxDh: jax.Array, positions_BxL: jax.Array, base: float,
           scaling: RopeScaling | None = None) -> jax.Array:
  """x rotated by RoPE at `positions` (half-split pairs), in x's dtype.

  Args:
    x_BxLxHxDh: queries or keys [B, L, H, Dh], Dh even.
    positions_BxL: int32[B, L] positions.
    base: the frequency base (rope_theta).
    scaling: an optional `RopeScaling`.
  """
  freq_Fr = inverse_frequencies(x_BxLxHxDh.shape[-1], base, scaling)
  half = freq_Fr.shape[0]
  angle_BxLx1xFr = (positions_BxL[..., None].astype(jnp.float32)
                    * freq_Fr)[:, :, None]
  magnitude = 1.0 if scaling is None else scaling.magnitude
  sin = jnp.sin(angle_BxLx1xFr) * magnitude
  cos = jnp.cos(angle_BxLx1xFr) * magnitude
  x = x_BxLxHxDh.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxDh.dtype)
