"""Import and export of Hugging Face checkpoints: GPT-2, LLaMA-style
(LLaMA, Mistral, Qwen2, Qwen3), and the diffusion LMs people run: LLaDA,
Dream, SDAR and Fast-dLLM v2.

`config_from_hf(hf_config, **overrides)` picks the family by `model_type`
(`family`); each family module has `config_from_hf`,
`conventions_from_hf(hf_config)` (its MASK / EOS / PAD ids:
`models.binding.Conventions`), `params_from_hf(source, config)` and
`params_to_hf(params, config)`; both directions run through one
`layout.Layout` per family. `hub.load(folder)` reads a hub-layout folder
(config.json, safetensors, tokenizer.json) into a `Model` that carries its
conventions, and its tokenizer. torch and transformers are not needed
(safetensors only to read `.safetensors` files): they are the `[peer]`
extra, used by the parity tests and benchmarks.

The importer table: what each family's `config_from_hf` does with each
config option (`options`: read, ignored, or accepted with the values given;
anything else, and any option not listed, is refused by name before a tensor
is read). The mixture-of-experts variants (qwen2_moe, qwen3_moe, sdar_moe,
lladamoe, llada2_moe) are refused by `model_type`. Parity with transformers
or the authors' modeling code for every row: tests/test_hf_import.py,
tests/test_hub_import.py.

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
  resid_pdrop,      ignored          refused       refused       refused
    embd_pdrop,
    attn_pdrop,
    summary_*,
    reorder_and_
    upcast_attn
  attention_        refused          ignored       ignored       ignored
    dropout,
    pretraining_tp
  is_encoder_       False / False / None / {} only (every family)
    decoder, add_
    cross_attention,
    quantization_
    config, pruned_
    heads
  token ids,        ignored (every family); auto_map too
    generation
    defaults,
    bookkeeping

The Qwen-based families read every qwen2 option above and:

  qwen3           q/k norm (fixed); attention_bias False only (Qwen3's
                  covers o_proj too)
  Dream           as qwen2; bidirectional, token shift (fixed);
                  mask_token_id read (default 151666)
  sdar            as qwen3; block-causal with block_size (read, int >= 1);
                  mask_token_id read (default 151669); attn_implementation,
                  debug, ep_size, fuse_cross_entropy, micro_forward,
                  skip_checkpoint, use_deepep ignored (training switches)
  Fast_dLLM_Qwen  as qwen2; block-causal with bd_size (read, a multiple of
                  its sampler's sub-block 8), token shift (fixed); MASK
                  151665 (mask_token_id read if present)

LLaDA (`model_type` 'llada', `hf_llada`): d_model, n_heads, n_kv_heads,
multi_query_attention, n_layers, mlp_ratio, mlp_hidden_size, block_type
('llama' with activation_type 'silu', or 'sequential' with 'swiglu'),
max_sequence_length, rope_theta, include_qkv_bias, vocab_size,
embedding_size, weight_tying, rms_norm_eps, mask_token_id read; alibi
False, rope True, attention_layer_norm False, input_emb_norm False,
layer_norm_type 'rms', layer_norm_with_affine True, bias_for_layer_norm
None/False, include_bias False, scale_logits False, block_group_size 1
only; alibi_bias_max, attention_layer_norm_with_affine, rope_full_precision,
flash_attention, the dropouts, init_*, precision, train_max_sequence_length
ignored. Bidirectional, no token shift.

Overrides (`options.OVERRIDES`, every family): attention ('bidirectional',
'block_causal' with block_length), dtype, param_dtype, quantization
('int8_weights': the float weights quantised on import, dequantised on
export), kv_cache_dtype.
"""

from typing import Any

from lm_decoding.checkpoints import hf_gpt2, hf_llada, hf_llama, layout
from lm_decoding.models.binding import Conventions
from lm_decoding.models.config import TransformerConfig

__all__ = ["hf_gpt2", "hf_llama", "hf_llada", "family", "config_from_hf",
           "conventions_from_hf", "MIXTURES_OF_EXPERTS"]

_FAMILIES = {"gpt2": hf_gpt2, "llada": hf_llada,
             **{t: hf_llama for t in hf_llama.OPTIONS}}
# Refused by name: mixture-of-experts MLPs, which the model does not have.
MIXTURES_OF_EXPERTS = {
    "qwen2_moe": "Qwen2-MoE", "qwen3_moe": "Qwen3-MoE",
    "sdar_moe": "SDAR-MoE (e.g. SDAR-30B-A3B)",
    "lladamoe": "LLaDA-MoE (e.g. LLaDA-MoE-7B-A1B)",
    "llada2_moe": "LLaDA 2.0 (e.g. LLaDA2.0-mini)"}


def family(hf_config: Any):
  """The family module (`hf_gpt2`, `hf_llama`, `hf_llada`) of a config's
  `model_type`.

  Raises:
    ValueError: no model_type, a mixture-of-experts model (named as one),
      or a model_type no family reads (named).
  """
  model_type = layout.hf_fields(hf_config).get("model_type")
  if model_type in MIXTURES_OF_EXPERTS:
    raise ValueError(f"model_type={model_type!r} is "
                     f"{MIXTURES_OF_EXPERTS[model_type]}, a mixture-of-"
                     f"experts model; the backbone has dense MLPs only")
  if model_type not in _FAMILIES:
    raise ValueError(f"model_type={model_type!r} is not importable; "
                     f"supported: {sorted(_FAMILIES)}")
  return _FAMILIES[model_type]


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """`family(hf_config).config_from_hf(hf_config, **overrides)`."""
  return family(hf_config).config_from_hf(hf_config, **overrides)


def conventions_from_hf(hf_config: Any) -> Conventions:
  """`family(hf_config).conventions_from_hf(hf_config)`."""
  return family(hf_config).conventions_from_hf(hf_config)
