"""The RoPE block of a Hugging Face config, read into our `RopeScaling`.

LLaMA-style configs (`hf_llama`) spell it `rope_parameters` (transformers
>= 5) or `rope_scaling` (older files), its kind `rope_type` or `type`, and
keep theta in the block or at the top level; the kinds are transformers'
default, dynamic (NTK), linear, llama3 and yarn (Peng et al. 2023).
"""
from __future__ import annotations

from typing import Mapping

from lm_decoding.models import rope
from lm_decoding.models.rope import RopeScaling

# rope_type -> the keys of its block (besides rope_type/type, rope_theta).
_ROPE_KEYS = {
    "default": (),
    "dynamic": ("factor",),
    "linear": ("factor",),
    "llama3": ("factor", "original_max_position_embeddings",
               "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast",
             "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
             "truncate"),
}


def rope_from_hf(hf: dict, family: str) -> tuple[float, RopeScaling | None]:
  """(rope_theta, scaling) from the config's RoPE block, in any spelling.

  The block is `rope_parameters` (transformers >= 5) or `rope_scaling`
  (older files; preferred when both are set, as transformers does); its kind
  is `rope_type` or the older `type`; theta is in the block or top-level
  `rope_theta` (default 10000). llama3 and yarn read
  original_max_position_embeddings from the block, else the top level,
  else max_position_embeddings; a yarn factor of None is max_position_
  embeddings / original; a yarn attention_factor of None comes from mscale
  and mscale_all_dim when both are set (ratio of 0.1 m ln(factor) + 1).
  'dynamic' (dynamic NTK) reads as no scaling: transformers changes the
  frequencies only for calls longer than max_position_embeddings, which is
  the imported model's max_len (the longest sequence it runs).

  Raises:
    ValueError: a kind not in default/dynamic/linear/llama3/yarn (longrope
      named), a key its kind does not use, a partial rotary factor other
      than 1, or per-layer-type blocks; each named.
  """
  kind, theta, block = _rope_block(hf, family)
  if kind in ("default", "dynamic"):
    # Dynamic NTK (transformers' "dynamic") rescales only calls longer than
    # max_position_embeddings, our max_len: up to it, the default RoPE.
    return theta, None
  max_len = hf.get("max_position_embeddings", 2048)
  context = int(block.get("original_max_position_embeddings")
                or hf.get("original_max_position_embeddings") or max_len)
  factor = block.get("factor")
  if factor is None and kind == "yarn":
    factor = max_len / context
  if factor is None:
    raise ValueError(f"{family} RoPE rope_type={kind!r} needs a factor")
  return theta, RopeScaling(kind=kind, factor=float(factor),
                            **_kind_fields(kind, block, factor, context,
                                           family))


def _kind_fields(kind: str, block: dict, factor: float, context: int,
                 family: str) -> dict:
  """The `RopeScaling` fields of a llama3 or yarn block beyond kind and
  factor, `context` its original_max_len ({} for linear).

  Raises:
    ValueError: a llama3 block without its two frequency factors.
  """
  fields = {}
  if kind == "llama3":
    missing = [k for k in ("low_freq_factor", "high_freq_factor")
               if block.get(k) is None]
    if missing:
      raise ValueError(f"{family} RoPE rope_type='llama3' needs {missing}")
    fields.update(original_max_len=context,
                  low_freq_factor=float(block["low_freq_factor"]),
                  high_freq_factor=float(block["high_freq_factor"]))
  if kind == "yarn":
    attention = block.get("attention_factor")
    mscale, mscale_all = block.get("mscale"), block.get("mscale_all_dim")
    if attention is None and mscale and mscale_all:
      attention = (rope.yarn_magnitude(factor, mscale)
                   / rope.yarn_magnitude(factor, mscale_all))
    fields.update(original_max_len=context,
                  beta_fast=float(block.get("beta_fast") or 32.0),
                  beta_slow=float(block.get("beta_slow") or 1.0),
                  attention_factor=attention,
                  truncate=bool(block.get("truncate", True)))
  return fields


def _rope_block(hf: dict, family: str) -> tuple[str, float, dict]:
  """(kind, theta, the block's other keys) of the config's RoPE block, its
  spellings unified (`rope_from_hf`).

  Raises:
    ValueError: as `rope_from_hf` says, but for a missing factor.
  """
  block = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
  if any(isinstance(v, Mapping) for v in block.values()):
    raise ValueError(f"{family} config option rope_parameters holds one "
                     f"block per layer type ({sorted(block)}); one RoPE for "
                     f"every layer is supported")
  if "type" in block and "rope_type" in block and (
      block["type"] != block["rope_type"]):
    raise ValueError(f"{family} RoPE block has type={block['type']!r} and "
                     f"rope_type={block['rope_type']!r}")
  older_spelling = block.pop("type", None)
  kind = block.pop("rope_type", older_spelling) or "default"
  theta = float(block.pop("rope_theta", hf.get("rope_theta") or 10000.0))
  if block.pop("partial_rotary_factor", 1.0) not in (None, 1.0):
    raise ValueError(f"{family} RoPE partial_rotary_factor must be 1 (every "
                     f"dimension rotated)")
  if kind not in _ROPE_KEYS:
    raise ValueError(f"{family} RoPE rope_type={kind!r} is not supported "
                     f"(supported: {sorted(_ROPE_KEYS)})")
  unknown = sorted(set(block) - set(_ROPE_KEYS[kind]))
  if unknown:
    raise ValueError(f"{family} RoPE rope_type={kind!r} does not use "
                     f"{unknown}; refused rather than ignored")
  return kind, theta, block
