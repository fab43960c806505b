"""LLaMA-style checkpoints in the Hugging Face layout: LLaMA (Touvron et al.
2023), Mistral (Jiang et al. 2023), Qwen2 (Yang et al. 2024) and Qwen3
(Yang et al. 2025), and the diffusion LMs built on the Qwen layouts: Dream
(Ye et al. 2025, Qwen2.5), SDAR (Cheng et al. 2025, Qwen3) and Fast-dLLM v2
(Wu et al. 2025, Qwen2.5).

`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` and
`Qwen3ForCausalLM` map onto a `TransformerConfig` with RMSNorm (eps from
`rms_norm_eps`), RoPE (base `rope_theta`, scaling from the RoPE block; HF's
`rotate_half` pairs dimension j with j + Dh/2 within a head, our half-split
`rope.rotary`), SwiGLU, GQA (`num_key_value_heads`) and an untied LM head
(tied when `tie_word_embeddings`, then unscaled). Mistral adds a sliding
window (`sliding_window`), Qwen2 biases on the query, key and value
projections (`qkv_bias`) and optionally a window, Qwen3 a per-head RMSNorm
of the queries and keys before RoPE (`qk_norm`) and no biases:

  model.embed_tokens.weight [V, D]                 embedding
  model.layers.{i}.input_layernorm.weight          block_i/attention_norm/scale
  model.layers.{i}.self_attn.{q,k,v}_proj.weight   query, key, value kernels
                                                   (Linear [out, in])
  model.layers.{i}.self_attn.{q,k,v}_proj.bias     their biases (Qwen2; LLaMA
                                                   with attention_bias)
  model.layers.{i}.self_attn.{q,k}_norm.weight     attention/query_norm,
                                                   key_norm scales [Dh] (Qwen3)
  model.layers.{i}.self_attn.o_proj.weight         block_i/attention/out
  model.layers.{i}.post_attention_layernorm.weight block_i/mlp_norm/scale
  model.layers.{i}.mlp.{up,gate,down}_proj.weight  block_i/mlp/wi, wi_gate, wo
  model.norm.weight                                final_norm/scale
  lm_head.weight [V, D]                            lm_head/kernel

Buffers `...rotary_emb.inv_freq` that some transformers versions saved are
skipped once checked against the config's RoPE. A tied checkpoint may hold
the embedding, the head, or both (equal).

The diffusion LMs keep their parent's tensors and change how the model is
run; the importer reads that from `model_type` and the config:

  model_type      layout  attention                     token shift  MASK id
  Dream           Qwen2   bidirectional                 yes          mask_token_id
                                                                     (151666)
  sdar            Qwen3   block-causal, block_size      no           mask_token_id
                                                                     (151669)
  Fast_dLLM_Qwen  Qwen2   block-causal, bd_size (sub-   yes          151665 (its
                          blocks of 8 in its sampler)                sampler's)

(token shift: the logits at position i predict token i + 1.) These ids and
the end-of-text ids (`eos_token_id`) are the checkpoint's generation
`Conventions` (`conventions_from_hf`), which a loaded `Model` carries.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from lm_decoding.checkpoints import layout as layout_lib
from lm_decoding.checkpoints import options
from lm_decoding.checkpoints.hf_rope import rope_from_hf
from lm_decoding.models import rope
from lm_decoding.models.binding import Conventions
from lm_decoding.models.config import TransformerConfig


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
_QWEN2 = {**_SHARED, **{name: options.READ for name in (
    "use_sliding_window", "sliding_window", "max_window_layers",
    "layer_types")}}
# Qwen3's attention_bias puts biases on o_proj too, which no switch here
# represents without the MLP's.
_QWEN3 = {**_QWEN2, "attention_bias": (False,)}
# SDAR's training and kernel switches: no effect on the forward pass.
_SDAR_TRAINING = {name: options.IGNORED for name in (
    "attn_implementation", "debug", "ep_size", "fuse_cross_entropy",
    "micro_forward", "skip_checkpoint", "use_deepep")}
# The LLaMA-style columns of the importer table (lm_decoding/checkpoints).
OPTIONS = {
    "llama": {**_SHARED, "attention_bias": options.READ,
              "mlp_bias": options.READ},
    "mistral": {**_SHARED, "sliding_window": options.READ},
    "qwen2": _QWEN2,
    "qwen3": _QWEN3,
    "Dream": {**_QWEN2, "mask_token_id": options.READ},
    "sdar": {**_QWEN3, **_SDAR_TRAINING, "block_size": options.READ,
             "mask_token_id": options.READ},
    "Fast_dLLM_Qwen": {**_QWEN2, "bd_size": options.READ,
                       "mask_token_id": options.READ},
}
FAMILY = {"llama": "LLaMA", "mistral": "Mistral", "qwen2": "Qwen2",
          "qwen3": "Qwen3", "Dream": "Dream", "sdar": "SDAR",
          "Fast_dLLM_Qwen": "Fast-dLLM v2"}
# model_type -> the Qwen layout it keeps (for windows, biases, q/k norm).
_PARENT = {"Dream": "qwen2", "Fast_dLLM_Qwen": "qwen2", "sdar": "qwen3"}
# The diffusion LMs' MASK ids when the config does not say (their own
# configuration and sampler defaults), and Fast-dLLM v2's sub-block.
DEFAULT_MASK_ID = {"Dream": 151666, "sdar": 151669, "Fast_dLLM_Qwen": 151665}
FAST_DLLM_SUB_BLOCK = 8

def _window(hf: dict, model_type: str, family: str) -> int:
  """The sliding window every layer uses (0: none).

  Mistral: `sliding_window` (None: none). Qwen2 and Qwen3 (and the
  diffusion LMs on them, by their parent's `model_type`): the layers' types
  (`layer_types`, else `use_sliding_window` with `max_window_layers`: layers
  from that index on slide), all sliding or none.

  Raises:
    ValueError: some layers sliding and others not (named: layer_types or
      max_window_layers), or a sliding layer without a window.
  """
  if model_type == "mistral":
    return int(hf.get("sliding_window") or 0)
  if model_type not in ("qwen2", "qwen3"):
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


def _count(hf: Mapping[str, Any], name: str, family: str) -> int:
  """A config option that must be an int >= 1 (a block length)."""
  value = hf.get(name)
  if not isinstance(value, int) or value < 1:
    raise ValueError(f"{family} config option {name}={value!r} must be an "
                     f"int >= 1")
  return value


def _generation(hf: Mapping[str, Any], model_type: str,
                family: str) -> dict:
  """The attention pattern and token shift of a diffusion LM (the table in
  the module docstring); {} for an AR family."""
  if model_type == "Dream":
    return dict(attention="bidirectional", token_shift=True)
  if model_type == "sdar":
    return dict(attention="block_causal",
                block_length=_count(hf, "block_size", family))
  if model_type == "Fast_dLLM_Qwen":
    block = _count(hf, "bd_size", family)
    if block % FAST_DLLM_SUB_BLOCK:
      raise ValueError(f"{family} config option bd_size={block} must be a "
                       f"multiple of its sampler's sub-block "
                       f"({FAST_DLLM_SUB_BLOCK})")
    return dict(attention="block_causal", block_length=block,
                token_shift=True)
  return {}


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """The `TransformerConfig` of a LLaMA-style config (or its dict).

  Args:
    hf_config: a LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config
      or its `to_dict()` (a `config.json`), or the `config.json` of Dream,
      SDAR or Fast-dLLM v2; `model_type` picks the column of the table in
      `lm_decoding.checkpoints` (absent: 'llama'). Dream comes out
      bidirectional with token shift, SDAR block-causal with its
      `block_size`, Fast-dLLM v2 block-causal with its `bd_size` and token
      shift (the module docstring).
    **overrides: fields in `options.OVERRIDES`, e.g.
      attention='bidirectional' or 'block_causal' with block_length, dtype.
  Raises:
    ValueError: an option the model does not represent, named (the table:
      an activation other than SiLU, a RoPE kind other than linear, llama3
      or yarn, LLaMA biases on attention but not the MLP or the reverse,
      Qwen3 attention biases, sliding windows on some layers only, a block
      length that is not an int >= 1, an unknown option), or an override
      not in `options.OVERRIDES`; before any tensor is read.
  """
  hf = layout_lib.hf_fields(hf_config)
  model_type = layout_lib.check_model_type(hf, tuple(OPTIONS), "LLaMA-style")
  family = FAMILY[model_type]
  options.check(hf, OPTIONS[model_type], family)
  attention_bias = hf.get("attention_bias", False)
  if model_type == "llama" and attention_bias != hf.get("mlp_bias", False):
    raise ValueError(f"{family} config options attention_bias="
                     f"{attention_bias} and mlp_bias={hf.get('mlp_bias')} "
                     f"must be equal (one use_bias switch covers both)")
  parent = _PARENT.get(model_type, model_type)
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
      scale_embeddings=False, use_bias=model_type == "llama" and bool(
          attention_bias),
      qkv_bias=parent == "qwen2", qk_norm=parent == "qwen3",
      norm_eps=hf.get("rms_norm_eps", 1e-6), rope_base=theta,
      rope_scaling=scaling,
      sliding_window=_window(hf, parent, family),
      **_generation(hf, model_type, family))
  return TransformerConfig(**options.overridden(fields, overrides, family))


def conventions_from_hf(hf_config: Any) -> Conventions:
  """The checkpoint's generation ids (`models.binding.Conventions`).

  MASK: `mask_token_id`, else the family's default (`DEFAULT_MASK_ID`),
  None for an AR family; EOS: `eos_token_id` (Fast-dLLM v2 adds its
  sampler's stop id, '<|im_end|>' 151645, when the vocabulary has it);
  PAD: `pad_token_id`, else None (a row is filled with its first EOS id);
  Fast-dLLM v2's sub-block of 8. The attention pattern and token shift are
  the config's (`config_from_hf`).

  Raises:
    ValueError: no eos_token_id (a row could never end), or a model_type
      no column reads.
  """
  hf = layout_lib.hf_fields(hf_config)
  model_type = layout_lib.check_model_type(hf, tuple(OPTIONS), "LLaMA-style")
  eos = layout_lib.eos_ids(hf, FAMILY[model_type])
  if model_type == "Fast_dLLM_Qwen" and hf["vocab_size"] > 151645:
    eos = tuple(dict.fromkeys(eos + (151645,)))
  mask = hf.get("mask_token_id", DEFAULT_MASK_ID.get(model_type))
  return Conventions(
      mask_id=mask, eos_ids=eos, pad_id=hf.get("pad_token_id"),
      sub_block_length=(FAST_DLLM_SUB_BLOCK
                        if model_type == "Fast_dLLM_Qwen" else 0))


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
    if config.qk_norm:
      tensors += [T(f"{hf}.self_attn.{proj}_norm.weight",
                    ((attn + (name, "scale"), (dh,)),))
                  for proj, name in (("q", "query_norm"), ("k", "key_norm"))]
    tensors += linear(f"{hf}.self_attn.o_proj", attn + ("out",), (h, dh),
                      (d,))
    tensors += [T(f"{hf}.post_attention_layernorm.weight",
                  ((ours + ("mlp_norm", "scale"), (d,)),))]
    tensors += linear(f"{hf}.mlp.gate_proj", mlp + ("wi_gate",), (d,), (m,))
    tensors += linear(f"{hf}.mlp.up_proj", mlp + ("wi",), (d,), (m,))
    tensors += linear(f"{hf}.mlp.down_proj", mlp + ("wo",), (m,), (d,))
  tensors.append(T("model.norm.weight", ((("final_norm", "scale"), (d,)),)))
  head, tied = layout_lib.lm_head(config, "lm_head.weight",
                                  "model.embed_tokens.weight")
  tensors += head
  return layout_lib.Layout(
      "LLaMA", tuple(tensors), tied,
      ignored=r"(^|\.)rotary_emb\.inv_freq$",
      check_ignored=_check_inv_freq(config))


def params_from_hf(source: Any, config: TransformerConfig) -> dict:
  """Our parameters from a LLaMA-style checkpoint (`source`: `.safetensors`
  path(s) or `LlamaForCausalLM.state_dict()`; `config`: `config_from_hf`'s),
  as `hf_gpt2.params_from_hf` does for GPT-2; the same errors."""
  return layout_lib.params_from_state_dict(layout(config), source, config)


def params_to_hf(params: Any, config: TransformerConfig) -> dict:
  """The `LlamaForCausalLM` state dict (numpy arrays) of our parameters."""
  return layout_lib.state_dict_from_params(layout(config), params, config)
