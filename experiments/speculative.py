r"""Speculative decoding measured against its prediction, and the router.

  python experiments/speculative.py --config=configs/tiny.py \
      --out=experiments/results/speculative

The models come from the config's pretrained set (`compare.pretrained_set`:
configs/base.py reads the base set); the evaluator is loaded only when it is
a target or the router runs, the MDLM model only for the extra rows or the
router.

Part 1, speed-up vs prediction (Leviathan et al. 2023, eq. for the expected
improvement factor): for --targets, 'ar' with the shipped AR drafts
(`config.drafts`, or --drafts) and 'evaluator' with draft 'ar'; gamma in
--gammas; batch sizes --batch_sizes; output length --output_length (fixed
length, no EOS); --temperatures, by default temperature 1 and greedy
(temperature 0), each in its own table. Per configuration:
  * alpha_i, the acceptance rate of draft position i, from the acceptance
    histogram (`stats["accept_counts"]`, rounds accepting exactly a tokens):
    alpha_i = sum_{a > i} / sum_{a >= i};
  * alpha, the overall rate: the alpha whose expected tokens per round
    (1 - alpha^(gamma+1)) / (1 - alpha) equals the measured tokens per round
    (sum over rows of T / sum of rounds); the prediction uses it;
  * tokens per target call (the batch's verification calls, prefill
    excluded: a batch runs until its slowest row is done);
  * c, the ms/token of plain cached AR decoding ("ar") with the draft over
    the same with the target, at the same batch size and temperature;
  * measured speed-up: the time of plain AR decoding with the target over
    the time of speculative decoding (per interleaved pair; median);
  * predicted speed-up (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)),
    and measured / predicted;
  * the component model: each part of a round timed alone with the loop's
    shapes (`component_systems`: the draft's proposal, the target's call on
    gamma + 1 tokens, the acceptance / commit / roll-back), interleaved
    with the decodes; the loop's rounds predicted from the measured
    acceptance histogram (`predicted_rounds`: per-position acceptance, the
    batch waiting for its slowest row); predicted time = prefill + rounds x
    round time, i.e. time per token = E[round time] / E[tokens per round]
    at B=1; model_error = predicted / measured speculative time - 1, which
    is also measured / predicted speed-up - 1 (AR's time is the measured
    one on both sides).
Extra rows (--extras) at gamma 4 with target 'ar': "jacobi",
"prompt_lookup" (no draft model: c = 0) and "diffusion_draft" (draft
'mdlm', one parallel step; c = one MDLM forward over the S = P + T + gamma
- 1 positions it reads over the target's ms/token).

Timing: every system of a group (one target, batch size and temperature) is
compiled first (compile time reported apart), then the systems are run in
turn, `--runs` rounds (AR, draft AR, speculative ..., AR, ...), each call
`block_until_ready`; medians, and the median of the per-round ratios.

Part 2, the router (`lm_decoding.evaluation.router`) on a mixed workload:
cost curves (batch-1 latency at T = 32 and --output_length; gen-PPL of
temperature-1 samples at batch --quality_batch under the evaluator) for AR,
MDLM K=8 and the fastest speculative configuration; requests alternate
short and long, each under a tight and a loose budget; policies "AR alone",
"parallel alone" and "router" run every request (batch 1, timed once after
compiling; the router's time includes its difficulty pass).

Writes speculative.csv, speculative.md, speedup.png, alpha.png,
router.csv (and the router's table in speculative.md) under --out;
--norouter skips part 2 and shows --out's router.csv as it is.
"""

from __future__ import annotations

import csv
import functools
import os
import platform
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from ml_collections import config_flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from lm_decoding.data import pipeline
from lm_decoding.decoding import base, speculative
from lm_decoding.evaluation import cost, entries, quality, router
from lm_decoding.models import KVCache
from lm_decoding.training import pretrained

_LOAD_AT_START = os.getloadavg()[0]  # 1-minute load average at import
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"), "Experiment configuration file.")
_OUT = flags.DEFINE_string("out", "experiments/results/speculative",
                           "Output folder.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_speculative",
                               "Data cache folder (pipeline.prepare).")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke run: T=8, gamma 2, B=1, "
                           "temperature 1, 1 run, target 'ar' only (with "
                           "the self-drafting and diffusion rows unless "
                           "--noextras).")
_T = flags.DEFINE_integer("output_length", 128, "T, tokens per row.")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "2", "4", "8"], "gamma values.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_TEMPS = flags.DEFINE_list("temperatures", ["1.0", "0.0"],
                           "Sampling temperatures (0 = greedy); the first "
                           "is the main table.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed runs per system (>= 1).")
_TARGETS = flags.DEFINE_list("targets", ["ar", "evaluator"],
                             "Targets: 'ar' (drafts: config.drafts, and the "
                             "extra rows) and/or 'evaluator' (draft 'ar').")
_DRAFTS = flags.DEFINE_list("drafts", None, "Drafts of target 'ar' "
                            "(default: every shipped one of config.drafts).")
_EXTRAS = flags.DEFINE_bool("extras", True, "The jacobi, prompt_lookup and "
                            "diffusion_draft rows (target 'ar', first batch "
                            "size).")
