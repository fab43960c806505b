"""Our cached AR decoder and forward pass against `transformers` on the same
weights (experiments/benchmark_ar.py).

`decode_row` times the registered 'ar' decoder (KV cache, `lax.scan`,
greedy, fixed length) against `model.generate(use_cache=True,
do_sample=False)`, `forward_row` one full-sequence forward in both
libraries, `matmul_floor` the step time the two libraries' dot kernels
alone allow; each against the bytes and FLOPs rooflines (Pope et al. 2022).
Calls alternate A, B, A, B (`cost.interleaved`). torch and transformers are
the `[peer]` extra, imported when a function needs them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model
from lm_decoding.models import make_logits_fn


def matmul_floor(config, batch: int, runs: int, steps: int = 16) -> dict:
  """Seconds per step of a decode step's matmuls alone, in XLA (jitted)
  and in torch, interleaved (`interleaved`; medians of `runs` calls of
  steps steps each): random float32 matrices of
  the model's shapes (per layer query, key, value, output, the MLP's; the
  LM head), applied to x[batch, D] in the model's order, with nothing
  else (no attention over the cache, norms or sampling): the step time
  the two libraries' dot kernels allow."""
  import torch
  d, h, hkv, dh, m = (config.d_model, config.num_heads, config.num_kv_heads,
                      config.head_dim, config.mlp_dim)
  rng = np.random.RandomState(0)
  w = lambda i, o: rng.standard_normal((i, o)).astype(np.float32) * i ** -0.5
  gates = 2 if config.mlp_activation == "swiglu" else 1
  layers = [(w(d, h * dh), w(d, hkv * dh), w(d, hkv * dh), w(h * dh, d),
             [w(d, m) for _ in range(gates)], w(m, d))
            for _ in range(config.num_layers)]
  # A tied head reads the [V, D] embedding table, an untied one a [D, V]
  # kernel: the model's layouts.
  tied = config.tie_embeddings
  table = w(config.vocab_size, d) if tied else w(d, config.vocab_size)
  x = rng.standard_normal((batch, d)).astype(np.float32)

  def step(x, layers, table, act):
    for wq, wk, wv, wo, wi, wd in layers:
      keys_values = (x @ wk).sum(-1, keepdims=True) + (x @ wv).sum(
          -1, keepdims=True)  # keeps both products live
      x = x + (x @ wq) @ wo + 1e-6 * keys_values
      inner = act(x @ wi[0])
      for gate in wi[1:]:
        inner = inner * (x @ gate)
      x = x + inner @ wd
    logits = x @ (table.T if tied else table)
    return x + 1e-6 * logits.sum(-1, keepdims=True)  # every column live

  # steps steps per call, as in a decode loop (XLA: one jitted loop, so no
  # per-step dispatch; torch: a Python loop, as `generate` runs).
  ours = jax.jit(lambda x, *a: jax.lax.fori_loop(
      0, steps, lambda _, y: step(y, *a, jax.nn.gelu), x))
  args = jax.tree.map(jnp.asarray, (x, layers, table))
  torch_args = jax.tree.map(torch.tensor, (x, layers, table))
  gelu = lambda t: torch.nn.functional.gelu(t, approximate="tanh")

  def theirs():
    y, rest = torch_args[0], torch_args[1:]
    with torch.no_grad():
      for _ in range(steps):
        y = step(y, *rest, gelu)
    return y

  times = interleaved(lambda: jax.block_until_ready(ours(*args)), theirs,
                       runs)
  return {k: v / steps for k, v in times.items() if k.endswith("median_s")}


def interleaved(ours, theirs, runs: int, warmup: bool = True) -> dict:
  """Warm-up once each (unless done), then `runs` pairs A, B
  (`cost.interleaved`): {ours_s, hf_s: [seconds], ours_median_s,
  hf_median_s, speedup_median (median of the per-pair ratios hf / ours)}."""
  times, _ = cost.interleaved({"ours": ours, "hf": theirs}, runs,
                              warmup=int(warmup))
  a, b = times["ours"], times["hf"]
  return {"ours_s": a, "hf_s": b, "ours_median_s": float(np.median(a)),
          "hf_median_s": float(np.median(b)),
          "speedup_median": float(np.median(np.array(b) / np.array(a)))}


