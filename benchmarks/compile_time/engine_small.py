r"""Compile seconds of the denoising decoders against the number of blocks N.

  PYTHONPATH=<tree> python benchmarks/compile_time/engine_small.py

A tiny random Transformer (d 32, 1 layer, V 64), T = 64 after P = 8, B = 1,
blocks of 16 and 4 (N = 4 and 16): threshold with the prefix cache, BD3-LM
with its block cache, uniform_eb with the canvas prefix, LLaDA without a
cache. Prints name, N, compile seconds, NFE and a digest of the tokens. It
jits with its own lambda (not `base.jit_decode`) so that it runs unchanged on
trees from before issue 37's engine too.
"""
import hashlib, sys, time
import jax, jax.numpy as jnp, numpy as np
from lm_decoding.decoding import make_decoder
from lm_decoding.models import Model, TransformerConfig, init_params, make_logits_fn
T, P = 64, 8
cfg = TransformerConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                        head_dim=16, mlp_dim=64, max_len=P + T, attention="bidirectional")
model = Model(make_logits_fn(cfg), init_params(cfg, jax.random.key(0)))
prompts = jax.random.randint(jax.random.key(1), (1, P), 5, 64)
lengths = jnp.full((1,), P, jnp.int32)
for name, opts in [("threshold", dict(kv_cache="prefix")), ("bd3lm", dict(steps=T)),
                   ("uniform_eb", dict(steps=T, kv_cache="prefix")), ("llada", dict(steps=T))]:
  for block in (16, 4):
    d = make_decoder(name, output_length=T, block_length=block, eos_ids=(), **opts)
    fn = jax.jit(lambda m, p, l, k, d=d: d.decode({"model": m}, p, l, k))
    t0 = time.perf_counter()
    c = fn.lower(model, prompts, lengths, jax.random.key(2)).compile()
    s = time.perf_counter() - t0
    out = c(model, prompts, lengths, jax.random.key(2))
    print(name, T // block, round(s, 2), int(out.nfe),
          hashlib.sha1(np.asarray(out.tokens).tobytes()).hexdigest()[:10], flush=True)
