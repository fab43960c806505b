r"""Speculative decoding measured against its prediction, and the router.

  python experiments/speculative.py --config=configs/tiny.py \
      --workdir=/tmp/speculative --out=experiments/results/speculative

The measurement is `lm_decoding.studies.speculative_cost` (part 1) and
`lm_decoding.studies.router_workload` (part 2); the tables and figures
`lm_decoding.studies.speculative_report`. This script reads the flags,
loads the models and writes the files.

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
router.csv (and the router's table in speculative.md) under --out (default
--workdir, the run's folder, which also holds the corpus cache and any member
trained here); --norouter skips part 2 and shows that router.csv as it is.
"""

from __future__ import annotations

import csv
import os
import platform
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from lm_decoding.data import pipeline
from lm_decoding.evaluation import cost, records
from lm_decoding.studies import router_workload
from lm_decoding.studies import speculative_cost
from lm_decoding.studies import speculative_report as spec_report
from lm_decoding.training.pretrained import loading, member_recipes, recipes

_LOAD_AT_START = os.getloadavg()[0]  # 1-minute load average at import
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"), "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "/tmp/lm_decoding_speculative", "The run's folder: outputs, "
    "the corpus cache ({workdir}/data/) and models trained here.")
_OUT = flags.DEFINE_string("out", "", "The record's folder (e.g. "
                           "experiments/results/speculative); '' = --workdir.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Smoke run: T=8, gamma 2, B=1, "
                           "temperature 1, 1 run, target 'ar' only (with "
                           "the self-drafting and diffusion rows unless "
                           "--noextras); not a measurement.")
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
                            "without it the markdown shows the output "
                            "router.csv from an earlier run, marked so.")
_LOOP_STEPS = flags.DEFINE_integer("loop_steps", 16, "Calls of each round "
                                   "part per timed component run.")
_SHORT_T = flags.DEFINE_integer("short_length", 32, "Router: short T.")
_REQUESTS = flags.DEFINE_integer("requests", 16, "Router: requests per "
                                 "budget (half short, half long).")


def fail(message: str):
  sys.exit(f"speculative: error: {message}")


def settings() -> dict:
  """The run's sizes from the flags (--smoke shrinks them)."""
  smoke = _SMOKE.value
  t = 8 if smoke else _T.value
  run = dict(
      t=t, smoke=smoke,
      gammas=(2,) if smoke else tuple(int(g) for g in _GAMMAS.value),
      batches=(1,) if smoke else tuple(int(b) for b in _BATCHES.value),
      temps=(1.0,) if smoke else tuple(float(x) for x in _TEMPS.value),
      runs=1 if smoke else _RUNS.value,
      loop_steps=2 if smoke else _LOOP_STEPS.value,
      requests=4 if smoke else _REQUESTS.value,
      lengths_T=(4, 8) if smoke else (_SHORT_T.value, t),
      targets=("ar",) if smoke else tuple(_TARGETS.value))
  if (run["runs"] < 1 or min(run["gammas"]) < 1 or min(run["batches"]) < 1
      or run["requests"] < 2 or run["loop_steps"] < 1):
    fail("--runs, --gammas, --batch_sizes, --loop_steps must be >= 1 and "
         "--requests >= 2")
  if not run["targets"] or not set(run["targets"]) <= {"ar", "evaluator"}:
    fail(f"--targets={','.join(run['targets'])} must be 'ar' and/or "
         "'evaluator'")
  return run


def shipped_drafts(config, set_dir) -> list[str]:
  """config.drafts shipped in set_dir, or --drafts (checked against them)."""
  drafts = [d for d in config.get("drafts", {})
            if (set_dir / d / recipes.MANIFEST_FILE).exists()]
  if _DRAFTS.value is None:
    return drafts
  if not set(_DRAFTS.value) <= set(drafts):
    fail(f"--drafts={','.join(_DRAFTS.value)} must be among the drafts "
         f"shipped in {set_dir}: {drafts}")
  return list(_DRAFTS.value)


def setting_lines(loaded: dict) -> list[str]:
  """The hardware and model bullets of speculative.md."""
  load = (_LOAD_AT_START, os.getloadavg()[0])
  lines = [f"- device: {jax.devices()[0].device_kind} x{jax.device_count()} "
           f"({platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} cores; {cost.load_summary(load)})",
           "- models (all decoded in float32):",
           *[f"  - {loaded[n].describe(n)}" for n in loaded]]
  for name, member in loaded.items():
    size = cost.tree_bytes(member.model.params)
    lines.append(f"  - {name}: {size // 4:,} parameters, {size / 2**20:.2f} "
                 f"MiB f32 ({'fits' if size < 32 * 2**20 else 'exceeds'} "
                 "the 32 MiB L3)")
  lines.append(
      "- every model fits in the 32 MiB L3 cache, so a one-token cached "
      "step is not bound by memory bandwidth but by CPU per-call overhead "
      "(dispatching the layers' small ops): a draft step costs nearly as "
      "much as a target step, c is large (see column c), and speculative "
      "decoding is expected to be SLOWER than AR here. That is the finding, "
      "not a failure: the speed-up needs c << 1 (a bandwidth-bound target, "
      "e.g. a large model on a GPU) and a draft that agrees with the target.")
  return lines