_ROUTER = flags.DEFINE_bool("router", True, "Run part 2 (the router); "
                            "without it the markdown shows --out's "
                            "router.csv from an earlier run, marked so.")
_LOOP_STEPS = flags.DEFINE_integer("loop_steps", 16, "Calls of each round "
                                   "part per timed component run.")
_SHORT_T = flags.DEFINE_integer("short_length", 32, "Router: short T.")
_REQUESTS = flags.DEFINE_integer("requests", 16, "Router: requests per "
                                 "budget (half short, half long).")

EXTRA_GAMMA = 4


def alpha_per_position(counts_A: np.ndarray) -> np.ndarray:
  """float64[gamma]: alpha_i = sum_{a > i} / sum_{a >= i} of a histogram
  int[gamma + 1] of rounds that accepted exactly a draft tokens."""
  at_least = np.cumsum(counts_A[::-1])[::-1].astype(np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    return at_least[1:] / at_least[:-1]


def expected_tokens(alpha: float, gamma: int) -> float:
  """(1 - alpha^(gamma+1)) / (1 - alpha) = 1 + alpha + ... + alpha^gamma."""
  return float(sum(alpha ** i for i in range(gamma + 1)))


def fitted_alpha(tokens_per_round: float, gamma: int) -> float:
  """The alpha in [0, 1] with expected_tokens(alpha) = tokens_per_round
  (bisection; clipped to the range [1, gamma + 1])."""
  low, high = 0.0, 1.0
  for _ in range(60):
    mid = (low + high) / 2
    if expected_tokens(mid, gamma) < tokens_per_round:
      low = mid
    else:
      high = mid
  return (low + high) / 2


def predicted_speedup(alpha: float, gamma: int, c: float,
                      draft_calls: int | None = None) -> float:
  """Leviathan et al. 2023: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c +
  1)), with a round's cost written out: `draft_calls` (default gamma) draft
  calls of relative cost c and one verification call of relative cost 1
  (the paper's memory-bound regime, where scoring gamma + 1 positions costs
  one step)."""
  calls = gamma if draft_calls is None else draft_calls
  return expected_tokens(alpha, gamma) / (calls * c + 1)


def compiled_system(fn, args):
  """(compiled fn, compile seconds) of jax.jit(fn) at args."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - start


def decoder_fn(decoder):
  return lambda models, prompts, lengths, key: decoder.decode(
      models, prompts, lengths, key)


def interleaved(systems: dict, runs: int) -> tuple[dict, dict]:
  """Runs each (compiled, args) of `systems` once untimed (warm-up), then
  times them in turns (`cost.interleaved`); returns ({name: [seconds]},
  {name: last output})."""
  for compiled, args in systems.values():
    jax.block_until_ready(compiled(*args))
  return cost.interleaved(
      {name: functools.partial(compiled, *args)
       for name, (compiled, args) in systems.items()}, runs)


def build(text: str, output_length: int, temperature: float):
  """(decoder, roles) of a comparison entry line (entries.parse_entry)."""
  entry = entries.parse_entry(text)
  return (entries.build(entry, output_length, temperature, eos_ids=()),
          dict(entry.roles))


def group_systems(target, drafts, gammas, extras, models, prompts_BxP, t,
                  temp, seed, loop_steps):
  """({name: (compiled, args)}, {name: compile seconds}) of one group: 'AR
  <model>' for the target and each draft, the speculative configurations,
  and for each of those its parts alone, '<name> | <part>'
  (`component_systems`)."""
  lines = {f"AR {m}": f"AR | ar | model={m}" for m in (target, *drafts)}
  for d in drafts:
    for g in gammas:
      lines[f"spec {d} g={g}"] = (f"spec g={{gamma}} | speculative | "
                                  f"target={target} draft={d} | gamma={g}")
  if extras:
    for name, roles in (("jacobi", ""), ("prompt_lookup", ""),
                        ("diffusion_draft", " draft=mdlm")):
      lines[f"{name} g={EXTRA_GAMMA}"] = (
          f"{name} g={{gamma}} | {name} | target={target}{roles} | "
          f"gamma={EXTRA_GAMMA}")
  batch = prompts_BxP.shape[0]
  args_tail = (jnp.asarray(prompts_BxP),
               jnp.full((batch,), prompts_BxP.shape[1], jnp.int32),
               jax.random.key(seed))
  systems, compile_s = {}, {}
  for name, line in lines.items():
    decoder, roles = build(line, t, temp)
    bound = {role: models[member] for role, member in roles.items()}
    args = (bound, *args_tail)
    compiled, compile_s[name] = compiled_system(decoder_fn(decoder), args)
    systems[name] = compiled, args
    if not name.startswith("AR "):
      parts = component_systems(decoder, bound, args_tail[0], args_tail[2],
                                loop_steps)
      systems.update({f"{name} | {part}": v for part, v in parts.items()})
  return systems, compile_s


def depend(x, scalar):
  """x, made to depend on `scalar` (a select on `scalar > inf`, never true,
  that the compiler cannot fold), so that no iteration of a timed loop is
  hoisted out of it or merged with another."""
  return jax.tree.map(lambda a: jnp.where(
      scalar.astype(jnp.float32) > jnp.inf, jnp.zeros_like(a), a), x)


def component_systems(decoder, bound, prompts_BxP, key, steps):
  """{part: (compiled, args)}: each part of `speculative.verify_round` alone,
  with the shapes of the decode loop, `steps` calls in one jit (as the loop
  makes them: no dispatch per call); the time of one call is a run's time
  over `steps` ("prefill": one call of `speculative.start`, both prefills).

    draft   `decoder.propose` from the state after the prefill (the draft
            cache moved back to where it was after each call, so every call
            drafts from the same position);
    verify  `speculative.score`, the target's cached call on gamma + 1
            tokens (the cache moved back after each call);
    settle  `speculative.settle` on one real draft and target call: the
            acceptance test, the target's draw, the commit and roll-back of
            both caches (the state carried from call to call: finished rows
            cost the same, the loop being static in shape).
  """
  batch, width = prompts_BxP.shape
  length = decoder.cache_length_for(width)
  lengths_B = jnp.full((batch,), width, jnp.int32)
  keys_Bx2 = jax.vmap(jax.random.split)(base.row_keys(key, batch))
  start = lambda m, p, n, k: speculative.start(decoder, length, m, p, n, k)
  prefill_args = (bound, prompts_BxP, lengths_B, keys_Bx2[:, 0])
  systems = {"prefill": (compiled_system(start, prefill_args)[0],
                         prefill_args)}
  state = systems["prefill"][0](*prefill_args)
  keys_B = keys_Bx2[:, 1]

  def draft_loop(m, state, keys_B):
    """The last call's (draft, q, draft state); q None for a deterministic
    draft."""
    def body(i, carry):
      state, draft, _, _ = carry
      state = state.replace(sequence=depend(state.sequence, draft[0, -1]),
                            round=i)
      keys_Bx3 = speculative.round_keys(state, keys_B)
      draft, q, draft_state, _ = decoder.propose(m, state, keys_Bx3[:, 0])
      moved = draft_state
      if isinstance(draft_state, KVCache):  # back to where it was
        moved = draft_state.at(state.draft.index)
      return state.replace(draft=moved), draft, q, draft_state
    first = jax.eval_shape(lambda: decoder.propose(
        m, state, speculative.round_keys(state, keys_B)[:, 0]))
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), first[:3])
    return jax.lax.fori_loop(0, steps, body, (state, *zeros))[1:]

  compiled = compiled_system(draft_loop, (bound, state, keys_B))[0]
  systems["draft"] = compiled, (bound, state, keys_B)
  draft_BxG, q_BxGxV, draft_state = compiled(bound, state, keys_B)
  state = state.replace(draft=draft_state)

  def verify_loop(m, state, draft_BxG):
    """The last call's ModelOutput."""
    def body(_, out):
      out, _ = speculative.score(m, state.replace(cache=out.cache.at(
          state.pos)), depend(draft_BxG, out.logits[0, 0, 0]))
      return out
    first, _ = speculative.score(m, state, draft_BxG)
    return jax.lax.fori_loop(0, steps - 1, body, first)

  compiled = compiled_system(verify_loop, (bound, state, draft_BxG))[0]
  systems["verify"] = compiled, (bound, state, draft_BxG)
  out = compiled(bound, state, draft_BxG)

  def settle_loop(state, draft_BxG, q_BxGxV, out, keys_B):
    def body(_, state):
      fresh = out._replace(logits=depend(out.logits, state.round))
      return speculative.settle(decoder, state, draft_BxG, q_BxGxV, fresh,
                                speculative.round_keys(state, keys_B))
    return jax.lax.fori_loop(0, steps, body, state)

  args = (state, draft_BxG, q_BxGxV, out, keys_B)
  systems["settle"] = compiled_system(settle_loop, args)[0], args
  return systems


def predicted_rounds(counts_A: np.ndarray, t: int, batch: int,
                     sims: int = 2000, seed: int = 0) -> float:
  """E[rounds of the decode loop]: the loop runs until its slowest row has
  t tokens; every round of every row accepts a draft tokens with the
  measured frequency counts_A[a] / sum (the measured per-position
  acceptance, pooled over rows) and commits a + 1 (Monte Carlo, `sims`
  batches)."""
  rng = np.random.default_rng(seed)
  commits = rng.choice(len(counts_A), size=(sims, batch, t),
                       p=counts_A / counts_A.sum()) + 1
  rounds = (np.cumsum(commits, -1) < t).sum(-1) + 1
  return float(rounds.max(-1).mean())


def mdlm_forward_system(model, batch, width):
  """(compiled, args) of one MDLM forward over [batch, width] tokens."""
  tokens = jnp.zeros((batch, width), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32),
                               (batch, width))
  fn = lambda m, x, p: m.logits_fn(m.params, x, p).logits
  compiled, _ = compiled_system(fn, (model, tokens, positions))
  return compiled, (model, tokens, positions)


