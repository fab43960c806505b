r"""Where a train step's time goes: XLA CPU's per-kernel trace of one step.

  PYTHONPATH=$PWD python benchmarks/training_speed/profile/profile_step.py \
      --objective=ar --num_steps=3 [--xla=xla_cpu_use_xnnpack=false] > out.txt

Builds `train_step.make_train_step` for configs/base.py (random tokens, seed 0),
compiles it ahead of time (with --xla's debug options, if any), runs two
warm-up steps, then traces --num_steps steps with `jax.profiler` (a perfetto
JSON trace) and sums each kernel's wall time over them. Prints the total,
the time by kernel kind (dots, copies/transposes, other fusions), the
top kernels with the shape they write and the JAX op they come from (the
compiled HLO's metadata), and the load average.
"""

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections  # noqa: F401  (configs import it)
import numpy as np

from lm_decoding.training import train
from lm_decoding.training import train_step

_OBJECTIVE = flags.DEFINE_enum("objective", "ar", ["ar", "mdlm", "bd3lm"],
                               "Objective.")
_STEPS = flags.DEFINE_integer("num_steps", 3, "Traced train steps.")
_TOP = flags.DEFINE_integer("top", 25, "Kernels listed.")
_XLA = flags.DEFINE_list("xla", [], "XLA debug options name=value.")
_CONFIG = flags.DEFINE_string("config", "configs/base.py", "Config file.")


def _config():
  import importlib.util
  spec = importlib.util.spec_from_file_location("cfg", _CONFIG.value)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.train.objective = _OBJECTIVE.value
  return config


def _option(text):
  name, value = text.split("=", 1)
  value = {"true": True, "false": False}.get(value.lower(), value)
  return name, value


def _kind(name, hlo_line):
  if name.startswith(("ynn", "xnn", "dot", "onednn")) or " dot(" in hlo_line:
    return "dot"
  if "copy" in name or "transpose" in name:
    return "copy/transpose"
  if "scatter" in name or "gather" in name:
    return "scatter/gather"
  if "reduce" in name:
    return "reduce"
  return "other"


def main(argv):
  del argv
  config = _config()
  model_cfg = train.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  step = train_step.make_train_step(model_cfg, _OBJECTIVE.value, optimizer,
                               config.train.block_length)
  state = train_step.init_state(model_cfg, optimizer, jax.random.key(0))
  tokens = jnp.asarray(np.random.RandomState(0).randint(
      5, config.data.vocab_size,
      (config.train.batch_size, config.data.seq_len)), jnp.int32)
  key = jax.random.key(1)
  compiled = step.lower(state, tokens, key).compile(
      dict(map(_option, _XLA.value)))
  hlo = compiled.as_text()
  lines = {}
  for line in hlo.splitlines():
    match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+)", line)
    if match:
      lines[match.group(1)] = line
  for _ in range(2):
    state, metrics = compiled(state, tokens, key)
  jax.block_until_ready(metrics)
  load = os.getloadavg()
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    for _ in range(_STEPS.value):
      state, metrics = compiled(state, tokens, key)
      jax.block_until_ready(metrics)
    jax.profiler.stop_trace()
    path = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                     recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_kernel = collections.Counter()
  step_us = 0.0
  for e in events:
    if e.get("ph") != "X":
      continue
    if e["name"] == "ThunkExecutor::Execute (wait for completion)":
      step_us += e["dur"]
    elif e["name"] in lines:
      per_kernel[e["name"]] += e["dur"]
  steps = _STEPS.value
  print(f"objective={_OBJECTIVE.value} xla={_XLA.value} "
        f"loss={float(metrics['loss']):.6f} load={load}")
  print(f"step (traced, mean of {steps}): {step_us / steps / 1e3:.1f} ms; "
        f"kernels summed: {sum(per_kernel.values()) / steps / 1e3:.1f} ms "
        "(2 threads: kernels overlap)")
  by_kind = collections.Counter()
  for name, us in per_kernel.items():
    by_kind[_kind(name, lines[name])] += us
  for kind, us in by_kind.most_common():
    print(f"  {kind:16s} {us / steps / 1e3:8.1f} ms")
  print(f"top {_TOP.value} kernels (ms per step, output shape, JAX op):")
  for name, us in per_kernel.most_common(_TOP.value):
    line = lines[name]
    shape = line.split(" = ", 1)[1].split(" ", 1)[0]
    op = re.search(r'op_name="([^"]*)"', line)
    print(f"  {us / steps / 1e3:8.1f}  {name:28s} {shape:28s} "
          f"{op.group(1) if op else ''}")
  print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
  app.run(main)
