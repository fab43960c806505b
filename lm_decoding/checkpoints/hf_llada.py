"""LLaDA checkpoints (Nie et al. 2025, "Large Language Diffusion Models";
GSAI-ML/LLaDA-8B-Base and -Instruct): a masked diffusion LM with its own
OLMo-derived parameter names and config keys.

`config.json` has `model_type` 'llada' and OLMo's keys (`d_model`,
`n_heads`, `n_kv_heads`, `n_layers`, `mlp_hidden_size`, `block_type`,
`layer_norm_type`, `weight_tying`, `mask_token_id`, ...); every one is read,
ignored or accepted with the values given in `OPTIONS` (the importer table in
`lm_decoding.checkpoints`). The model is bidirectional (no causal mask: its
sampler calls it with none), unshifted (the logits at position i predict
token i) and denoises the MASK token `mask_token_id` (126336 in the
published checkpoints). Two block types:

  'llama' (the published checkpoints; SiLU-gated MLP, separate projections)
  model.transformer.wte.weight [V, D]                   embedding
  model.transformer.blocks.{i}.attn_norm.weight          attention_norm/scale
  model.transformer.blocks.{i}.{q,k,v}_proj.weight (.bias with
    include_qkv_bias)                                    query, key, value
  model.transformer.blocks.{i}.attn_out.weight           attention/out
  model.transformer.blocks.{i}.ff_norm.weight            mlp_norm/scale
  model.transformer.blocks.{i}.ff_proj.weight            mlp/wi_gate (SiLU'd)
  model.transformer.blocks.{i}.up_proj.weight            mlp/wi
  model.transformer.blocks.{i}.ff_out.weight             mlp/wo
  model.transformer.ln_f.weight                          final_norm/scale
  model.transformer.ff_out.weight [V, D]                 lm_head/kernel
                                                         (absent when tied)

  'sequential' (OLMo's fused projections, SwiGLU activation)
  model.transformer.blocks.{i}.att_proj.weight [D + 2 Hkv Dh, D]: query,
    key, value side by side along the output axis
  model.transformer.blocks.{i}.ff_proj.weight [2 F, D]: mlp/wi then
    mlp/wi_gate (OLMo's SwiGLU computes silu(second half) * first half)

The vocabulary is `embedding_size` (the padded table; `vocab_size` when
unset). RoPE pairs dimension j with j + Dh/2, as ours does. The MoE
variants (LLaDA-MoE, LLaDA 2.0) have other `model_type`s and are refused by
`lm_decoding.checkpoints.family`.
"""
from __future__ import annotations

from typing import Any

from lm_decoding.checkpoints import layout as layout_lib
from lm_decoding.checkpoints import options
from lm_decoding.models.binding import Conventions
from lm_decoding.models.config import TransformerConfig

# The MASK id of the published checkpoints (their sampler's default).
DEFAULT_MASK_ID = 126336
# block_type -> the activation_type its MLP is written for.
_ACTIVATION = {"llama": "silu", "sequential": "swiglu"}

# The LLaDA column of the importer table (lm_decoding/checkpoints).
OPTIONS = {
    **{name: options.READ for name in (
        "d_model", "n_heads", "n_kv_heads", "multi_query_attention",
        "n_layers", "mlp_ratio", "mlp_hidden_size", "block_type",
        "activation_type", "max_sequence_length", "rope_theta",
        "include_qkv_bias", "vocab_size", "embedding_size", "weight_tying",
        "rms_norm_eps", "mask_token_id")},
    "alibi": (False,),
    "rope": (True,),
    "attention_layer_norm": (False,),
    "input_emb_norm": (False,),
    "layer_norm_type": ("rms",),
    "layer_norm_with_affine": (True,),
    "bias_for_layer_norm": (None, False),
    "include_bias": (False,),
    "scale_logits": (False,),
    # Groups of blocks rename the tensors (block_groups.{g}); one per block.
    "block_group_size": (1,),
    # Unused with the accepted values above (no ALiBi, no q/k norm), or
    # no effect at inference in float32: RoPE precision, the attention
    # kernel, dropout, initialisation, training length and precision.
    **{name: options.IGNORED for name in (
        "alibi_bias_max", "attention_layer_norm_with_affine",
        "rope_full_precision", "flash_attention", "attention_dropout",
        "residual_dropout", "embedding_dropout", "init_device", "init_fn",
        "init_std", "init_cutoff_factor", "precision",
        "train_max_sequence_length")},
}