def spread(times_s) -> float:
  """(max - min) / median of a system's run times."""
  times_s = np.asarray(times_s)
  return float((times_s.max() - times_s.min()) / np.median(times_s))


def measure_group(target, drafts, gammas, extras, models, prompts, t, batch,
                  temp, runs, seed, loop_steps):
  """Rows of part 1 for one (target, batch, temperature)."""
  prompts_BxP = prompts[:batch]
  systems, compile_s = group_systems(target, drafts, gammas, extras, models,
                                     prompts_BxP, t, temp, seed, loop_steps)
  if extras:
    width = prompts_BxP.shape[1] + t + EXTRA_GAMMA - 1
    systems["MDLM forward"] = mdlm_forward_system(models["mdlm"], batch,
                                                  width)
  times, outputs = interleaved(systems, runs)

  ar_s = np.asarray(times[f"AR {target}"])
  ar_ms_token = np.median(ar_s) * 1e3 / t
  rows = []
  for name in compile_s:
    if name.startswith("AR "):
      continue
    result, spec_s = outputs[name], np.asarray(times[name])
    decoder, gamma = name.split()[0], int(name.rpartition("g=")[2])
    draft = name.split()[1] if name.startswith("spec") else {
        "diffusion_draft": "mdlm"}.get(decoder, "—")
    if f"AR {draft}" in times:
      c = np.median(times[f"AR {draft}"]) * 1e3 / t / ar_ms_token
    elif draft == "mdlm":
      c = np.median(times["MDLM forward"]) * 1e3 / ar_ms_token
    else:
      c = 0.0
    counts = np.asarray(result.stats["accept_counts"]).sum(0)
    rounds = np.asarray(result.stats["rounds"])
    per_round = batch * t / rounds.sum()
    alpha = fitted_alpha(min(per_round, gamma + 1), gamma)
    target_calls = int(result.calls["target"]) - 1
    measured = float(np.median(ar_s) / np.median(spec_s))
    predicted = predicted_speedup(
        alpha, gamma, c, draft_calls=1 if decoder == "diffusion_draft" else None)
    part_ms = {part: float(np.median(times[f"{name} | {part}"])) * 1e3
               / (1 if part == "prefill" else loop_steps)
               for part in ("prefill", "draft", "verify", "settle")}
    round_ms = part_ms["draft"] + part_ms["verify"] + part_ms["settle"]
    rounds_predicted = predicted_rounds(counts, t, batch, seed=seed)
    model_ms = part_ms["prefill"] + rounds_predicted * round_ms
    rows.append(dict(
        target=target, draft=draft, decoder=decoder, gamma=gamma,
        batch_size=batch, temperature=temp, output_length=t,
        alpha=alpha, alpha_mean_position=float(np.nanmean(
            alpha_per_position(counts))),
        alpha_per_position=" ".join(
            f"{a:.3f}" for a in alpha_per_position(counts)),
        tokens_per_round=per_round, tokens_per_target_call=t / target_calls,
        c=c, ar_ms=np.median(ar_s) * 1e3, spec_ms=np.median(spec_s) * 1e3,
        spec_spread=spread(spec_s), ar_spread=spread(ar_s),
        measured_speedup=measured,
        pair_ratio_median=float(np.median(ar_s / spec_s)),
        predicted_speedup=predicted, measured_over_predicted=measured
        / predicted,
        prefill_ms=part_ms["prefill"], draft_ms=part_ms["draft"],
        verify_ms=part_ms["verify"], settle_ms=part_ms["settle"],
        round_ms=round_ms, round_spread=max(
            spread(times[f"{name} | {part}"])
            for part in ("draft", "verify", "settle")),
        rounds=int(rounds.max()), rounds_predicted=rounds_predicted,
        model_spec_ms=model_ms, model_speedup=float(np.median(ar_s)) * 1e3
        / model_ms, model_error=model_ms / (np.median(spec_s) * 1e3) - 1,
        compile_s=compile_s[name], ar_compile_s=compile_s[f"AR {target}"]))
  return rows


