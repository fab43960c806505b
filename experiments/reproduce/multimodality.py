r"""Claim 3: one-step parallel decoding of a two-mode target mixes the modes.

  python experiments/reproduce/multimodality.py [--smoke] [--out=DIR]

The target puts weight w on one sequence of L tokens ("A B": "thank you") and
1 - w on another ("C D": "vielen dank"), every position's token differing
between them (Gu et al. 2018's example of the multimodality problem of
non-autoregressive translation). `TwoModeDenoiser` is its EXACT denoiser:
at each masked position, the true conditional marginal given the unmasked
positions, in closed form. Decoding it with the registered MDLM and LLaDA
samplers at K steps, a row is "neither" when it equals neither mode (e.g.
"A D", "C B"). The measured rate is compared with the closed form of each
sampler's unmasking schedule (derived in `mdlm_neither_rate` and
`llada_neither_rate`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from lm_decoding.studies import claims
from lm_decoding.decoding import make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID, RESERVED_IDS

claims.define_flags()

CLAIM = "multimodality"
FIRST_ID = len(RESERVED_IDS)  # mode m's token at position i: FIRST_ID + 2i + m
IMPOSSIBLE = -1e9  # logit of a token the target never has at a position


def mode_token(position: int, mode: int) -> int:
  """The token id of mode 0 or 1 at `position`."""
  return FIRST_ID + 2 * position + mode


@dataclasses.dataclass(frozen=True)
class TwoModeDenoiser:
  """Exact denoiser of a mixture of two L-token sequences (a LogitsFn).

  `params` is float32[2], the modes' weights (w, 1 - w), traced, so one
  compile serves every weight. For a row whose unmasked tokens are
  consistent with a set of modes, the posterior is the prior restricted to
  that set and renormalised; position i's logits are then log posterior(m)
  at `mode_token(i, m)` and IMPOSSIBLE elsewhere, MASK included. A row
  consistent with no mode (already mixed) gets the prior: whatever it draws
  next, it stays "neither". The row must be the L outputs with no prompt
  (position i = output position i). No cache.

  Attributes:
    length: L, tokens per sequence (>= 1).
  """

  length: int

  @property
  def vocab_size(self) -> int:
    return FIRST_ID + 2 * self.length

  @property
  def max_len(self) -> int:
    return self.length

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del attention_mask
    mode_BxL = tokens - FIRST_ID - 2 * positions
    unmasked_BxL = tokens != MASK_ID
    agrees_Bx2 = jnp.stack(
        [jnp.all(~unmasked_BxL | (mode_BxL == m), axis=1) for m in (0, 1)], -1)
    weights_2 = jnp.asarray(params, jnp.float32)
    posterior_Bx2 = weights_2 * agrees_Bx2
    total_Bx1 = posterior_Bx2.sum(-1, keepdims=True)
    posterior_Bx2 = jnp.where(total_Bx1 > 0, posterior_Bx2
                              / jnp.maximum(total_Bx1, 1e-30), weights_2)
    log_post_Bx2 = jnp.where(posterior_Bx2 > 0,
                             jnp.log(jnp.maximum(posterior_Bx2, 1e-30)),
                             IMPOSSIBLE)
    ids_BxLx2 = (FIRST_ID + 2 * positions)[..., None] + jnp.arange(2)
    hits_BxLx2xV = jax.nn.one_hot(ids_BxLx2, self.vocab_size, dtype=bool)
    logits_BxLxV = jnp.max(jnp.where(
        hits_BxLx2xV, log_post_Bx2[:, None, :, None], IMPOSSIBLE), axis=2)
    return ModelOutput(logits_BxLxV, cache, None)

  def init_cache(self, batch_size, length):
    del batch_size, length
    return None


def mdlm_neither_rate(length: int, steps: int, w: float) -> float:
  """P(neither) for MDLM's ancestral sampler with an exact denoiser.

  MDLM unmasks each masked position at step k with probability 1 / (K - k)
  (log-linear schedule; the last step unmasks the rest), independently
  across positions, so each position's unmasking step is uniform over the K
  steps and independent of the others. Let m be the size of the FIRST
  non-empty group of positions unmasked together. They are drawn
  independently from their marginals (w, 1 - w): they agree on a mode with
  probability w^m + (1 - w)^m. If they agree, the posterior is that mode
  and every later draw follows it; if not, the row is mixed for good. So

    P(neither) = 1 - sum_m P(m) (w^m + (1 - w)^m),
    P(m = j) = C(L, j) K^-L sum_{r=0}^{K-1} r^(L-j)

  (first group at step s with j positions, the other L - j at one of the
  K - 1 - s = r later steps; 0^0 = 1). For L = 2: P(m = 2) = 1 / K and
  P(neither) = 2 w (1 - w) / K: 1/2 at K = 1 for equal modes, then halving
  with every doubling of K, never exactly 0.

  Raises:
    ValueError: length < 1, steps < 1 or w outside [0, 1].
  """
  _check(length, steps, w)
  agree = 0.0
  for j in range(1, length + 1):
    p_j = math.comb(length, j) * sum(r ** (length - j) for r in range(steps))
    agree += p_j / steps ** length * (w ** j + (1 - w) ** j)
  return 1.0 - agree


def llada_neither_rate(length: int, steps: int, w: float) -> float:
  """P(neither) for LLaDA's sampler (fixed transfer schedule, low-confidence
  ranking) with an exact denoiser.

  LLaDA draws every masked position, then commits the c =
  `transfer_schedule(L, K)[0]` = ceil(L / K) most confident draws at step
  0, the confidence being the drawn token's probability: w for a mode-0
  draw, 1 - w for a mode-1 draw (ties to the leftmost position). Every later
  commit follows the mode the first c agree on, so the row is mixed iff
  those c disagree. With w = 1/2 all confidences tie, the leftmost c are
  committed whatever they drew: P = 1 - 2^(1 - c). Otherwise the likelier
  mode's draws (q = max(w, 1 - w)) rank first; with k ~ Binomial(L, q) of
  them, the first c disagree iff 1 <= k <= c - 1. So the ranking mixes LESS
  than committing c positions chosen at random (1 - q^c - (1 - q)^c): it
  prefers draws of the majority mode. Exactly 0 once K >= L (c = 1).

  Raises:
    ValueError: as `mdlm_neither_rate`.
  """
  _check(length, steps, w)
  first = -(-length // steps)
  if w == 0.5:
    return 1.0 - 2.0 ** (1 - first)
  q = max(w, 1.0 - w)
  return sum(math.comb(length, k) * q ** k * (1 - q) ** (length - k)
             for k in range(1, first))


def _check(length, steps, w):
  if length < 1 or steps < 1:
    raise ValueError(f"length={length} and steps={steps} must be >= 1")
  if not 0 <= w <= 1:
    raise ValueError(f"w={w} must be in [0, 1]")


CLOSED_FORM = {"mdlm": mdlm_neither_rate, "llada": llada_neither_rate}


def neither_rate(decoder_name: str, length: int, steps: int, w: float,
                 rows: int, seed: int) -> float:
  """Measured fraction of `rows` samples equal to neither mode."""
  decoder = make_decoder(decoder_name, output_length=length, steps=steps,
                         sampling=SamplingConfig(temperature=1.0),
                         eos_ids=())
  models = {"model": Model(TwoModeDenoiser(length),
                           jnp.asarray([w, 1.0 - w], jnp.float32))}
  out = decoder.decode(models, jnp.zeros((rows, 0), jnp.int32),
                       jnp.zeros((rows,), jnp.int32), jax.random.key(seed))
  tokens = np.asarray(out.tokens)
  modes = [np.array([mode_token(i, m) for i in range(length)]) for m in (0, 1)]
  is_mode = (tokens == modes[0]).all(1) | (tokens == modes[1]).all(1)
  return float(1.0 - is_mode.mean())


def grid(smoke: bool) -> dict:
  if smoke:
    return {"rows": 4000, "lengths": (2,), "weights": (0.5, 0.8),
            "steps": (1, 2)}
  return {"rows": 40000, "lengths": (2, 3), "weights": (0.5, 0.8),
          "steps": (1, 2, 4)}


def run(folder: str, smoke: bool, cmd: str) -> dict:
  """Measures every (decoder, L, w, K) of the grid and writes the record."""
  g = grid(smoke)
  rows = []
  for name in CLOSED_FORM:
    for length in g["lengths"]:
      for w in g["weights"]:
        for steps in g["steps"]:
          rate = neither_rate(name, length, steps, w, g["rows"],
                              seed=len(rows))
          closed = CLOSED_FORM[name](length, steps, w)
          se = math.sqrt(closed * (1 - closed) / g["rows"])
          rows.append({"decoder": name, "length": length, "w": w,
                       "steps": steps, "rows": g["rows"], "rate": rate,
                       "closed_form": closed, "se": se,
                       "z": (rate - closed) / se if se > 0 else
                       (0.0 if rate == closed else math.inf)})
  worst = max(abs(r["z"]) for r in rows)
  one_step = [r for r in rows if r["steps"] == 1 and r["length"] == 2
              and r["w"] == 0.5]
  within = worst <= 3
  verdict = "supported" if within else "contradicted"
  fig, axes = plt.subplots(1, len(g["lengths"]), figsize=(
      5 * len(g["lengths"]), 3.8), squeeze=False)
  for ax, length in zip(axes[0], g["lengths"]):
    for name, style in (("mdlm", "o"), ("llada", "s")):
      for w in g["weights"]:
        pts = [r for r in rows if r["decoder"] == name
               and r["length"] == length and r["w"] == w]
        ks = [r["steps"] for r in pts]
        line = ax.errorbar(ks, [r["rate"] for r in pts],
                           yerr=[3 * r["se"] for r in pts], fmt=style,
                           label=f"{name} w={w} measured (±3 SE)")
        ax.plot(ks, [r["closed_form"] for r in pts], "--",
                color=line[0].get_color(), lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("denoising steps K")
    ax.set_ylabel('"neither" rate')
    ax.set_title(f"L = {length} (dashed: closed form)")
  axes[0][0].legend(fontsize=7)
  summary = {"max_abs_z": worst,
             "one_step_rate_L2_equal": {r["decoder"]: r["rate"]
                                        for r in one_step},
             "rows_per_point": g["rows"]}
  rate_1 = summary["one_step_rate_L2_equal"]
  our = (f"L = 2, equal modes, K = 1: neither rate MDLM "
         f"{rate_1.get('mdlm', float('nan')):.3f}, LLaDA "
         f"{rate_1.get('llada', float('nan')):.3f} (closed form 0.5); "
         f"MDLM falls as 2w(1-w)/K, LLaDA is 0 from K = L on; every point "
         f"within {worst:.2f} binomial SE of its closed form "
         f"({g['rows']} samples per point).")
  method = f"""\
