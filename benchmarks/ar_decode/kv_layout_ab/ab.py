"""One A/B point: median seconds of our cached greedy AR decode.

usage: PYTHONPATH=<checkout> python ab.py D LAYERS HEADS VOCAB B T RUNS
Prints one JSON line: tree, point, compile_s, runs_s, median_ms_per_step.
"""
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn

d, layers, heads, vocab, batch, new, runs = map(int, sys.argv[1:8])
prompt = 16
config = TransformerConfig(vocab_size=vocab, d_model=d, num_layers=layers,
                           num_heads=heads, num_kv_heads=heads,
                           head_dim=d // heads, mlp_dim=4 * d,
                           max_len=prompt + new)
params = init_params(config, jax.random.PRNGKey(0))
logits_fn = make_logits_fn(config)
decoder = base.make_decoder("ar", output_length=new, eos_ids=(),
                            sampling=SamplingConfig(temperature=0.0))
jitted = jax.jit(lambda p, x, n: decoder.decode(
    base.bind(logits_fn, p), x, n, None).tokens)
x = jnp.asarray(np.random.RandomState(batch).randint(5, vocab, (batch, prompt)))
n = jnp.full((batch,), prompt, jnp.int32)
t0 = time.perf_counter()
compiled = jitted.lower(params, x, n).compile()
compile_s = time.perf_counter() - t0
tokens = np.asarray(compiled(params, x, n))  # warm-up
times = []
for _ in range(runs):
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(params, x, n))
  times.append(time.perf_counter() - t0)
print(json.dumps({"tree": os.environ.get("PYTHONPATH"), "point": sys.argv[1:7],
                  "compile_s": compile_s, "runs_s": times,
                  "ms_per_step": float(np.median(times)) / new * 1e3,
                  "tokens_sum": int(tokens.sum())}), flush=True)
