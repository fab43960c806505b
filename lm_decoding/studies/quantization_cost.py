"""int8 weights and an int8 KV cache measured against float32.

The measurements of experiments/quantization.py, each a pure function of
{variant: (TransformerConfig, params)} (`variants`): decode speed against
the bytes roofline (`timing`), logits against f32 teacher-forced
(`teacher_forced`), gen-PPL of samples (`gen_ppl`), drift along long greedy
generations (`drift`) and the two matmul forms of weight-only int8
(`matmul_forms`). The int8 weights are symmetric absmax
(`models.quantization.quantize_params`, no retraining); the int8 KV cache
is the model's `kv_cache_dtype='int8'` (one scale per slot).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base, bind, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost, quality
from lm_decoding.models import KVCache, TransformerConfig, make_logits_fn
from lm_decoding.models.quantization import quantize_params

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
  """ms/token of greedy cached decoding, variants timed in turns
  (`cost.interleaved`), compile time apart.

  Args:
    models: {variant: (TransformerConfig, params)} (`variants`), with 'f32'.
    prompt_len: P, prompt tokens (constant prompts).
    new_tokens: T, tokens per decode.
    batch_sizes: B values.
    runs: timed rounds, >= 1.
    bandwidth: measured bytes/s (`cost.measure_bandwidth`), for the bytes
      roofline.
  Returns:
    Rows: variant, batch_size, new_tokens, ms_per_token, ratio_to_f32
    (median per-run ratio), param/cache bytes, roofline ms/token,
    x_roofline, compile_s, runs_s.
  """
  rows = []
  decoder = _greedy(new_tokens)
  for batch in batch_sizes:
    prompts = jnp.ones((batch, prompt_len), jnp.int32) * 7
    lengths = jnp.full((batch,), prompt_len, jnp.int32)
    compiled, compile_s = {}, {}
    for name, (config, params) in models.items():
      logits_fn = make_logits_fn(config)
      fn = lambda p, x, n, lf=logits_fn: decoder.decode(
          bind(lf, p), x, n, None).tokens
      compiled[name], compile_s[name] = cost.compile_timed(
          fn, (params, prompts, lengths))
      jax.block_until_ready(compiled[name](params, prompts, lengths))
    runs_s, _ = cost.interleaved(
        {name: functools.partial(compiled[name], params, prompts, lengths)
         for name, (_, params) in models.items()}, runs)
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
    tokens = np.asarray(base.jit_decode(decoder)(
        bind(make_logits_fn(config), params), jnp.asarray(prompts_BxP),
        lengths, jax.random.key(key)).tokens)
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
    greedy[name] = np.asarray(base.jit_decode(decoder)(
        bind(make_logits_fn(c), p), jnp.asarray(prompts_BxP), lengths,
        None).tokens)
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
  """ms of `layers` stacked [d_in, d_out] matmuls in three forms (float32
  x @ w, int8 (x @ q) * s, int8 x @ (q * s)), timed in turns."""
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
    calls = {name: functools.partial(fns[name], x, *weights)
             for name, (_, weights) in forms.items()}
    for call in calls.values():
      jax.block_until_ready(call())
    runs_s, _ = cost.interleaved(calls, runs)
    f32_s = np.array(runs_s["f32 x @ w"])
    for name in forms:
      rows.append({"form": name, "batch_size": batch,
                   "ms": float(np.median(runs_s[name])) * 1e3,
                   "ratio_to_f32": float(np.median(
                       np.array(runs_s[name]) / f32_s))})
  return rows
