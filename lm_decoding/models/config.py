"""Frozen, hashable configuration of the Transformer backbone."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lm_decoding.models.rope import RopeScaling

ATTENTION_KINDS = ("causal", "bidirectional", "block_causal")
NORMS = ("rmsnorm", "layernorm")
POSITIONALS = ("rope", "learned")
MLP_ACTIVATIONS = ("swiglu", "gelu")
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8_weights")
KV_CACHE_DTYPES = ("compute", "int8")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Shape and options of the decoder-only Transformer.

  Hashable, so it can be a static argument of `jax.jit`. Attention kind is
  configuration: the same module is a causal LM (`causal`) or a masked-diffusion
  denoiser (`bidirectional`).

  Attributes:
    vocab_size: number of token ids, reserved ids (PAD/BOS/EOS/MASK) included.
    d_model: residual stream width.
    num_layers: number of Transformer blocks.
    num_heads: query heads H.
    num_kv_heads: key/value heads Hkv; H % Hkv == 0. H == Hkv is MHA, 1 is MQA,
      otherwise GQA (query head h reads kv head h // (H // Hkv)).
    head_dim: width of one head.
    mlp_dim: hidden width of the MLP.
    max_len: longest sequence (and KV cache) the model accepts.
    norm: 'rmsnorm' or 'layernorm' (pre-norm blocks plus a final norm).
    positional: 'rope' (rotary, Su et al. 2021) or 'learned' absolute embeddings.
    mlp_activation: 'swiglu' (Shazeer 2020) or 'gelu'.
    tie_embeddings: if True the LM head is the transposed token embedding.
    attention: 'causal', 'bidirectional' or 'block_causal' (blocks of
      `block_length` positions, each seeing itself and the blocks before:
      `masks.block_causal_mask`). Only the default mask: a call may pass
      its own.
    block_length: the block of 'block_causal' attention, >= 1 there; 0
      (default) for the other kinds.
    dtype: compute dtype name; logits are always returned in float32.
    param_dtype: parameter dtype name.
    rope_base: RoPE frequency base.
    rope_scaling: None (default), or a `rope.RopeScaling` (linear, llama3,
      yarn) applied to the RoPE frequencies.
    sliding_window: W > 0 limits every layer's attention to keys fewer than
      W slots away from the query (|query slot - key slot| < W; slots are
      input indices, or cache slots with a cache, which every decoder here
      fills in position order), on top of the mask given or the default;
      0 (default): no window. Mistral's sliding window attention.
    length_classes: C > 0 adds a length head (CMLM, Ghazvininejad et al.
      2019) predicting a target length in 1..C from mean-pooled source
      hidden states (`transformer.length_logits`); 0 (default): no head,
      and the parameters are those of a model without it.
    quantization: 'none' (default), or 'int8_weights': weight-only int8
      with a float32 scale per output channel for every matmul kernel and a
      scale per row for the token embedding (which is also the tied LM
      head); norms, learned positions and the length head stay float. Make
      such parameters from a float checkpoint with
      `lm_decoding.models.quantization.quantize_params`. Inference only.
    kv_cache_dtype: 'compute' (default: keys/values cached in the compute
      dtype) or 'int8': int8 keys/values with a float32 absmax scale per
      (row, KV head, slot) (see `lm_decoding.models.kv_cache`). Calls
      without a cache are unaffected.
    norm_eps: epsilon added to the mean square (RMSNorm) or variance
      (LayerNorm) of every norm; 1e-6 by default, 1e-5 for GPT-2, the HF
      config's `rms_norm_eps` for LLaMA-style checkpoints.
    use_bias: if True every attention projection (query, key, value, out) and
      MLP dense layer has a bias, as GPT-2's; False (default): none, and the
      parameters are those of a model without them.
    qkv_bias: if True the query, key and value projections have biases
      (Qwen2's layout) even when use_bias is False.
    qk_norm: if True every query and key head is RMS-normalised over its
      Dh features (one learned scale [Dh] for the queries and one for the
      keys of a layer, epsilon `norm_eps`) before RoPE: Qwen3's layout
      (Yang et al. 2025), also SDAR's. False (default): no such norm, and
      the parameters are those of a model without it.
    scale_embeddings: with tie_embeddings, True (default) multiplies the input
      embeddings by sqrt(d_model) and the logits by d_model**-0.5 (so a
      unit-variance table serves both ends); False applies neither, as GPT-2
      and tied LLaMA-style checkpoints do. Unused when untied.
    token_shift: how a denoiser's logits line up with the tokens they
      predict. False (default): the logits at position i predict token i
      (MDLM, BD3-LM, LLaDA). True: the logits at position i predict token
      i + 1, as an AR model's do (DiffuLLaMA, Fast-dLLM v2: a diffusion model
      adapted from an AR parent keeps its head's alignment). The module
      computes the same thing either way; the training objectives and every
      diffusion decoder read this flag (`token_shift`). Causal models ignore
      it.
    self_conditioning: if True the model takes a second, optional input:
      the previous prediction's probabilities float32[B, L, V] (self-
      conditioning, Chen et al. 2022, arXiv:2208.04202; DiffusionGemma's
      decoder), fed in as DiffusionGemma does: their expectation of the
      (scaled) token embedding, through a norm and an MLP block of the
      model's kind, added to the token embedding, the sum RMS-normalised
      without a scale (`layers.SelfConditioning`). Absent or zero, the
      signal is the MLP of a zero vector (0 without biases). False
      (default): no such input, and the parameters and outputs are those of
      a model without it. The objectives and `uniform_eb` read this flag
      (`self_conditioned`).
  """

  vocab_size: int = 4096
  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 32
  mlp_dim: int = 512
  max_len: int = 128
  norm: str = "rmsnorm"
  positional: str = "rope"
  mlp_activation: str = "swiglu"
  tie_embeddings: bool = True
  attention: str = "causal"
  dtype: str = "float32"
  param_dtype: str = "float32"
  rope_base: float = 10000.0
  rope_scaling: RopeScaling | None = None
  sliding_window: int = 0
  block_length: int = 0
  length_classes: int = 0
  quantization: str = "none"
  kv_cache_dtype: str = "compute"
  norm_eps: float = 1e-6
  use_bias: bool = False
  qkv_bias: bool = False
  qk_norm: bool = False
  scale_embeddings: bool = True
  token_shift: bool = False
  self_conditioning: bool = False

  def __post_init__(self):
    for name, value, allowed in (
        ("attention", self.attention, ATTENTION_KINDS),
        ("norm", self.norm, NORMS),
        ("positional", self.positional, POSITIONALS),
        ("mlp_activation", self.mlp_activation, MLP_ACTIVATIONS),
        ("dtype", self.dtype, DTYPES),
        ("param_dtype", self.param_dtype, DTYPES),
        ("quantization", self.quantization, QUANTIZATIONS),
        ("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES),
    ):
      if value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {allowed}")
    for name in ("vocab_size", "d_model", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "mlp_dim", "max_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    if self.sliding_window < 0:
      raise ValueError(f"sliding_window={self.sliding_window} must be >= 0 "
                       f"(0: no window)")
    if (self.attention == "block_causal") != (self.block_length > 0):
      raise ValueError(f"block_length={self.block_length} must be >= 1 with "
                       f"attention='block_causal' and 0 otherwise "
                       f"(attention={self.attention!r})")
    if self.rope_scaling is not None and not isinstance(self.rope_scaling,
                                                        RopeScaling):
      raise ValueError(f"rope_scaling={self.rope_scaling!r} must be None or "
                       f"a RopeScaling")
    if self.length_classes < 0:
      raise ValueError(f"length_classes={self.length_classes} must be >= 0 "
                       f"(0: no length head)")
    if not self.norm_eps > 0:
      raise ValueError(f"norm_eps={self.norm_eps} must be > 0")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} must be a multiple of "
          f"num_kv_heads={self.num_kv_heads}")
    if self.positional == "rope" and self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)