def write_csv(path, rows):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def number(text: str):
  """A CSV field as a float where it is one, else the text."""
  try:
    return float(text)
  except ValueError:
    return text


def markdown_table(rows, columns):
  def show(v):
    return f"{v:.3g}" if isinstance(v, (float, np.floating)) else str(v)
  lines = ["| " + " | ".join(columns) + " |",
           "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(show(r[c]) for c in columns) + " |"
            for r in rows]
  return "\n".join(lines)


def plot_speedup(rows, path):
  keys = sorted({(r["batch_size"], r["temperature"]) for r in rows})
  fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6),
                           squeeze=False)
  for ax, (batch, temp) in zip(axes[0], keys):
    pairs = sorted({(r["target"], r["draft"]) for r in rows
                    if r["decoder"] == "spec"})
    for i, (target, draft) in enumerate(pairs):
      sel = sorted((r for r in rows if r["decoder"] == "spec"
                    and (r["target"], r["draft"]) == (target, draft)
                    and (r["batch_size"], r["temperature"]) == (batch, temp)),
                   key=lambda r: r["gamma"])
      g = [r["gamma"] for r in sel]
      color = f"C{i}"
      ax.plot(g, [r["measured_speedup"] for r in sel], "o-", color=color,
              label=f"{draft}->{target} measured")
      ax.plot(g, [r["predicted_speedup"] for r in sel], "s--", color=color,
              label=f"{draft}->{target} paper's formula")
      ax.plot(g, [r["model_speedup"] for r in sel], "x:", color=color,
              label=f"{draft}->{target} component model")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("gamma")
    ax.set_ylabel("speed-up over AR")
    ax.set_title(f"B={batch}, temperature {temp:g}")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_alpha(rows, path):
  """alpha_i of the draft-model rows at their largest gamma (an empty plot
  when there are none)."""
  spec = [r for r in rows if r["decoder"] == "spec"]
  gamma = max((r["gamma"] for r in spec), default=0)
  sel = [r for r in spec if r["gamma"] == gamma]
  fig, ax = plt.subplots(figsize=(6, 3.8))
  for r in sel:
    alphas = [float(a) for a in r["alpha_per_position"].split()]
    ax.plot(range(1, len(alphas) + 1), alphas, "o-", label=(
        f"{r['draft']}->{r['target']} B={r['batch_size']} "
        f"temp {r['temperature']:g}"))
  ax.set_xlabel(f"draft position i (gamma={gamma})")
  ax.set_ylabel("acceptance rate alpha_i")
  if sel:
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def router_curves(models, prompts, lengths_T, quality_batch, spec_line, runs,
                  seed):
  """Part 2's cost curves: (curves, {(name, T): (compiled, args)} at B=1).

  Latency: batch-1 median over `runs` interleaved runs at each T. Quality:
  gen-PPL under the evaluator of one temperature-1 run at batch
  `quality_batch` and the longest T; speculative decoding samples the AR
  target's distribution exactly (tests/test_speculative.py), so it gets AR's
  gen-PPL rather than a second noisy estimate of the same number.
  """
  lines = {"AR": ("ar", "AR | ar | model=ar"),
           "MDLM K=8": ("parallel",
                        "MDLM K={steps} | mdlm | model=mdlm | steps=8"),
           "speculative": ("speculative", spec_line)}
  key = jax.random.key(seed)
  systems, ppl = {}, {}
  for name, (_, line) in lines.items():
    for t in lengths_T:
      decoder, roles = build(line, t, 1.0)
      bound = {role: models[member] for role, member in roles.items()}
      args = (bound, jnp.asarray(prompts[:1]),
              jnp.full((1,), prompts.shape[1], jnp.int32), key)
      systems[name, t] = compiled_system(decoder_fn(decoder), args)[0], args
    if name == "speculative":  # exactly the AR target's distribution
      ppl[name] = ppl["AR"]
      continue
    batch_prompts = jnp.asarray(prompts[:quality_batch])
    batch_lengths = jnp.full((quality_batch,), prompts.shape[1], jnp.int32)
    result = jax.jit(decoder_fn(decoder))(bound, batch_prompts,
                                          batch_lengths, key)
    ppl[name] = quality.gen_ppl(
        models["evaluator"].logits_fn, models["evaluator"].params,
        result.tokens, result.lengths, batch_prompts, batch_lengths).ppl
  times, _ = interleaved(systems, runs)
  curves = [router.CostCurve(
      name, kind, tuple(lengths_T),
      tuple(float(np.median(times[name, t])) * 1e3 for t in lengths_T),
      gen_ppl=ppl[name]) for name, (kind, _) in lines.items()]
  return curves, systems