def _kv_heads(hf: dict) -> int:
  """OLMo's effective_n_kv_heads: n_kv_heads, else 1 with
  multi_query_attention, else n_heads.

  Raises:
    ValueError: multi_query_attention set against n_kv_heads.
  """
  heads, kv, mqa = hf["n_heads"], hf.get("n_kv_heads"), hf.get(
      "multi_query_attention")
  if kv is None:
    return 1 if mqa else heads
  if mqa is not None and kv != (1 if mqa else heads):
    raise ValueError(f"LLaDA config options n_kv_heads={kv} and "
                     f"multi_query_attention={mqa} disagree")
  return kv


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """The `TransformerConfig` of a LLaDA `config.json` (or its config object).

  Bidirectional attention, no token shift, RMSNorm (`rms_norm_eps`), RoPE
  (`rope_theta`), SwiGLU with the MLP width `mlp_hidden_size` (else
  `mlp_ratio * d_model`; half of it for the 'sequential' block, whose
  fused projection holds both halves).

  Args:
    hf_config: the config dict or object.
    **overrides: fields in `options.OVERRIDES` (e.g. dtype).
  Raises:
    ValueError: an option outside the table (named: ALiBi, q/k norm, a
      LayerNorm other than RMS, biases, scaled logits, block groups, an
      activation its block type does not use, an unknown option), or an
      override not in `options.OVERRIDES`; before any tensor is read.
  """
  hf = layout_lib.hf_fields(hf_config)
  layout_lib.check_model_type(hf, ("llada",), "LLaDA")
  options.check(hf, OPTIONS, "LLaDA")
  block = hf.get("block_type", "sequential")
  if block not in _ACTIVATION:
    raise ValueError(f"LLaDA config option block_type={block!r} is not "
                     f"supported; accepted: {sorted(_ACTIVATION)}")
  activation = hf.get("activation_type", "swiglu")
  if activation != _ACTIVATION[block]:
    raise ValueError(f"LLaDA config option activation_type={activation!r} "
                     f"is not supported with block_type={block!r} (accepted:"
                     f" {_ACTIVATION[block]!r})")
  d, heads = hf["d_model"], hf["n_heads"]
  if d % heads:
    raise ValueError(f"LLaDA config options d_model={d} and n_heads={heads}"
                     f": d_model must be a multiple of n_heads")
  hidden = hf.get("mlp_hidden_size") or hf.get("mlp_ratio", 4) * d
  vocab = hf.get("embedding_size") or hf["vocab_size"]
  if vocab < hf["vocab_size"]:
    raise ValueError(f"LLaDA config option embedding_size={vocab} is "
                     f"smaller than vocab_size={hf['vocab_size']}")
  fields = dict(
      vocab_size=vocab, d_model=d, num_layers=hf["n_layers"],
      num_heads=heads, num_kv_heads=_kv_heads(hf), head_dim=d // heads,
      mlp_dim=hidden // 2 if block == "sequential" else hidden,
      max_len=hf.get("max_sequence_length", 1024), norm="rmsnorm",
      positional="rope", mlp_activation="swiglu",
      tie_embeddings=hf.get("weight_tying", True), scale_embeddings=False,
      qkv_bias=bool(hf.get("include_qkv_bias", False)),
      norm_eps=hf.get("rms_norm_eps", 1e-5),
      rope_base=float(hf.get("rope_theta", 10000.0)),
      attention="bidirectional")
  return TransformerConfig(**options.overridden(fields, overrides, "LLaDA"))


def conventions_from_hf(hf_config: Any) -> Conventions:
  """LLaDA's generation ids: MASK `mask_token_id` (else 126336), EOS
  `eos_token_id`, PAD `pad_token_id` (else None).

  Raises:
    ValueError: no eos_token_id.
  """
  hf = layout_lib.hf_fields(hf_config)
  return Conventions(mask_id=hf.get("mask_token_id", DEFAULT_MASK_ID),
                     eos_ids=layout_lib.eos_ids(hf, "LLaDA"),
                     pad_id=hf.get("pad_token_id"))


