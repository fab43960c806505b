"""GPT-2 (Radford et al. 2019) checkpoints in the Hugging Face layout.

`GPT2LMHeadModel` maps onto a `TransformerConfig` with LayerNorm (eps from
`layer_norm_epsilon`), learned absolute positions, the tanh GELU ('gelu_new'),
biases on every dense layer, and a tied, unscaled LM head:

  transformer.wte.weight [V, D]            embedding (also lm_head.weight)
  transformer.wpe.weight [max_len, D]      pos_embedding
  transformer.h.{i}.ln_1.{weight,bias}     block_i/attention_norm/{scale,bias}
  transformer.h.{i}.attn.c_attn.{weight,bias} [D, 3D], [3D]
                                           query, key, value kernels/biases
                                           (Conv1D [in, out]: split in three)
  transformer.h.{i}.attn.c_proj.*          block_i/attention/out
  transformer.h.{i}.ln_2.*                 block_i/mlp_norm
  transformer.h.{i}.mlp.c_fc.*, c_proj.*   block_i/mlp/wi, wo
  transformer.ln_f.*                       final_norm

Keys without the 'transformer.' prefix (the hub's `gpt2` safetensors,
`GPT2Model`) are accepted; the causal-mask buffers `h.{i}.attn.bias` and
`h.{i}.attn.masked_bias` older files carry are skipped. A tied checkpoint
may hold the embedding, the head `lm_head.weight`, or both (equal).
"""

from __future__ import annotations

from typing import Any

from lm_decoding.checkpoints import layout as layout_lib
from lm_decoding.checkpoints import options
from lm_decoding.models.binding import Conventions
from lm_decoding.models.config import TransformerConfig

_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")

# The GPT-2 column of the importer table (lm_decoding/checkpoints/__init__).
OPTIONS = {
    **{name: options.READ for name in (
        "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
        "layer_norm_epsilon", "tie_word_embeddings")},
    "activation_function": _GELU_TANH,
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    # Attention in float32, which ours always computes its scores in.
    "reorder_and_upcast_attn": options.IGNORED,
    **{name: options.IGNORED for name in (
        "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type",
        "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout")},
    "n_ctx": options.READ,  # older files: must equal n_positions
}


def config_from_hf(hf_config: Any, **overrides) -> TransformerConfig:
  """The `TransformerConfig` of a `transformers.GPT2Config` (or its dict).

  Args:
    hf_config: a GPT2Config or its `to_dict()` (a `config.json`).
    **overrides: fields in `options.OVERRIDES` (e.g. dtype,
      attention='bidirectional').
  Raises:
    ValueError: an option the model does not represent, named (the table in
      `lm_decoding.checkpoints`: an activation other than the tanh GELU,
      attention scaled by layer index or unscaled, cross-attention, an
      unknown option), or an override not in `options.OVERRIDES`; before
      any tensor is read.
  """
  hf = layout_lib.hf_fields(hf_config)
  layout_lib.check_model_type(hf, ("gpt2",), "GPT-2")
  options.check(hf, OPTIONS, "GPT-2")
  if hf.get("n_ctx", hf["n_positions"]) != hf["n_positions"]:
    raise ValueError(f"GPT-2 config option n_ctx={hf['n_ctx']} differs from "
                     f"n_positions={hf['n_positions']}")
  d_model, heads = hf["n_embd"], hf["n_head"]
  fields = dict(
      vocab_size=hf["vocab_size"], d_model=d_model,
      num_layers=hf["n_layer"], num_heads=heads, num_kv_heads=heads,
      head_dim=d_model // heads, mlp_dim=hf.get("n_inner") or 4 * d_model,
      max_len=hf["n_positions"], norm="layernorm", positional="learned",
      mlp_activation="gelu",
      tie_embeddings=hf.get("tie_word_embeddings", True),
      scale_embeddings=False, use_bias=True,
      norm_eps=hf.get("layer_norm_epsilon", 1e-5))
  return TransformerConfig(**options.overridden(fields, overrides, "GPT-2"))


