r"""Claim 9: float32 Gumbel noise in masked-diffusion sampling lowers entropy.

  python experiments/reproduce/gumbel_precision.py [--smoke] [--out=DIR]

Zheng et al. 2024 ("Masked Diffusion Models are Secretly Time-Agnostic
Masked Models and Exploit Inaccurate Categorical Sampling") found that MDLM
samples drawn with float32 Gumbel noise have lower token entropy and a
flattering gen-PPL, more so with more sampling steps: a "low temperature in
disguise". The library's sampler draws with `mode="high"` noise
(`decoding/sampling.py`); the float32 path is the explicit option
`SamplingConfig(gumbel_noise="float32")`, off by default, and this script
measures three things:

  A. the registered `mdlm` decoder on the shipped MDLM, both noises, against
     the step count K: unigram entropy of the samples and gen-PPL under the
     shipped evaluator (`evaluation.quality.gen_ppl`);
  B. the mechanism, exactly: the distribution of the token drawn when a
     masked position unmasks in ONE joint categorical over "stay masked"
     (mass 1 - 1/K) and the V tokens (mass p(x) / K each), as the reference
     MDLM sampler draws, for float32 and high-precision noise (closed form,
     `joint_draw_distribution`), on the shipped MDLM's first-step
     distributions (V = 4096) and on a Zipf stub with V = 50,000;
  C. a Monte Carlo check of that closed form, on float16 noise (whose grid
     is coarse enough to sample in seconds).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from lm_decoding.studies import claims
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import make_decoder
from lm_decoding.decoding.sampling import GUMBEL_NOISES, SamplingConfig
from lm_decoding.evaluation import quality
from lm_decoding.models import init_params, make_logits_fn
from lm_decoding.special_tokens import MASK_ID
from lm_decoding.training.pretrained import member_recipes, recipes, store
from lm_decoding.training import train

claims.define_flags()

CLAIM = "gumbel_precision"
NOISES = GUMBEL_NOISES  # "high" (the default) and "float32"
# Spacing of the uniform draws near 1 behind jax's default ("low") Gumbel
# noise -log(-log u), u on a grid of 2**-nmant: the smallest exponential
# -log u it can produce. "high" mode refines the small exponentials to about
# 2**-(2 nmant) (jax._src.random: high + 2**-nmant * low).
GRID = {"float32": 2.0 ** -23, "high": 2.0 ** -46, "float16": 2.0 ** -10}
ZIPF_VOCAB = 50_000


def win_weight(w: np.ndarray, grid: float) -> np.ndarray:
  """Unnormalised probability that an entry of tiny mass w wins a
  Gumbel-max race against a competitor of mass ~1, with noise whose
  exponentials -log u lie on a grid of spacing `grid`.

  Gumbel-max picks argmin E_j / w_j with E_j = -log u_j. For w << 1 only
  E_i near 0 matters, where u_i = 1 - j grid gives E_i = j grid (j >= 1,
  probability `grid` each): P(win) = sum_j grid exp(-j grid / w) =
  grid / (exp(grid / w) - 1). Exact noise (grid -> 0) gives w; an entry of
  mass below the grid is suppressed by about (grid / w) exp(-grid / w).
  """
  w = np.asarray(w, np.float64)
  with np.errstate(over="ignore"):
    return grid / np.expm1(grid / np.maximum(w, 1e-300))


def joint_draw_distribution(p_V: np.ndarray, steps: int,
                            grid: float) -> np.ndarray:
  """float64[V]: the token drawn when a masked position unmasks in MDLM's
  first of K steps, drawn as one categorical over (stay masked: 1 - 1/K,
  token x: p(x) / K), given that it unmasks (`win_weight`, renormalised).
  Exact noise returns p itself."""
  q = win_weight(np.asarray(p_V, np.float64) / steps, grid)
  return q / q.sum()


def entropy(p: np.ndarray) -> float:
  """Shannon entropy of a distribution, nats."""
  p = np.asarray(p, np.float64)
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def zipf(vocab: int, exponent: float = 1.0) -> np.ndarray:
  """p(r) proportional to r^-exponent over ranks 1..vocab."""
  p = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
  return p / p.sum()


def grid(smoke: bool) -> dict:
  if smoke:
    return {"batch_size": 4, "output_length": 8, "steps": (2, 8),
            "mechanism_steps": (1, 64, 1024), "mc_draws": 400_000}
  return {"batch_size": 16, "output_length": 128, "steps": (8, 32, 128),
          "mechanism_steps": (1, 8, 64, 256, 1024, 4096, 16384),
          "mc_draws": 4_000_000}


def _models(smoke: bool):
  """(mdlm Model, evaluator (logits_fn, params), source): shipped, or random
  smoke-size models."""
  if smoke:
    mdlm_cfg = claims.model_config("mdlm", True)
    eval_cfg = claims.model_config("ar", True)
    return ((make_logits_fn(mdlm_cfg), init_params(mdlm_cfg, jax.random.key(0))),
            (make_logits_fn(eval_cfg), init_params(eval_cfg, jax.random.key(1))),
            "random smoke-size models")
  tokenizer = Tokenizer.load(str(recipes.DEFAULT_DIR
                                 / recipes.TOKENIZER_FILE))
  members = member_recipes.member_configs(claims.load_config("tiny"))
  loaded = []
  for name in ("mdlm", "evaluator"):
    params, source = store.find(members[name], name, tokenizer)
    if params is None:
      raise ValueError(f"shipped {name!r} unavailable: {source}")
    loaded.append((make_logits_fn(train.model_config(members[name])), params))
  return loaded[0], loaded[1], "the shipped MDLM and evaluator"


def sample_quality(smoke: bool) -> tuple[list[dict], list, str]:
  """Part A rows, the MDLM (logits_fn, params), and where the models are from."""
  g = grid(smoke)
  (mdlm_fn, mdlm_params), (eval_fn, eval_params), source = _models(smoke)
  b, t = g["batch_size"], g["output_length"]
  samples = {}
  for noise in NOISES:
    for steps in g["steps"]:
      decoder = make_decoder("mdlm", output_length=t, steps=steps,
                             eos_ids=(), sampling=SamplingConfig(
                                 temperature=1.0, gumbel_noise=noise))
      out = claims.decode_fn(decoder, mdlm_fn)(
          mdlm_params, jnp.zeros((b, 0), jnp.int32),
          jnp.zeros((b,), jnp.int32), jax.random.key(steps))
      samples[noise, steps] = (np.asarray(out.tokens),
                               np.asarray(out.lengths))
  rows = []
  for (noise, steps), (tokens, lengths) in samples.items():
    scored = quality.gen_ppl(eval_fn, eval_params, tokens, lengths,
                             batch_size=b)
    rows.append({"part": "A", "noise": noise, "steps": steps,
                 "vocab": int(mdlm_fn.config.vocab_size),
                 "unigram_entropy": float(np.mean(scored.row_entropy)),
                 "gen_ppl": scored.ppl, "tokens": scored.num_tokens})
    print(rows[-1], flush=True)
  return rows, (mdlm_fn, mdlm_params), source


def first_step_distributions(mdlm, length: int) -> np.ndarray:
  """float64[T, V]: the denoiser's distributions at a fully masked row
  (MASK excluded, as SUBS), the proposals of MDLM's first step."""
  logits_fn, params = mdlm
  tokens = jnp.full((1, length), MASK_ID, jnp.int32)
  positions = jnp.arange(length, dtype=jnp.int32)[None]
  logits = logits_fn(params, tokens, positions).logits[0].astype(jnp.float32)
  logits = logits.at[:, MASK_ID].set(-jnp.inf)
  return np.asarray(jax.nn.softmax(logits, -1), np.float64)