def layout(config: TransformerConfig, block_type: str = "llama"
           ) -> layout_lib.Layout:
  """The LLaDA tensors of `config` (see the module docstring)."""
  T = layout_lib.Tensor
  d, h, hkv, dh, m = (config.d_model, config.num_heads, config.num_kv_heads,
                      config.head_dim, config.mlp_dim)

  def weight(hf, pieces, in_shape):
    """A torch Linear weight [out, in] holding `pieces` along out."""
    return T(f"{hf}.weight", tuple((path + ("kernel",), in_shape + shape)
                                   for path, shape in pieces),
             len(in_shape), transpose=True)

  tensors = [T("model.transformer.wte.weight",
               ((("embedding",), (config.vocab_size, d)),), 1)]
  for i in range(config.num_layers):
    hf, ours = f"model.transformer.blocks.{i}", (f"block_{i}",)
    attn, mlp = ours + ("attention",), ours + ("mlp",)
    qkv = ((attn + ("query",), (h, dh)), (attn + ("key",), (hkv, dh)),
           (attn + ("value",), (hkv, dh)))
    tensors.append(T(f"{hf}.attn_norm.weight",
                     ((ours + ("attention_norm", "scale"), (d,)),)))
    if block_type == "sequential":
      tensors.append(weight(f"{hf}.att_proj", qkv, (d,)))
      if config.qkv_bias:
        tensors.append(T(f"{hf}.att_proj.bias", tuple(
            (path + ("bias",), shape) for path, shape in qkv)))
    else:
      for (path, shape), proj in zip(qkv, "qkv"):
        tensors.append(weight(f"{hf}.{proj}_proj", ((path, shape),), (d,)))
        if config.qkv_bias:
          tensors.append(T(f"{hf}.{proj}_proj.bias",
                           ((path + ("bias",), shape),)))
    tensors.append(weight(f"{hf}.attn_out", ((attn + ("out",), (d,)),),
                          (h, dh)))
    tensors.append(T(f"{hf}.ff_norm.weight",
                     ((ours + ("mlp_norm", "scale"), (d,)),)))
    if block_type == "sequential":
      tensors.append(weight(f"{hf}.ff_proj", ((mlp + ("wi",), (m,)),
                                              (mlp + ("wi_gate",), (m,))),
                            (d,)))
    else:
      tensors.append(weight(f"{hf}.ff_proj", ((mlp + ("wi_gate",), (m,)),),
                            (d,)))
      tensors.append(weight(f"{hf}.up_proj", ((mlp + ("wi",), (m,)),), (d,)))
    tensors.append(weight(f"{hf}.ff_out", ((mlp + ("wo",), (d,)),), (m,)))
  tensors.append(T("model.transformer.ln_f.weight",
                   ((("final_norm", "scale"), (d,)),)))
  if not config.tie_embeddings:  # tied: the head is wte, stored once
    tensors.append(T("model.transformer.ff_out.weight",
                     ((("lm_head", "kernel"), (d, config.vocab_size)),), 1,
                     transpose=True))
  return layout_lib.Layout("LLaDA", tuple(tensors))


def params_from_hf(source: Any, config: TransformerConfig,
                   block_type: str | None = None) -> dict:
  """Our parameters from a LLaDA checkpoint.

  Args:
    source: `.safetensors` path(s) or a state dict (`LLaDAModelLM`'s).
    config: from `config_from_hf`.
    block_type: the config's `block_type` ('llama' or 'sequential'); None:
      'sequential' when the checkpoint has fused `att_proj` tensors, else
      'llama'.
  Raises:
    ValueError: a missing, misshapen or unexpected tensor, named.
  """
  state = layout_lib.read_state_dict(source)
  if block_type is None:
    block_type = ("sequential" if any(".att_proj." in name for name in state)
                  else "llama")
  return layout_lib.params_from_state_dict(layout(config, block_type),
                                           state, config)


def params_to_hf(params: Any, config: TransformerConfig,
                 block_type: str = "llama") -> dict:
  """The `LLaDAModelLM` state dict (numpy arrays) of our parameters."""
  return layout_lib.state_dict_from_params(layout(config, block_type),
                                           params, config)
