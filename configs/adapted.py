"""The diffusion models adapted from the AR member, decoded beside it.

configs/tiny.py's models and data; the grid compares cached AR with the
members adapted from it (`pretrained.ADAPTED_MEMBERS`, docs/adaptation.md)
and with their from-scratch counterparts: BD3-LM blocks of 4 with the
reference sampler (K = T) and with Fast-dLLM v2's threshold commits at three
tau, blocks of 16 with threshold commits, and the adapted full-sequence
MDLM with Fast-dLLM threshold decoding. T = 256, B = 1 and 8, 3 timed runs.
With `--config.compare.pretrained_set=base` the base set (those of its
adapted members that are shipped; the others train first).

Usage:
  python experiments/compare_decoding.py --config=configs/adapted.py \
      --workdir=/tmp/adapted_compare
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
  block4 = ("{label} | bd3lm | model=bd3lm4_from_ar | block_length=4 "
            "steps=T {options}")
  config.compare.decoders = (
      "AR cached | ar | model=ar",
      "BD3-LM block={block_length} K={steps} | bd3lm | model=bd3lm"
      " | block_length=16 steps=T",
      block4.format(label="BD3-LM from AR block={block_length} K={steps}",
                    options=""),
      *(block4.format(
          label=("BD3-LM from AR {remasking} tau={threshold}"
                 " block={block_length} K={steps}"),
          options=f"remasking=threshold threshold={tau}")
        for tau in (0.9, 0.7, 0.5)),
      "BD3-LM from AR {remasking} tau={threshold} block={block_length}"
      " K={steps} | bd3lm"
      " | model=bd3lm16_from_ar | block_length=16 steps=T"
      " remasking=threshold threshold=0.9",
      "threshold tau={threshold} block={block_length} cache={kv_cache}"
      " | threshold | model=mdlm | threshold=0.9 block_length=32"
      " kv_cache=dual",
      "MDLM from AR threshold tau={threshold} block={block_length}"
      " cache={kv_cache} | threshold | model=mdlm_from_ar | threshold=0.9"
      " block_length=32 kv_cache=dual",
  )
  config.compare.output_lengths = (256,)
  return config