def mechanism(mdlm, smoke: bool) -> list[dict]:
  """Part B rows: exact entropies of the joint draw against K."""
  g = grid(smoke)
  targets = {"mdlm_first_step": first_step_distributions(
      mdlm, g["output_length"]), "zipf_50k": zipf(ZIPF_VOCAB)[None]}
  rows = []
  for name, p_NxV in targets.items():
    exact = float(np.mean([entropy(p) for p in p_NxV]))
    for steps in g["mechanism_steps"]:
      row = {"part": "B", "target": name, "vocab": p_NxV.shape[1],
             "steps": steps, "entropy_exact": exact}
      for noise in NOISES:
        row[f"entropy_{noise}"] = float(np.mean([
            entropy(joint_draw_distribution(p, steps, GRID[noise]))
            for p in p_NxV]))
      rows.append(row)
      print(row, flush=True)
  return rows


def monte_carlo_check(draws: int) -> list[dict]:
  """Part C: a two-entry Gumbel-max race (masses w and 1) with float16
  "low" noise, measured against `win_weight` with the float16 grid."""
  rows = []
  for ratio in (0.5, 1.0, 2.0, 8.0):
    w = ratio * GRID["float16"]
    noise = jax.random.gumbel(jax.random.key(int(ratio * 8)), (draws, 2),
                              jnp.float16).astype(jnp.float32)
    wins = noise[:, 0] + math.log(w) > noise[:, 1]
    rate = float(jnp.mean(wins))
    predicted = float(win_weight(w, GRID["float16"]))
    se = math.sqrt(predicted * (1 - predicted) / draws)
    rows.append({"part": "C", "w_over_grid": ratio, "w": w,
                 "win_rate": rate, "predicted": predicted,
                 "exact_noise": w / (1 + w), "se": se,
                 "z": (rate - predicted) / se})
    print(rows[-1], flush=True)
  return rows