Target: two sequences of L tokens differing at every position, weights w and
1 - w. Denoiser: exact (`TwoModeDenoiser`, the true conditional marginals of
the masked positions given the unmasked ones). Decoders: the registered
`mdlm` (ancestral sampler, log-linear schedule) and `llada` (fixed transfer
schedule), temperature 1, no EOS, K steps, {g['rows']} independent rows per
point (one batch). A row is "neither" if it equals neither sequence.

Closed forms (derivations in the docstrings of `mdlm_neither_rate` and
`llada_neither_rate`): the rows unmasked at the same step are drawn
independently from their marginals, which is the conditional-independence
assumption; only the FIRST group of positions unmasked together can mix
the modes, because after a consistent first group the exact posterior is
one mode. With m the size of that group, P(neither) = 1 - E[w^m + (1-w)^m].
- MDLM unmasks each position at a step uniform over K, independently:
  P(m = j) = C(L, j) K^-L sum_(r<K) r^(L-j); for L = 2 this is
  2 w (1 - w) / K: one-step decoding gives 1/2 for equal modes, and more
  steps shrink the rate like 1/K but never to exactly 0 (two positions can
  always fall on the same step).
- LLaDA commits the c = ceil(L/K) most confident of its L draws at its
  first step (confidence: the drawn token's probability, w or 1 - w): the
  rate is P(1 <= k <= c - 1) for k ~ Binomial(L, max(w, 1 - w)) majority
  draws (1 - 2^(1-c) at w = 1/2, where confidences tie and the leftmost c
  are taken), exactly 0 once K >= L. The ranking mixes less than c
  positions chosen at random would (1 - w^c - (1 - w)^c): at L = 3, K = 2,
  w = 0.8 it predicts 0.096 instead of 0.32.

Check: |measured - closed| / SE with the binomial SE sqrt(p (1 - p) / n) of
the closed form p (a point with p = 0 must measure exactly 0). Largest
|z| over the {len(rows)} points: {worst:.2f} (verdict rule: all within 3).
"""
  return claims.write(
      folder, claim=CLAIM, title="Multimodality of one-step parallel decoding",
      source="Gu et al. 2018, \"Non-Autoregressive Neural Machine "
      "Translation\" (ICLR), the multimodality problem; the source article's "
      "'thank you' / 'vielen dank' example",
      statement="With a two-mode target, parallel decoding that draws "
      "positions independently produces outputs that are neither mode, at "
      "the rate conditional independence predicts; more (iterative) steps "
      "remove them.", verdict=verdict, our_number=our, method=method,
      summary=summary, rows=rows, figure=fig, cmd=cmd, smoke=smoke)


if __name__ == "__main__":
  claims.main(CLAIM, run)
