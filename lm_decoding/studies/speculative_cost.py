r"""Speculative decoding measured against its closed-form prediction.

The closed forms are those of Leviathan et al. 2023 ("Fast Inference from
Transformers via Speculative Decoding"): with per-token acceptance rate
alpha and gamma draft tokens per round, a round commits

    E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)
              = 1 + alpha + ... + alpha^gamma

tokens and the expected speed-up over plain AR decoding is
E[tokens] / (gamma c + 1), c being a draft call's cost over a target call's.

`measure_group` times one group of systems (one target, batch size and
temperature: plain AR with the target and with each draft, the speculative
configurations, and each part of a round alone, `component_systems`) in
turns (`cost.interleaved`) and returns one row per speculative
configuration: measured speed-up, the paper's prediction, and the component
model (prefill + predicted rounds x measured round time).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base, speculative
from lm_decoding.evaluation import cost, entries
from lm_decoding.models import KVCache

EXTRA_GAMMA = 4  # gamma of the self-drafting and diffusion-draft rows
PARTS = ("prefill", "draft", "verify", "settle")


def alpha_per_position(counts_G1: np.ndarray) -> np.ndarray:
  """alpha_i = sum_{a > i} / sum_{a >= i}: float64[gamma], from a histogram
  int[gamma + 1] of rounds that accepted exactly a draft tokens (NaN where
  no round reached position i)."""
  at_least = np.cumsum(np.asarray(counts_G1)[::-1])[::-1].astype(np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    return at_least[1:] / at_least[:-1]


def expected_tokens(alpha: float, gamma: int) -> float:
  """Tokens committed per round: (1 - alpha^(gamma+1)) / (1 - alpha) =
  1 + alpha + ... + alpha^gamma (Leviathan et al. 2023, eq. 1)."""
  return float(sum(alpha ** i for i in range(gamma + 1)))


def fitted_alpha(tokens_per_round: float, gamma: int) -> float:
  """The alpha in [0, 1] whose `expected_tokens(alpha, gamma)` equals
  `tokens_per_round` (bisection, 60 halvings; a value outside [1, gamma + 1]
  gives 0 or 1)."""
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
  1)), a round costing `draft_calls` (default gamma) draft calls of relative
  cost c and one verification call of relative cost 1 (the paper's
  memory-bound regime, where scoring gamma + 1 positions costs one step)."""
  calls = gamma if draft_calls is None else draft_calls
  return expected_tokens(alpha, gamma) / (calls * c + 1)


def predicted_rounds(counts_G1: np.ndarray, t: int, batch: int,
                     sims: int = 2000, seed: int = 0) -> float:
  """E[rounds of the decode loop]: the loop runs until its slowest row has
  `t` tokens; each round of each row accepts a draft tokens with frequency
  counts_G1[a] / sum(counts_G1) (pooled over rows) and commits a + 1 (Monte
  Carlo over `sims` batches of `batch` rows, numpy seed `seed`)."""
  counts_G1 = np.asarray(counts_G1, np.float64)
  rng = np.random.default_rng(seed)
  commits = rng.choice(len(counts_G1), size=(sims, batch, t),
                       p=counts_G1 / counts_G1.sum()) + 1
  rounds = (np.cumsum(commits, -1) < t).sum(-1) + 1
  return float(rounds.max(-1).mean())


def spread(times_s: Sequence[float]) -> float:
  """(max - min) / median of a system's run times (dimensionless)."""
  times_s = np.asarray(times_s)
  return float((times_s.max() - times_s.min()) / np.median(times_s))


def timed_systems(systems: dict[Any, tuple[Any, tuple]], runs: int
                  ) -> tuple[dict, dict]:
  """Each (compiled, args) of `systems` run once untimed (warm-up), then all
  timed in turns by `cost.interleaved`: ({name: [seconds]}, {name: last
  output}).

  Raises:
    ValueError: runs < 1 or no systems.
  """
  return cost.interleaved(
      {name: functools.partial(compiled, *args)
       for name, (compiled, args) in systems.items()}, runs, warmup=1)


