"""Sampling from logits: categorical draws and the logit processors before them.

Categorical sampling uses the Gumbel-max trick with `mode="high"`: in float32
the default ("low") Gumbel noise is capped near 16, which truncates the tail,
silently lowers sample entropy and flatters gen-PPL (Zheng et al. 2024,
"Masked Diffusion Models are Secretly Time-Agnostic Masked Models and Exploit
Inaccurate Categorical Sampling"). "high" raises the cap to ~32 for about twice
the cost of the noise, without enabling float64 globally.

Noise for every vocabulary entry is the dominant cost of sampling many
positions at once (a masked-diffusion step samples all B x L positions: on a
2-core CPU, Gumbel noise over [8, 272, 4096] costs several forward passes of
the tiny model). So for a large vocabulary `categorical` draws hierarchically,
which is exact: split the V entries into G groups of g; pick a group with the
Gumbel-max trick over the groups' log-sum-exp logits (probability = the
group's mass), then a token inside it with the Gumbel-max trick over its g
logits (probability proportional to its own). P(v) = mass(group) * p(v) /
mass(group) = p(v), with G + g ~ 2 sqrt(V) noise draws instead of V.

`sample` applies the processors of a `SamplingConfig` in this fixed order, each
to the previous one's output:

  0. suppressed ids (HF's `suppress_tokens`): their logits set to -inf, so they
     are never drawn, greedy included; e.g. the reserved ids no target holds
     (PAD, MASK) when an AR model's rows become training data;
  1. repetition penalty (Keskar et al. 2019, CTRL): for a token already present
     in the row (prompt + generated), a positive logit is divided by the
     penalty and a negative one multiplied by it, so a penalty > 1 never
     raises that token's logit;
  2. temperature: logits / T; T below `MIN_TEMPERATURE` (0 included) is
     greedy (argmax of the penalised logits; steps 3-6 are skipped), see
     `is_greedy`;
  3. top-k (Fan et al. 2018): keep exactly the k largest logits;
  4. top-p, nucleus (Holtzman et al. 2020): keep the smallest set of the most
     likely tokens whose probability mass is >= p;
  5. min-p (Nguyen et al. 2024): keep tokens whose probability is >= min_p
     times the largest probability;
  6. draw with `categorical`.

Filters 3-5 set removed logits to -inf, always keep the most likely token, and
are off at their neutral values (top_k=0, top_p=1, min_p=0). Ties at a top-k or
top-p boundary go to the lower token id, so exactly k tokens / the smallest set
are kept.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from lm_decoding.checks import is_count, is_number


# Temperatures below this decode greedily, in every decoder (`is_greedy`).
# Dividing float32 logits by a tiny T overflows: logits [50, 60, 0] / 1e-37
# are [inf, inf, 0], and the draw among infinities is arbitrary (a subnormal T
# may even be flushed to 0, giving inf/NaN). At T = 1e-6 logits up to ~3e32
# stay finite, and the softmax is already one-hot unless the two best logits
# lie within ~1e-4 of each other, i.e. within the rounding noise of a float32
# forward pass: sampling below this floor is argmax in all but name.
MIN_TEMPERATURE = 1e-6
GUMBEL_NOISES = ("high", "float32")  # `SamplingConfig.gumbel_noise`


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How a token is chosen from next-token logits (hashable: static jit arg).

  Attributes:
    temperature: >= 0; below MIN_TEMPERATURE (0 included) is greedy decoding.
    top_k: >= 0 tokens kept; 0 keeps all.
    top_p: nucleus mass in (0, 1]; 1 keeps all.
    min_p: in [0, 1); 0 keeps all.
    repetition_penalty: > 0; 1 is off, > 1 discourages seen tokens.
    gumbel_noise: the noise of every draw (`categorical`): "high" (exact,
      the default) or "float32" (jax's default float32 noise over the whole
      vocabulary, capped near 16: the truncated sampler of Zheng et al. 2024,
      kept to measure it, `experiments/reproduce/gumbel_precision.py`).
    suppress_ids: distinct token ids >= 0 never drawn (step 0); () is off.
      An id outside the model's vocabulary, or every id of it, is refused
      when the logits are first seen (while tracing).

  Raises:
    ValueError: an attribute outside its range (the message names it).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0
  repetition_penalty: float = 1.0
  gumbel_noise: str = GUMBEL_NOISES[0]  # "high"
  suppress_ids: tuple[int, ...] = ()

  def __post_init__(self):
    number = lambda name: is_number(getattr(self, name))
    checks = (
        ("temperature",
         lambda: number("temperature") and 0 <= self.temperature < math.inf,
         "in [0, inf) (a number; 0 = greedy)"),
        ("top_k", lambda: is_count(self.top_k, minimum=0),
         "an integer >= 0 (0 = off)"),
        ("top_p", lambda: number("top_p") and 0 < self.top_p <= 1,
         "in (0, 1] (a number; 1 = off)"),
        ("min_p", lambda: number("min_p") and 0 <= self.min_p < 1,
         "in [0, 1) (a number; 0 = off)"),
        ("repetition_penalty", lambda: number("repetition_penalty")
         and 0 < self.repetition_penalty < math.inf,
         "in (0, inf) (a number; 1 = off)"),
        ("gumbel_noise", lambda: self.gumbel_noise in GUMBEL_NOISES,
         f"one of {GUMBEL_NOISES}"),
        ("suppress_ids", lambda: isinstance(self.suppress_ids, tuple)
         and all(is_count(i, minimum=0) for i in self.suppress_ids)
         and len(set(self.suppress_ids)) == len(self.suppress_ids),
         "a tuple of distinct integers >= 0 (token ids; () = off)"),
    )
    for name, ok, allowed in checks:
      if not ok():
        raise ValueError(f"{name}={getattr(self, name)!r} must be {allowed}")


def is_greedy(temperature: float | jax.Array) -> bool | jax.Array:
  """Whether a temperature decodes greedily: T < MIN_TEMPERATURE (0 included).

  The one rule for every decoder (autoregressive, beam, masked diffusion):
  below the floor, choose the argmax instead of dividing the logits by T.

  Args:
    temperature: a Python float (static, e.g. from a config: returns a bool)
      or a float array such as per-row temperatures float32[B] (returns
      bool[B], elementwise). Callers validate T >= 0 beforehand.
  """
  return temperature < MIN_TEMPERATURE


def _group_size(vocab_size: int) -> int:
  """Largest divisor of V not above sqrt(V) (1: draw in one level)."""
  return max(g for g in range(1, math.isqrt(vocab_size) + 1)
             if vocab_size % g == 0)


def categorical(key: jax.Array, logits: jax.Array,
                noise: str = "high") -> jax.Array:
  """Draws token ids from softmax(logits) along the last axis.

  Exact Gumbel-max sampling (noise `mode="high"`), in two levels when V has a
  divisor g >= 16 below sqrt(V) (see the module docstring); both levels take
  their noise from one draw. With noise "float32", Gumbel-max over the whole
  vocabulary with jax's default float32 noise (u on a 2**-23 grid, noise at
  most ~15.9): the truncation Zheng et al. 2024 measured.

  Args:
    key: PRNG key.
    logits: float[..., V]; entries of -inf (or a very negative finite value)
      are never drawn.
    noise: one of GUMBEL_NOISES (`SamplingConfig.gumbel_noise`).
  Returns:
    int32[...] token ids.
  """
  logits = logits.astype(jnp.float32)
  if noise == "float32":
    return jnp.argmax(logits + jax.random.gumbel(key, logits.shape,
                                                 jnp.float32),
                      axis=-1).astype(jnp.int32)
  vocab = logits.shape[-1]
  g = _group_size(vocab)
  if g < 16:
    return jax.random.categorical(key, logits, axis=-1,
                                  mode="high").astype(jnp.int32)
  groups = vocab // g
  noise = jax.random.gumbel(key, (*logits.shape[:-1], groups + g),
                            jnp.float32, mode="high")
  grouped = logits.reshape(*logits.shape[:-1], groups, g)
  group = argmax(jax.nn.logsumexp(grouped, axis=-1) + noise[..., :groups])
  inside = jnp.take_along_axis(grouped, group[..., None, None], axis=-2)[..., 0, :]
  token = argmax(inside + noise[..., groups:])
  return (group * g + token).astype(jnp.int32)


def argmax(x: jax.Array) -> jax.Array:
  """int32[...]: `jnp.argmax(x, axis=-1)`, computed as two plain reductions.

  The index of the first maximum along the last axis (the first NaN if the
  row has one), as `jnp.argmax`. XLA CPU lowers `jnp.argmax` to one
  reduction over (value, index) pairs, which it does not vectorise: 3.7x
  slower than this on [8, 32000] logits, 0.60 against 0.16 ms
  (`benchmarks/ar_decode/argmax/`).

  Args:
    x: float[..., n], any last axis (V for logits).
  """
  best = jnp.max(x, axis=-1, keepdims=True)
  hit = (x == best) | jnp.isnan(x)  # a NaN row: best is NaN, == never holds
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)


def greedy(logits_BxV: jax.Array) -> jax.Array:
  """int32[B]: the most likely token of each row (lowest id on ties)."""
  return argmax(logits_BxV)


def token_presence(tokens_BxL: jax.Array, valid_BxL: jax.Array,
                   vocab_size: int) -> jax.Array:
  """bool[B, V]: which ids occur among the valid tokens of each row.

  Args:
    tokens_BxL: int32[B, L] token ids.
    valid_BxL: bool[B, L]; False entries (e.g. padding) are ignored.
    vocab_size: V.
  """
  rows_Bx1 = jnp.arange(tokens_BxL.shape[0])[:, None]
  ids_BxL = jnp.where(valid_BxL, tokens_BxL, vocab_size)  # V: dropped below
  seen = jnp.zeros((tokens_BxL.shape[0], vocab_size), bool)
  return seen.at[rows_Bx1, ids_BxL].set(True, mode="drop")


def apply_repetition_penalty(logits_BxV: jax.Array, seen_BxV: jax.Array,
                             penalty: float) -> jax.Array:
  """CTRL's repetition penalty (Keskar et al. 2019), sign-aware.

  Seen tokens with a positive logit get logit / penalty, with a negative one
  logit * penalty (0 stays 0), so for penalty > 1 no seen logit increases.

  Args:
    logits_BxV: float[B, V].
    seen_BxV: bool[B, V] tokens present in the row (see `token_presence`).
    penalty: > 0.
  Returns:
    float32[B, V].
  """
  logits = logits_BxV.astype(jnp.float32)
  penalised = jnp.where(logits > 0, logits / penalty, logits * penalty)
  return jnp.where(seen_BxV, penalised, logits)


def top_k_filter(logits_BxV: jax.Array, top_k: int) -> jax.Array:
  """Keeps exactly the `top_k` largest logits per row (others -inf).

  top_k = 0 or >= V keeps all; ties at the boundary keep the lower ids.
  """
  vocab = logits_BxV.shape[-1]
  if top_k == 0 or top_k >= vocab:
    return logits_BxV
  _, ids_BxC = jax.lax.top_k(logits_BxV, top_k)
  rows_Bx1 = jnp.arange(logits_BxV.shape[0])[:, None]
  keep_BxV = jnp.zeros(logits_BxV.shape, bool).at[rows_Bx1, ids_BxC].set(True)
  return jnp.where(keep_BxV, logits_BxV, -jnp.inf)


def top_p_mask(probs_BxV: jax.Array, top_p: float) -> jax.Array:
  """bool[B, V]: the nucleus of Holtzman et al. (2020).

  A token is kept iff the mass of the tokens ranked before it (descending
  probability, lower id first on ties) is < top_p: the smallest set whose mass
  is >= top_p. The most likely token is always kept. Exact on exactly
  representable probabilities; on probabilities computed in float32 a token
  at an exact boundary may fall either side by rounding.

  Args:
    probs_BxV: float[B, V] probabilities (rows sum to 1).
    top_p: in (0, 1].
  """
  order_BxV = jnp.argsort(-probs_BxV, axis=-1, stable=True)
  sorted_BxV = jnp.take_along_axis(probs_BxV, order_BxV, axis=-1)
  cumulative_BxV = jnp.cumsum(sorted_BxV, axis=-1)
  mass_before_BxV = jnp.concatenate(
      [jnp.zeros_like(cumulative_BxV[:, :1]), cumulative_BxV[:, :-1]], axis=-1)
  rows_Bx1 = jnp.arange(probs_BxV.shape[0])[:, None]
  keep = jnp.zeros(probs_BxV.shape, bool)
  return keep.at[rows_Bx1, order_BxV].set(mass_before_BxV < top_p)


def top_p_filter(logits_BxV: jax.Array, top_p: float) -> jax.Array:
  """Keeps the nucleus (`top_p_mask` of softmax(logits)); top_p=1 keeps all."""
  if top_p >= 1:
    return logits_BxV
  keep_BxV = top_p_mask(jax.nn.softmax(logits_BxV, axis=-1), top_p)
  return jnp.where(keep_BxV, logits_BxV, -jnp.inf)


def min_p_filter(logits_BxV: jax.Array, min_p: float) -> jax.Array:
  """Keeps tokens with p >= min_p * max p (Nguyen et al. 2024); 0 keeps all.

  Computed in log space: logit >= max logit + log(min_p).
  """
  if min_p == 0:
    return logits_BxV
  floor_Bx1 = jnp.max(logits_BxV, axis=-1, keepdims=True) + math.log(min_p)
  return jnp.where(logits_BxV >= floor_Bx1, logits_BxV, -jnp.inf)


def filter_logits(logits_BxV: jax.Array, config: SamplingConfig) -> jax.Array:
  """Steps 3-5 of the module docstring: top-k, then top-p, then min-p."""
  logits = top_k_filter(logits_BxV, config.top_k)
  logits = top_p_filter(logits, config.top_p)
  return min_p_filter(logits, config.min_p)


def suppress(logits_BxV: jax.Array, ids: tuple[int, ...],
             also: tuple[int, ...] = ()) -> jax.Array:
  """Step 0: `logits_BxV` (float[..., V]) with the logits of `ids` -inf,
  and of `also`, ids the caller never draws either (a denoiser's MASK).

  Raises:
    ValueError: an id outside [0, V), or `ids` and `also` covering the
      whole vocabulary.
  """
  vocab = logits_BxV.shape[-1]
  if not ids and not also:
    return logits_BxV
  if ids and max(ids) >= vocab or len(set(ids) | set(also)) >= vocab:
    left = f" with the MASK id(s) {also!r}" if also else ""
    raise ValueError(f"sampling.suppress_ids={ids!r}{left} must be fewer "
                     f"than {vocab} ids in [0, {vocab}) (the model's "
                     "vocabulary): an id must be left to draw")
  return logits_BxV.at[..., jnp.asarray(ids + also)].set(-jnp.inf)


def _penalised(logits_BxV, config, seen_BxV):
  """Steps 0 and 1: float32 logits less the suppressed ids, after the
  repetition penalty (if any)."""
  logits = suppress(logits_BxV.astype(jnp.float32), config.suppress_ids)
  if config.repetition_penalty == 1:
    return logits
  if seen_BxV is None:
    raise ValueError(f"seen_BxV is required with repetition_penalty="
                     f"{config.repetition_penalty}")
  return apply_repetition_penalty(logits, seen_BxV, config.repetition_penalty)


def probabilities(logits_BxV: jax.Array, config: SamplingConfig,
                  seen_BxV: jax.Array | None = None) -> jax.Array:
  """The distribution `sample` draws from, after the same processors.

  Speculative sampling compares the draft's and the target's distributions
  token by token (Leviathan et al. 2023), so both must be exactly the ones
  the tokens are drawn from: steps 0-5 of the module docstring, then the
  softmax; greedy decoding is the one-hot distribution of the argmax.

  Args:
    logits_BxV: float[B, V] next-token logits.
    config: the processors' settings.
    seen_BxV: bool[B, V], as for `sample`.
  Returns:
    float32[B, V], rows summing to 1 (filtered tokens exactly 0).
  Raises:
    ValueError: seen_BxV missing while a repetition penalty is set.
  """
  logits = _penalised(logits_BxV, config, seen_BxV)
  if is_greedy(config.temperature):
    return jax.nn.one_hot(greedy(logits), logits.shape[-1], dtype=jnp.float32)
  return jax.nn.softmax(filter_logits(logits / config.temperature, config), -1)


def sample(key: jax.Array, logits_BxV: jax.Array, config: SamplingConfig,
           seen_BxV: jax.Array | None = None,
           temperature_B: jax.Array | None = None) -> jax.Array:
  """Chooses one token per row by the processors of the module docstring.

  Args:
    key: PRNG key (unused when decoding is greedy).
    logits_BxV: float[B, V] next-token logits.
    config: the processors' settings.
    seen_BxV: bool[B, V] tokens already in each row (prompt + generated);
      required when config.repetition_penalty != 1, ignored otherwise.
    temperature_B: optional float32[B] per-row temperatures (>= 0; greedy
      for a row below MIN_TEMPERATURE) overriding config.temperature.
  Returns:
    int32[B] token ids.
  Raises:
    ValueError: seen_BxV missing while a repetition penalty is set, or
      temperature_B not of shape [B] or (when concrete) negative.
  """
  logits = _penalised(logits_BxV, config, seen_BxV)
  if temperature_B is None:
    if is_greedy(config.temperature):
      return greedy(logits)
    temperature_B = jnp.full(logits.shape[:1], config.temperature, jnp.float32)
  elif jnp.shape(temperature_B) != logits.shape[:1]:
    raise ValueError(f"temperature_B has shape {jnp.shape(temperature_B)}; "
                     f"expected ({logits.shape[0]},)")
  elif (not isinstance(temperature_B, jax.core.Tracer)
        and not np.all(np.asarray(temperature_B) >= 0)):
    raise ValueError(f"temperature_B={temperature_B} must be >= 0")
  hot_B = ~is_greedy(temperature_B)
  tempered = logits / jnp.where(hot_B, temperature_B, 1.0)[:, None]
  drawn_B = categorical(key, filter_logits(tempered, config),
                        config.gumbel_noise)
  return jnp.where(hot_B, drawn_B, greedy(logits))
