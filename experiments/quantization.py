r"""int8 weights and an int8 KV cache, measured against float32.

  python experiments/quantization.py --workdir=/tmp/quantization \
      --out_dir=experiments/results/quantization

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
drift.png under --out_dir. `--smoke` runs every step on tiny random models
and random text, without the large model (tests/test_quantization_experiment.py;
about 1.5 min of CPU, most of it compiling ~20 small programs).
"""

import csv
import json
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

from lm_decoding.data import pipeline
from lm_decoding.decoding import bind, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost, quality
from lm_decoding.models import KVCache, TransformerConfig, init_params
from lm_decoding.models import make_logits_fn
from lm_decoding.models.quantization import quantize_params
from lm_decoding.training import pretrained
from lm_decoding.training import train

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"),
    "Experiment configuration file (the shipped models' recipe).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_quantization",
                               "Corpus cache (and training, if no shipped "
                               "model matches).")
_OUT_DIR = flags.DEFINE_string(
    "out_dir", os.path.join(os.path.dirname(__file__), "results",
                            "quantization"), "Where results are written.")
_SMOKE = flags.DEFINE_bool("smoke", False,
                           "Tiny random models and text: seconds.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed runs per variant and batch.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128,
                                   "Tokens per timed decode.")
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

# name -> (quantization, kv_cache_dtype)
VARIANTS = {"f32": ("none", "compute"),
            "int8 weights": ("int8_weights", "compute"),
            "int8 KV": ("none", "int8"),
            "both": ("int8_weights", "int8")}


def variants(config: TransformerConfig, params) -> dict:
  """{name: (config, params)}: int8 weights quantised once from `params`."""
  int8_params = quantize_params(params, config)
  return {name: (config.replace(quantization=q, kv_cache_dtype=kv),
                 int8_params if q == "int8_weights" else params)
          for name, (q, kv) in VARIANTS.items()}


def _greedy(new_tokens: int) -> object:
  return make_decoder("ar", output_length=new_tokens, eos_ids=(),
                      sampling=SamplingConfig(temperature=0.0))


def timing(models: dict, prompt_len: int, new_tokens: int,
           batch_sizes: list[int], runs: int, bandwidth: float) -> list[dict]:
  """ms/token of greedy cached decoding, variants interleaved per run."""
  rows = []
  decoder = _greedy(new_tokens)
  for batch in batch_sizes:
    prompts = jnp.ones((batch, prompt_len), jnp.int32) * 7
    lengths = jnp.full((batch,), prompt_len, jnp.int32)
    compiled, compile_s = {}, {}
    for name, (config, params) in models.items():
      logits_fn = make_logits_fn(config)
      fn = jax.jit(lambda p, x, n, lf=logits_fn: decoder.decode(
          bind(lf, p), x, n, None).tokens)
      start = time.perf_counter()
      compiled[name] = fn.lower(params, prompts, lengths).compile()
      compile_s[name] = time.perf_counter() - start
      jax.block_until_ready(compiled[name](params, prompts, lengths))
    runs_s = {name: [] for name in models}
    for _ in range(runs):
      for name, (config, params) in models.items():
        start = time.perf_counter()
        jax.block_until_ready(compiled[name](params, prompts, lengths))
        runs_s[name].append(time.perf_counter() - start)
    for name, (config, params) in models.items():
      cache = KVCache.init(config, batch, prompt_len + new_tokens)
      p_bytes = cost.tree_bytes(params)
      bound = cost.ar_decode_roofline_s(
          p_bytes, cache.bytes_per_slot() * batch, prompt_len, new_tokens,
          bandwidth)
      median = float(np.median(runs_s[name]))
      ratios = np.array(runs_s[name]) / np.array(runs_s["f32"])
      rows.append({
          "variant": name, "batch_size": batch, "new_tokens": new_tokens,
          "ms_per_token": median / new_tokens * 1e3,
          "ratio_to_f32": float(np.median(ratios)),
          "param_bytes": p_bytes,
          "cache_bytes": cost.tree_bytes(cache),
          "roofline_ms_per_token": bound / new_tokens * 1e3,
          "x_roofline": median / bound,
          "compile_s": compile_s[name],
          "runs_s": [round(s, 5) for s in runs_s[name]]})
  return rows