def build(line: str, output_length: int, temperature: float):
  """(decoder, {role: member}) of a comparison entry line
  (`entries.parse_entry`), fixed length (no EOS)."""
  entry = entries.parse_entry(line)
  return (entries.build(entry, output_length, temperature, eos_ids=()),
          dict(entry.roles))


def _depend(x, scalar):
  """x, made to depend on `scalar` (a select on `scalar > inf`, never true,
  that the compiler cannot fold), so that no call of a timed loop is
  hoisted out of it or merged with another."""
  return jax.tree.map(lambda a: jnp.where(
      scalar.astype(jnp.float32) > jnp.inf, jnp.zeros_like(a), a), x)


def component_systems(decoder, bound: dict, prompts_BxP: jax.Array,
                      key: jax.Array, steps: int) -> dict:
  """{part: (compiled, args)}: each part of `speculative.verify_round` alone,
  with the shapes of the decode loop, `steps` calls in one jit (as the loop
  makes them: no dispatch per call); one call's time is a run's time over
  `steps` ("prefill": one call of `speculative.start`, both prefills).

    draft   `decoder.propose` from the state after the prefill (a KV-cache
            draft state moved back after each call, so every call drafts
            from the same position);
    verify  `speculative.score`, the target's cached call on gamma + 1
            tokens (the cache moved back after each call);
    settle  `speculative.settle` on one real draft and target call: the
            acceptance test, the target's draw, the commit and roll-back of
            both caches (the state carried from call to call).

  Args:
    decoder: a speculative-family decoder (`speculative.start` accepts it).
    bound: {role: Model} as the decoder binds them.
    prompts_BxP: int32[B, P] prompts, all of length P.
    key: a jax.random key.
    steps: calls per timed run, >= 1.
  """
  batch, width = prompts_BxP.shape
  length = decoder.cache_length_for(width)
  lengths_B = jnp.full((batch,), width, jnp.int32)
  keys_Bx2 = jax.vmap(jax.random.split)(base.row_keys(key, batch))
  start = lambda m, p, n, k: speculative.start(decoder, length, m, p, n, k)
  prefill_args = (bound, prompts_BxP, lengths_B, keys_Bx2[:, 0])
  systems = {"prefill": (cost.compile_timed(start, prefill_args)[0],
                         prefill_args)}
  state = systems["prefill"][0](*prefill_args)
  keys_B = keys_Bx2[:, 1]
  systems["draft"] = _draft_system(decoder, bound, state, keys_B, steps)
  draft_BxG, q_BxGxV, draft_state = systems["draft"][0](bound, state, keys_B)
  state = state.replace(draft=draft_state)
  systems["verify"] = _verify_system(bound, state, draft_BxG, steps)
  out = systems["verify"][0](bound, state, draft_BxG)
  systems["settle"] = _settle_system(decoder, state, draft_BxG, q_BxGxV, out,
                                     keys_B, steps)
  return systems


