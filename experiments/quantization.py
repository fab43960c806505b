r"""int8 weights and an int8 KV cache, measured against float32.

  python experiments/quantization.py --workdir=/tmp/quantization \
      --out=experiments/results/quantization

The measurements are `lm_decoding.studies.quantization_cost`; this script
loads the models, runs them and writes the files.

Four variants of one model: f32, int8 weights (`quantization='int8_weights'`,
parameters from `quantize_params` of the float checkpoint, no retraining),
int8 KV (`kv_cache_dtype='int8'`) and both. Two models: the shipped
pretrained AR model (`lm_decoding/pretrained/ar`, loaded as
experiments/compare_decoding.py does) and a larger random one whose float32
weights exceed the 32 MiB last-level cache. Measured:

1. ms/token of greedy cached AR decoding at batch 1 and 8: variants
   interleaved run by run (A, B, C, D, A, ...), medians and per-run ratios
   to f32, compile time apart; parameter and KV-cache bytes; the bytes
   roofline (parameters + live cache over the measured bandwidth).
2. Logit KL(f32 || variant), NLL and top-1 agreement, teacher-forced on
   validation text (the int8 cache is written by the same forward pass, one
   scale per slot, so this is what token-by-token decoding computes).
3. gen-PPL under the shipped evaluator of continuations sampled at
   temperature 1 with the same keys (shipped model only), and the f32
   model's gen-PPL under a second seed as the noise floor.
4. Drift along long generations (shipped model only): the f32 model's
   greedy continuation up to max_len; along that same sequence, the KL of
   each variant's next-token distribution against f32 per bucket of
   positions, the share of positions whose argmax differs, and where each
   variant's own greedy continuation first leaves the f32 one.
5. The two matmul forms of weight-only int8, (x @ q) * s and x @ (q * s),
   against float32 on a stack of kernels larger than the cache.

Writes results.json, timing.csv, quality.csv, drift.csv, report.md and
drift.png under --out (default --workdir). `--smoke` runs every step on tiny
random models and random text, without the large model
(tests/test_quantization_experiment.py;
about 1.5 min of CPU, most of it compiling ~20 small programs).
"""

import os
import platform
import time

from absl import app
from absl import flags
from absl import logging
import jax
import matplotlib
import numpy as np
from ml_collections import config_flags

from lm_decoding.data import pipeline
from lm_decoding.decoding import bind
from lm_decoding.evaluation import cost, records
from lm_decoding.studies import quantization_cost as qc
from lm_decoding.models import TransformerConfig, init_params
from lm_decoding.models import make_logits_fn
from lm_decoding.training.pretrained import loading, member_recipes

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"),
    "Experiment configuration file (the shipped models' recipe).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_quantization",
                               "The run's folder: outputs, the corpus cache "
                               "and any model trained here.")
_OUT = flags.DEFINE_string("out", "", "The record's folder (e.g. experiments"
                           "/results/quantization); '' = --workdir.")
_SMOKE = flags.DEFINE_bool("smoke", False,
                           "Tiny random models and text: seconds.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed runs per variant and batch.")
_NEW_TOKENS = flags.DEFINE_integer("output_length", 128,
                                   "T, tokens per timed decode.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_LARGE = flags.DEFINE_list(
    "large", ["512", "8", "4096"],
    "d_model, num_layers, vocab_size of the large random model (8 heads of "
    "d_model / 8, MLP 4 d_model).")
_KL_ROWS = flags.DEFINE_integer("kl_rows", 16, "Validation sequences.")
_KL_LEN = flags.DEFINE_integer("kl_len", 256, "Tokens per validation row.")
_SAMPLES = flags.DEFINE_integer("samples", 32, "Sampled rows for gen-PPL.")
_SAMPLE_LEN = flags.DEFINE_integer("sample_len", 128,
                                   "Tokens per sampled row.")
_DRIFT_ROWS = flags.DEFINE_integer("drift_rows", 8, "Rows of the drift run.")
_BUCKET = flags.DEFINE_integer("bucket", 32, "Positions per drift bucket.")

def _shipped(config, workdir):
  """(ar (config, params), evaluator Model, validation and test streams)."""
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            workdir, data_format=config.data.format)
  members = member_recipes.member_configs(config)
  loaded = loading.load_models(
      {n: members[n] for n in ("ar", "evaluator")}, workdir, corpus.tokenizer)
  for name, member in loaded.items():
    if not member.shipped:
      raise ValueError(f"{name} is not the shipped model ({member.source})")
  ar = loaded["ar"].model
  return ((ar.logits_fn.config, ar.params), loaded["evaluator"].model, corpus,
          [member.describe(name) for name, member in loaded.items()])


def _smoke_models():
  small = TransformerConfig(vocab_size=64, d_model=32, num_layers=1,
                            num_heads=2, num_kv_heads=2, head_dim=16,
                            mlp_dim=64, max_len=40)
  evaluator = bind(make_logits_fn(small), init_params(small, jax.random.key(9)))
  return small, evaluator["model"]


