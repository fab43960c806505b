"""Greedy token choice over [B, V] logits: `jnp.argmax` against
`lm_decoding.decoding.sampling.argmax` (a max, then a min over the indices
that reach it), each applied 100 times inside one jitted loop (so per-call
dispatch is excluded); medians of 5 calls after a warm-up, microseconds per
application. V = 32000, the vocabulary of benchmark_ar.py's 110m model.

  python benchmarks/ar_decode/argmax/argmax.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import sampling


def per_call_us(fn, logits, repeats=100, runs=5):
  def body(_, acc):  # the sum depends on every call, so none is dropped
    return acc + fn(logits + acc[:, None].astype(logits.dtype) * 0)
  loop = jax.jit(lambda x: jax.lax.fori_loop(
      0, repeats, body, jnp.zeros(x.shape[0], jnp.int32)))
  loop(logits).block_until_ready()
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    loop(logits).block_until_ready()
    times.append(time.perf_counter() - start)
  return float(np.median(times)) / repeats * 1e6


def main():
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
  print("| B | jnp.argmax us | sampling.argmax us | ratio |")
  print("|---|---|---|---|")
  for batch in (1, 8, 32):
    logits = jax.random.normal(jax.random.key(0), (batch, 32000))
    ref = np.asarray(jnp.argmax(logits, -1))
    assert np.array_equal(np.asarray(sampling.argmax(logits)), ref)
    old = per_call_us(lambda x: jnp.argmax(x, -1).astype(jnp.int32), logits)
    new = per_call_us(sampling.argmax, logits)
    print(f"| {batch} | {old:.1f} | {new:.1f} | {old / new:.1f} |")


if __name__ == "__main__":
  main()
