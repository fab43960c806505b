r"""Measures block-diffusion members at threshold commits against cached AR
greedy: the certainty-forcing student beside its teacher (issue 36, item 5).

  python experiments/distill_measure.py --config=configs/base.py \
      --set_dir=/work/runs/distill/set \
      --models=bd3lm16_from_ar,bd3lm16_distilled \
      --out=experiments/results/distill_base

For every member of --models and every tau of --thresholds: `bd3lm` with
blocks of --block_length, remasking='threshold', greedy (temperature 0),
the exact prefix cache, on --num_prompts held-out test prompts of
--prompt_length tokens, T = --output_length. Per row: the mean tokens
made (up to and including EOS), TPF = tokens / NFE with the row decoded
alone (B = 1, the latency case; calls_b1 its mean NFE; `bd3lm` decodes
all T positions, so its calls after a row's EOS count) and the batch's (its longest row's
tokens / NFE); over the rows decoded alone, how many tokens each step
committed (self-speculation: how many draft tokens each round accepted),
a histogram per row of the record (`parallelism.per_call_histogram`); for
a threshold row, the cost model's time at B = 1 over cached AR's on this
CPU's profile, an H100 and a TPU v5e (`cost_model.block_decode_s` of the
NFEs); gen-PPL
under --evaluator, unigram entropy, rep-4; agreement with AR greedy's
tokens (the fraction of the T positions that hold the same token, and the
mean length of the common prefix); and, since a row's unigram entropy grows
with its length, both rows' entropies at equal length (each prompt's row and
AR greedy's cut to the shorter of the two: entropy_eq, ar_entropy_eq). AR greedy (`ar_early_exit`, cached,
stopping at EOS as the others) is the reference row. With
--self_speculative_gammas, each member is also decoded by
`self_speculative` (draft in diffusion mode, verify at block size 1: the
member's own AR greedy output, token for token), its TPF the tokens per
verifying call (tokens / rounds), and timed beside the others at the
first gamma. With --in_order_thresholds, each member is also decoded at
those tau committing left to right only (`rules.commit_in_order`), and
timed at --timed_tau when it is one of them. Then the AR decode and each
member at --timed_tau are timed in turns (`cost.interleaved`,
--timed_runs rounds) at B = 1 on the first prompt: ms per sequence and the
speed-up over cached AR.

Writes rows.csv, record.json, record.md (with this command, the commit and
the load) and tokens.npz (each row's tokens and lengths, by label) under
--out.
"""

import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np

from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model
from lm_decoding.evaluation import parallelism
from lm_decoding.evaluation import quality
from lm_decoding.evaluation import records
from lm_decoding.training import self_distillation
from lm_decoding.training import train as train_lib
from lm_decoding.training.pretrained import loading, recipes, store

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"), "The set's config (data path).")
_SET_DIR = flags.DEFINE_string("set_dir", str(recipes.DEFAULT_DIR),
                               "The pretrained set of every member named.")
_MODELS = flags.DEFINE_list("models", ["bd3lm16_from_ar", "bd3lm16_distilled"],
                            "Block-diffusion members to decode, each NAME "
                            "or NAME:W (its block length; default "
                            "--block_length).")
_AR = flags.DEFINE_string("ar", "ar", "The AR member (the reference).")
_EVALUATOR = flags.DEFINE_string("evaluator", "evaluator", "Scores gen-PPL.")
_THRESHOLDS = flags.DEFINE_list("thresholds", ["0.3", "0.5", "0.7", "0.9"],
                                "tau of the threshold commits.")
_IN_ORDER = flags.DEFINE_list(
    "in_order_thresholds", [], "tau of threshold commits made left to right "
    "only (bd3lm in_order=True: rules.commit_in_order), rows of their own.")