def _large_config(d_model, num_layers, vocab, max_len):
  return TransformerConfig(vocab_size=vocab, d_model=d_model,
                           num_layers=num_layers, num_heads=8, num_kv_heads=8,
                           head_dim=d_model // 8, mlp_dim=4 * d_model,
                           max_len=max_len)


def _write_csv(path, rows):
  records.write_csv([{k: v for k, v in r.items() if k != "runs_s"}
                     for r in rows], path)


def _table(rows, keys, formats) -> list[str]:
  lines = ["| " + " | ".join(keys) + " |",
           "|" + "---|" * len(keys)]
  for row in rows:
    lines.append("| " + " | ".join(
        format(row[k], formats.get(k, "")) for k in keys) + " |")
  return lines


def _plot(drift_result, path):
  fig, ax = plt.subplots(figsize=(6, 3.6))
  centers = np.array(drift_result["bucket_starts"]) + drift_result["bucket"] / 2
  for name, v in drift_result["variants"].items():
    ax.plot(centers, v["kl_per_bucket"], marker="o", label=name)
  ax.set_yscale("log")
  ax.set_xlabel("generated token position (bucket centre)")
  ax.set_ylabel("KL(f32 || int8) per token, nats")
  ax.set_title("Drift along the f32 greedy continuation")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.time()
  load_start = os.getloadavg()
  smoke = _SMOKE.value
  runs = 1 if smoke else _RUNS.value
  new_tokens = 4 if smoke else _NEW_TOKENS.value
  prompt_len = 4 if smoke else _PROMPT_LEN.value
  batch_sizes = [int(b) for b in _BATCH_SIZES.value]
  rng = np.random.default_rng(0)
  if smoke:
    small, evaluator = _smoke_models()
    shipped = (small, init_params(small, jax.random.key(0)))
    valid = rng.integers(3, small.vocab_size, (2, 12)).astype(np.int32)
    prompts = rng.integers(3, small.vocab_size, (2, prompt_len)).astype(
        np.int32)
    sample_len, bucket, batch_sizes = 6, 8, [1]
    lines = ["smoke: random tiny models, no large model"]
  else:
    config = _CONFIG.value
    shipped, evaluator, corpus, lines = _shipped(config, _WORKDIR.value)
    valid = pipeline.pack(corpus.tokens["valid"],
                          _KL_LEN.value)[:_KL_ROWS.value]
    prompts, _ = pipeline.prompts(corpus, "test", _SAMPLES.value, prompt_len,
                                  1)
    sample_len, bucket = _SAMPLE_LEN.value, _BUCKET.value
    d_model, num_layers, vocab = (int(x) for x in _LARGE.value)
    large = _large_config(d_model, num_layers, vocab,
                          max(_KL_LEN.value, prompt_len + new_tokens))
  bandwidth = cost.measure_bandwidth(1 << 16 if smoke else 1 << 28)
  models = {"shipped": qc.variants(*shipped)}
  if not smoke:  # the same code as "shipped" on another shape
    models["large"] = qc.variants(large, jax.jit(
        init_params, static_argnums=0)(large, jax.random.key(1)))
  result = {"device": jax.devices()[0].device_kind,
            "bandwidth_GBps": bandwidth / 1e9, "models": lines,
            "configs": {k: str(m["f32"][0]) for k, m in models.items()},
            "timing": [], "teacher_forced": []}
  for key, model in models.items():
    print(f"timing {key}", flush=True)
    for row in qc.timing(model, prompt_len, new_tokens, batch_sizes, runs,
                      bandwidth):
      result["timing"].append({"model": key, **row})
    print(f"teacher-forced {key}", flush=True)
    text = valid if key == "shipped" else rng.integers(
        3, model["f32"][0].vocab_size, (min(4, valid.shape[0]),
                                        valid.shape[1])).astype(np.int32)
    for row in qc.teacher_forced(model, text):
      result["teacher_forced"].append({"model": key, **row})
  print("gen-PPL", flush=True)
  result["gen_ppl"] = qc.gen_ppl(models["shipped"], evaluator, prompts,
                              sample_len, seed=0)
  print("drift", flush=True)
  result["drift"] = qc.drift(models["shipped"],
                          prompts[:2 if smoke else _DRIFT_ROWS.value], bucket)
  print("matmul forms", flush=True)
  result["matmul_forms"] = qc.matmul_forms(
      *((32, 64, 2) if smoke else (512, 2048, 16)), batch_sizes,
      1 if smoke else 21)
  result["wall_s"] = time.time() - start
  result["load_average"] = {"start": load_start, "end": os.getloadavg()}
  write(result, _OUT.value or _WORKDIR.value, records.command())


