r"""Measures this machine's `HardwareProfile` for the cost model.

  python experiments/measure_cpu_profile.py

Writes experiments/results/cpu_profile.json (`cost_model.load_profile("cpu")`
reads it):
  peak_flops: float32 matmul, jnp.dot of two 2048 x 2048 matrices
    (`cost.measure_peak_flops`; --dtype, e.g. bfloat16 on a GPU);
  bandwidth: a jitted sum over a 1 GiB float32 array (`cost.measure_bandwidth`);
  step_overhead_s: a jitted `lax.scan` of --scan_steps tiny trips
    (`cost.measure_step_overhead`).
Medians of --runs timed calls; other jobs share this machine, so the figures
move by +-15% from run to run. It measures JAX's default device: on a GPU
(experiments/gpu_record.py) give --name, --dtype and larger sizes.
"""

import datetime
import json
import os
import platform

from absl import app
from absl import flags
import jax

from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model
from lm_decoding.evaluation import records

_OUT = flags.DEFINE_string("out", cost_model.CPU_PROFILE_PATH,
                           "Where to write the profile (JSON).")
_MATMUL = flags.DEFINE_integer("matmul_size", 2048, "Square matmul size.")
_BYTES = flags.DEFINE_integer("bandwidth_bytes", 1 << 30,
                              "Bytes summed for the bandwidth.")
_SCAN_STEPS = flags.DEFINE_integer("scan_steps", 10000,
                                   "Trips of the overhead scan.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed runs per figure.")
_NAME = flags.DEFINE_string("name", "cpu", "The profile's name.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Matmul dtype of the peak FLOP/s.")


def measure(matmul_size: int, bandwidth_bytes: int, scan_steps: int,
            runs: int, name: str = "cpu", dtype: str = "float32") -> dict:
  """The profile's fields (and the inputs that made them) as a dict, for
  JAX's default device."""
  device = jax.devices()[0]
  load = [os.getloadavg()[0]]
  fields = {
      "peak_flops": cost.measure_peak_flops(matmul_size, runs, dtype),
      "bandwidth": cost.measure_bandwidth(bandwidth_bytes, runs),
      "step_overhead_s": cost.measure_step_overhead(scan_steps, runs)}
  load.append(os.getloadavg()[0])
  shared = (f"; {cost.load_summary(load)}" if device.platform == "cpu"
            else "")
  return {
      "name": name,
      **fields,
      "source": (f"measured by experiments/measure_cpu_profile.py on "
                 f"{platform.node() or 'this machine'} "
                 f"({os.cpu_count()} cores, {device.device_kind}{shared}), "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"),
      "matmul_size": matmul_size,
      "matmul_dtype": dtype,
      "bandwidth_bytes": bandwidth_bytes,
      "scan_steps": scan_steps,
      "runs": runs,
  }


def main(argv):
  del argv
  profile = measure(_MATMUL.value, _BYTES.value, _SCAN_STEPS.value,
                    _RUNS.value, _NAME.value, _DTYPE.value)
  cost_model.HardwareProfile(**{k: profile[k] for k in (
      "name", "peak_flops", "bandwidth", "step_overhead_s", "source")})
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  print(json.dumps(records.write_json(profile, _OUT.value), indent=2))
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