def check_attention(logits_fn, causal: bool, user: str) -> None:
  """Raises ValueError unless the model's attention kind is the one `user`
  needs.

  The kind is read from `logits_fn.config.attention` (a Transformer's
  `ModelLogitsFn`, or a wrapper exposing its `config`); a logits_fn without
  one (a stub, a plain function) is accepted, there being nothing to read.
  Shared by the training objectives and the decoders that bind several
  models, so both read the kind the same way.

  Args:
    logits_fn: the model (the decoder boundary, `models.binding.LogitsFn`).
    causal: True if 'causal' attention is needed, False if any other kind
      (e.g. 'bidirectional', a masked-diffusion denoiser) is.
    user: who needs it, the message's subject (e.g. "mdlm_loss", "the
      target model of JacobiDecoder").
  Raises:
    ValueError: the kind read is causal where `causal` is False, or the
      reverse; the message names `user`, the kind needed and the kind found.
  """
  kind = getattr(getattr(logits_fn, "config", None), "attention", None)
  if kind is not None and (kind == "causal") != causal:
    wanted = "'causal'" if causal else "non-causal (e.g. 'bidirectional')"
    raise ValueError(f"{user} needs {wanted} attention; "
                     f"logits_fn.config.attention={kind!r}")


def token_shift(logits_fn) -> bool:
  """Whether the model's logits at position i predict token i + 1.

  Read from `logits_fn.config.token_shift` (see `TransformerConfig`); False
  for a logits_fn without one (a stub, a plain function), whose logits at i
  predict token i. The one place the objectives and decoders read it.
  """
  return bool(getattr(getattr(logits_fn, "config", None), "token_shift",
                      False))


def self_conditioned(logits_fn) -> bool:
  """Whether the model takes the previous prediction as an input.

  Read from `logits_fn.config.self_conditioning` (see `TransformerConfig`);
  False for a logits_fn without one (a stub, a plain function), which is
  then never passed a `self_conditioning` argument. The one place the
  objectives and decoders read it.
  """
  return bool(getattr(getattr(logits_fn, "config", None),
                      "self_conditioning", False))
