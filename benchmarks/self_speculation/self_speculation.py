r"""Self-drafting against cached AR on the same weights (issue 36, item 4).

For each member (--decoder=self_speculative: a block-diffusion member with a
token shift, the base set's `bd3lm4_from_ar`, `bd3lm16_from_ar`;
--decoder=jacobi: a causal member, e.g. `ar` or a Jacobi-forced one; from
the config's shipped set or --set_dir), greedy, T = 256 new tokens (EOS
ignored, so every row makes all 256), the first B test prompts of the base
config (P = 16), B = 1 and 8:
  A  `ar` on the member's causal view (`models.binding.causal_view`: the
     same weights at block size 1), KV-cached;
  B  --decoder at each gamma of --gammas (self_speculative: those that fit
     the member's block).
Timing: jitted decodes, one warm-up each, then --runs rounds interleaving
A and every B (block_until_ready), medians and the median of per-round B/A
ratios. Also: tokens identical to A's, TPF (tokens per verifying call:
256 / rounds, mean over rows), the acceptance-length histogram
(accept_counts summed over rows), and the cost of one call of each kind at
the decode's shapes (draft call, verify call, AR step; median of 50 jitted
calls on the state after the prefill, dispatch included). With
--evaluator (a causal member of the set), A's rows get their gen-PPL and
mean unigram entropy (nats) under it, so members can be compared by the
text their greedy decode makes.

  nice -n 5 python benchmarks/self_speculation/self_speculation.py \
      --out=benchmarks/self_speculation/base
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from lm_decoding.data import pipeline
from lm_decoding.decoding import base, make_decoder, speculative
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import quality
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.models.binding import causal_view
from lm_decoding.training.pretrained import recipes, store
from lm_decoding.training import train as train_lib

_CONFIG = config_flags.DEFINE_config_file("config", "configs/base.py",
                                          "The base set's config.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/self_speculation",
                               "The data cache's folder.")
_SET_DIR = flags.DEFINE_string("set_dir", None, "Pretrained set to load "
                               "(default: the config's shipped set).")
_MEMBERS = flags.DEFINE_list("members", ["bd3lm4_from_ar", "bd3lm16_from_ar"],
                             "Members to measure.")
_DECODER = flags.DEFINE_enum("decoder", "self_speculative",
                             ["self_speculative", "jacobi"],
                             "The self-drafting decoder measured against AR.")
_EVALUATOR = flags.DEFINE_string("evaluator", None, "A causal member of the "
                                 "set scoring A's rows (gen-PPL, entropy).")
_GAMMAS = flags.DEFINE_list("gammas", ["2", "3", "4", "8", "16"],
                            "Drafted block lengths (those <= the member's "
                            "training block length, train.block_length, "
                            "are run).")
_BATCHES = flags.DEFINE_list("batches", ["1", "8"], "Batch sizes.")
_T = flags.DEFINE_integer("output_length", 256, "New tokens per row.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed interleaved rounds.")
_CALLS_ONLY = flags.DEFINE_bool(
    "calls_only", False, "Only the per-call costs (ms of one draft call, one "
    "verify call, one AR step: median and minimum of --call_repeats), no "
    "decodes; --out then gets calls.json and calls.md.")
_CALL_REPEATS = flags.DEFINE_integer("call_repeats", 50,
                                     "Timed calls per kind.")
_OUT = flags.DEFINE_string("out", None, "A folder: writes record.json and "
                           "record.md there.")

GREEDY = SamplingConfig(temperature=0.0)


def call_costs(decoder, model, prompts, lengths, minimum=False) -> dict:
  """ms of one draft call, one verify call and one AR step (1 token) at
  the decode's shapes, on the state right after the prefill: the median of
  --call_repeats jitted calls (dispatch included), the three kinds
  interleaved; with `minimum`, {kind: {"median", "min"}}."""
  models = {"target": causal_view(model), "draft": model}
  width = decoder.cache_length_for(prompts.shape[1])
  keys = base.row_keys(jax.random.key(0), prompts.shape[0])
  state = jax.jit(lambda m, p, l: speculative.start(
      decoder, width, m, p, l, keys))(models, prompts, lengths)
  draft = jax.jit(lambda m, s: decoder.propose(m, s, keys)[0])
  verify = jax.jit(lambda m, s, d: speculative.score(m, s, d)[0].logits)
  step = jax.jit(lambda m, s: base.forward(
      m, "target", s.cost, s.sequence[:, :1], s.pos[:, None],
      cache=s.cache)[0].logits)
  tokens = draft(models, state).block_until_ready()
  calls = {"draft": lambda: draft(models, state),
           "verify": lambda: verify(models, state, tokens),
           "ar_step": lambda: step(models, state)}
  times = {name: [] for name in calls}
  for fn in calls.values():
    fn().block_until_ready()
  for _ in range(_CALL_REPEATS.value):
    for name, fn in calls.items():
      start = time.perf_counter()
      fn().block_until_ready()
      times[name].append((time.perf_counter() - start) * 1e3)
  if minimum:
    return {name: {"median": float(np.median(t)), "min": float(np.min(t))}
            for name, t in times.items()}
  return {name: float(np.median(t)) for name, t in times.items()}


def call_rows(name: str, model: Model, block: int,
              prompts_all: np.ndarray) -> list[dict]:
  """--calls_only: per batch and gamma, the three calls' ms."""
  rows = []
  for batch in map(int, _BATCHES.value):
    prompts = jnp.asarray(prompts_all[:batch])
    lengths = jnp.full((batch,), prompts.shape[1], jnp.int32)
    for g in (g for g in map(int, _GAMMAS.value) if g <= block):
      decoder = make_decoder(_DECODER.value, output_length=_T.value,
                             gamma=g, sampling=GREEDY, eos_ids=())
      row = {"member": name, "batch": batch, "gamma": g,
             "call_ms": call_costs(decoder, model, prompts, lengths, True)}
      rows.append(row)
      print(json.dumps(row), flush=True)
  return rows