def _log_probs(config, params, tokens_BxL, chunk: int = 4) -> np.ndarray:
  """float32[B, L, V] log-probabilities of one cached teacher-forced pass."""
  logits_fn = jax.jit(make_logits_fn(config))
  b, length = tokens_BxL.shape
  out = []
  for start in range(0, b, chunk):
    rows = jnp.asarray(tokens_BxL[start:start + chunk])
    positions = jnp.broadcast_to(jnp.arange(length), rows.shape)
    cache = KVCache.init(config, rows.shape[0], length)
    logits = logits_fn(params, rows, positions, cache).logits
    out.append(np.asarray(jax.nn.log_softmax(logits, -1)))
  return np.concatenate(out)


def _kl(reference_BxLxV: np.ndarray, other_BxLxV: np.ndarray) -> np.ndarray:
  """KL(reference || other) in nats per position, float64[B, L]."""
  p = np.exp(reference_BxLxV.astype(np.float64))
  return (p * (reference_BxLxV - other_BxLxV)).sum(-1)


def teacher_forced(models: dict, tokens_BxL: np.ndarray) -> list[dict]:
  """KL to f32, NLL and top-1 agreement on text, per variant."""
  log_probs = {name: _log_probs(c, p, tokens_BxL)
               for name, (c, p) in models.items()}
  reference = log_probs["f32"][:, :-1]
  targets = tokens_BxL[:, 1:]
  rows = []
  for name, lp in log_probs.items():
    lp = lp[:, :-1]
    nll = -np.take_along_axis(lp, targets[..., None], -1)[..., 0]
    rows.append({
        "variant": name, "positions": int(nll.size),
        "kl_to_f32_nats": float(_kl(reference, lp).mean()),
        "kl_to_f32_max_nats": float(_kl(reference, lp).max()),
        "nll_nats": float(nll.mean()), "ppl": float(np.exp(nll.mean())),
        "top1_agreement": float((lp.argmax(-1)
                                 == reference.argmax(-1)).mean())})
  return rows


def gen_ppl(models: dict, evaluator, prompts_BxP: np.ndarray,
            new_tokens: int, seed: int) -> list[dict]:
  """gen-PPL of temperature-1 samples (same keys for every variant)."""
  decoder = make_decoder("ar", output_length=new_tokens, eos_ids=(),
                         sampling=SamplingConfig(temperature=1.0))
  lengths = jnp.full((prompts_BxP.shape[0],), prompts_BxP.shape[1], jnp.int32)
  runs = [(name, seed) for name in models] + [("f32", seed + 1)]
  rows = []
  for name, key in runs:
    config, params = models[name]
    fn = jax.jit(lambda p, x, n, k, lf=make_logits_fn(config): decoder.decode(
        bind(lf, p), x, n, k).tokens)
    tokens = np.asarray(fn(params, jnp.asarray(prompts_BxP), lengths,
                           jax.random.key(key)))
    score = quality.gen_ppl(
        evaluator.logits_fn, evaluator.params, tokens,
        np.full((tokens.shape[0],), new_tokens), prompts_BxP,
        np.asarray(lengths))
    rows.append({"variant": name, "seed": key, "gen_ppl": score.ppl,
                 "tokens": score.num_tokens,
                 "unigram_entropy": float(np.mean(score.row_entropy))})
  return rows


def drift(models: dict, prompts_BxP: np.ndarray, bucket: int) -> dict:
  """KL per position bucket along the f32 greedy continuation to max_len."""
  config, params = models["f32"]
  prompt_len = prompts_BxP.shape[1]
  new_tokens = config.max_len - prompt_len
  lengths = jnp.full((prompts_BxP.shape[0],), prompt_len, jnp.int32)
  decoder = _greedy(new_tokens)
  greedy = {}
  for name, (c, p) in models.items():
    fn = jax.jit(lambda p, x, n, lf=make_logits_fn(c): decoder.decode(
        bind(lf, p), x, n, None).tokens)
    greedy[name] = np.asarray(fn(p, jnp.asarray(prompts_BxP), lengths))
  sequence = np.concatenate([prompts_BxP, greedy["f32"]], 1)
  log_probs = {name: _log_probs(c, p, sequence)
               for name, (c, p) in models.items()}
  # Position i predicts token i + 1: the generated tokens are predicted at
  # prompt_len - 1 .. max_len - 2.
  span = slice(prompt_len - 1, config.max_len - 1)
  reference = log_probs["f32"][:, span]
  edges = list(range(0, new_tokens, bucket))
  out = {"prompt_len": prompt_len, "new_tokens": new_tokens,
         "bucket": bucket, "rows": int(sequence.shape[0]), "variants": {}}
  for name, lp in log_probs.items():
    if name == "f32":
      continue
    kl_BxT = _kl(reference, lp[:, span])
    flips_BxT = lp[:, span].argmax(-1) != reference.argmax(-1)
    same = greedy[name] == greedy["f32"]
    first = np.where(same.all(1), new_tokens, (~same).argmax(1))
    out["variants"][name] = {
        "kl_per_bucket": [float(kl_BxT[:, e:e + bucket].mean())
                          for e in edges],
        "argmax_flips_per_bucket": [float(flips_BxT[:, e:e + bucket].mean())
                                    for e in edges],
        "first_divergence": first.tolist(),
        "kl_mean": float(kl_BxT.mean())}
  out["bucket_starts"] = edges
  return out


