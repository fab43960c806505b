"""Scratch check behind speculative.md's verify cost: the base model's
matmuls (d256, 4 layers, SwiGLU 1024, tied 4096 head; random weights) on
1, 2, 3, 5 and 9 rows, 64 steps in one jitted loop, rows interleaved,
median of 7. Run: python benchmarks/speculative_few_rows/few_rows.py
"""
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

D, LAYERS, RUNS, STEPS = 256, 4, 7, 64
key = jax.random.key(0)
weights = [jax.random.normal(jax.random.fold_in(key, i), shape) * 0.02
           for i, shape in enumerate([(D, 3 * D), (D, D), (D, 2048),
                                      (1024, D)] * LAYERS)]
table = jax.random.normal(key, (4096, D)) * 0.02


def step(x, ws):
  for i in range(LAYERS):
    qkv, out, gate_up, down = ws[4 * i:4 * i + 4]
    x = x + (x @ qkv)[:, :D] @ out
    g = x @ gate_up
    x = x + (g[:, :1024] * g[:, 1024:]) @ down
  return x @ table.T


loop = jax.jit(lambda x, ws: jax.lax.fori_loop(
    0, STEPS, lambda i, x: x + 1e-3 * step(x, ws)[:, :D], x))
rows = (1, 2, 3, 5, 9)
inputs = {r: jnp.ones((r, D)) for r in rows}
for r in rows:
  loop(inputs[r], weights).block_until_ready()
times = {r: [] for r in rows}
for _ in range(RUNS):
  for r in rows:
    start = time.perf_counter()
    loop(inputs[r], weights).block_until_ready()
    times[r].append((time.perf_counter() - start) / STEPS * 1e3)
one = np.median(times[1])
print(f"jax {jax.__version__}, {jax.devices()[0].platform}, "
      f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
for r in rows:
  print(f"{r} rows: {np.median(times[r]):.3f} ms per step, "
        f"{np.median(times[r]) / one:.2f}x one row")