def _draft_system(decoder, bound: dict, state, keys_B: jax.Array,
                  steps: int) -> tuple:
  """(compiled, args): `steps` calls of `decoder.propose` from `state` (a
  KV-cache draft state moved back after each call); the compiled call
  returns the last (draft int32[B, gamma], q [B, gamma, V], draft state)."""
  def draft_loop(m, state, keys_B):
    def body(i, carry):
      state, draft, _, _ = carry
      state = state.replace(sequence=_depend(state.sequence, draft[0, -1]),
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

  args = (bound, state, keys_B)
  return cost.compile_timed(draft_loop, args)[0], args


def _verify_system(bound: dict, state, draft_BxG: jax.Array,
                   steps: int) -> tuple:
  """(compiled, args): `steps` calls of `speculative.score` on the same
  draft (the target's cache moved back after each call); the compiled call
  returns the last call's output."""
  def verify_loop(m, state, draft_BxG):
    def body(_, out):
      out, _ = speculative.score(m, state.replace(cache=out.cache.at(
          state.pos)), _depend(draft_BxG, out.logits[0, 0, 0]))
      return out
    first, _ = speculative.score(m, state, draft_BxG)
    return jax.lax.fori_loop(0, steps - 1, body, first)

  args = (bound, state, draft_BxG)
  return cost.compile_timed(verify_loop, args)[0], args


def _settle_system(decoder, state, draft_BxG: jax.Array,
                   q_BxGxV: jax.Array, out, keys_B: jax.Array,
                   steps: int) -> tuple:
  """(compiled, args): `steps` calls of `speculative.settle` on one real
  draft and target call, the state carried from call to call."""
  def settle_loop(state, draft_BxG, q_BxGxV, out, keys_B):
    def body(_, state):
      fresh = out._replace(logits=_depend(out.logits, state.round))
      return speculative.settle(decoder, state, draft_BxG, q_BxGxV, fresh,
                                speculative.round_keys(state, keys_B))
    return jax.lax.fori_loop(0, steps, body, state)

  args = (state, draft_BxG, q_BxGxV, out, keys_B)
  return cost.compile_timed(settle_loop, args)[0], args


def group_lines(target: str, drafts: Sequence[str], gammas: Sequence[int],
                extras: bool) -> dict[str, str]:
  """{system name: comparison entry line} of one group: 'AR <member>' for
  the target and each draft, 'spec <draft> g=<gamma>' for each pair, and
  with `extras` the jacobi, prompt_lookup and diffusion_draft (draft 'mdlm')
  rows at gamma `EXTRA_GAMMA`."""
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
  return lines


def _forward_system(model, batch: int, width: int):
  """(compiled, args) of one forward over [batch, width] tokens."""
  tokens = jnp.zeros((batch, width), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32),
                               (batch, width))
  fn = lambda m, x, p: m.logits_fn(m.params, x, p).logits
  return cost.compile_timed(fn, (model, tokens, positions))[0], (
      model, tokens, positions)


def measure_group(target: str, drafts: Sequence[str], gammas: Sequence[int],
                  extras: bool, models: dict, prompts_BxP: np.ndarray, t: int,
                  temperature: float, runs: int, seed: int, loop_steps: int
                  ) -> list[dict]:
  """One row per speculative configuration of one (target, B, temperature).

  Every system of the group (`group_lines`, and each speculative one's
  parts, `component_systems`) is compiled first, then all are timed in
  turns, `runs` rounds (`timed_systems`).

  Args:
    target: the target member's name in `models`.
    drafts: draft members' names.
    gammas: draft lengths, each >= 1.
    extras: add the jacobi, prompt_lookup and diffusion_draft rows (the
      latter needs `models['mdlm']`).
    models: {member: Model}.
    prompts_BxP: int[B, P] prompts (B = the batch size measured).
    t: T, tokens generated per row (fixed length).
    temperature: sampling temperature (0 = greedy).
    runs: timed rounds, >= 1.
    seed: seed of the decode key and the Monte Carlo of `predicted_rounds`.
    loop_steps: calls per component run (`component_systems`), >= 1.
  Returns:
    Rows (dicts): alpha (fitted), alpha_per_position, tokens per round and
    per target call, c, ar_ms / spec_ms (medians), measured, pair-ratio and
    predicted speed-ups, the component times (ms per call) and the
    component model's time, speed-up and error, compile seconds.
  Raises:
    ValueError: runs < 1.
  """
  systems, compile_s = _group_systems(
      target, drafts, gammas, extras, models, prompts_BxP, t, temperature,
      seed, loop_steps)
  times, outputs = timed_systems(systems, runs)
  return [_row(name, target, times, outputs[name], compile_s,
               batch=prompts_BxP.shape[0], t=t, temperature=temperature,
               seed=seed, loop_steps=loop_steps)
          for name in compile_s if not name.startswith("AR ")]


def _group_systems(target, drafts, gammas, extras, models, prompts_BxP, t,
                   temperature, seed, loop_steps) -> tuple[dict, dict]:
  """({system name: (compiled, args)}, {decoder system: compile s}) of one
  group (`measure_group`'s arguments): each whole decode, each speculative
  one's parts ("<name> | <part>") and with `extras` one MDLM forward."""
  batch = prompts_BxP.shape[0]
  args_tail = (jnp.asarray(prompts_BxP),
               jnp.full((batch,), prompts_BxP.shape[1], jnp.int32),
               jax.random.key(seed))
  systems, compile_s = {}, {}
  for name, line in group_lines(target, drafts, gammas, extras).items():
    decoder, roles = build(line, t, temperature)
    bound = {role: models[member] for role, member in roles.items()}
    args = (bound, *args_tail)
    compiled, compile_s[name] = cost.compile_timed(
        base.jit_decode(decoder), args)
    systems[name] = compiled, args
    if not name.startswith("AR "):
      parts = component_systems(decoder, bound, args_tail[0], args_tail[2],
                                loop_steps)
      systems.update({f"{name} | {part}": v for part, v in parts.items()})
  if extras:
    width = prompts_BxP.shape[1] + t + EXTRA_GAMMA - 1
    systems["MDLM forward"] = _forward_system(models["mdlm"], batch, width)
  return systems, compile_s