def decode_row(model, config, params, batch, new_tokens, prompt_length,
               runs, bandwidth, peak, floor):
  """One greedy decode of `new_tokens` tokens from random int32[batch,
  prompt_length] prompts in both libraries: tokens/s, whether the tokens
  agree, the speed-up, and each against the roofline (bytes/s `bandwidth`,
  FLOP/s `peak`) and its own `matmul_floor` (`floor`).

  Args:
    model: the transformers model whose weights `params` hold.
    config: our TransformerConfig of the same model.
  """
  import torch
  rng = np.random.RandomState(batch * 1000 + new_tokens)
  prompts = rng.randint(5, config.vocab_size, (batch, prompt_length))
  lengths = jnp.full((batch,), prompt_length, jnp.int32)
  decoder = base.make_decoder("ar", output_length=new_tokens, eos_ids=(),
                              sampling=SamplingConfig(temperature=0.0))
  logits_fn = make_logits_fn(config)
  args = (base.bind(logits_fn, params), jnp.asarray(prompts), lengths, None)
  compiled, compile_s = cost.compile_timed(base.jit_decode(decoder), args)
  ours = lambda: jax.block_until_ready(compiled(*args).tokens)
  ids = torch.tensor(prompts)
  mask = torch.ones_like(ids)

  def theirs():
    with torch.no_grad():
      return model.generate(ids, attention_mask=mask, do_sample=False,
                            use_cache=True, max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, pad_token_id=0,
                            eos_token_id=None)

  same = bool(np.array_equal(np.asarray(ours()),  # also the warm-up
                             theirs()[:, prompt_length:].numpy()))
  times = interleaved(ours, theirs, runs, warmup=False)
  p_bytes = cost.tree_bytes(params)
  kv_per_token = logits_fn.init_cache(1, 1).bytes_per_slot() * batch
  bytes_s = cost.ar_decode_roofline_s(p_bytes, kv_per_token, prompt_length,
                                      new_tokens, bandwidth)
  flops = sum(cost_model.forward_flops(config, batch, 1, prompt_length + t)
              for t in range(new_tokens))  # step t attends to P + t keys
  bound_s = max(bytes_s, flops / peak)
  tokens = batch * new_tokens
  return {
      "ours_floor_ms": floor["ours_median_s"] * 1e3,
      "hf_floor_ms": floor["hf_median_s"] * 1e3,
      "ours_x_floor": times["ours_median_s"] / new_tokens / floor[
          "ours_median_s"],
      "hf_x_floor": times["hf_median_s"] / new_tokens / floor["hf_median_s"],
      "kind": "decode", "batch": batch, "new_tokens": new_tokens,
      "same_tokens": same, "compile_s": compile_s,
      "ours_tok_s": tokens / times["ours_median_s"],
      "hf_tok_s": tokens / times["hf_median_s"],
      "speedup": times["speedup_median"],
      "bytes_roofline_s": bytes_s, "flops_roofline_s": flops / peak,
      "ours_x_roofline": times["ours_median_s"] / bound_s,
      "hf_x_roofline": times["hf_median_s"] / bound_s,
      "ours_ms_per_step": times["ours_median_s"] / new_tokens * 1e3,
      "hf_ms_per_step": times["hf_median_s"] / new_tokens * 1e3,
      **times}


def forward_row(model, config, params, batch, length, runs, peak):
  """One full forward over random int32[batch, length] tokens in both
  libraries: ms, speed-up and % of the `peak` FLOP/s."""
  import torch
  tokens = np.random.RandomState(length).randint(5, config.vocab_size,
                                                 (batch, length))
  positions = np.broadcast_to(np.arange(length), tokens.shape)
  logits_fn = make_logits_fn(config)
  jitted = jax.jit(lambda p, t, q: logits_fn(p, t, q).logits)
  args = (params, jnp.asarray(tokens), jnp.asarray(positions))
  compiled, compile_s = cost.compile_timed(jitted, args)
  ids = torch.tensor(tokens)

  def theirs():
    with torch.no_grad():
      return model(ids, use_cache=False).logits

  times = interleaved(lambda: jax.block_until_ready(compiled(*args)),
                       theirs, runs)
  flops = cost_model.forward_flops(config, batch, length, length)
  return {"kind": "forward", "batch": batch, "length": length,
          "compile_s": compile_s, "flops": flops,
          "ours_ms": times["ours_median_s"] * 1e3,
          "hf_ms": times["hf_median_s"] * 1e3,
          "speedup": times["speedup_median"],
          "ours_pct_peak": 100 * flops / times["ours_median_s"] / peak,
          "hf_pct_peak": 100 * flops / times["hf_median_s"] / peak, **times}
