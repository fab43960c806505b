"""Import and export of Hugging Face checkpoints: GPT-2 and LLaMA-style
(LLaMA, Mistral, Qwen2).

`config_from_hf(hf_config, **overrides)` picks the family by `model_type`
(`family`); each family module has `config_from_hf`, `params_from_hf(source,
config)` and `params_to_hf(params, config)`; both directions run through one
`layout.Layout` per family. torch and transformers are not needed
(safetensors only to read `.safetensors` files): they are the `[peer]`
extra, used by the parity tests and benchmarks.

The importer table: what each family's `config_from_hf` does with each
config option (`options`: read, ignored, or accepted with the values given;
anything else, and any option not listed, is refused by name before a tensor
is read). Parity with transformers for every row: tests/test_hf_import.py.

  option                    gpt2             llama            mistral          qwen2
  sizes (vocab, width,      read             read             read             read
    layers, heads, kv
    heads, head_dim, mlp)
  max positions             n_positions      max_position_embeddings (max_len)
  norm epsilon              layer_norm_eps.  rms_norm_eps     rms_norm_eps     rms_norm_eps
  activation                gelu_new, gelu_  silu only        silu only        silu only
                            pytorch_tanh
  tie_word_embeddings       read             read             read             read
  biases                    all (fixed)      attention_bias   none             q/k/v (fixed)
                                             == mlp_bias
  RoPE block (rope_         -                default, linear, llama3, yarn read in either spelling
    parameters/rope_scaling,                 (rope_type or type); dynamic, longrope, per-layer
    rope_theta)                              blocks, partial_rotary_factor != 1 refused
  sliding_window            refused          refused          read (None: off) read with use_sliding_
                                                                               window; every layer or
                                                                               none (layer_types,
                                                                               max_window_layers)
  scale_attn_weights        True only        -                -                -
  scale_attn_by_inverse_    False only       -                -                -
    layer_idx
  n_ctx                     == n_positions   refused          refused          refused
  dropouts, summary_*,      ignored          attention_dropout, pretraining_tp ignored
    reorder_and_upcast_attn
  is_encoder_decoder,       False / None / {} only (every family)
    add_cross_attention,
    quantization_config,
    pruned_heads
  token ids, generation     ignored (every family)
    defaults, bookkeeping

Overrides (`options.OVERRIDES`, every family): attention ('bidirectional',
'block_causal' with block_length), dtype, param_dtype, quantization
('int8_weights': the float weights quantised on import, dequantised on
export), kv_cache_dtype.
"""

from typing import Any

from lm_decoding.checkpoints import hf_gpt2, hf_llama, layout
from lm_decoding.models.config import TransformerConfig

__all__ = ["hf_gpt2", "hf_llama", "family", "config_from_hf"]

_FAMILIES = {"gpt2": hf_gpt2, **{t: hf_llama for t in hf_llama.OPTIONS}}


def family(hf_config: Any):
  """The family module (`hf_gpt2`, `hf_llama`) of a config's `model_type`.

  Raises:
    ValueError: no model_type, or one no family reads (named).
  """
  model_type = layout.hf_fields(hf_config).get("model_type")
  if model_type not in _FAMILIES:
    raise ValueError(f"model_type={model_type!r} is not importable; "
                     f"supported: {sorted(_FAMILIES)}")
  return _FAMILIES[model_type]


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """`family(hf_config).config_from_hf(hf_config, **overrides)`."""
  return family(hf_config).config_from_hf(hf_config, **overrides)
