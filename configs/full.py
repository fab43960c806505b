"""The full grid of the main job: 19 decoders x T = 32, 128, 256 x B = 1, 8.

configs/tiny.py's models and data with today's whole comparison grid: every
family at several settings (steps, blocks, caches, orderings), three output
lengths and 5 timed runs. About 20-35 minutes on 2 CPU cores; the default
grid (configs/tiny.py) takes each family's strongest setting at T = 256.

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
  config.compare.decoders = (
      "AR cached | ar | model=ar",
      "AR uncached | ar_uncached | model=ar",
      "MDLM K={steps} | mdlm | model=mdlm | steps=8",
      "MDLM K={steps} | mdlm | model=mdlm | steps=32",
      "MDLM K={steps} | mdlm | model=mdlm | steps=T",
      "LLaDA K={steps} | llada | model=mdlm | steps=32",
      "LLaDA K={steps} block={block_length} | llada | model=mdlm | steps=32 block_length=32",
      "LLaDA K={steps} block={block_length} | llada | model=mdlm | steps=T block_length=32",
      "LLaDA {remasking} K={steps} block={block_length} | llada | model=mdlm"
      " | remasking=margin steps=32 block_length=32",
      "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm"
      " | threshold=0.9 block_length=32 kv_cache=none",
      "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm"
      " | threshold=0.9 block_length=32 kv_cache=prefix",
      "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm"
      " | threshold=0.9 block_length=32 kv_cache=dual",
      "factor f={factor} block={block_length} | factor | model=mdlm | factor=1.0 block_length=32",
      "MaskGIT K={steps} | maskgit | model=mdlm | steps=32",
      "ReMDM K={steps} | remdm | model=mdlm | steps=32",
      "BD3-LM block={block_length} K={steps} | bd3lm | model=bd3lm | block_length=16 steps=T",
      "speculative small draft gamma={gamma} | speculative"
      " | target=ar draft=draft_small | gamma=4",
      "prompt lookup gamma={gamma} | prompt_lookup | target=ar | gamma=4",
      "MDLM K={draft_steps} skeleton + AR polish p>={threshold} gamma={gamma}"
      " | skeleton_polish | target=ar draft=mdlm | draft_steps=32 threshold=0.01"
      " gamma=8",
  )
  return config
