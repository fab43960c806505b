"""Does the stored layout of a dense kernel change XLA CPU's few-row matmul?

The model stores each dense kernel [in, out] (flax `DenseGeneral`) and
multiplies x[B, in] @ W[in, out]. This times the same products with the
kernel stored [out, in] (torch's `Linear` layout) and contracted on its last
dimension, on the MLP matrices of the 110m benchmark model (d 768, MLP 3072,
12 layers: 226 MB of float32, above the 32 MiB LLC), 16 decode-like steps
per jitted call, the two layouts interleaved, median of 7 calls after a
warm-up. Prints ms per step, the pair ratio, and GB/s of weights streamed.

  python benchmarks/ar_decode/weight_layout/weight_layout.py
"""
import os
import time

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from lm_decoding.evaluation import cost

D, F, LAYERS, STEPS, RUNS = 768, 3072, 12, 16, 7


def step_fn(transposed: bool):
  """16 steps of x + (x @ W1) @ W2 per layer; W stored [in, out] or, when
  transposed, [out, in] and contracted on its last dimension."""
  contract = ((1,), (1,)) if transposed else ((1,), (0,))

  def dot(x, w):
    return lax.dot_general(x, w, (contract, ((), ())))

  @jax.jit
  def run(x, weights):
    def body(_, x):
      for w_in, w_out in weights:
        x = x + 1e-3 * dot(dot(x, w_in), w_out)
      return x
    return lax.fori_loop(0, STEPS, body, x)
  return run


def main():
  load_start = os.getloadavg()[0]
  keys = jax.random.split(jax.random.PRNGKey(0), 2 * LAYERS)
  stored = [(jax.random.normal(keys[2 * i], (D, F)),
             jax.random.normal(keys[2 * i + 1], (F, D))) for i in range(LAYERS)]
  layouts = {
      "[in, out]": (step_fn(False), stored),
      "[out, in]": (step_fn(True),
                    [(jnp.asarray(np.asarray(a).T.copy()),
                      jnp.asarray(np.asarray(b).T.copy())) for a, b in stored]),
  }
  weight_bytes = 2 * LAYERS * D * F * 4
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, "
        f"{os.cpu_count()} cores; weights {weight_bytes / 2**20:.0f} MiB")
  for batch in (1, 8, 32):
    x = jnp.ones((batch, D), jnp.float32)
    times = {name: [] for name in layouts}
    for fn, weights in layouts.values():
      fn(x, weights).block_until_ready()
    for _ in range(RUNS):
      for name, (fn, weights) in layouts.items():
        start = time.perf_counter()
        fn(x, weights).block_until_ready()
        times[name].append((time.perf_counter() - start) / STEPS * 1e3)
    ratios = np.asarray(times["[in, out]"]) / np.asarray(times["[out, in]"])
    for name, ms in times.items():
      med = float(np.median(ms))
      print(f"batch {batch:2d} kernel {name}: {med:6.2f} ms/step, "
            f"{weight_bytes / med / 1e6:5.1f} GB/s, "
            f"{2 * batch * weight_bytes / 4 / med / 1e6:6.1f} GFLOP/s")
    print(f"batch {batch:2d} [in, out] / [out, in] per pair: "
          + " ".join(f"{r:.2f}" for r in ratios)
          + f" (median {np.median(ratios):.2f})")
  print(cost.load_summary([load_start, os.getloadavg()[0]]))


if __name__ == "__main__":
  main()
