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

  option            gpt2             llama         mistral       qwen2
  sizes (vocab,     read             read          read          read
    width, layers,
    heads, kv heads,
    head_dim, mlp)
  max positions     n_positions      max_position_embeddings (all three)
  norm epsilon      layer_norm_eps.  rms_norm_eps  rms_norm_eps  rms_norm_eps
  activation        gelu_new or      silu only     silu only     silu only
                    gelu_pytorch_
                    tanh only
  tie_word_         read             read          read          read
    embeddings
  biases            all (fixed)      attention_    none          q/k/v (fixed)
                                     bias ==
                                     mlp_bias
  RoPE block        -                rope_parameters or rope_scaling, kind
    (rope_theta                      as rope_type or type: default, linear,
    too)                             llama3, yarn read; dynamic read (the
                                     default RoPE up to max_len); longrope,
                                     per-layer blocks, unused keys and
                                     partial_rotary_factor != 1 refused
  sliding_window    refused          refused       read (None:   read with use_
                                                   no window)    sliding_window;
                                                                 all layers or
                                                                 none, else
                                                                 refused
  scale_attn_       True only        -             -             -
    weights
  scale_attn_by_    False only       -             -             -
    inverse_layer_
    idx
  n_ctx             == n_positions   refused       refused       refused
  dropouts etc.     ignored (dropouts, summary_*, reorder_and_upcast_attn;
                    attention_dropout, pretraining_tp)
  is_encoder_       False / False / None / {} only (every family)
    decoder, add_
    cross_attention,
    quantization_
    config, pruned_
    heads
  token ids,        ignored (every family)
    generation
    defaults,
    bookkeeping

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
