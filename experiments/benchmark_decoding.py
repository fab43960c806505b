r"""Micro-benchmarks of the decoding hot paths (figures printed and saved).

  python experiments/benchmark_decoding.py --workdir=/tmp/bench

1. Cached AR decoding, ms per token at each batch size, against the bytes
   roofline (parameters + live KV cache read once per step over the measured
   memory bandwidth).
2. Compile time of the AR decoder for a short and a long output (the scan
   body is compiled once, so it should not grow with T).
3. One full forward pass (a parallel decoding step) per batch size and
   sequence length, and the break-even step count K* against (1).

Random parameters of the configured shape: cost does not depend on weights.

With a mesh (`--config.mesh.shape="(1, 1, -1)"`, say; the default (1, 1, 1)
is one device, unchanged), parameters and prompts are placed by the
config's rules, every program runs under `jax.jit` with explicit shardings
(`lm_decoding.decoding.sharded`), and rows add the device count, weight
GB/s per device (each step or pass reads every weight once) and model
GFLOP/s per device (2 FLOPs per parameter per token position); the bytes
roofline then assumes the measured bandwidth on every device.
"""

import json
import os

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from lm_decoding.decoding import base, bind, make_decoder, sharded
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost, records
from lm_decoding.models import count_params, init_params, make_logits_fn
from lm_decoding.parallel import sharding
from lm_decoding.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"),
    "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_bench",
                               "Output directory.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_NEW_TOKENS = flags.DEFINE_integer("output_length", 256,
                                   "T, tokens per AR decode.")
_COMPILE_LENGTHS = flags.DEFINE_list("compile_lengths", ["64", "1024"],
                                     "Output lengths whose compile time is compared.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed runs (median reported).")


def _ar_fn(new_tokens):
  """The jitted AR decode of (models, prompts, prompt_lengths, key)."""
  return base.jit_decode(make_decoder(
      "ar", output_length=new_tokens, eos_ids=(),
      sampling=SamplingConfig(temperature=1.0)))


def _sharded_ar(model_cfg, new_tokens, params, batch, prompt_len, mesh,
                rules):
  """(jitted fn, args) of the AR decode on `mesh` with explicit shardings."""
  decoder = make_decoder("ar", output_length=new_tokens, eos_ids=(),
                         sampling=SamplingConfig(temperature=1.0))
  args = (*sharded.place(bind(make_logits_fn(model_cfg), params),
                         jnp.ones((batch, prompt_len), jnp.int32),
                         jnp.full((batch,), prompt_len, jnp.int32),
                         mesh, rules), jax.random.key(1))
  return sharded.jit_decode(decoder, args, mesh, rules), args


def _per_device(weight_reads, positions, seconds, p_bytes, n_params,
                devices):
  return {"devices": devices,
          "weight_GBps_per_device":
              weight_reads * p_bytes / seconds / devices / 1e9,
          "GFLOPs_per_device":
              2.0 * n_params * positions / seconds / devices / 1e9}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  prompt_len = config.compare.prompt_len
  model_cfg = train.model_config(config)
  params = init_params(model_cfg, jax.random.key(0))
  logits_fn = make_logits_fn(model_cfg)
  mesh = sharding.mesh_or_none(config.get("mesh"))
  rules = sharding.rules_from_config(config.get("mesh"))
  devices = 1 if mesh is None else mesh.size
  n_params = count_params(params)
  bandwidth = cost.measure_bandwidth()
  p_bytes = cost.tree_bytes(params)
  kv_per_token = logits_fn.init_cache(1, 1).bytes_per_slot()
  out = {"device": jax.devices()[0].device_kind, "bandwidth_GBps": bandwidth / 1e9,
         "param_bytes": p_bytes, "kv_bytes_per_token": kv_per_token,
         "ar": [], "compile": [], "forward": []}
  t = _NEW_TOKENS.value
  if mesh is not None:
    out["mesh"] = dict(mesh.shape)
  for b in map(int, _BATCH_SIZES.value):
    prompts = jnp.ones((b, prompt_len), jnp.int32)
    lengths = jnp.full((b,), prompt_len, jnp.int32)
    if mesh is None:
      timing = cost.time_fn(_ar_fn(t), bind(logits_fn, params), prompts,
                            lengths, jax.random.key(1), runs=_RUNS.value)
    else:
      fn, args = _sharded_ar(model_cfg, t, params, b, prompt_len, mesh, rules)
      timing = cost.time_fn(fn, *args, runs=_RUNS.value)
    bound = cost.ar_decode_roofline_s(p_bytes, kv_per_token * b, prompt_len, t,
                                      bandwidth * devices)
    row = {"batch_size": b, "new_tokens": t,
           "ms_per_token": timing.median_s / t * 1e3,
           "roofline_ms_per_token": bound / t * 1e3,
           "x_roofline": timing.median_s / bound,
           "compile_s": timing.compile_s}
    if mesh is not None:  # a prefill and T - 1 steps read the weights
      row.update(_per_device(t, b * (prompt_len + t - 1), timing.median_s,
                             p_bytes, n_params, devices))
    out["ar"].append(row)
    print(json.dumps(row))
    forward = lambda p, x: logits_fn(p, x, jnp.broadcast_to(
        jnp.arange(x.shape[1]), x.shape))[0]
    tokens = jnp.ones((b, prompt_len + t), jnp.int32)
    if mesh is None:
      fwd = cost.time_fn(jax.jit(forward), params, tokens, runs=_RUNS.value)
    else:
      p_shardings = sharding.param_shardings(
          model_cfg, mesh, sharding.rules_for_model(model_cfg, mesh, rules))
      forward = jax.jit(forward, in_shardings=(
          p_shardings, sharding.batch_sharding(mesh, tokens.shape, rules)))
      fwd = cost.time_fn(forward, jax.device_put(params, p_shardings),
                         sharding.shard_batch(tokens, mesh, rules),
                         runs=_RUNS.value)
    row = {"batch_size": b, "length": prompt_len + t,
           "forward_ms": fwd.median_s * 1e3,
           "break_even_steps": timing.median_s / fwd.median_s}
    if mesh is not None:
      row.update(_per_device(1, b * (prompt_len + t), fwd.median_s, p_bytes,
                             n_params, devices))
    out["forward"].append(row)
    print(json.dumps(row))
  for t in map(int, _COMPILE_LENGTHS.value):
    long_cfg = model_cfg.replace(max_len=max(model_cfg.max_len, prompt_len + t))
    prompts = jnp.ones((1, prompt_len), jnp.int32)
    long_models = bind(make_logits_fn(long_cfg),
                       init_params(long_cfg, jax.random.key(0)))
    timing = cost.time_fn(_ar_fn(t), long_models,
                          prompts, jnp.full((1,), prompt_len, jnp.int32),
                          jax.random.key(1), runs=1, warmup=0)
    row = {"new_tokens": t, "compile_s": timing.compile_s}
    out["compile"].append(row)
    print(json.dumps(row))
  os.makedirs(_WORKDIR.value, exist_ok=True)
  path = os.path.join(_WORKDIR.value, "benchmark.json")
  records.write_json(out, path)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