def run_workload(curves, systems, models, prompts, lengths_T, requests,
                 budgets):
  """Rows of part 2: each policy on each budget's requests (module doc)."""
  short_t, long_t = lengths_T
  request_T = [short_t if i % 2 == 0 else long_t for i in range(requests)]
  prompt_rows = [jnp.asarray(prompts[i % len(prompts)][None])
                 for i in range(requests)]
  one = jnp.ones((1,), jnp.int32) * prompts.shape[1]
  entropy = lambda p: float(router.prompt_entropy(models["ar"], p, one)[0])
  entropy(prompt_rows[0])  # compile the difficulty pass
  difficulty = [entropy(p) for p in prompt_rows]
  config = router.RouterConfig(hard_entropy=float(np.median(difficulty)))
  policies = {"AR alone": lambda *_: "AR",
              "parallel alone (MDLM K=8)": lambda *_: "MDLM K=8",
              "router": lambda t, budget, d: router.route(
                  curves, t, budget, d, config)}
  rows = []
  for budget_name, budget in budgets.items():
    for policy, choose in policies.items():
      latency, tokens, chosen = [], [], []
      for i, t in enumerate(request_T):
        start = time.perf_counter()
        if policy == "router":
          d = entropy(prompt_rows[i])
          name = choose(t, budget, d)
        else:
          name = choose()
        compiled, args = systems[name, t]
        out = jax.block_until_ready(compiled(args[0], prompt_rows[i],
                                             *args[2:]))
        latency.append((time.perf_counter() - start) * 1e3)
        tokens.append(np.pad(np.asarray(out.tokens[0]), (0, long_t - t)))
        chosen.append(name)
      ppl = quality.gen_ppl(
          models["evaluator"].logits_fn, models["evaluator"].params,
          np.stack(tokens), np.asarray(request_T),
          np.concatenate([np.asarray(p) for p in prompt_rows]),
          np.full((requests,), prompts.shape[1])).ppl
      within = np.mean(np.asarray(latency) <= budget)
      rows.append(dict(
          budget=budget_name, budget_ms=budget, policy=policy,
          mean_ms=float(np.mean(latency)),
          p95_ms=float(np.percentile(latency, 95)),
          within_budget=float(within), gen_ppl=ppl,
          choices=" ".join(f"{n}:{chosen.count(n)}"
                           for n in dict.fromkeys(chosen))))
  return rows, config


