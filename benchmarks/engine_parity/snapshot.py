"""Every registered decoder's record, and the denoising decoders' on a tiny
real Transformer over their contexts, pickled for a bit-for-bit comparison.

  KEEP=<indices> PYTHONPATH=<tree> python snapshot.py OUT.pkl

Stub cases: each registered name on the determinism stub (tests/stubs.py),
temperature 1 where it samples, T = 4. Real cases: a 1-layer random
Transformer (plain, token-shifted, self-conditioned) under every context
(full, prefix, dual, step refresh, causal prefix, blocks, sub-blocks,
canvas prefix): `decode`, `denoise(measure_error=True)` or the uniform
`run(trace=True, measure_error=True)`, LLaDA's trace and infill. KEEP picks
case indices (keys are per index, so a subset keeps its keys). Run from the
repository root (imports `tests/stubs.py`).
"""
import dataclasses, pickle, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, "tests")
import stubs
from lm_decoding.decoding import base, make_decoder, registered, sampling
from lm_decoding.models import TransformerConfig, make_logits_fn
from lm_decoding.special_tokens import PAD_ID

HOT = sampling.SamplingConfig(temperature=1.0)
PROMPTS = jnp.asarray([[5, 6, 7], [7, 0, 0], [9, 5, 0]], jnp.int32)
LENGTHS = jnp.asarray([3, 1, 2], jnp.int32)
STUB = stubs.TableLogitsFn.random(7, 12, 16, masked_ids=(PAD_ID,))
TINY = TransformerConfig(vocab_size=16, d_model=32, num_layers=1, num_heads=2,
                         num_kv_heads=2, head_dim=16, mlp_dim=64, max_len=16,
                         attention="bidirectional")
REAL = make_logits_fn(TINY)
PARAMS = stubs.random_params(TINY)
SHIFT = make_logits_fn(dataclasses.replace(TINY, token_shift=True))
SC = make_logits_fn(dataclasses.replace(TINY, self_conditioning=True))
SCP = stubs.random_params(dataclasses.replace(TINY, self_conditioning=True))

def rec(x):
  return jax.tree.map(np.asarray, x)

cases = []
for name in registered():
  cls = base.decoder_class(name)
  fields = {f.name for f in dataclasses.fields(cls)}
  opts = {"output_length": 4}
  if "steps" in fields and name not in ("threshold", "factor", "entropy_bound"):
    opts["steps"] = 4
  if "sampling" in fields:
    opts["sampling"] = HOT
  cases.append((name, opts, "stub"))
R = dict(sampling=HOT)
cases += [
  ("mdlm", dict(output_length=8, steps=8, block_length=4, kv_cache="none", **R), "real"),
  ("mdlm", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix", reuse_logits=False, early_stop=False, **R), "real"),
  ("llada", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix", **R), "real"),
  ("llada", dict(output_length=8, steps=8, kv_cache="dual", remasking="margin", **R), "real"),
  ("llada", dict(output_length=8, steps=8, block_length=4, kv_cache="dual", cache_refresh="step", **R), "real"),
  ("llada", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix", attention="causal"), "real"),
  ("threshold", dict(output_length=8, block_length=4, kv_cache="prefix"), "real"),
  ("factor", dict(output_length=8, block_length=4, kv_cache="dual", **R), "real"),
  ("entropy_bound", dict(output_length=8, kv_cache="none", **R), "real"),
  ("maskgit", dict(output_length=8, steps=8, block_length=4, kv_cache="dual", **R), "real"),
  ("remdm", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix", **R), "real"),
  ("threshold", dict(output_length=8, block_length=4, kv_cache="prefix"), "shift"),
  ("threshold", dict(output_length=8, kv_cache="dual"), "shift"),
  ("llada", dict(output_length=8, steps=8, kv_cache="none", **R), "shift"),
  ("bd3lm", dict(output_length=8, steps=8, block_length=4, **R), "real"),
  ("bd3lm", dict(output_length=8, steps=8, block_length=4, kv_cache="none", remasking="margin", **R), "real"),
  ("bd3lm", dict(output_length=8, steps=8, block_length=4, remasking="threshold", sub_block_length=2, kv_cache="dual", **R), "real"),
  ("bd3lm", dict(output_length=8, steps=8, block_length=4, remasking="threshold", sub_block_length=2, **R), "real"),
  ("bd3lm", dict(output_length=8, steps=16, block_length=4, reuse_logits=False, **R), "real"),
  ("bd3lm", dict(output_length=8, steps=8, block_length=2, **R), "shift"),
  ("bd3lm", dict(output_length=8, steps=8, block_length=4, remasking="threshold", sub_block_length=2, kv_cache="dual", **R), "shift"),
  ("uniform_eb", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix"), "real"),
  ("uniform_eb", dict(output_length=8, steps=8, kv_cache="none"), "sc"),
  ("uniform_eb", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix"), "sc"),
  ("uniform_ancestral", dict(output_length=8, steps=8, block_length=4, kv_cache="prefix"), "real"),
  ("uniform_ancestral", dict(output_length=8, steps=8, block_length=4, kv_cache="none"), "sc"),
]

def models(kind, decoder):
  if kind == "stub":
    return stubs.bind_roles(decoder, STUB)
  fn, p = dict(real=(REAL, PARAMS), shift=(SHIFT, PARAMS), sc=(SC, SCP))[kind]
  return base.bind(fn, p)

import os
KEEP = os.environ.get("KEEP")
KEEP = None if KEEP is None else {int(x) for x in KEEP.split(",")}
out = {}
for i, (name, o, kind) in enumerate(cases):
  if KEEP is not None and i not in KEEP:
    continue
  d = make_decoder(name, **o)
  m = models(kind, d)
  key = jax.random.key(i)
  r = {"decode": rec(d.decode(m, PROMPTS, LENGTHS, key))}
  if kind != "stub" and name.startswith("uniform"):
    tokens, cost, stats, recs = d.run(m, PROMPTS, LENGTHS, key, trace=True, measure_error=True)
    r["run"] = rec((tokens, cost, stats, recs))
  elif kind != "stub" and hasattr(d, "denoise"):
    r["denoise"] = rec(d.denoise(m, PROMPTS, LENGTHS, key, measure_error=True))
    if name == "llada":
      r["trace"] = rec(d.denoise(m, PROMPTS, LENGTHS, key, trace=True).states)
      if kind == "real" and d.block_length is None and name == "llada":
        toks = jnp.tile(jnp.arange(5, 13, dtype=jnp.int32)[None], (3, 1))
        fill = jnp.zeros((3, 8), bool).at[:, 2:6].set(True).at[1, 0].set(True)
        r["infill"] = rec(d.infill(m, toks, fill, key, trace=True))
  out[f"{i:03d} {name} {kind} {sorted(o.items())}"] = r
  print(i, name, kind, flush=True)
  with open(sys.argv[1], "wb") as f:
    pickle.dump(out, f)

print("done")