def write(result: dict, out_dir: str, command: str) -> None:
  """results.json, the CSVs, drift.png and report.md."""
  os.makedirs(out_dir, exist_ok=True)
  records.write_json(result, os.path.join(out_dir, "results.json"), command)
  _write_csv(os.path.join(out_dir, "timing.csv"), result["timing"])
  _write_csv(os.path.join(out_dir, "quality.csv"), result["teacher_forced"])
  drift_result = result["drift"]
  drift_rows = [{"variant": name, "bucket_start": start,
                 "kl_nats": v["kl_per_bucket"][i],
                 "argmax_flips": v["argmax_flips_per_bucket"][i]}
                for name, v in drift_result["variants"].items()
                for i, start in enumerate(drift_result["bucket_starts"])]
  _write_csv(os.path.join(out_dir, "drift.csv"), drift_rows)
  _plot(drift_result, os.path.join(out_dir, "drift.png"))
  mib = lambda b: b / 2 ** 20
  timing_rows = [dict(r, param_MiB=mib(r["param_bytes"]),
                      cache_MiB=mib(r["cache_bytes"]))
                 for r in result["timing"]]
  load = result["load_average"]
  lines = [
      "# int8 weights and int8 KV cache",
      "",
      "```", command, "```", "",
      f"- device: {result['device']} ({platform.machine()}, "
      f"{os.cpu_count()} cores), measured bandwidth "
      f"{result['bandwidth_GBps']:.1f} GB/s; "
      f"{cost.load_summary([load['start'][0], load['end'][0]])}; compare "
      "the interleaved per-run ratios",
      *[f"- {line}" for line in result["models"]],
      *[f"- {key}: {config}" for key, config in result["configs"].items()],
      f"- wall time {result['wall_s'] / 60:.1f} min",
      "",
      "## Speed and memory (greedy cached AR decoding)",
      "",
      "ms/token: median over the interleaved runs of one decode (prefill "
      "included) / new tokens; ratio: median of per-run time / f32 time; "
      "roofline: (parameter bytes + live KV cache bytes) / bandwidth per "
      "step. Cache bytes: the whole cache (prompt + new tokens) of the batch.",
      "",
      *_table(timing_rows,
              ["model", "variant", "batch_size", "ms_per_token",
               "ratio_to_f32", "x_roofline", "param_MiB", "cache_MiB",
               "compile_s"],
              {"ms_per_token": ".2f", "ratio_to_f32": ".2f",
               "x_roofline": ".2f", "param_MiB": ".2f", "cache_MiB": ".3f",
               "compile_s": ".1f"}),
      "",
      "## Logits against f32 (teacher-forced)",
      "",
      "Shipped model: validation text; large random model: random tokens "
      "(its KL measures the arithmetic, not a language model).",
      "",
      *_table(result["teacher_forced"],
              ["model", "variant", "positions", "kl_to_f32_nats",
               "kl_to_f32_max_nats", "nll_nats", "ppl", "top1_agreement"],
              {"kl_to_f32_nats": ".2e", "kl_to_f32_max_nats": ".2e",
               "nll_nats": ".4f", "ppl": ".2f", "top1_agreement": ".4f"}),
      "",
      "## gen-PPL under the evaluator (shipped model, temperature 1)",
      "",
      "Every variant samples with the same keys (seed 0); f32 with seed 1 is "
      "the noise floor of the measure.",
      "",
      *_table(result["gen_ppl"],
              ["variant", "seed", "gen_ppl", "tokens", "unigram_entropy"],
              {"gen_ppl": ".2f", "unigram_entropy": ".3f"}),
      "",
      "## Drift along long generations (shipped model)",
      "",
      f"{drift_result['rows']} prompts of {drift_result['prompt_len']} "
      f"tokens, the f32 greedy continuation of {drift_result['new_tokens']} "
      "tokens (to max_len); along it, each variant's KL(f32 || variant) per "
      f"bucket of {drift_result['bucket']} positions (drift.png, drift.csv), "
      "the share of positions whose argmax differs from f32's, and the first "
      "position where the variant's own greedy continuation differs from "
      "f32's (per row; the length if never).",
      "",
      "| variant | mean KL | KL first bucket | KL last bucket | argmax "
      "flips | first divergence per row |",
      "|---|---|---|---|---|---|",
      *[f"| {name} | {v['kl_mean']:.2e} | {v['kl_per_bucket'][0]:.2e} | "
        f"{v['kl_per_bucket'][-1]:.2e} | "
        f"{np.mean(v['argmax_flips_per_bucket']):.4f} | "
        f"{v['first_divergence']} |"
        for name, v in drift_result["variants"].items()],
      "",
      "![drift](drift.png)",
      "",
      "## Weight-only int8 matmul forms",
      "",
      "A scan over stacked kernels (the weights exceed the last-level cache), "
      "medians of interleaved runs; ratio: median per-run time / f32.",
      "",
      *_table(result["matmul_forms"], ["form", "batch_size", "ms",
                                       "ratio_to_f32"],
              {"ms": ".2f", "ratio_to_f32": ".2f"}),
      ""]
  with open(os.path.join(out_dir, "report.md"), "w") as f:
    f.write("\n".join(lines))
  print(f"wrote {out_dir}")


if __name__ == "__main__":
  app.run(main)
