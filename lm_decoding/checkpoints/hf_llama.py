"""LLaMA-style checkpoints in the Hugging Face layout: LLaMA (Touvron et al.
2023), Mistral (Jiang et al. 2023) and Qwen2 (Yang et al. 2024).

`LlamaForCausalLM`, `MistralForCausalLM` and `Qwen2ForCausalLM` map onto a
`TransformerConfig` with RMSNorm (eps from `rms_norm_eps`), RoPE (base
`rope_theta`, scaling from the RoPE block; HF's `rotate_half` pairs
dimension j with j + Dh/2 within a head, our half-split `rope.rotary`),
SwiGLU, GQA (`num_key_value_heads`) and an untied LM head (tied when
`tie_word_embeddings`, then unscaled). Mistral adds a sliding window
(`sliding_window`), Qwen2 biases on the query, key and value projections
(`qkv_bias`) and optionally a window:

  model.embed_tokens.weight [V, D]                 embedding
  model.layers.{i}.input_layernorm.weight          block_i/attention_norm/scale
  model.layers.{i}.self_attn.{q,k,v}_proj.weight   query, key, value kernels
                                                   (Linear [out, in])
  model.layers.{i}.self_attn.{q,k,v}_proj.bias     their biases (Qwen2; LLaMA
                                                   with attention_bias)
  model.layers.{i}.self_attn.o_proj.weight         block_i/attention/out
  model.layers.{i}.post_attention_layernorm.weight block_i/mlp_norm/scale
  model.layers.{i}.mlp.{up,gate,down}_proj.weight  block_i/mlp/wi, wi_gate, wo
  model.norm.weight                                final_norm/scale
  lm_head.weight [V, D]                            lm_head/kernel

Buffers `...rotary_emb.inv_freq` that some transformers versions saved are
skipped once checked against the config's RoPE. A tied checkpoint may hold
the embedding, the head, or both (equal).

The same families with bidirectional attention are the backbones of masked
diffusion LMs: LLaDA (LLaMA-style) and Dream (Qwen2.5): pass
`attention='bidirectional'` to `config_from_hf`.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from lm_decoding.checkpoints import layout as layout_lib
from lm_decoding.checkpoints import options
from lm_decoding.models import rope
from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.rope import RopeScaling


_SHARED = {
    **{name: options.READ for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim",
        "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
        "rope_parameters", "rope_scaling", "rope_theta",
        "original_max_position_embeddings")},
    "hidden_act": ("silu",),
    "partial_rotary_factor": (None, 1.0),
    "attention_dropout": options.IGNORED,
    # Slices the matmuls during pre-training; the same products.
    "pretraining_tp": options.IGNORED,
}
# The LLaMA-style columns of the importer table (lm_decoding/checkpoints).
OPTIONS = {
    "llama": {**_SHARED, "attention_bias": options.READ,
              "mlp_bias": options.READ},
    "mistral": {**_SHARED, "sliding_window": options.READ},
    "qwen2": {**_SHARED, "use_sliding_window": options.READ,
              "sliding_window": options.READ,
              "max_window_layers": options.READ,
              "layer_types": options.READ},
}
FAMILY = {"llama": "LLaMA", "mistral": "Mistral", "qwen2": "Qwen2"}
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
  fields = dict(kind=kind, factor=float(factor))
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
  return theta, RopeScaling(**fields)


def _window(hf: dict, model_type: str, family: str) -> int:
  """The sliding window every layer uses (0: none).

  Mistral: `sliding_window` (None: none). Qwen2: the layers' types
  (`layer_types`, else `use_sliding_window` with `max_window_layers`: layers
  from that index on slide), all sliding or none.

  Raises:
    ValueError: some layers sliding and others not (named: layer_types or
      max_window_layers), or a sliding layer without a window.
  """
  if model_type == "mistral":
    return int(hf.get("sliding_window") or 0)
  if model_type != "qwen2":
    return 0
  layers = hf["num_hidden_layers"]
  window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
  types = hf.get("layer_types")
  if types is None:
    first = hf.get("max_window_layers", 28)
    types = ["sliding_attention" if window is not None and i >= first
             else "full_attention" for i in range(layers)]
    source = f"max_window_layers={first}"
  else:
    source = "layer_types"
  unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
  if unknown or len(types) != layers:
    raise ValueError(f"{family} config option layer_types={types!r} must "
                     f"list 'sliding_attention'/'full_attention' for each of "
                     f"the {layers} layers")
  if len(set(types)) > 1:
    raise ValueError(f"{family} config option {source} makes some layers "
                     f"sliding-window and others full; one attention for "
                     f"every layer is supported")
  if types[0] == "full_attention":
    return 0
  if not window:
    raise ValueError(f"{family} layers are 'sliding_attention' but "
                     f"sliding_window={hf.get('sliding_window')!r} with "
                     f"use_sliding_window={hf.get('use_sliding_window')!r}")
  return int(window)


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """The `TransformerConfig` of a LLaMA, Mistral or Qwen2 config (or dict).

  Args:
    hf_config: a LlamaConfig / MistralConfig / Qwen2Config or its
      `to_dict()` (a `config.json`); `model_type` picks the column of the
      table in `lm_decoding.checkpoints` (absent: 'llama').
    **overrides: fields in `options.OVERRIDES`, e.g.
      attention='bidirectional' (LLaDA, Dream) or 'block_causal' with
      block_length, dtype.
  Raises:
    ValueError: an option the model does not represent, named (the table:
      an activation other than SiLU, a RoPE kind other than linear, llama3
      or yarn, LLaMA biases on attention but not the MLP or the reverse,
      sliding windows on some layers only, an unknown option), or an
      override not in `options.OVERRIDES`; before any tensor is read.
  """
  hf = layout_lib.hf_fields(hf_config)
  model_type = layout_lib.check_model_type(hf, tuple(OPTIONS), "LLaMA-style")
  family = FAMILY[model_type]
  options.check(hf, OPTIONS[model_type], family)
  attention_bias = hf.get("attention_bias", False)
  if attention_bias != hf.get("mlp_bias", False):
    raise ValueError(f"{family} config options attention_bias="
                     f"{attention_bias} and mlp_bias={hf.get('mlp_bias')} "
                     f"must be equal (one use_bias switch covers both)")
  theta, scaling = rope_from_hf(hf, family)
  heads = hf["num_attention_heads"]
  fields = dict(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      mlp_dim=hf["intermediate_size"],
      max_len=hf.get("max_position_embeddings", 2048), norm="rmsnorm",
      positional="rope", mlp_activation="swiglu",
      tie_embeddings=hf.get("tie_word_embeddings", False),
      scale_embeddings=False, use_bias=attention_bias,
      qkv_bias=model_type == "qwen2",
      norm_eps=hf.get("rms_norm_eps", 1e-6), rope_base=theta,
      rope_scaling=scaling,
      sliding_window=_window(hf, model_type, family))
  return TransformerConfig(**options.overridden(fields, overrides, family))


def _check_inv_freq(config: TransformerConfig):
  """A `Layout.check_ignored` for RoPE `inv_freq` buffers: they must be the
  frequencies `config` rotates with (rope_base, rope_scaling)."""
  expected = np.asarray(rope.inverse_frequencies(
      config.head_dim, config.rope_base, config.rope_scaling))

  def check(name: str, value: np.ndarray) -> None:
    if value.shape != expected.shape or not np.allclose(
        value, expected, rtol=1e-5, atol=0):
      raise ValueError(f"buffer {name!r} holds RoPE frequencies that differ "
                       f"from the config's (rope_theta={config.rope_base}, "
                       f"rope_scaling={config.rope_scaling})")
  return check


def layout(config: TransformerConfig) -> layout_lib.Layout:
  """The LLaMA tensors of `config` (see the module docstring)."""
  T = layout_lib.Tensor
  d, h, hkv, dh, m = (config.d_model, config.num_heads, config.num_kv_heads,
                      config.head_dim, config.mlp_dim)
  bias = config.use_bias

  def linear(hf, ours, in_shape, out_shape, with_bias=bias):
    """A torch Linear: weight [out, in] (+ bias [out] with_bias)."""
    rules = [T(f"{hf}.weight", ((ours + ("kernel",), in_shape + out_shape),),
               len(in_shape), transpose=True)]
    if with_bias:
      rules.append(T(f"{hf}.bias", ((ours + ("bias",), out_shape),)))
    return rules

  tensors = [T("model.embed_tokens.weight",
               ((("embedding",), (config.vocab_size, d)),), 1)]
  for i in range(config.num_layers):
    hf, ours = f"model.layers.{i}", (f"block_{i}",)
    attn, mlp = ours + ("attention",), ours + ("mlp",)
    tensors += [T(f"{hf}.input_layernorm.weight",
                  ((ours + ("attention_norm", "scale"), (d,)),))]
    for proj, name, out_shape in (("q", "query", (h, dh)),
                                  ("k", "key", (hkv, dh)),
                                  ("v", "value", (hkv, dh))):
      tensors += linear(f"{hf}.self_attn.{proj}_proj", attn + (name,), (d,),
                        out_shape, bias or config.qkv_bias)
    tensors += linear(f"{hf}.self_attn.o_proj", attn + ("out",), (h, dh),
                      (d,))
    tensors += [T(f"{hf}.post_attention_layernorm.weight",
                  ((ours + ("mlp_norm", "scale"), (d,)),))]
    tensors += linear(f"{hf}.mlp.gate_proj", mlp + ("wi_gate",), (d,), (m,))
    tensors += linear(f"{hf}.mlp.up_proj", mlp + ("wi",), (d,), (m,))
    tensors += linear(f"{hf}.mlp.down_proj", mlp + ("wo",), (m,), (d,))
  tensors.append(T("model.norm.weight", ((("final_norm", "scale"), (d,)),)))
  tied = {}
  if config.tie_embeddings:
    tied = {"lm_head.weight": "model.embed_tokens.weight"}
  else:
    tensors.append(T("lm_head.weight",
                     ((("lm_head", "kernel"), (d, config.vocab_size)),), 1,
                     transpose=True))
  return layout_lib.Layout(
      "LLaMA", tuple(tensors), tied,
      ignored=r"(^|\.)rotary_emb\.inv_freq$",
      check_ignored=_check_inv_freq(config))


def params_from_hf(source: Any, config: TransformerConfig) -> dict:
  """Our parameters from a LLaMA-style checkpoint.

  Args:
    source: a `.safetensors` path (or several), or a state dict of numpy
      arrays / torch tensors (`LlamaForCausalLM.state_dict()`).
    config: from `config_from_hf` (possibly with overrides).
  Returns:
    The parameter tree of `Transformer(config)`, numpy, config.param_dtype.
  Raises:
    ValueError: see `layout.params_from_state_dict` (a missing, misshapen or
      unexpected tensor, named with its expected shape).
  """
  return layout_lib.params_from_state_dict(layout(config), source, config)


def params_to_hf(params: Any, config: TransformerConfig) -> dict:
  """The `LlamaForCausalLM` state dict (numpy arrays) of our parameters."""
  return layout_lib.state_dict_from_params(layout(config), params, config)
