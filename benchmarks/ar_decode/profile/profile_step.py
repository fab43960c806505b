r"""Where one cached AR decode step's time goes, per compiled op kind.

  python benchmarks/ar_decode/profile/profile_step.py \
      --size=110m --batch=1

benchmark_ar.py's GPT-2-shaped model (float32, greedy, 16 prompt tokens,
128 new), compiled once; one decode traced with `jax.profiler` (perfetto
trace). Each executed op's time is summed per (output shape, op kind) and
divided by the 127 loop steps (the prefill's ops are included, under their
own shapes); printed: the median step time of 3 untraced calls, the top
op groups, and the number of ops per step that copy a cache-sized array
(the KV-cache copies of `NOTES.md`) and their time.
"""

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "experiments"))
import benchmark_ar  # experiments/benchmark_ar.py
from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models.transformer import make_logits_fn

_SIZE = flags.DEFINE_enum("size", "110m", list(benchmark_ar.SIZES), "Model.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows B.")
_TOP = flags.DEFINE_integer("top", 12, "Op groups printed.")
PROMPT, NEW = 16, 128


def main(_):
  family = benchmark_ar.FAMILIES["gpt2"]
  hf = benchmark_ar._hf_model("gpt2", benchmark_ar.SIZES[_SIZE.value],
                              PROMPT + NEW)
  config = family.config_from_hf(hf.config)
  params = jax.tree.map(jnp.asarray,
                        family.params_from_hf(hf.state_dict(), config))
  decoder = base.make_decoder("ar", output_length=NEW, eos_ids=(),
                              sampling=SamplingConfig(temperature=0.0))
  logits_fn = make_logits_fn(config)
  batch = _BATCH.value
  prompts = jnp.asarray(np.random.RandomState(0).randint(
      5, config.vocab_size, (batch, PROMPT)))
  lengths = jnp.full((batch,), PROMPT, jnp.int32)
  compiled = jax.jit(lambda p, x, n: decoder.decode(
      base.bind(logits_fn, p), x, n, None).tokens).lower(
          params, prompts, lengths).compile()
  hlo = compiled.as_text()
  run = lambda: compiled(params, prompts, lengths).block_until_ready()
  run()
  times = []
  for _ in range(3):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    run()
    jax.profiler.stop_trace()
    path, = glob.glob(f"{trace_dir}/plugins/profile/*/perfetto_trace.json.gz")
    events = json.load(gzip.open(path))["traceEvents"]
  # Executed op name -> (output shape, op kind), from the compiled HLO.
  kinds = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
      r"\n\s*(?:ROOT )?%(\S+) = (\S+?)\{[^}]*\} (\w[\w-]*)\(", hlo)}
  totals = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e["name"] in kinds:
      totals[kinds[e["name"]]] += e["dur"] / 1e3 / (NEW - 1)
  # Executed ops that copy a cache-sized array (any layout, the size-1
  # batch axis dropped or not): per step, and their time.
  cache_size = batch * config.num_kv_heads * (PROMPT + NEW) * config.head_dim
  size = lambda shape: np.prod([int(d) for d in re.findall(
      r"\d+", shape.partition("[")[2])])
  copies = [e for e in events if e.get("ph") == "X" and e["name"] in kinds
            and "copy" in e["name"] and size(kinds[e["name"]][0]) == cache_size]
  copies_ms = sum(e["dur"] for e in copies) / 1e3 / (NEW - 1)
  print(f"{_SIZE.value}, B = {batch}: {np.median(times) / NEW * 1e3:.2f} "
        f"ms/step (median of 3, untraced); jax {jax.__version__}")
  print(f"cache-sized copies per step: {len(copies) / (NEW - 1):.0f}, "
        f"{copies_ms:.3f} ms")
  print("| ms/step | output shape | op |")
  print("|---|---|---|")
  for (shape, kind), ms in totals.most_common(_TOP.value):
    print(f"| {ms:.3f} | {shape} | {kind} |")


if __name__ == "__main__":
  app.run(main)
