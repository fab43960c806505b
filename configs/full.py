"""The full grid of the main job: 24 decoders x T = 32, 128, 256 x B = 1, 8.

configs/tiny.py's models and data with today's whole comparison grid: every
family at several settings (steps, blocks, caches, orderings), three output
lengths and 5 timed runs. Its one record (experiments/results/full_grid_cpu_2core/:
the 19 decoders of its day at T = 32 and 256) took 21 minutes on 2 idle CPU
cores; the whole of today's grid is not timed in a record. The default grid
(configs/tiny.py) takes each family's strongest setting at T = 256.

Usage:
  python experiments/compare_decoding.py --config=configs/full.py \
      --workdir=/tmp/full_compare
"""

import importlib.util
import pathlib

import ml_collections

_spec = importlib.util.spec_from_file_location(
    "tiny", pathlib.Path(__file__).with_name("tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


def get_config() -> ml_collections.ConfigDict:
  config = tiny.get_config()
  config.compare.output_lengths = (32, 128, 256)
  config.compare.timed_runs = 5
  # The default grid's entries (pinned by tests/test_comparison.py), in
  # order, and the other settings of each family between them.
  (ar_cached, ar_uncached, mdlm_8, uniform_32, llada_margin, threshold_dual,
   maskgit, remdm, bd3lm, speculative, prompt_lookup,
   skeleton, *greedy) = config.compare.decoders
  config.compare.decoders = (
      ar_cached, ar_uncached, mdlm_8,
      "MDLM K={steps} | mdlm | model=mdlm | steps=32",
      "MDLM K={steps} | mdlm | model=mdlm | steps=T",
      "uniform EB K={steps} | uniform_eb | model=uniform | steps=8",
      uniform_32,
      "uniform EB K={steps} block={block_length} cache={kv_cache} | uniform_eb"
      " | model=uniform | steps=64 block_length=32 kv_cache=prefix",
      "LLaDA K={steps} | llada | model=mdlm | steps=32",
      "LLaDA K={steps} block={block_length} | llada | model=mdlm | steps=32 block_length=32",
      "LLaDA K={steps} block={block_length} | llada | model=mdlm | steps=T block_length=32",
      llada_margin,
      "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm"
      " | threshold=0.9 block_length=32 kv_cache=none",
      "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm"
      " | threshold=0.9 block_length=32 kv_cache=prefix",
      threshold_dual,
      "factor f={factor} block={block_length} | factor | model=mdlm | factor=1.0 block_length=32",
      maskgit, remdm, bd3lm, speculative, prompt_lookup, skeleton, *greedy,
  )
  return config
