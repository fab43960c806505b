r"""Claim 1: AR latency is linear in T; parallel decoding takes K steps.

  python experiments/reproduce/ar_vs_parallel_latency.py [--smoke] [--out=DIR]

Cached AR decoding makes T dependent steps; MDLM makes a fixed K (here with
`reuse_logits=False`, so exactly K full-sequence forward passes), each over
the prompt + T positions. For batch sizes 1 and 8 and a grid of T, both are
timed in turns on random weights of the tiny config's shape (cost does not
depend on the weights), and the script fits AR ms against T (ms per token),
MDLM ms and MDLM ms per step against T, and reads off the break-even step
count K* = AR ms / MDLM ms per step at each T and the crossover output
length at the fixed K.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

from lm_decoding.studies import claims
from lm_decoding.decoding import make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import init_params, make_logits_fn

claims.define_flags()

CLAIM = "ar_vs_parallel_latency"


def grid(smoke: bool) -> dict:
  if smoke:
    return {"batch_sizes": (1,), "lengths": (4, 8), "steps": 4,
            "prompt_len": 4, "runs": 1}
  return {"batch_sizes": (1, 8), "lengths": (16, 64, 256),
          "steps": 16, "prompt_len": 16, "runs": 3}


def measure(smoke: bool) -> tuple[list[dict], dict]:
  """Timed rows {batch_size, new_tokens, ar_ms, mdlm_ms, ...} and the grid."""
  g = grid(smoke)
  fns = {}
  for objective in ("ar", "mdlm"):
    cfg = claims.model_config(objective, smoke)
    fns[objective] = (make_logits_fn(cfg), init_params(cfg, jax.random.key(0)))
  rows = []
  for b in g["batch_sizes"]:
    prompts = jnp.ones((b, g["prompt_len"]), jnp.int32)
    lengths = jnp.full((b,), g["prompt_len"], jnp.int32)
    for t in g["lengths"]:
      sampling = SamplingConfig(temperature=1.0)
      decoders = {
          "ar": make_decoder("ar", output_length=t, eos_ids=(),
                             sampling=sampling),
          "mdlm": make_decoder("mdlm", output_length=t, steps=g["steps"],
                               eos_ids=(), sampling=sampling,
                               reuse_logits=False)}
      calls, nfe, compile_s = {}, {}, {}
      for name, decoder in decoders.items():
        logits_fn, params = fns[name]
        calls[name], out, compile_s[name] = claims.compiled_call(
            claims.decode_fn(decoder, logits_fn), params, prompts,
            lengths, jax.random.key(1))
        nfe[name] = int(out.nfe)
      median_s = claims.interleaved(calls, g["runs"])
      row = {"batch_size": b, "new_tokens": t,
             "sequence_length": g["prompt_len"] + t, "steps_K": g["steps"],
             "ar_ms": median_s["ar"] * 1e3, "mdlm_ms": median_s["mdlm"] * 1e3,
             "ar_nfe": nfe["ar"], "mdlm_nfe": nfe["mdlm"],
             "ar_ms_per_token": median_s["ar"] * 1e3 / t,
             "mdlm_ms_per_step": median_s["mdlm"] * 1e3 / nfe["mdlm"],
             "break_even_steps": median_s["ar"] / (median_s["mdlm"]
                                                   / nfe["mdlm"]),
             "ar_compile_s": compile_s["ar"],
             "mdlm_compile_s": compile_s["mdlm"]}
      rows.append(row)
      print(row, flush=True)
  return rows, g


def fitted_crossover_length(ar_fit: dict, mdlm_fit: dict) -> float | None:
  """T beyond which the fitted lines say AR is slower: where they cross,
  when AR's slope is the larger; None when it is not (MDLM never catches up
  as T grows) or the lines cross at T <= 0."""
  slope = ar_fit["slope"] - mdlm_fit["slope"]
  if slope <= 0:
    return None
  t = (mdlm_fit["intercept"] - ar_fit["intercept"]) / slope
  return t if t > 0 else None


def run(folder: str, smoke: bool, cmd: str) -> dict:
  rows, g = measure(smoke)
  summary, per_batch = {"steps_K": g["steps"]}, {}
  for b in g["batch_sizes"]:
    pts = [r for r in rows if r["batch_size"] == b]
    ts = [r["new_tokens"] for r in pts]
    ar = claims.fit_line(ts, [r["ar_ms"] for r in pts])
    mdlm = claims.fit_line(ts, [r["mdlm_ms"] for r in pts])
    step = claims.fit_line(ts, [r["mdlm_ms_per_step"] for r in pts])
    faster = [r["new_tokens"] for r in pts if r["mdlm_ms"] < r["ar_ms"]]
    per_batch[b] = {
        "ar_ms_vs_T": ar, "mdlm_ms_vs_T": mdlm,
        "mdlm_ms_per_step_vs_T": step,
        "crossover_T_fitted": fitted_crossover_length(ar, mdlm),
        "T_where_mdlm_faster": faster,
        "break_even_steps_by_T": {r["new_tokens"]: r["break_even_steps"]
                                  for r in pts},
        "ar_growth": pts[-1]["ar_ms"] / pts[0]["ar_ms"],
        "mdlm_growth": pts[-1]["mdlm_ms"] / pts[0]["mdlm_ms"],
        "mdlm_nfe": sorted({r["mdlm_nfe"] for r in pts})}
  summary["by_batch"] = per_batch
  t_ratio = g["lengths"][-1] / g["lengths"][0]
  linear = all(v["ar_ms_vs_T"]["r2"] >= 0.95 for v in per_batch.values())
  fixed_k = all(v["mdlm_nfe"] == [g["steps"]] for v in per_batch.values())
  slower_growth = all(v["mdlm_growth"] < v["ar_growth"]
                      for v in per_batch.values())
  verdict = ("supported" if linear and fixed_k and slower_growth
             else "mixed")

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for b in g["batch_sizes"]:
    pts = [r for r in rows if r["batch_size"] == b]
    ts = [r["new_tokens"] for r in pts]
    line = axes[0].plot(ts, [r["ar_ms"] for r in pts], "o-",
                        label=f"AR cached, B={b}")
    axes[0].plot(ts, [r["mdlm_ms"] for r in pts], "s--",
                 color=line[0].get_color(),
                 label=f"MDLM K={g['steps']}, B={b}")
    axes[1].plot(ts, [r["break_even_steps"] for r in pts], "o-",
                 label=f"B={b}")
  axes[0].set(xscale="log", yscale="log", xlabel="output length T (tokens)",
              ylabel="ms per batch (median)", title="latency against T")
  axes[1].axhline(g["steps"], color="grey", lw=1, ls=":")
  axes[1].set(xscale="log", yscale="log", xlabel="output length T (tokens)",
              ylabel="K* = AR ms / MDLM ms per step",
              title="break-even step count (dotted: K used)")
  for ax in axes:
    ax.legend(fontsize=8)

  lines = []
  for b, v in per_batch.items():
    cross = v["crossover_T_fitted"]
    lines.append(
        f"B={b}: AR {v['ar_ms_vs_T']['slope']:.3f} ms/token "
        f"(R² {v['ar_ms_vs_T']['r2']:.3f}); MDLM K={g['steps']} "
        f"{v['mdlm_ms_vs_T']['slope']:.3f} ms per output token of T "
        f"(per step {v['mdlm_ms_per_step_vs_T']['slope'] * 1e3:.2f} µs per "
        f"token of T); over T x{t_ratio:.0f} AR grows x{v['ar_growth']:.1f}, "
        f"MDLM x{v['mdlm_growth']:.1f}; K* from "
        f"{min(v['break_even_steps_by_T'].values()):.1f} to "
        f"{max(v['break_even_steps_by_T'].values()):.1f}; fitted crossover "
        f"T = {'none' if cross is None else f'{cross:.0f}'}.")
  our = " ".join(lines)
  table = "\n".join(
      ["| B | T | AR ms | MDLM ms | MDLM NFE | ms/step | K* |",
       "|---|---|---|---|---|---|---|"]
      + [f"| {r['batch_size']} | {r['new_tokens']} | {r['ar_ms']:.1f} | "
         f"{r['mdlm_ms']:.1f} | {r['mdlm_nfe']} | "
         f"{r['mdlm_ms_per_step']:.2f} | {r['break_even_steps']:.1f} |"
         for r in rows])
  method = f"""\
