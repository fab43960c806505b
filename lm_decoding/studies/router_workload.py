r"""The router (`router.route`) measured on a mixed workload.

`router_curves` measures the cost curves the router reads (batch-1 latency
at two output lengths, gen-PPL under an evaluator) for AR, MDLM K=8 and one
speculative configuration; `run_workload` sends requests that alternate a
short and a long T, each under every budget, through three policies ("AR
alone", "parallel alone", "router") and times each request once (batch 1,
compiled before; the router's time includes its difficulty pass).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base
from lm_decoding.evaluation import cost, quality, router
from lm_decoding.studies import speculative_cost

PARALLEL = "MDLM K=8"


def router_curves(models: dict, prompts_BxP: np.ndarray,
                  lengths_T: Sequence[int], quality_batch: int,
                  spec_line: str, runs: int, seed: int
                  ) -> tuple[list[router.CostCurve], dict]:
  """The workload's cost curves: (curves, {(name, T): (compiled, args)}).

  Latency: batch-1 median over `runs` rounds timed in turns at each T of
  `lengths_T`. Quality: gen-PPL under `models['evaluator']` of one
  temperature-1 run at batch `quality_batch` and the longest T; speculative
  decoding samples the AR target's distribution exactly
  (tests/test_speculative.py), so it gets AR's gen-PPL rather than a second
  noisy estimate of the same number.

  Args:
    models: {member: Model} with 'ar', 'mdlm' and 'evaluator' and the
      members `spec_line` names.
    prompts_BxP: int[B, P] prompts, B >= quality_batch.
    lengths_T: output lengths T (tokens per row), increasing.
    quality_batch: rows of the gen-PPL run.
    spec_line: the speculative configuration's comparison entry line.
    runs: timed rounds, >= 1.
    seed: the decode key's seed.
  Raises:
    ValueError: runs < 1.
  """
  lines = {"AR": ("ar", "AR | ar | model=ar"),
           PARALLEL: ("parallel",
                      "MDLM K={steps} | mdlm | model=mdlm | steps=8"),
           "speculative": ("speculative", spec_line)}
  key = jax.random.key(seed)
  width = prompts_BxP.shape[1]
  systems, ppl = {}, {}
  for name, (_, line) in lines.items():
    for t in lengths_T:
      decoder, roles = speculative_cost.build(line, t, 1.0)
      bound = {role: models[member] for role, member in roles.items()}
      args = (bound, jnp.asarray(prompts_BxP[:1]),
              jnp.full((1,), width, jnp.int32), key)
      systems[name, t] = cost.compile_timed(
          base.jit_decode(decoder), args)[0], args
    if name == "speculative":  # exactly the AR target's distribution
      ppl[name] = ppl["AR"]
      continue
    batch_prompts = jnp.asarray(prompts_BxP[:quality_batch])
    batch_lengths = jnp.full((quality_batch,), width, jnp.int32)
    result = base.jit_decode(decoder)(bound, batch_prompts, batch_lengths,
                                      key)
    ppl[name] = quality.gen_ppl(
        models["evaluator"].logits_fn, models["evaluator"].params,
        result.tokens, result.lengths, batch_prompts, batch_lengths).ppl
  times, _ = speculative_cost.timed_systems(systems, runs)
  curves = [router.CostCurve(
      name, kind, tuple(lengths_T),
      tuple(float(np.median(times[name, t])) * 1e3 for t in lengths_T),
      gen_ppl=ppl[name]) for name, (kind, _) in lines.items()]
  return curves, systems


def budgets(ar_curve: router.CostCurve) -> dict[str, float]:
  """{'tight': geometric mean of AR's latency at the two lengths (AR fits
  the short requests only), 'loose': 1.5 x AR's latency at the long one},
  ms."""
  short_ms, long_ms = ar_curve.latency_ms
  return {"tight": float(np.sqrt(short_ms * long_ms)), "loose": 1.5 * long_ms}


def run_workload(curves: Sequence[router.CostCurve], systems: dict,
                 models: dict, prompts_BxP: np.ndarray,
                 lengths_T: Sequence[int], requests: int,
                 budgets_ms: dict[str, float]
                 ) -> tuple[list[dict], router.RouterConfig]:
  """Each policy on each budget's `requests` requests (module doc).

  Request i has T = lengths_T[i % 2] and prompt row i mod B. A prompt is
  hard when the AR target's mean next-token entropy on it is above the
  workload's median (`router.prompt_entropy`).

  Returns:
    (rows: budget, budget_ms, policy, mean_ms, p95_ms, within_budget,
    gen_ppl (under models['evaluator']), choices; the RouterConfig used).
  """
  short_t, long_t = lengths_T
  width = prompts_BxP.shape[1]
  request_T = [short_t if i % 2 == 0 else long_t for i in range(requests)]
  prompt_rows = [jnp.asarray(prompts_BxP[i % len(prompts_BxP)][None])
                 for i in range(requests)]
  one = jnp.full((1,), width, jnp.int32)
  entropy = lambda p: float(router.prompt_entropy(models["ar"], p, one)[0])
  entropy(prompt_rows[0])  # compile the difficulty pass
  config = router.RouterConfig(
      hard_entropy=float(np.median([entropy(p) for p in prompt_rows])))
  policies = {"AR alone": lambda *_: "AR",
              f"parallel alone ({PARALLEL})": lambda *_: PARALLEL,
              "router": lambda t, budget, p: router.route(
                  curves, t, budget, entropy(p), config)}
  rows = []
  for budget_name, budget in budgets_ms.items():
    for policy, choose in policies.items():
      latency, tokens, chosen = [], [], []
      for prompt, t in zip(prompt_rows, request_T):
        start = time.perf_counter()
        name = choose(t, budget, prompt)
        compiled, args = systems[name, t]
        out = jax.block_until_ready(compiled(args[0], prompt, *args[2:]))
        latency.append((time.perf_counter() - start) * 1e3)
        tokens.append(np.pad(np.asarray(out.tokens[0]), (0, long_t - t)))
        chosen.append(name)
      ppl = quality.gen_ppl(
          models["evaluator"].logits_fn, models["evaluator"].params,
          np.stack(tokens), np.asarray(request_T),
          np.concatenate([np.asarray(p) for p in prompt_rows]),
          np.full((requests,), width)).ppl
      rows.append(dict(
          budget=budget_name, budget_ms=budget, policy=policy,
          mean_ms=float(np.mean(latency)),
          p95_ms=float(np.percentile(latency, 95)),
          within_budget=float(np.mean(np.asarray(latency) <= budget)),
          gen_ppl=ppl,
          choices=" ".join(f"{n}:{chosen.count(n)}"
                           for n in dict.fromkeys(chosen))))
  return rows, config
