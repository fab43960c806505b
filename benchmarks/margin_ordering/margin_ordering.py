r"""Per-step cost of LLaDA's remasking orderings: margin against confidence.

  PYTHONPATH=$PWD python benchmarks/margin_ordering/margin_ordering.py

Both orderings make the same model calls (K full passes over P + T
positions), so any gap in time per step is the ordering's own cost. The
model is configs/tiny.py's shape (d128, 2 layers, vocab 4096) with random
weights (timing does not depend on the weights); P = 16 like the main job.
Each (B, T) decodes once per ordering to compile and warm up, then the
orderings are timed in turns (`cost.interleaved`), and the medians are
reported with their ratio, ms per step = ms per decode / NFE. It also checks
that greedy margin decoding gives the same tokens before and after a change
by printing a digest of the tokens (compare the line across commits).
"""

import hashlib
import os
import sys

import jax
import numpy as np

from lm_decoding.decoding import base
from lm_decoding.evaluation import cost
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.models import Model

PROMPT_LEN = 16
RUNS = 7
SHAPES = ((1, 32), (8, 32), (1, 256))  # (B, T)
ORDERINGS = ("low_confidence", "margin")


def main():
  cfg = TransformerConfig(vocab_size=4096, d_model=128, num_layers=2,
                          num_heads=4, num_kv_heads=4, head_dim=32,
                          mlp_dim=512, max_len=PROMPT_LEN + 256,
                          attention="bidirectional")
  models = {"model": Model(make_logits_fn(cfg),
                                init_params(cfg, jax.random.key(0)))}
  load = os.getloadavg()[0]
  print(f"jax {jax.__version__}, {os.cpu_count()} cores, 1-min load "
        f"{load:.1f} at start; {RUNS} interleaved rounds, medians")
  for b, t in SHAPES:
    prompts = np.random.default_rng(0).integers(
        5, cfg.vocab_size, (b, PROMPT_LEN)).astype(np.int32)
    args = (models, prompts, np.full((b,), PROMPT_LEN, np.int32),
            jax.random.key(1))
    calls, nfe = {}, {}
    for ordering in ORDERINGS:
      decoder = base.make_decoder("llada", output_length=t, steps=32,
                                  block_length=32, remasking=ordering,
                                  eos_ids=())
      fn = jax.jit(decoder.decode)
      out = jax.block_until_ready(fn(*args))  # compile + warm up
      nfe[ordering] = int(out.nfe)
      calls[ordering] = lambda fn=fn: fn(*args)
    times, outs = cost.interleaved(calls, RUNS)
    per_step = {o: 1e3 * np.median(times[o]) / nfe[o] for o in ORDERINGS}
    digest = hashlib.sha256(np.asarray(outs["margin"].tokens).tobytes())
    ratio = per_step["margin"] / per_step["low_confidence"]
    print(f"B={b} T={t} K=32: ms/step "
          + ", ".join(f"{o} {per_step[o]:.2f}" for o in ORDERINGS)
          + f"; margin / low_confidence {ratio:.2f}x; margin tokens sha256 "
          f"{digest.hexdigest()[:16]}")
  print(f"1-min load {os.getloadavg()[0]:.1f} at end")
  return 0


if __name__ == "__main__":
  sys.exit(main())