def earlier_router(out: str) -> list[str]:
  """The router section before part 2 runs: the output router.csv as an
  earlier run left it (--norouter), or a note."""
  path = os.path.join(out, "router.csv")
  title = spec_report.ROUTER_TITLE
  if _ROUTER.value:
    return [title, "", "Not run yet."]
  if not os.path.exists(path):
    return [title, "", f"Not run (--norouter; {out} holds no earlier "
            "router.csv)."]
  with open(path, newline="") as f:
    rows = [{k: records.number(v) for k, v in r.items()}
            for r in csv.DictReader(f)]
  return [title, "", "Not re-run (--norouter): router.csv as an earlier run "
          "of this script left it (its setting is in that run's "
          "speculative.md, in the git history).", "",
          spec_report.table(rows, spec_report.ROUTER_COLUMNS)]


def write(out: str, rows: list[dict], router_section: list[str],
          setting: list[str], run: dict) -> None:
  records.write_csv(rows, os.path.join(out, "speculative.csv"))
  spec_report.plot_speedup(rows, os.path.join(out, "speedup.png"))
  spec_report.plot_alpha(rows, os.path.join(out, "alpha.png"))
  with open(os.path.join(out, "speculative.md"), "w") as f:
    f.write(spec_report.markdown(rows, router_section, setting, run))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.time()
  config, out, run = (_CONFIG.value, _OUT.value or _WORKDIR.value,
                     settings())
  cmp, batches, temps = config.compare, run["batches"], run["temps"]
  try:
    set_dir = recipes.set_dir(cmp.pretrained_set)
  except ValueError as e:
    fail(str(e))
  drafts = shipped_drafts(config, set_dir)
  if _ROUTER.value and ("ar" not in run["targets"] or not drafts
                        or 1 not in batches or 1.0 not in temps):
    fail("the router (part 2) uses the fastest speculative configuration of "
         "target 'ar' at B=1 and temperature 1: --targets must hold ar, "
         "--drafts a draft, --batch_sizes 1 and --temperatures 1.0; or pass "
         "--norouter")
  os.makedirs(out, exist_ok=True)
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            _WORKDIR.value, data_format=config.data.format)
  # The MDLM model drafts an extra row or is the router's parallel decoder,
  # the evaluator is a target or scores the router's samples; otherwise
  # neither is loaded (nor trained, where the set lacks it).
  needed = ["ar", *drafts]
  if (_EXTRAS.value and "ar" in run["targets"]) or _ROUTER.value:
    needed.append("mdlm")
  if "evaluator" in run["targets"] or _ROUTER.value:
    needed.append("evaluator")
  members = member_recipes.member_configs(config)
  loaded = loading.load_models({n: members[n] for n in needed},
                                  _WORKDIR.value, corpus.tokenizer,
                                  progress=False, out_dir=set_dir)
  models = {n: m.model for n, m in loaded.items()}
  prompts, _ = pipeline.prompts(corpus, "test",
                                max(max(batches), run["requests"]),
                                cmp.prompt_len, cmp.reference_len)
  run.update(command=records.command(), prompt_len=cmp.prompt_len)
  setting, router_section = setting_lines(loaded), earlier_router(out)
  groups = [(target, target_drafts, extras, batch, temp)
            for target, target_drafts, extras in (("ar", drafts, True),
                                                  ("evaluator", ["ar"], False))
            if target in run["targets"]
            for batch in batches for temp in temps]
  rows = []
  for done, (target, target_drafts, extras, batch, temp) in enumerate(groups):
    print(f"target {target} B={batch} temperature {temp:g} "
          f"({time.time() - start:.0f} s)", flush=True)
    rows += speculative_cost.measure_group(
        target, target_drafts, run["gammas"],
        extras and _EXTRAS.value and batch == batches[0], models,
        prompts[:batch], run["t"], temp, run["runs"], config.seed,
        run["loop_steps"])
    # Written after every group, so that a run stopped early leaves the
    # groups it finished (the markdown says how many).
    run.update(part1_s=time.time() - start, total_s=time.time() - start,
               groups=f"{done + 1} of {len(groups)}")
    write(out, rows, router_section, setting, run)
  if _ROUTER.value:
    best = max((r for r in rows if r["decoder"] == "spec"
                and r["target"] == "ar" and r["batch_size"] == 1
                and r["temperature"] == 1.0),
               key=lambda r: r["measured_speedup"])
    spec_line = (f"spec g={{gamma}} | speculative | target=ar "
                 f"draft={best['draft']} | gamma={best['gamma']}")
    curves, systems = router_workload.router_curves(
        models, prompts, run["lengths_T"], max(batches), spec_line,
        run["runs"], config.seed)
    budgets_ms = router_workload.budgets(curves[0])
    route_rows, router_config = router_workload.run_workload(
        curves, systems, models, prompts, run["lengths_T"], run["requests"],
        budgets_ms)
    records.write_csv(route_rows, os.path.join(out, "router.csv"))
    router_section = spec_report.router_lines(
        route_rows, curves, budgets_ms, router_config, best,
        run["lengths_T"], run["requests"])
    run["total_s"] = time.time() - start
    write(out, rows, router_section, setting, run)
  print(f"wrote {out} in {time.time() - start:.0f} s")


if __name__ == "__main__":
  app.run(main)