_BLOCK = flags.DEFINE_integer("block_length", 16, "W of the members.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "Held-out prompts.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 16, "P, tokens.")
_OUTPUT_LENGTH = flags.DEFINE_integer("output_length", 256, "T, tokens.")
_TIMED_TAU = flags.DEFINE_float("timed_tau", 0.5, "tau of the timed rows.")
_TIMED_RUNS = flags.DEFINE_integer("timed_runs", 5, "Timed rounds at B = 1.")
_GAMMAS = flags.DEFINE_list(
    "self_speculative_gammas", [], "Also decode each member with "
    "`self_speculative` at each gamma (its lossless AR view's greedy output).")
_OUT = flags.DEFINE_string("out", None, "Output folder.", required=True)

GREEDY = SamplingConfig(temperature=0.0)
PROFILES = ("cpu", "h100_sxm", "tpu_v5e")  # of the threshold rows' prediction


def _load(config, names):
  """(tokenizer, corpus, {name: Model}) of the members of --set_dir."""
  set_dir = _SET_DIR.value
  data_dir = os.path.join(_OUT.value, ".data_cache")
  store.seed_data_cache(config, data_dir, set_dir)
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            data_dir, config.data.format)
  tokenizer = Tokenizer.load(os.path.join(set_dir, recipes.TOKENIZER_FILE))
  members = {n: ml_collections.ConfigDict(
      recipes.read_manifest(n, set_dir)["recipe"]) for n in names}
  loaded = loading.load_models(members, data_dir, tokenizer,
                                  progress=False, out_dir=set_dir)
  missing = [n for n, m in loaded.items() if not m.shipped]
  if missing:
    raise ValueError(f"members {missing} did not load from {set_dir}")
  return tokenizer, corpus, {n: m.model for n, m in loaded.items()}


def _calls(result) -> int:
  """The forward calls a TPF divides by: NFE, or for a draft-and-verify
  decoder its verifying calls (rounds; the longest row's in a batch)."""
  if "rounds" in result.stats:
    return int(np.max(result.stats["rounds"]))
  return int(result.nfe)


def _tpf(result) -> float:
  """Tokens per forward: the tokens the longest row made (up to and
  including its EOS) over `_calls` (all of them: `bd3lm` runs on past
  the rows' ends)."""
  return float(np.max(result.lengths) / _calls(result))


def _decode(decoder, model, prompts):
  """(DecodeResult of the batch, [DecodeResult of each row decoded alone])."""
  models = {"model": model}
  lengths = jnp.full((prompts.shape[0],), prompts.shape[1], jnp.int32)
  key = jax.random.key(0)
  batch = decoder.decode(models, jnp.asarray(prompts), lengths, key)
  alone = [decoder.decode(models, jnp.asarray(prompts[i:i + 1]), lengths[:1],
                          key) for i in range(prompts.shape[0])]
  return batch, alone


