"""speculative.md and its figures: the rows of `speculative_cost` and
`router_workload` as tables, plots and the notes that define them."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
import numpy as np

from lm_decoding.evaluation import report

COLUMNS = ("target", "draft", "decoder", "gamma", "batch_size", "alpha",
           "alpha_per_position", "tokens_per_round",
           "tokens_per_target_call", "c", "ar_ms", "spec_ms", "spec_spread",
           "measured_speedup", "pair_ratio_median", "predicted_speedup",
           "measured_over_predicted", "compile_s")
MODEL_COLUMNS = ("draft", "decoder", "gamma", "batch_size", "prefill_ms",
                 "draft_ms", "verify_ms", "settle_ms", "round_ms",
                 "round_spread", "rounds", "rounds_predicted",
                 "model_spec_ms", "spec_ms", "spec_spread",
                 "measured_speedup", "model_speedup", "model_error")
ROUTER_COLUMNS = ("budget", "budget_ms", "policy", "mean_ms", "p95_ms",
                  "within_budget", "gen_ppl", "choices")
ROUTER_TITLE = "## Router on a mixed workload"


def table(rows: Sequence[dict], columns: Sequence[str]) -> str:
  """`report.markdown_table` of `columns` (headers = keys, 3 decimals)."""
  return report.markdown_table(rows, [(c, c, 3, "") for c in columns])


def plot_speedup(rows: Sequence[dict], path: str) -> None:
  """Measured, paper's and component-model speed-up against gamma, one panel
  per (batch size, temperature), one colour per (draft, target)."""
  keys = sorted({(r["batch_size"], r["temperature"]) for r in rows})
  fig = Figure(figsize=(4.5 * len(keys), 3.6))
  axes = fig.subplots(1, len(keys), squeeze=False)
  spec = [r for r in rows if r["decoder"] == "spec"]
  pairs = sorted({(r["target"], r["draft"]) for r in spec})
  for ax, (batch, temp) in zip(axes[0], keys):
    for i, pair in enumerate(pairs):
      sel = sorted((r for r in spec if (r["target"], r["draft"]) == pair
                    and (r["batch_size"], r["temperature"]) == (batch, temp)),
                   key=lambda r: r["gamma"])
      g, label = [r["gamma"] for r in sel], f"{pair[1]}->{pair[0]}"
      for key, style, what in (("measured_speedup", "o-", "measured"),
                               ("predicted_speedup", "s--",
                                "paper's formula"),
                               ("model_speedup", "x:", "component model")):
        ax.plot(g, [r[key] for r in sel], style, color=f"C{i}",
                label=f"{label} {what}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("gamma")
    ax.set_ylabel("speed-up over AR")
    ax.set_title(f"B={batch}, temperature {temp:g}")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def plot_alpha(rows: Sequence[dict], path: str) -> None:
  """alpha_i of the draft-model rows at their largest gamma (an empty plot
  when there are none)."""
  spec = [r for r in rows if r["decoder"] == "spec"]
  gamma = max((r["gamma"] for r in spec), default=0)
  sel = [r for r in spec if r["gamma"] == gamma]
  fig = Figure(figsize=(6, 3.8))
  ax = fig.subplots()
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


def router_lines(route_rows: Sequence[dict], curves, budgets_ms: dict,
                 router_config, best: dict, lengths_T: Sequence[int],
                 requests: int) -> list[str]:
  """The router section of speculative.md (Markdown lines)."""
  lines = [ROUTER_TITLE, "",
           "Cost curves (batch 1; latency medians in ms at T = "
           f"{tuple(lengths_T)}; gen-PPL of temperature-1 samples at the "
           "largest batch and longest T under the evaluator, fixed "
           "length):", ""]
  lines += [f"- {c.name} ({c.kind}): latency "
            f"{', '.join(f'{m:.1f}' for m in c.latency_ms)} ms, "
            f"gen-PPL {c.gen_ppl:.1f}" for c in curves]
  lines += [
      f"- speculative = the best measured configuration at B=1, temperature "
      f"1: draft {best['draft']}, gamma {best['gamma']}",
      f"- {requests} requests per budget, alternating T = {lengths_T[0]} and "
      f"{lengths_T[1]}, prompts one at a time (batch 1); budgets: tight = "
      "geometric mean of AR's latency at the two lengths "
      f"({budgets_ms['tight']:.1f} ms: AR fits short requests only), loose "
      f"= 1.5 x AR's latency at the long one ({budgets_ms['loose']:.1f} ms)",
      "- router rule: among decoders whose interpolated latency fits the "
      "budget the lowest gen-PPL (ties: faster), else the fastest; a prompt "
      "is hard when the AR target's mean next-token entropy on it is above "
      f"{router_config.hard_entropy:.2f} nats (the workload's median); on a "
      f"hard prompt parallel gen-PPL x{router_config.hard_quality_penalty} "
      f"and speculative latency x{router_config.hard_latency_factor}; the "
      "router's latency includes its difficulty pass",
      "", table(route_rows, ROUTER_COLUMNS)]
  return lines


def _share(values, mask) -> str:
  return f"{np.median(values[mask]):.0%}" if mask.any() else "nan"


def _method_lines(rows: Sequence[dict], run: dict) -> list[str]:
  """speculative.md's setting and method bullets: T and the prompts, the
  timing, alpha, c, the prediction against the measurement and the
  component model's accuracy, the run's duration (`markdown`'s `run`)."""
  within = [r["measured_over_predicted"] for r in rows
            if r["decoder"] == "spec"] or [float("nan")]
  return [
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
      "interleaved with the decodes "
      "(lm_decoding/studies/speculative_cost.py, component_systems); "
      "rounds_predicted from the measured acceptance histogram "
      "(per-position acceptance, pooled over rows; Monte Carlo of the batch "
      "waiting for its slowest row), against rounds, the loop's measured "
      "rounds; model_spec_ms = prefill_ms + rounds_predicted x round_ms; "
      "model_error = model_spec_ms / spec_ms - 1 (= measured / model "
      "speed-up - 1)",
      *_accuracy_lines(rows, run)]


def _accuracy_lines(rows: Sequence[dict], run: dict) -> list[str]:
  """The component model's accuracy and spread over `rows`, and how long
  the run took."""
  errors = np.asarray([r["model_error"] for r in rows])
  noisy = np.asarray([max(r["spec_spread"], r["round_spread"])
                      for r in rows])
  close = np.abs(errors) <= 0.10
  return [
      f"- component model: {close.sum()} of {len(rows)} points within "
      f"10% ({close.mean():.0%}); |model_error| median "
      f"{np.median(np.abs(errors)):.1%}, max {np.abs(errors).max():.1%}; "
      f"median error {np.median(errors):+.1%}. Spread ((max - min) / median "
      "over the runs) of the speculative decode: median "
      f"{np.median([r['spec_spread'] for r in rows]):.0%}; points within "
      f"10% have median spread {_share(noisy, close)}, points outside "
      f"{_share(noisy, ~close)} (spread = the larger of the decode's and "
      "the round parts')",
      f"- part 1 took {run['part1_s'] / 60:.1f} min (groups of (target, "
      f"B, temperature) done: {run['groups']}), the whole run "
      f"{run['total_s'] / 60:.1f} min",
  ]


def markdown(rows: Sequence[dict], router_section: Sequence[str],
             setting: Sequence[str], run: dict) -> str:
  """speculative.md: title, `command` and `setting` lines (hardware,
  models), the method notes, both tables per temperature, the figures and
  the router section.

  Args:
    rows: `speculative_cost.measure_group` rows.
    router_section: Markdown lines (`router_lines` or a note).
    setting: Markdown bullet lines describing the machine and models.
    run: command, t, prompt_len, runs, loop_steps, part1_s, total_s,
      groups, smoke.
  """
  lines = [
      "# Speculative decoding: measured vs predicted speed-up, and the router",
      "", f"Command: `{run['command']}`", "", *setting,
      *_method_lines(rows, run)]
  if run["smoke"]:
    lines.append("- SMOKE run (--smoke): T=8, gamma 2, B=1, temperature 1, one "
                 "run; not a measurement")
  for temp, title in ((1.0, "Main table: sampling at temperature 1"),
                      (0.0, "Greedy (temperature 0)")):
    sel = [r for r in rows if r["temperature"] == temp]
    if sel:
      lines += ["", f"## {title}", "", table(sel, COLUMNS), "",
                f"Component model ({title.lower()}; times in ms):", "",
                table(sel, MODEL_COLUMNS)]
  lines += ["", "![speed-up](speedup.png)", "", "![alpha](alpha.png)", "",
            *router_section]
  return "\n".join(lines) + "\n"