def conventions_from_hf(hf_config: Any) -> Conventions:
  """GPT-2's generation ids: no MASK, EOS `eos_token_id` (50256 in the
  published checkpoints), PAD `pad_token_id` (else None).

  Raises:
    ValueError: no eos_token_id.
  """
  hf = layout_lib.hf_fields(hf_config)
  return Conventions(mask_id=None, eos_ids=layout_lib.eos_ids(hf, "GPT-2"),
                     pad_id=hf.get("pad_token_id"))


def _canonical(name: str) -> str:
  if name == "lm_head.weight" or name.startswith("transformer."):
    return name
  return "transformer." + name


def layout(config: TransformerConfig) -> layout_lib.Layout:
  """The GPT-2 tensors of `config` (see the module docstring)."""
  T = layout_lib.Tensor
  d, h, dh, m = (config.d_model, config.num_heads, config.head_dim,
                 config.mlp_dim)
  one = lambda hf, path, shape, in_dims=0: T(hf, ((path, shape),), in_dims)
  norm = lambda hf, ours: [one(f"{hf}.weight", ours + ("scale",), (d,)),
                           one(f"{hf}.bias", ours + ("bias",), (d,))]
  dense = lambda hf, ours, shape, in_dims=1: [
      one(f"{hf}.weight", ours + ("kernel",), shape, in_dims),
      one(f"{hf}.bias", ours + ("bias",), shape[in_dims:])]
  tensors = [
      one("transformer.wte.weight", ("embedding",), (config.vocab_size, d), 1),
      one("transformer.wpe.weight", ("pos_embedding",), (config.max_len, d), 1)]
  qkv = ("query", "key", "value")
  for i in range(config.num_layers):
    hf, ours = f"transformer.h.{i}", (f"block_{i}",)
    attn, mlp = ours + ("attention",), ours + ("mlp",)
    tensors += norm(f"{hf}.ln_1", ours + ("attention_norm",))
    tensors += [  # Conv1D [D, 3D]: query, key, value side by side
        T(f"{hf}.attn.c_attn.weight",
          tuple((attn + (n, "kernel"), (d, h, dh)) for n in qkv), 1),
        T(f"{hf}.attn.c_attn.bias",
          tuple((attn + (n, "bias"), (h, dh)) for n in qkv))]
    tensors += dense(f"{hf}.attn.c_proj", attn + ("out",), (h, dh, d), 2)
    tensors += norm(f"{hf}.ln_2", ours + ("mlp_norm",))
    tensors += dense(f"{hf}.mlp.c_fc", mlp + ("wi",), (d, m))
    tensors += dense(f"{hf}.mlp.c_proj", mlp + ("wo",), (m, d))
  tensors += norm("transformer.ln_f", ("final_norm",))
  head, tied = layout_lib.lm_head(config, "lm_head.weight",
                                  "transformer.wte.weight")
  tensors += head
  return layout_lib.Layout("GPT-2", tuple(tensors), tied, _canonical,
                           ignored=r"(^|\.)h\.\d+\.attn\.(masked_)?bias$")


def params_from_hf(source: Any, config: TransformerConfig) -> dict:
  """Our parameters from a GPT-2 checkpoint.

  Args:
    source: a `.safetensors` path (or several), or a state dict of numpy
      arrays / torch tensors (`GPT2LMHeadModel.state_dict()`).
    config: from `config_from_hf` (possibly with overrides).
  Returns:
    The parameter tree of `Transformer(config)`, numpy, config.param_dtype.
  Raises:
    ValueError: see `layout.params_from_state_dict` (a missing, misshapen or
      unexpected tensor, named with its expected shape).
  """
  return layout_lib.params_from_state_dict(layout(config), source, config)


def params_to_hf(params: Any, config: TransformerConfig) -> dict:
  """The `GPT2LMHeadModel` state dict (numpy arrays) of our parameters."""
  return layout_lib.state_dict_from_params(layout(config), params, config)
