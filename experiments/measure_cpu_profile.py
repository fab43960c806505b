r"""Measures this machine's `HardwareProfile` for the cost model.

  python experiments/measure_cpu_profile.py

Writes experiments/results/cpu_profile.json (`cost_model.load_profile("cpu")`
reads it):
  peak_flops: float32 matmul, jnp.dot of two 2048 x 2048 matrices
    (2 x 2048^3 FLOPs over the median time);
  bandwidth: a jitted sum over a 1 GiB float32 array (`cost.measure_bandwidth`);
  step_overhead_s: a jitted `lax.scan` of --scan_steps trips whose body is a
    tiny step (an 8 x 8 matmul and a tanh): the median time over the number of trips.
Medians of --runs timed calls; other jobs share this machine, so the figures
move by +-15% from run to run.
"""

import datetime
import functools
import json
import os
import platform

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model

_OUT = flags.DEFINE_string("out", cost_model.CPU_PROFILE_PATH,
                           "Where to write the profile (JSON).")
_MATMUL = flags.DEFINE_integer("matmul_size", 2048, "Square matmul size.")
_BYTES = flags.DEFINE_integer("bandwidth_bytes", 1 << 30,
                              "Bytes summed for the bandwidth.")
_SCAN_STEPS = flags.DEFINE_integer("scan_steps", 10000,
                                   "Trips of the overhead scan.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed runs per figure.")


def _tiny_scan(x_8x8, steps):
  def body(carry_8x8, _):  # a dot and an elementwise op: two kernels a trip
    return jnp.tanh(carry_8x8 @ x_8x8), None
  return jax.lax.scan(body, x_8x8, None, length=steps)[0]


def measure(matmul_size: int, bandwidth_bytes: int, scan_steps: int,
            runs: int) -> dict:
  """The profile's fields (and the inputs that made them) as a dict."""
  a = jnp.ones((matmul_size, matmul_size), jnp.float32)
  matmul = cost.time_fn(jnp.dot, a, a, runs=runs)
  peak = 2 * matmul_size ** 3 / matmul.median_s
  bandwidth = cost.measure_bandwidth(bandwidth_bytes, runs=runs)
  scan = cost.time_fn(functools.partial(_tiny_scan, steps=scan_steps),
                      jnp.full((8, 8), 0.1, jnp.float32), runs=runs)
  return {
      "name": "cpu",
      "peak_flops": peak,
      "bandwidth": bandwidth,
      "step_overhead_s": scan.median_s / scan_steps,
      "source": (f"measured by experiments/measure_cpu_profile.py on "
                 f"{platform.node() or 'this machine'} "
                 f"({os.cpu_count()} cores, {jax.devices()[0].device_kind}, "
                 f"shared with other jobs), "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"),
      "matmul_size": matmul_size,
      "bandwidth_bytes": bandwidth_bytes,
      "scan_steps": scan_steps,
      "runs": runs,
  }


def main(argv):
  del argv
  profile = measure(_MATMUL.value, _BYTES.value, _SCAN_STEPS.value, _RUNS.value)
  cost_model.HardwareProfile(**{k: profile[k] for k in (
      "name", "peak_flops", "bandwidth", "step_overhead_s", "source")})
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(profile, f, indent=2)
  print(json.dumps(profile, indent=2))
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