def run(folder: str, smoke: bool, cmd: str) -> dict:
  g = grid(smoke)
  part_a, mdlm, source = sample_quality(smoke)
  part_b = mechanism(mdlm, smoke)
  part_c = monte_carlo_check(g["mc_draws"])
  keys = sorted({k for r in part_a + part_b + part_c for k in r})
  rows = [{k: r.get(k, "") for k in keys} for r in part_a + part_b + part_c]

  def a(noise, steps, field):
    return next(r[field] for r in part_a
                if r["noise"] == noise and r["steps"] == steps)

  k_max, k_b = g["steps"][-1], g["mechanism_steps"][-1]
  drop = {}
  for name in ("mdlm_first_step", "zipf_50k"):
    row = next(r for r in part_b if r["target"] == name and r["steps"] == k_b)
    drop[name] = {"exact": row["entropy_exact"],
                  "float32": row["entropy_float32"],
                  "high": row["entropy_high"]}
  summary = {
      "decoder_entropy_gap_at_max_K": a("high", k_max, "unigram_entropy")
      - a("float32", k_max, "unigram_entropy"),
      "decoder_gen_ppl_ratio_at_max_K": a("float32", k_max, "gen_ppl")
      / a("high", k_max, "gen_ppl"),
      "joint_draw_entropy_at_max_K": drop, "mechanism_max_K": k_b,
      "monte_carlo_max_abs_z": max(abs(r["z"]) for r in part_c)}
  zipf_fall = 1 - drop["zipf_50k"]["float32"] / drop["zipf_50k"]["exact"]
  decoder_gap = abs(summary["decoder_entropy_gap_at_max_K"])
  verdict = ("mixed" if zipf_fall > 0.05 and decoder_gap < 0.05 else
             "supported" if zipf_fall > 0.05 else "contradicted")

  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for noise, style in (("high", "o-"), ("float32", "s--")):
    pts = [r for r in part_a if r["noise"] == noise]
    axes[0].plot([r["steps"] for r in pts], [r["unigram_entropy"] for r in pts],
                 style, label=f"{noise} noise")
    axes[1].plot([r["steps"] for r in pts], [r["gen_ppl"] for r in pts],
                 style, label=f"{noise} noise")
  for name in ("mdlm_first_step", "zipf_50k"):
    pts = [r for r in part_b if r["target"] == name]
    ks = [r["steps"] for r in pts]
    line = axes[2].plot(ks, [r["entropy_float32"] for r in pts], "s--",
                        label=f"{name}: float32")
    axes[2].plot(ks, [r["entropy_high"] for r in pts], "o-", lw=1,
                 color=line[0].get_color(), label=f"{name}: high / exact")
  axes[0].set(xscale="log", xlabel="steps K", ylabel="unigram entropy (nats)",
              title="A. registered mdlm decoder")
  axes[1].set(xscale="log", yscale="log", xlabel="steps K",
              ylabel="gen-PPL (evaluator)", title="A. registered mdlm decoder")
  axes[2].set(xscale="log", xlabel="steps K",
              ylabel="entropy of the unmasked token (nats)",
              title="B. joint draw (reference MDLM), exact")
  for ax in axes:
    ax.legend(fontsize=8)

  table_a = "\n".join(
      ["| noise | K | unigram entropy | gen-PPL |", "|---|---|---|---|"]
      + [f"| {r['noise']} | {r['steps']} | {r['unigram_entropy']:.3f} | "
         f"{r['gen_ppl']:.1f} |" for r in part_a])
  table_b = "\n".join(
      ["| target | V | K | exact | high | float32 |", "|---|---|---|---|---|---|"]
      + [f"| {r['target']} | {r['vocab']} | {r['steps']} | "
         f"{r['entropy_exact']:.3f} | {r['entropy_high']:.3f} | "
         f"{r['entropy_float32']:.3f} |" for r in part_b])
  table_c = "\n".join(
      ["| w / grid | measured | closed form | exact noise | z |",
       "|---|---|---|---|---|"]
      + [f"| {r['w_over_grid']} | {r['win_rate']:.5f} | {r['predicted']:.5f} "
         f"| {r['exact_noise']:.5f} | {r['z']:.2f} |" for r in part_c])
  m, z = drop["mdlm_first_step"], drop["zipf_50k"]
  our = (f"Registered mdlm decoder ({source}, V = "
         f"{part_a[0]['vocab']}, K = {k_max}): unigram entropy high "
         f"{a('high', k_max, 'unigram_entropy'):.3f} vs float32 "
         f"{a('float32', k_max, 'unigram_entropy'):.3f} nats, gen-PPL "
         f"{a('high', k_max, 'gen_ppl'):.1f} vs "
         f"{a('float32', k_max, 'gen_ppl'):.1f}: no effect, because this "
         f"decoder draws the token apart from the unmasking decision. In the "
         f"reference MDLM's joint draw at K = {k_b}, float32 noise lowers the "
         f"unmasked token's entropy from {m['exact']:.2f} to "
         f"{m['float32']:.2f} nats (shipped MDLM, V = 4096) and from "
         f"{z['exact']:.2f} to {z['float32']:.2f} (Zipf, V = 50k); high "
         f"noise stays at {m['high']:.2f} / {z['high']:.2f}.")
  method = f"""\
**Mechanism.** Gumbel-max draws argmax_x (log m(x) + g_x), g = -log(-log u).
In float32 with jax's default mode, u lies on a grid of 2^-23 in [tiny, 1),
so the exponential E = -log u is never below ~1.2e-7 and the noise never
above ~15.9: the upper tail is truncated. An entry of mass m far above the
grid is drawn with probability m; one near or below it is suppressed, by
about (grid/m) exp(-grid/m) (`win_weight`: exact for the grid, checked in
part C). MDLM's reference sampler draws each masked position from ONE
categorical over "stay masked" (mass 1 - 1/K at the first step) and the
tokens (mass p(x)/K): as K grows every token's mass shrinks towards the
grid, the tail tokens are suppressed first, and the sampler behaves as if
at a lower temperature: lower entropy, better-looking gen-PPL (Zheng et al.
2024). This library's `mdlm` decoder decides unmasking with its own
uniform draw and draws the token from p(x) itself, so no token's mass is
divided by K; with V = 4096 and `mode="high"` noise (grid ~1.4e-14), and
even with float32 noise, the draw is practically exact.

**A. Registered decoder.** `mdlm`, {source}, B = {g['batch_size']}
unconditional rows of T = {g['output_length']} tokens (no prompt, no EOS),
temperature 1, K in {list(g['steps'])}; the float32 path is
`SamplingConfig(gumbel_noise="float32")` (full-vocabulary Gumbel-max with
float32 "low" noise, `sampling.categorical`). Unigram entropy
(mean over rows, nats) and gen-PPL under the shipped evaluator, as
`evaluation.quality.gen_ppl` computes them (BOS context).

{table_a}

**B. Joint draw, exact.** `joint_draw_distribution`: the distribution of the
token drawn when a masked position unmasks at MDLM's first step, for
float32 noise (grid 2^-23), high-precision noise (grid ~2^-46) and exact
noise (= p). Targets: the shipped MDLM's first-step distributions at a fully
masked row of T = {g['output_length']} (mean entropy over positions; V =
4096) and a Zipf(1) stub over V = {ZIPF_VOCAB:,}, where more mass sits in
tokens of small probability.

{table_b}

**C. Monte Carlo check of the closed form** (`win_weight`) with float16
noise (grid 2^-10): two entries of masses w and 1, {g['mc_draws']:,} races
each.

{table_c}

Verdict rule: mixed if the joint draw's entropy falls by > 5% at the largest
K on the 50k stub while the registered decoder's entropy gap stays below
0.05 nats (the effect is real where the sampler divides masses by K, absent
from this library's decoder); supported if both show it; contradicted if
neither.
"""
  return claims.write(
      folder, claim=CLAIM, title="Gumbel noise precision in masked diffusion",
      source="Zheng et al. 2024, \"Masked Diffusion Models are Secretly "
      "Time-Agnostic Masked Models and Exploit Inaccurate Categorical "
      "Sampling\"",
      statement="float32 (truncated) Gumbel noise silently lowers the "
      "entropy of masked-diffusion samples and flatters gen-PPL, more so as "
      "the number of sampling steps grows; float64 / high-precision noise "
      "does not.", verdict=verdict, our_number=our, method=method,
      summary=summary, rows=rows, figure=fig, cmd=cmd, smoke=smoke)


if __name__ == "__main__":
  claims.main(CLAIM, run)