def matmul_forms(d_in: int, d_out: int, layers: int, batch_sizes: list[int],
                 runs: int) -> list[dict]:
  """ms of `layers` stacked [d_in, d_out] matmuls in three forms."""
  w = jax.random.normal(jax.random.key(0), (layers, d_in, d_out))
  scale = jnp.abs(w).max(1) / 127
  q = jnp.round(w / scale[:, None]).astype(jnp.int8)
  forms = {
      "f32 x @ w": (lambda x, w: x @ w, (w,)),
      "int8 (x @ q) * s": (lambda x, q, s: (x @ q.astype(x.dtype)) * s,
                           (q, scale)),
      "int8 x @ (q * s)": (lambda x, q, s: x @ (q.astype(x.dtype) * s),
                           (q, scale))}

  def stacked(body):
    def run(x, *weights):
      def step(x, w):
        return x + body(x, *w)[:, :d_in] * 1e-3, None
      return jax.lax.scan(step, x, weights)[0]
    return jax.jit(run)

  rows = []
  for batch in batch_sizes:
    x = jnp.ones((batch, d_in))
    fns = {name: stacked(body) for name, (body, _) in forms.items()}
    for name, (_, weights) in forms.items():
      jax.block_until_ready(fns[name](x, *weights))
    runs_s = {name: [] for name in forms}
    for _ in range(runs):
      for name, (_, weights) in forms.items():
        start = time.perf_counter()
        jax.block_until_ready(fns[name](x, *weights))
        runs_s[name].append(time.perf_counter() - start)
    for name in forms:
      rows.append({"form": name, "batch_size": batch,
                   "ms": float(np.median(runs_s[name])) * 1e3,
                   "ratio_to_f32": float(np.median(
                       np.array(runs_s[name]) / np.array(runs_s["f32 x @ w"])))})
  return rows


def _shipped(config, workdir):
  """(ar (config, params), evaluator Model, validation and test streams)."""
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            workdir, data_format=config.data.format)
  members = pretrained.member_configs(config)
  loaded = pretrained.load_models(
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
  keys = [k for k in rows[0] if k != "runs_s"]
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, keys, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


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
  models = {"shipped": variants(*shipped)}
  if not smoke:  # the same code as "shipped" on another shape
    models["large"] = variants(large, jax.jit(
        init_params, static_argnums=0)(large, jax.random.key(1)))
  result = {"device": jax.devices()[0].device_kind,
            "bandwidth_GBps": bandwidth / 1e9, "models": lines,
            "configs": {k: str(m["f32"][0]) for k, m in models.items()},
            "timing": [], "teacher_forced": []}
  for key, model in models.items():
    print(f"timing {key}", flush=True)
    for row in timing(model, prompt_len, new_tokens, batch_sizes, runs,
                      bandwidth):
      result["timing"].append({"model": key, **row})
    print(f"teacher-forced {key}", flush=True)
    text = valid if key == "shipped" else rng.integers(
        3, model["f32"][0].vocab_size, (min(4, valid.shape[0]),
                                        valid.shape[1])).astype(np.int32)
    for row in teacher_forced(model, text):
      result["teacher_forced"].append({"model": key, **row})
  print("gen-PPL", flush=True)
  result["gen_ppl"] = gen_ppl(models["shipped"], evaluator, prompts,
                              sample_len, seed=0)
  print("drift", flush=True)
  result["drift"] = drift(models["shipped"],
                          prompts[:2 if smoke else _DRIFT_ROWS.value], bucket)
  print("matmul forms", flush=True)
  result["matmul_forms"] = matmul_forms(
      *((32, 64, 2) if smoke else (512, 2048, 16)), batch_sizes,
      1 if smoke else 21)
  result["wall_s"] = time.time() - start
  result["load_average"] = {"start": load_start, "end": os.getloadavg()}
  write(result, _OUT_DIR.value, " ".join(["python"] + sys.argv))


def write(result: dict, out_dir: str, command: str) -> None:
  """results.json, the CSVs, drift.png and report.md."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump({"command": command, **result}, f, indent=2)
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