def calls_markdown(record: dict) -> str:
  lines = ["# Self-speculation: the cost of one call of each kind", "",
           f"Command: `{record['command']}`  ",
           f"Commit {record['commit']}, {record['hardware']}.  ",
           f"One jitted call at the decode's shapes (P = 16, the state after "
           f"the prefill), {record['call_repeats']} calls of each kind "
           "interleaved, dispatch included: median (minimum) ms.", "",
           "| member | B | gamma | draft call | verify call | AR step |",
           "|---|---|---|---|---|---|"]
  for r in record["rows"]:
    c = r["call_ms"]
    lines.append(f"| {r['member']} | {r['batch']} | {r['gamma']} | " + " | ".join(
        f"{c[k]['median']:.2f} ({c[k]['min']:.2f})"
        for k in ("draft", "verify", "ar_step")) + " |")
  return "\n".join(lines) + "\n"


def measure(name: str, model: Model, block: int,
            prompts_all: np.ndarray, evaluator: Model | None) -> list[dict]:
  gammas = [g for g in map(int, _GAMMAS.value) if g <= block]
  rows = []
  for batch in map(int, _BATCHES.value):
    prompts = jnp.asarray(prompts_all[:batch])
    lengths = jnp.full((batch,), prompts.shape[1], jnp.int32)
    ar = make_decoder("ar", output_length=_T.value, sampling=GREEDY,
                      eos_ids=())
    runs = {"ar": (ar, {"model": causal_view(model)})}
    for g in gammas:
      decoder = make_decoder(_DECODER.value, output_length=_T.value, gamma=g,
                             sampling=GREEDY, eos_ids=())
      runs[f"{_DECODER.value} gamma={g}"] = (
          decoder, {decoder.roles[0]: model})  # its one role
    fns, results, times = {}, {}, {k: [] for k in runs}
    for key, (decoder, models) in runs.items():
      fns[key] = jax.jit(lambda m, p, l, d=decoder: d.decode(m, p, l, None))
      start = time.perf_counter()
      results[key] = jax.block_until_ready(fns[key](models, prompts, lengths))
      print(f"{name} B={batch} {key}: compiled and ran in "
            f"{time.perf_counter() - start:.1f} s", flush=True)
    for _ in range(_RUNS.value):
      for key, (decoder, models) in runs.items():
        start = time.perf_counter()
        jax.block_until_ready(fns[key](models, prompts, lengths))
        times[key].append(time.perf_counter() - start)
    reference = np.asarray(results["ar"].tokens)
    ar_ms = np.asarray(times["ar"]) * 1e3
    for key, (decoder, models) in runs.items():
      out = results[key]
      ms = np.asarray(times[key]) * 1e3
      row = {"member": name, "decoder": key, "batch": batch,
             "output_length": _T.value,
             "ms_median": float(np.median(ms)),
             "ms_min": float(ms.min()),
             "ms_per_sequence_median": float(np.median(ms)) / batch,
             "ms_runs": [round(float(x), 2) for x in ms],
             "ratio_to_ar_median": float(np.median(ms / ar_ms)),
             "ratio_to_ar_of_minima": float(ms.min() / ar_ms.min()),
             "identical_to_ar": bool((np.asarray(out.tokens)
                                      == reference).all()),
             "calls": int(sum(out.calls.values()))}
      if key == "ar" and evaluator is not None:
        row.update(text_quality(evaluator, out.tokens, prompts))
      if key != "ar":
        rounds = np.asarray(out.stats["rounds"])
        row.update(
            gamma=decoder.gamma,
            tpf=float(np.mean(_T.value / rounds)),
            rounds_per_row=rounds.tolist(),
            accept_histogram=np.asarray(
                out.stats["accept_counts"]).sum(0).tolist(),
            call_ms=call_costs(decoder, model, prompts, lengths))
      rows.append(row)
      print(json.dumps(row), flush=True)
  return rows