def _draft_cost(target: str, draft: str, times: dict, t: int) -> float:
  """c: a draft call's time over a target call's (medians of `times`, {system
  name: [s]}): from the draft member's own AR decode, one MDLM forward for
  'mdlm', 0 for self-drafting."""
  ar_ms_token = np.median(times[f"AR {target}"]) * 1e3 / t
  if f"AR {draft}" in times:
    return np.median(times[f"AR {draft}"]) * 1e3 / t / ar_ms_token
  if draft == "mdlm":
    return np.median(times["MDLM forward"]) * 1e3 / ar_ms_token
  return 0.0


def _row(name: str, target: str, times: dict, result, compile_s: dict, *,
         batch: int, t: int, temperature: float, seed: int,
         loop_steps: int) -> dict:
  """`measure_group`'s row of system `name` from the group's run times and
  its last decode `result`."""
  ar_s, spec_s = np.asarray(times[f"AR {target}"]), np.asarray(times[name])
  decoder, gamma = name.split()[0], int(name.rpartition("g=")[2])
  draft = name.split()[1] if name.startswith("spec") else {
      "diffusion_draft": "mdlm"}.get(decoder, "—")
  c = _draft_cost(target, draft, times, t)
  counts = np.asarray(result.stats["accept_counts"]).sum(0)
  rounds = np.asarray(result.stats["rounds"])
  per_round = batch * t / rounds.sum()
  alpha = fitted_alpha(min(per_round, gamma + 1), gamma)
  measured = float(np.median(ar_s) / np.median(spec_s))
  predicted = predicted_speedup(
      alpha, gamma, c,
      draft_calls=1 if decoder == "diffusion_draft" else None)
  part_ms = {part: float(np.median(times[f"{name} | {part}"])) * 1e3
             / (1 if part == "prefill" else loop_steps) for part in PARTS}
  round_ms = part_ms["draft"] + part_ms["verify"] + part_ms["settle"]
  rounds_predicted = predicted_rounds(counts, t, batch, seed=seed)
  model_ms = part_ms["prefill"] + rounds_predicted * round_ms
  alphas = alpha_per_position(counts)
  return dict(
      target=target, draft=draft, decoder=decoder, gamma=gamma,
      batch_size=batch, temperature=temperature, output_length=t,
      alpha=alpha, alpha_mean_position=float(np.nanmean(alphas)),
      alpha_per_position=" ".join(f"{a:.3f}" for a in alphas),
      tokens_per_round=per_round,
      tokens_per_target_call=t / (int(result.calls["target"]) - 1),
      c=c, ar_ms=np.median(ar_s) * 1e3, spec_ms=np.median(spec_s) * 1e3,
      spec_spread=spread(spec_s), ar_spread=spread(ar_s),
      measured_speedup=measured,
      pair_ratio_median=float(np.median(ar_s / spec_s)),
      predicted_speedup=predicted,
      measured_over_predicted=measured / predicted,
      **{f"{part}_ms": part_ms[part] for part in PARTS},
      round_ms=round_ms, round_spread=max(
          spread(times[f"{name} | {part}"]) for part in PARTS[1:]),
      rounds=int(rounds.max()), rounds_predicted=rounds_predicted,
      model_spec_ms=model_ms,
      model_speedup=float(np.median(ar_s)) * 1e3 / model_ms,
      model_error=model_ms / (np.median(spec_s) * 1e3) - 1,
      compile_s=compile_s[name], ar_compile_s=compile_s[f"AR {target}"])
