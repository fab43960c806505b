"""LLaMA-style checkpoints (Touvron et al. 2023) in the Hugging Face layout.

`LlamaForCausalLM` maps onto a `TransformerConfig` with RMSNorm (eps from
`rms_norm_eps`), RoPE (base `rope_theta`; HF's `rotate_half` pairs dimension
j with j + Dh/2 within a head, our half-split `rotary`), SwiGLU, GQA
(`num_key_value_heads`) and an untied LM head (tied when
`tie_word_embeddings`, then unscaled):

  model.embed_tokens.weight [V, D]                 embedding
  model.layers.{i}.input_layernorm.weight          block_i/attention_norm/scale
  model.layers.{i}.self_attn.{q,k,v}_proj.weight   query, key, value kernels
                                                   (Linear [out, in])
  model.layers.{i}.self_attn.o_proj.weight         block_i/attention/out
  model.layers.{i}.post_attention_layernorm.weight block_i/mlp_norm/scale
  model.layers.{i}.mlp.{up,gate,down}_proj.weight  block_i/mlp/wi, wi_gate, wo
  model.norm.weight                                final_norm/scale
  lm_head.weight [V, D]                            lm_head/kernel

The same family with bidirectional attention is the backbone of LLaDA- and
Dream-class masked diffusion LMs: pass `attention='bidirectional'` to
`config_from_hf`.
"""

from __future__ import annotations

from typing import Any

from lm_decoding.checkpoints import layout as layout_lib
from lm_decoding.models.config import TransformerConfig


def _rope_theta(hf: dict) -> float:
  """rope_theta from `rope_parameters` (transformers >= 5) or the older
  `rope_theta` / `rope_scaling` fields.

  Raises:
    ValueError: a RoPE scaling other than the default.
  """
  rope = dict(hf.get("rope_parameters") or {})
  scaling = hf.get("rope_scaling") or {}
  kind = rope.get("rope_type", scaling.get("rope_type", "default"))
  if kind != "default":
    raise ValueError(f"rope_type={kind!r}; only 'default' RoPE is supported")
  return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """The `TransformerConfig` of a `transformers.LlamaConfig` (or its dict).

  Args:
    hf_config: a LlamaConfig or its `to_dict()`.
    **overrides: TransformerConfig fields to change, e.g.
      attention='bidirectional' (a LLaDA/Dream-style denoiser), dtype.
  Raises:
    ValueError: an option our model does not represent (an activation other
      than SiLU, RoPE scaling, biases on attention but not the MLP or the
      reverse).
  """
  hf = layout_lib.hf_fields(hf_config)
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU) "
                     f"is supported")
  attention_bias = hf.get("attention_bias", False)
  if attention_bias != hf.get("mlp_bias", False):
    raise ValueError(f"attention_bias={attention_bias} and mlp_bias="
                     f"{hf.get('mlp_bias', False)} must be equal (one "
                     f"use_bias switch covers both)")
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
      norm_eps=hf.get("rms_norm_eps", 1e-6), rope_base=_rope_theta(hf))
  return TransformerConfig(**{**fields, **overrides})


def layout(config: TransformerConfig) -> layout_lib.Layout:
  """The LLaMA tensors of `config` (see the module docstring)."""
  T = layout_lib.Tensor
  d, h, hkv, dh, m = (config.d_model, config.num_heads, config.num_kv_heads,
                      config.head_dim, config.mlp_dim)
  bias = config.use_bias

  def linear(hf, ours, in_shape, out_shape):
    """A torch Linear: weight [out, in] (+ bias [out] when use_bias)."""
    rules = [T(f"{hf}.weight", ((ours + ("kernel",), in_shape + out_shape),),
               len(in_shape), transpose=True)]
    if bias:
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
                        out_shape)
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
  return layout_lib.Layout("LLaMA", tuple(tensors), tied)


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
