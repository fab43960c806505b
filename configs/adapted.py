"""The diffusion models adapted from the AR member, decoded beside it.

The grid compares cached AR with the members adapted from it
(`member_recipes.ADAPTED_MEMBERS`, docs/adaptation.md) and with their
from-scratch counterparts: BD3-LM blocks of 4 with the reference sampler
(K = T) and with Fast-dLLM v2's threshold commits at three tau, blocks of 16
with threshold commits, alone and in sub-blocks of 4 without and with
Fast-dLLM v2's sub-block cache, and the adapted full-sequence MDLM with
Fast-dLLM threshold decoding. T = 256, B = 1 and 8, 3 timed runs.

`configs/adapted.py` (the default, `:tiny`) uses configs/tiny.py's models and
set; `configs/adapted.py:base` uses configs/base.py's and keeps its whole grid
(every family at its main settings), so that the report's quality-cost
frontier holds every decoder of the base set, adapted ones included.

Usage:
  python experiments/compare_decoding.py --config=configs/adapted.py:base \
      --workdir=/tmp/adapted_compare
"""


import ml_collections

from lm_decoding.config_reference import load_sized



def adapted_decoders() -> tuple[str, ...]:
  """The adapted members' rows (one entry string per decoder setting)."""
  block4 = ("{label} | bd3lm | model=bd3lm4_from_ar | block_length=4 "
            "steps=T {options}")
  return (
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
      *("BD3-LM from AR {remasking} tau={threshold} block={block_length}"
        " sub={sub_block_length} cache={kv_cache} K={steps} | bd3lm"
        " | model=bd3lm16_from_ar | block_length=16 steps=T"
        f" remasking=threshold threshold=0.9 sub_block_length=4 kv_cache={c}"
        for c in ("prefix", "dual")),
      "MDLM from AR threshold tau={threshold} block={block_length}"
      " cache={kv_cache} | threshold | model=mdlm_from_ar | threshold=0.9"
      " block_length=32 kv_cache=dual",
  )


def get_config(size: str = "tiny") -> ml_collections.ConfigDict:
  config = load_sized(__file__, size)
  if size == "tiny":
    config.compare.decoders = (
        "AR cached | ar | model=ar",
        "AR greedy temp={temperature} | ar | model=ar | temperature=0",
        "BD3-LM block={block_length} K={steps} | bd3lm | model=bd3lm"
        " | block_length=16 steps=T",
        "threshold tau={threshold} block={block_length} cache={kv_cache}"
        " | threshold | model=mdlm | threshold=0.9 block_length=32"
        " kv_cache=dual",
        *adapted_decoders(),
    )
  else:
    config.compare.decoders = (*config.compare.decoders, *adapted_decoders())
  config.compare.output_lengths = (256,)
  return config