def model_lines(models):
  lines = []
  for name, model in models.items():
    size = cost.tree_bytes(model.params)
    lines.append(f"  - {name}: {size // 4:,} parameters, {size / 2**20:.2f} "
                 f"MiB f32 ({'fits' if size < 32 * 2**20 else 'exceeds'} "
                 "the 32 MiB L3)")
  return lines


COLUMNS = ("target", "draft", "decoder", "gamma", "batch_size", "alpha",
           "alpha_per_position", "tokens_per_round",
           "tokens_per_target_call", "c", "ar_ms", "spec_ms", "spec_spread",
           "measured_speedup", "pair_ratio_median", "predicted_speedup",
           "measured_over_predicted", "compile_s")
ROUTER_COLUMNS = ("budget", "budget_ms", "policy", "mean_ms", "p95_ms",
                  "within_budget", "gen_ppl", "choices")
MODEL_COLUMNS = ("draft", "decoder", "gamma", "batch_size", "prefill_ms",
                 "draft_ms", "verify_ms", "settle_ms", "round_ms",
                 "round_spread", "rounds", "rounds_predicted",
                 "model_spec_ms", "spec_ms", "spec_spread",
                 "measured_speedup", "model_speedup", "model_error")


def router_markdown(route_rows, curves, budgets, router_config, best, run):
  """The router section of speculative.md (lines)."""
  lines = ["## Router on a mixed workload", "",
           "Cost curves (batch 1; latency medians in ms at T = "
           f"{run['lengths_T']}; gen-PPL of temperature-1 samples at the "
           "largest batch and longest T under the evaluator, fixed "
           "length):", ""]
  lines += [f"- {c.name} ({c.kind}): latency {', '.join(f'{m:.1f}' for m in c.latency_ms)} ms, "
            f"gen-PPL {c.gen_ppl:.1f}" for c in curves]
  lines += [
      f"- speculative = the best measured configuration at B=1, temperature "
      f"1: draft {best['draft']}, gamma {best['gamma']}",
      f"- {run['requests']} requests per budget, alternating T = "
      f"{run['lengths_T'][0]} and {run['lengths_T'][1]}, prompts one at a "
      "time (batch 1); budgets: tight = geometric mean of AR's latency at "
      f"the two lengths ({budgets['tight']:.1f} ms: AR fits short requests "
      f"only), loose = 1.5 x AR's latency at the long one "
      f"({budgets['loose']:.1f} ms)",
      "- router rule: among decoders whose interpolated latency fits the "
      "budget the lowest gen-PPL (ties: faster), else the fastest; a prompt "
      "is hard when the AR target's mean next-token entropy on it is above "
      f"{router_config.hard_entropy:.2f} nats (the workload's median); on a "
      f"hard prompt parallel gen-PPL x{router_config.hard_quality_penalty} "
      f"and speculative latency x{router_config.hard_latency_factor}; the "
      "router's latency includes its difficulty pass",
      "", markdown_table(route_rows, ROUTER_COLUMNS)]
  return lines