def _row(label, result, alone, prompts, evaluator, reference):
  """One record row; `reference` is AR greedy's DecodeResult."""
  tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
  ref_tokens = np.asarray(reference.tokens)
  equal = np.minimum(lengths, np.asarray(reference.lengths))
  ppl = quality.gen_ppl(evaluator.logits_fn, evaluator.params, tokens,
                        lengths, prompts,
                        np.full(len(prompts), prompts.shape[1], np.int32))
  same = tokens == ref_tokens
  prefix = np.where(same.all(1), same.shape[1], np.argmin(same, 1))
  return {"label": label, "tpf_b1": float(np.mean([_tpf(r) for r in alone])),
          "calls_b1": float(np.mean([_calls(r) for r in alone])),
          "tpf_batch": _tpf(result), "tokens": float(lengths.mean()),
          "gen_ppl": float(ppl.ppl), "entropy": float(np.mean(ppl.row_entropy)),
          "rep_4": float(np.nanmean(quality.repetition_rate(tokens, lengths,
                                                            4))),
          "agreement": float(same.mean()),
          "common_prefix": float(prefix.mean()),
          "entropy_eq": float(np.nanmean(quality.unigram_entropy(tokens,
                                                                equal))),
          "ar_entropy_eq": float(np.nanmean(quality.unigram_entropy(
              ref_tokens, equal)))}


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)
  config, start = _CONFIG.value, time.time()
  load_start = os.getloadavg()[0]
  try:
    widths = self_distillation.member_widths(_MODELS.value, _BLOCK.value)
    tokenizer, corpus, models = _load(
        config, [_AR.value, _EVALUATOR.value, *widths])
    prompts, _ = pipeline.prompts(corpus, "test", _NUM_PROMPTS.value,
                                  _PROMPT_LENGTH.value, 1)
  except (ValueError, OSError) as e:
    sys.exit(f"distill_measure: error: {e}")
  del tokenizer
  t = _OUTPUT_LENGTH.value
  # The AR reference stops once every row has ended.
  ar = base.make_decoder("ar_early_exit", output_length=t, sampling=GREEDY)
  evaluator = models[_EVALUATOR.value]
  ar_result, ar_alone = _decode(ar, models[_AR.value], prompts)
  reference = ar_result
  rows = [_row("AR greedy (cached)", ar_result, ar_alone, prompts, evaluator,
               reference)]
  outputs = {"AR greedy (cached)": ar_result}
  histograms = {
      "AR greedy (cached)": parallelism.per_call_histogram(ar_alone)}

  def bd3lm(tau, name, in_order=False):
    return base.make_decoder(
        "bd3lm", output_length=t, steps=t, block_length=widths[name],
        remasking="threshold", threshold=tau, sampling=GREEDY,
        kv_cache="prefix", in_order=in_order)

  def self_speculative(gamma):
    return base.make_decoder("self_speculative", output_length=t,
                             gamma=gamma, sampling=GREEDY)

  def measure(label, decoder, name, **settings):
    """Decodes the prompts with member `name`; its row and rows' tokens."""
    result, alone = _decode(decoder, models[name], prompts)
    rows.append({**_row(label, result, alone, prompts, evaluator, reference),
                 "member": name, **settings})
    outputs[label] = result
    histograms[label] = parallelism.per_call_histogram(alone)
    print(rows[-1], flush=True)

  gammas = [int(g) for g in _GAMMAS.value]
  configs = {n: train_lib.model_config(ml_collections.ConfigDict(
      recipes.read_manifest(n, _SET_DIR.value)["recipe"]))
             for n in [_AR.value, *widths]}
  profiles = {n: cost_model.load_profile(n) for n in PROFILES}
  ar_config, p_len = configs[_AR.value], _PROMPT_LENGTH.value
  ar_s = {n: cost_model.prefill_s(ar_config, 1, p_len, t, p)
          + (rows[0]["calls_b1"] - 1)
          * cost_model.ar_step_s(ar_config, 1, p_len, t, p)
          for n, p in profiles.items()}
  for name in widths:
    for tau in map(float, _THRESHOLDS.value):
      measure(f"{name} tau={tau}", bd3lm(tau, name), name, tau=tau)
      rows[-1]["predicted_b1"] = {
          n: cost_model.block_decode_s(configs[name], 1, p_len, t,
                                       widths[name], rows[-1]["calls_b1"], p)
          / ar_s[n] for n, p in profiles.items()}
    for tau in map(float, _IN_ORDER.value):
      measure(f"{name} tau={tau} in order", bd3lm(tau, name, True), name,
              tau=tau, in_order=True)
    for gamma in gammas:
      measure(f"{name} self_speculative gamma={gamma}",
              self_speculative(gamma), name, gamma=gamma)
  one = jnp.asarray(prompts[:1])
  one_len = jnp.full((1,), prompts.shape[1], jnp.int32)
  key = jax.random.key(0)
  calls = {"AR greedy (cached)": lambda: ar.decode(
      {"model": models[_AR.value]}, one, one_len, key)}
  for name in widths:
    decoder = bd3lm(_TIMED_TAU.value, name)
    calls[f"{name} tau={_TIMED_TAU.value}"] = (
        lambda d=decoder, m=models[name]: d.decode({"model": m}, one,
                                                   one_len, key))
    if _TIMED_TAU.value in map(float, _IN_ORDER.value):
      calls[f"{name} tau={_TIMED_TAU.value} in order"] = (
          lambda d=bd3lm(_TIMED_TAU.value, name, True), m=models[name]:
          d.decode({"model": m}, one, one_len, key))
    if gammas:
      calls[f"{name} self_speculative gamma={gammas[0]}"] = (
          lambda d=self_speculative(gammas[0]), m=models[name]: d.decode(
              {"model": m}, one, one_len, key))
  times, _ = cost.interleaved(calls, _TIMED_RUNS.value, warmup=1)
  ar_ms = 1e3 * float(np.median(times["AR greedy (cached)"]))
  timed = [{"label": label, "ms_median": 1e3 * float(np.median(s)),
            "ms_min": 1e3 * float(np.min(s)),
            "speedup_vs_ar": ar_ms / (1e3 * float(np.median(s)))}
           for label, s in times.items()]
  load = cost.load_summary((load_start, os.getloadavg()[0]))
  record = {"command": records.command(), "commit": recipes.current_commit(),
            "set_dir": os.path.abspath(_SET_DIR.value),
            "manifests": {n: recipes.read_manifest(n, _SET_DIR.value)
                          for n in widths},
            "prompts": int(len(prompts)), "prompt_length": _PROMPT_LENGTH.value,
            "output_length": t, "block_lengths": widths,
            "device": jax.devices()[0].device_kind, "cpus": os.cpu_count(),
            "load": load, "wall_s": time.time() - start,
            "rows": rows, "per_call_histograms": histograms,
            "timed_b1": timed}
  os.makedirs(_OUT.value, exist_ok=True)
  records.write_csv(rows, os.path.join(_OUT.value, "rows.csv"))
  records.write_json(record, os.path.join(_OUT.value, "record.json"))
  np.savez_compressed(
      os.path.join(_OUT.value, "tokens.npz"),
      **{f"{label} {part}": np.asarray(getattr(result, part))
         for label, result in outputs.items()
         for part in ("tokens", "lengths")})
  columns = ("label", "tokens", "tpf_b1", "calls_b1", "tpf_batch", "gen_ppl",
             "entropy", "entropy_eq", "ar_entropy_eq", "rep_4", "agreement",
             "common_prefix")
  lines = [f"Command: `{record['command']}`", "",
           f"Commit {record['commit'][:10]}; set {record['set_dir']}; "
           f"{len(prompts)} held-out prompts of {_PROMPT_LENGTH.value} tokens, "
           f"T = {t}, greedy; {load}.", "",
           "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(
      r[c] if isinstance(r[c], str) else f"{r[c]:.3g}" for c in columns)
            + " |" for r in rows]
  lines += ["", "Rows decoded alone (B = 1): counts[n] of the decoding steps "
            "that committed n tokens (self-speculation: of the rounds that "
            "accepted n draft tokens), n = 0, 1, ...:", ""]
  lines += [f"- {label}: {' '.join(map(str, counts))}"
            for label, counts in histograms.items()]
  lines += ["", "Threshold rows at B = 1, the cost model's time over cached "
            "AR's (`cost_model.block_decode_s` of their mean calls over the "
            "prefill and AR greedy's mean calls - 1 cached steps):", "",
            "| row | " + " | ".join(PROFILES) + " |",
            "|---|" + "---|" * len(PROFILES)]
  lines += [f"| {r['label']} | " + " | ".join(
      f"{r['predicted_b1'][n]:.2f}x" for n in PROFILES) + " |"
            for r in rows if "predicted_b1" in r]
  lines += ["", f"B = 1, first prompt, {_TIMED_RUNS.value} interleaved rounds:",
            "", "| decoder | ms median | ms min | speed-up vs cached AR |",
            "|---|---|---|---|"]
  lines += [f"| {r['label']} | {r['ms_median']:.1f} | {r['ms_min']:.1f} | "
            f"{r['speedup_vs_ar']:.2f} |" for r in timed]
  with open(os.path.join(_OUT.value, "record.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