Random weights of the tiny config's shape ({'smoke model' if smoke else
'd128, 2 layers, V 4096'}), prompt of {g['prompt_len']} tokens, no EOS
(fixed length). AR: the registered `ar` decoder (KV cache, `lax.scan`).
Parallel: the registered `mdlm` decoder with K = {g['steps']} and
`reuse_logits=False`, so NFE = K exactly; each step is one bidirectional pass
over P + T positions. Every (B, T) point compiles both (compile time in the
CSV, apart), then times them in turns, {g['runs']} runs each, median.

Reading: AR's time is a straight line in T (T dependent steps, each reading
the parameters and the cache). MDLM's step count is flat (NFE = K for every
T), but on this CPU a full forward pass is compute-bound, so its time per
step grows with the sequence length P + T as well: "flat in T" holds for
the number of steps, and for wall time only where a step is latency-bound
(an accelerator at small B x L). K* is how many parallel steps fit in one
AR decode of T tokens; a parallel decoder with K below K* is faster.
Verdict rule: supported if AR is linear (R² >= 0.95 at every B), MDLM's NFE
is K at every T, and MDLM's time grows less than AR's over the T range;
otherwise mixed.

{table}
"""
  return claims.write(
      folder, claim=CLAIM, title="AR latency linear in T, parallel fixed K",
      source="the source articles (DESIGN.md question 1); Sahoo et al. 2024 "
      "(MDLM) for the parallel sampler",
      statement="AR decoding latency grows linearly with the output length T "
      "(T dependent steps); parallel decoding takes a fixed number of steps "
      "K, each a full-sequence forward pass, so it is flat in T at fixed K; "
      "the two cross at a K* per batch size.", verdict=verdict,
      our_number=our, method=method, summary=summary, rows=rows, figure=fig,
      cmd=cmd, smoke=smoke)


if __name__ == "__main__":
  claims.main(CLAIM, run)