def write_markdown(out, rows, router_lines, loaded, models, run):
  """speculative.md: the command, the setting and every table."""
  command = " ".join(["python", *sys.argv])
  within = [r["measured_over_predicted"] for r in rows
            if r["decoder"] == "spec"]
  errors = np.asarray([r["model_error"] for r in rows])
  noisy = np.asarray([max(r["spec_spread"], r["round_spread"])
                      for r in rows])
  within_10 = np.abs(errors) <= 0.10
  load = (_LOAD_AT_START, os.getloadavg()[0])
  lines = [
      "# Speculative decoding: measured vs predicted speed-up, and the router",
      "", f"Command: `{command}`", "",
      f"- device: {jax.devices()[0].device_kind} x{jax.device_count()} "
      f"({platform.processor() or platform.machine()}, {os.cpu_count()} "
      f"cores; {cost.load_summary(load)})",
      "- models (all decoded in float32):",
      *[f"  - {loaded[n].describe(n)}" for n in loaded],
      *model_lines(models),
      "- every model fits in the 32 MiB L3 cache, so a one-token cached "
      "step is not bound by memory bandwidth but by CPU per-call overhead "
      "(dispatching the layers' small ops): a draft step costs nearly as "
      "much as a target step, c is large (see column c), and speculative "
      "decoding is expected to be SLOWER than AR here. That is the finding, "
      "not a failure: the speed-up needs c << 1 (a bandwidth-bound target, "
      "e.g. a large model on a GPU) and a draft that agrees with the target.",
      f"- T = {run['t']} tokens per row (fixed length, no EOS), prompts: "
      "the first held-out test documents (the main job's prompt source), "
      f"first P = {run['prompt_len']} tokens",
      f"- timing: every system of a (target, B, temperature) group compiled "
      f"first (compile_s apart), then {run['runs']} interleaved rounds (AR, "
      "draft AR, speculative ..., AR, ...), each call block_until_ready; "
      "medians; pair_ratio_median = median over rounds of AR time / "
      "speculative time in the same round",
      "- alpha (used in the prediction) is FITTED: the alpha whose "
      "(1 - alpha^(gamma+1)) / (1 - alpha) equals the measured tokens per "
      "round (sum over rows of T / sum of their rounds); alpha_per_position "
      "is sum_{a>i} / sum_{a>=i} of the acceptance histogram; "
      "tokens_per_target_call counts the batch's verification calls (the "
      "batch waits for its slowest row)",
      "- c: ms/token of plain cached AR decoding with the draft over that "
      "with the target (same B and temperature); jacobi/prompt_lookup: c = "
      "0 (no draft model); diffusion_draft: one MDLM forward over P + T + "
      "gamma - 1 positions over the target's ms/token",
      f"- measured / predicted for the AR drafts: median "
      f"{np.median(within):.2f}, range {min(within):.2f}-{max(within):.2f} "
      "(the issue's goal is within 10%)",
      "- the paper's prediction assumes that scoring gamma + 1 positions in "
      "one target call costs one target step (true where a step is bound by "
      "reading the weights) and that nothing else in a round costs time. "
      "Neither holds here (see the component table: verify_ms against the "
      "AR step, settle_ms). The component model replaces the formula's "
      "costs by measured ones: prefill_ms (both prefills, one call), and "
      f"per round draft_ms, verify_ms and settle_ms, each timed alone over "
      f"{run['loop_steps']} calls in one jit with the loop's shapes, "
      "interleaved with the decodes (experiments/speculative.py, "
      "component_systems); rounds_predicted from the measured acceptance "
      "histogram (per-position acceptance, pooled over rows; Monte Carlo "
      "of the batch waiting for its slowest row), against rounds, the "
      "loop's measured rounds; model_spec_ms = prefill_ms + "
      "rounds_predicted x round_ms; model_error = model_spec_ms / spec_ms "
      "- 1 (= measured / model speed-up - 1)",
      f"- component model: {within_10.sum()} of {len(rows)} points within "
      f"10% ({within_10.mean():.0%}); |model_error| median "
      f"{np.median(np.abs(errors)):.1%}, max {np.abs(errors).max():.1%}; "
      f"median error {np.median(errors):+.1%}. Spread ((max - min) / median "
      "over the runs) of the speculative decode: median "
      f"{np.median([r['spec_spread'] for r in rows]):.0%}; points within "
      f"10% have median spread {np.median(noisy[within_10]) if within_10.any() else float('nan'):.0%}, "
      "points outside "
      f"{np.median(noisy[~within_10]) if (~within_10).any() else float('nan'):.0%} "
      "(spread = the larger of the decode's and the round parts')",
      f"- part 1 took {run['part1_s'] / 60:.1f} min (groups of (target, "
      f"B, temperature) done: {run['groups']}), the whole run "
      f"{run['total_s'] / 60:.1f} min",
  ]
  if run["quick"]:
    lines.append("- QUICK smoke run: T=8, gamma 2, B=1, temperature 1, one "
                 "run; not a measurement")
  for temp, title in ((1.0, "Main table: sampling at temperature 1"),
                      (0.0, "Greedy (temperature 0)")):
    sel = [r for r in rows if r["temperature"] == temp]
    if sel:
      lines += ["", f"## {title}", "", markdown_table(sel, COLUMNS), "",
                f"Component model ({title.lower()}; times in ms):", "",
                markdown_table(sel, MODEL_COLUMNS)]
  lines += ["", "![speed-up](speedup.png)", "", "![alpha](alpha.png)", "",
            *router_lines]
  with open(os.path.join(out, "speculative.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.time()
  config, out = _CONFIG.value, _OUT.value
  cmp = config.compare
  quick = _QUICK.value
  t = 8 if quick else _T.value
  gammas = (2,) if quick else tuple(int(g) for g in _GAMMAS.value)
  batches = (1,) if quick else tuple(int(b) for b in _BATCHES.value)
  temps = (1.0,) if quick else tuple(float(x) for x in _TEMPS.value)
  runs = 1 if quick else _RUNS.value
  loop_steps = 2 if quick else _LOOP_STEPS.value
  requests = 4 if quick else _REQUESTS.value
  lengths_T = (4, 8) if quick else (_SHORT_T.value, t)
  if (runs < 1 or min(gammas) < 1 or min(batches) < 1 or requests < 2
      or loop_steps < 1):
    sys.exit("speculative: error: --runs, --gammas, --batch_sizes, "
             "--loop_steps must be >= 1 and --requests >= 2")
  try:
    set_dir = pretrained.set_dir(cmp.pretrained_set)
  except ValueError as e:
    sys.exit(f"speculative: error: {e}")
  targets = ("ar",) if quick else tuple(_TARGETS.value)
  if not set(targets) <= {"ar", "evaluator"} or not targets:
    sys.exit(f"speculative: error: --targets={','.join(targets)} must be "
             "'ar' and/or 'evaluator'")
  members = pretrained.member_configs(config)
  drafts = [d for d in config.get("drafts", {})
            if (set_dir / d / pretrained.MANIFEST_FILE).exists()]
  if _DRAFTS.value is not None:
    if not set(_DRAFTS.value) <= set(drafts):
      sys.exit(f"speculative: error: --drafts={','.join(_DRAFTS.value)} "
               f"must be among the drafts shipped in {set_dir}: {drafts}")
    drafts = list(_DRAFTS.value)
  if _ROUTER.value and ("ar" not in targets or not drafts or 1 not in batches
                        or 1.0 not in temps):
    sys.exit("speculative: error: the router (part 2) uses the fastest "
             "speculative configuration of target 'ar' at B=1 and "
             "temperature 1: --targets must hold ar, --drafts a draft, "
             "--batch_sizes 1 and --temperatures 1.0; or pass --norouter")
  os.makedirs(out, exist_ok=True)
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            _WORKDIR.value, data_format=config.data.format)
  # The evaluator is a target (of draft 'ar') or scores the router's
  # samples, the MDLM drafts an extra row or is the router's parallel
  # decoder; otherwise neither is loaded (nor trained, where the set lacks
  # it).
  needed = ["ar", *drafts]
  if (_EXTRAS.value and "ar" in targets) or _ROUTER.value:
    needed.append("mdlm")
  if "evaluator" in targets or _ROUTER.value:
    needed.append("evaluator")
  loaded = pretrained.load_models({n: members[n] for n in needed},
                                  _WORKDIR.value, corpus.tokenizer,
                                  progress=False, out_dir=set_dir)
  models = {n: m.model for n, m in loaded.items()}
  prompts, _ = pipeline.prompts(corpus, "test", max(max(batches), requests),
                                cmp.prompt_len, cmp.reference_len)
  pairs = [pair for pair in (("ar", drafts, True), ("evaluator", ["ar"],
                                                    False))
           if pair[0] in targets]
  run = dict(t=t, runs=runs, requests=requests, prompt_len=cmp.prompt_len,
             lengths_T=lengths_T, quick=quick, loop_steps=loop_steps)
  router_csv = os.path.join(out, "router.csv")
  if _ROUTER.value:
    router_lines = ["## Router on a mixed workload", "", "Not run yet."]
  elif not os.path.exists(router_csv):
    router_lines = ["## Router on a mixed workload", "",
                    f"Not run (--norouter; {out} holds no earlier router.csv)."]
  else:
    with open(router_csv, newline="") as f:
      router_lines = ["## Router on a mixed workload", "",
                      "Not re-run (--norouter): router.csv as an earlier run "
                      "of this script left it (its setting is in that run's "
                      "speculative.md, in the git history).", "",
                      markdown_table([{k: number(v) for k, v in r.items()}
                                      for r in csv.DictReader(f)],
                                     ROUTER_COLUMNS)]
  groups = [(target, target_drafts, extras, batch, temp)
            for target, target_drafts, extras in pairs
            for batch in batches for temp in temps]
  rows = []
  for done, (target, target_drafts, extras, batch, temp) in enumerate(groups):
    print(f"target {target} B={batch} temperature {temp:g} "
          f"({time.time() - start:.0f} s)", flush=True)
    rows += measure_group(target, target_drafts, gammas,
                          extras and _EXTRAS.value and batch == batches[0],
                          models, prompts, t, batch,
                          temp, runs, config.seed, loop_steps)
    # Written after every group, so that a run stopped early leaves the
    # groups it finished (the markdown says how many).
    write_csv(os.path.join(out, "speculative.csv"), rows)
    plot_speedup(rows, os.path.join(out, "speedup.png"))
    plot_alpha(rows, os.path.join(out, "alpha.png"))
    run.update(part1_s=time.time() - start, total_s=time.time() - start,
               groups=f"{done + 1} of {len(groups)}")
    write_markdown(out, rows, router_lines, loaded, models, run)
  if _ROUTER.value:
    spec_rows = [r for r in rows if r["decoder"] == "spec"
                 and r["target"] == "ar" and r["batch_size"] == 1
                 and r["temperature"] == 1.0]
    best = max(spec_rows, key=lambda r: r["measured_speedup"])
    spec_line = (f"spec g={{gamma}} | speculative | target=ar "
                 f"draft={best['draft']} | gamma={best['gamma']}")
    curves, systems = router_curves(models, prompts, lengths_T, max(batches),
                                    spec_line, runs, config.seed)
    ar_curve = curves[0]
    budgets = {
        "tight": float(np.sqrt(ar_curve.latency_ms[0]
                               * ar_curve.latency_ms[1])),
        "loose": 1.5 * ar_curve.latency_ms[1]}
    route_rows, router_config = run_workload(curves, systems, models,
                                             prompts, lengths_T, requests,
                                             budgets)
    write_csv(os.path.join(out, "router.csv"), route_rows)
    router_lines = router_markdown(route_rows, curves, budgets, router_config,
                                   best, run)
    run["total_s"] = time.time() - start
    write_markdown(out, rows, router_lines, loaded, models, run)
  print(f"wrote {out} in {time.time() - start:.0f} s")


if __name__ == "__main__":
  app.run(main)