def text_quality(evaluator: Model, tokens, prompts) -> dict:
  """gen-PPL of greedy rows int32[B, T] (all T tokens) under `evaluator`
  given their prompts int32[B, P], and their mean unigram entropy (nats)."""
  batch, length = tokens.shape
  lengths = np.full(batch, length)
  scored = quality.gen_ppl(evaluator.logits_fn, evaluator.params, tokens,
                           lengths, prompts, np.full(batch, prompts.shape[1]))
  return {"gen_ppl": float(scored.ppl),
          "entropy": float(np.mean(scored.row_entropy))}


def markdown(record: dict) -> str:
  scored = bool(record.get("evaluator"))
  lines = [f"# {record.get('decoder', 'self_speculative')} against cached AR, "
           "same weights", "",
           f"Command: `{record['command']}`  ",
           f"Commit {record['commit']}, set `{record['set_dir']}`, "
           f"{record['hardware']}.  ",
           f"Greedy, T = {record.get('output_length', 256)} (EOS ignored), "
           "the config's test prompts (P = 16); "
           f"{record['runs']} interleaved timed runs after a warm-up; "
           "ratio = median over runs of (decoder ms / AR ms in the same "
           "round); TPF = T / verifying calls (mean over rows); histogram "
           "= rounds that accepted a = 0..gamma draft tokens (summed over "
           "rows); call ms = one jitted call at B's shapes (median of 50)."
           + (f" AR's text under `{record['evaluator']}`: gen-PPL and mean "
              "unigram entropy (nats)." if scored else ""),
           "",
           "| member | decoder | B | ms / sequence (median) | ratio to AR "
           "(median of pairs) | ratio of minima | identical | TPF | "
           "acceptance histogram a=0..gamma | draft / verify / AR-step call "
           "ms |" + (" gen-PPL | entropy |" if scored else ""),
           "|---|---|---|---|---|---|---|---|---|---|" + (
               "---|---|" if scored else "")]
  for r in record["rows"]:
    calls = r.get("call_ms")
    lines.append(
        f"| {r['member']} | {r['decoder']} | {r['batch']} | "
        f"{r['ms_per_sequence_median']:.1f} | {r['ratio_to_ar_median']:.2f} "
        f"| {r['ratio_to_ar_of_minima']:.2f} | {r['identical_to_ar']} | "
        + (f"{r['tpf']:.2f} | {r['accept_histogram']} | "
           f"{calls['draft']:.2f} / {calls['verify']:.2f} / "
           f"{calls['ar_step']:.2f} |" if calls else "1.00 | - | - |")
        + ((f" {r['gen_ppl']:.2f} | {r['entropy']:.2f} |" if "gen_ppl" in r
            else " | |") if scored else ""))
  return "\n".join(lines) + "\n"


def stored_model(name: str, set_dir: pathlib.Path) -> tuple[Model, int]:
  """(the member `name` of `set_dir` as a Model, its training block length:
  train.block_length, or T for a member trained without blocks)."""
  recipe, params = store.load_stored(name, set_dir)
  model = Model(make_logits_fn(train_lib.model_config(recipe)), params)
  return model, recipe.train.get("block_length") or _T.value


def main(_):
  config = _CONFIG.value
  cmp = config.compare
  set_dir = pathlib.Path(_SET_DIR.value or recipes.set_dir(
      cmp.pretrained_set))
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            _WORKDIR.value, data_format=config.data.format)
  prompts, _ = pipeline.prompts(corpus, "test", max(map(int, _BATCHES.value)),
                                cmp.prompt_len, cmp.reference_len)
  rows, evaluator = [], None
  if _EVALUATOR.value:
    evaluator = stored_model(_EVALUATOR.value, set_dir)[0]
  for name in _MEMBERS.value:
    model, block = stored_model(name, set_dir)
    if _CALLS_ONLY.value:
      rows += call_rows(name, model, block, prompts)
    else:
      rows += measure(name, model, block, prompts, evaluator)
  record = {"command": "python " + " ".join(sys.argv),
            "commit": recipes.current_commit(),
            "set_dir": str(set_dir),
            "hardware": (f"{jax.devices()[0].platform}, {os.cpu_count()} "
                         f"cores, load average {os.getloadavg()[0]:.1f}"),
            "runs": _RUNS.value, "call_repeats": _CALL_REPEATS.value,
            "decoder": _DECODER.value, "evaluator": _EVALUATOR.value,
            "output_length": _T.value,
            "rows": rows}
  stem, show = ("calls", calls_markdown) if _CALLS_ONLY.value else (
      "record", markdown)
  if _OUT.value:
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    (out / f"{stem}.md").write_text(show(record))
  print(show(record))


if __name__ == "__main__":
  app.run(main)
