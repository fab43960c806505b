"""An analytic latency model of AR and parallel decoding per hardware.

Where `cost` measures a decoder on the machine at hand, this module predicts
it from the model's shape and a `HardwareProfile` (peak FLOP/s, memory
bandwidth, fixed overhead per step), so the crossover between sequential
and parallel decoding can be read off for hardware we do not have. A step
is costed with the roofline model (Williams et al. 2009, "Roofline"; for
Transformer inference Pope et al. 2022, "Efficiently Scaling Transformer
Inference"):

  step_s = max(flops / peak_flops, bytes / bandwidth) + step_overhead_s.

FLOPs of one forward pass over B x L token positions attending to S key
slots (`forward_flops`; a multiply-add is 2 FLOPs; norms, RoPE, softmax and
sampling are elementwise and left out), per position:

  per layer   2 D (H + 2 Hkv) Dh      q, k, v projections
            + 2 H Dh D                output projection
            + 4 S H Dh                scores q.k (2 S H Dh) and probs.v (same)
            + 2 m D F                 MLP, m = 3 matrices (SwiGLU) or 2 (GELU)
  once      + 2 D V                   LM head (tied or not)

(D width, H / Hkv query / KV heads, Dh head width, F MLP width, V vocab.)
With H Dh = D the attention term is the familiar 4 S D per layer. As in this
codebase's model, masked slots are computed, not skipped: a causal prefill
and every cached AR step attend to all S = P + T slots of the cache the AR
decoder allocates, and a full denoising pass to all S = P + T positions.

Bytes of one forward pass (`forward_bytes`): every parameter once, the keys
and values of the S slots read once per row (`kv_bytes_per_slot`: 2 L Hkv Dh
x itemsize of the compute dtype), and the float32 logits B x L x V written.
Other activations are assumed to stay in cache or be fused.

Decodes, as this codebase's decoders run them:
  AR (`ar_decode_s`): one prefill over B x P positions, then T - 1 cached
    steps over B x 1 (the first token comes from the prefill's logits).
  Parallel (`parallel_decode_s`): K steps, each a full pass over B x (P + T)
    positions (MDLM, LLaDA without a cache); with a block length W, K steps
    over B x W positions against the cache (a Fast-dLLM style dual cache)
    plus one full pass per block to refresh the cache.
  BD3-LM over its exact prefix cache (`block_decode_s`, from a decode's
    NFE): the prefill, a window call per step and a clean write between
    blocks.
The crossover: K* = AR decode / one full denoising step (parallel wins for
K < K*), and T*, the shortest output length at which K parallel steps beat
the AR decode.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from lm_decoding.checks import is_count, is_number
from lm_decoding.evaluation import cost
from lm_decoding.models.config import TransformerConfig

# Written by experiments/measure_cpu_profile.py; `load_profile("cpu")` reads it.
CPU_PROFILE_PATH = os.path.normpath(os.path.join(
    os.path.dirname(__file__), "..", "..", "experiments", "results",
    "cpu_profile.json"))
LOGITS_ITEMSIZE = 4  # the model returns float32 logits


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
  """One accelerator (or CPU) as the roofline model sees it.

  Attributes:
    name: short name (`load_profile` key).
    peak_flops: peak dense FLOP/s at the model's compute dtype, > 0.
    bandwidth: main-memory (HBM / DRAM) bandwidth, bytes/s, > 0.
    step_overhead_s: fixed time per forward step (kernel launches, loop
      control), seconds, >= 0.
    source: where the figures come from (vendor document, or the script and
      machine that measured them).

  Raises:
    ValueError: a figure out of range (the message names it).
  """

  name: str
  peak_flops: float
  bandwidth: float
  step_overhead_s: float
  source: str

  def __post_init__(self):
    for field in ("peak_flops", "bandwidth"):
      value = getattr(self, field)
      if not (is_number(value) and 0 < value < math.inf):
        raise ValueError(f"{field}={value!r} must be in (0, inf)")
    if not (is_number(self.step_overhead_s)
            and 0 <= self.step_overhead_s < math.inf):
      raise ValueError(f"step_overhead_s={self.step_overhead_s!r} must be in "
                       "[0, inf)")


# Published dense bf16 peaks and HBM bandwidths. The per-step overhead is
# not published: 20 us is an assumption for a jitted step of a few dozen
# fused kernels (GPU launches; TPU step dispatch).
_ASSUMED_OVERHEAD_S = 20e-6
PROFILES = {p.name: p for p in (
    HardwareProfile(
        "h100_sxm", 989e12, 3.35e12, _ASSUMED_OVERHEAD_S,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: BF16 Tensor Core "
        "1,979 TFLOPS with sparsity, i.e. 989 dense; GPU memory bandwidth "
        "3.35 TB/s); overhead assumed"),
    HardwareProfile(
        "h200", 989e12, 4.8e12, _ASSUMED_OVERHEAD_S,
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: BF16 Tensor Core "
        "1,979 TFLOPS with sparsity, i.e. 989 dense; GPU memory bandwidth "
        "4.8 TB/s); overhead assumed"),
    HardwareProfile(
        "tpu_v5e", 197e12, 819e9, _ASSUMED_OVERHEAD_S,
        "Google Cloud TPU documentation, 'TPU v5e' (peak compute per chip "
        "197 TFLOPs bf16; HBM2 bandwidth 819 GBps); overhead assumed"),
    HardwareProfile(
        "tpu_v4", 275e12, 1.2e12, _ASSUMED_OVERHEAD_S,
        "Google Cloud TPU documentation, 'TPU v4' (peak compute per chip "
        "275 TFLOPs bf16; HBM2 bandwidth 1,200 GBps); overhead assumed"),
)}
PROFILE_NAMES = ("cpu",) + tuple(PROFILES)
# Pieces of `jax.Device.device_kind` (lower case) -> the published profile.
# The H100's PCIe part has other figures: only the SXM part, which JAX names
# 'NVIDIA H100 80GB HBM3', matches.
_DEVICE_KINDS = (("h200", "h200"), ("h100 80gb hbm3", "h100_sxm"),
                 ("tpu v5 lite", "tpu_v5e"), ("tpu v5e", "tpu_v5e"),
                 ("tpu v4", "tpu_v4"))


def published_profile(device_kind: str) -> str | None:
  """The name of the published profile (`PROFILES`) of a JAX device kind,
  e.g. 'NVIDIA H200' -> 'h200'; None when none matches (a CPU, another
  accelerator)."""
  kind = device_kind.lower()
  return next((name for piece, name in _DEVICE_KINDS if piece in kind), None)


def profile_from_json(path: str) -> HardwareProfile:
  """The profile saved by experiments/measure_cpu_profile.py at `path`.

  Raises:
    ValueError: the file is missing or lacks a field.
  """
  if not os.path.exists(path):
    raise ValueError(f"path={path!r}: no profile there; run "
                     "experiments/measure_cpu_profile.py first")
  with open(path) as f:
    saved = json.load(f)
  fields = [f.name for f in dataclasses.fields(HardwareProfile)]
  missing = [f for f in fields if f not in saved]
  if missing:
    raise ValueError(f"path={path!r} lacks the fields {missing}")
  return HardwareProfile(**{f: saved[f] for f in fields})


def load_profile(name: str, cpu_path: str = CPU_PROFILE_PATH
                 ) -> HardwareProfile:
  """The profile called `name`: "cpu" (measured, read from `cpu_path`) or
  a published one (`PROFILES`).

  Raises:
    ValueError: an unknown name (the message lists `PROFILE_NAMES`), or as
      `profile_from_json`.
  """
  if name == "cpu":
    return profile_from_json(cpu_path)
  if name not in PROFILES:
    raise ValueError(f"unknown profile name={name!r}; allowed: "
                     f"{PROFILE_NAMES}")
  return PROFILES[name]


def param_count(config: TransformerConfig) -> int:
  """Scalar parameters of `Transformer(config)`, in closed form.

  V D (embedding) + [max_len D (learned positions)] + L (D (H + 2 Hkv) Dh
  + H Dh D + m D F + n D) + n D (final norm) + [D V (untied head)]
  + [D C + C (length head)] + [m D F + n D (self-conditioning block)],
  m = 3 (SwiGLU) or 2, n = 1 (RMSNorm scale) or 2 (LayerNorm scale and
  bias) per norm, two norms per layer; biases per layer: (H + 2 Hkv) Dh
  with use_bias or qkv_bias, plus D + (m - 1) F + D with use_bias (the
  self-conditioning MLP's too).
  """
  c = config
  d, per_norm = c.d_model, 2 if c.norm == "layernorm" else 1
  mlp_matrices = 3 if c.mlp_activation == "swiglu" else 2
  qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  layer = (d * qkv + c.num_heads * c.head_dim * d
           + mlp_matrices * d * c.mlp_dim + 2 * per_norm * d)
  if c.use_bias or c.qkv_bias:
    layer += qkv
  if c.use_bias:
    layer += d + (mlp_matrices - 1) * c.mlp_dim + d
  total = c.vocab_size * d + c.num_layers * layer + per_norm * d
  if c.positional == "learned":
    total += c.max_len * d
  if not c.tie_embeddings:
    total += d * c.vocab_size
  if c.length_classes:
    total += d * c.length_classes + c.length_classes
  if c.self_conditioning:
    total += mlp_matrices * d * c.mlp_dim + per_norm * d
    if c.use_bias:
      total += d + (mlp_matrices - 1) * c.mlp_dim
  return total


def param_bytes(config: TransformerConfig) -> int:
  """Bytes of the parameters at `config.param_dtype`."""
  return param_count(config) * config.weight_dtype.itemsize


def kv_bytes_per_slot(config: TransformerConfig) -> int:
  """KV-cache bytes of one token position of one row, all layers, as
  `KVCache.bytes_per_slot`: 2 L Hkv Dh x itemsize in the compute dtype, or
  with `kv_cache_dtype='int8'` 2 L Hkv (Dh + 4): int8 values and a float32
  scale per head vector."""
  per_head = (config.head_dim + 4 if config.kv_cache_dtype == "int8"
              else config.head_dim * config.compute_dtype.itemsize)
  return 2 * config.num_layers * config.num_kv_heads * per_head


def _check_counts(**counts) -> None:
  for name, value in counts.items():
    if not is_count(value):
      raise ValueError(f"{name}={value!r} must be an integer >= 1")


def matmul_params(config: TransformerConfig) -> int:
  """N: the weights every position is multiplied by in a forward pass.

  L (D (H + 2 Hkv) Dh + H Dh D + m D F) + D V: the query, key, value,
  output and MLP kernels of every layer and the LM head (the tied embedding
  counts once, as the head: a lookup is not a matmul). Norms, biases,
  positional tables and the length head are left out, so a forward pass
  costs 2 N FLOPs per position plus attention. With self-conditioning,
  + V D + m D F: the probabilities times the embedding table and the
  block's MLP.
  """
  c = config
  mlp_matrices = 3 if c.mlp_activation == "swiglu" else 2
  layer = (c.d_model * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
           + c.num_heads * c.head_dim * c.d_model
           + mlp_matrices * c.d_model * c.mlp_dim)
  total = c.num_layers * layer + c.d_model * c.vocab_size
  if c.self_conditioning:
    total += c.vocab_size * c.d_model + mlp_matrices * c.d_model * c.mlp_dim
  return total


def forward_flops(config: TransformerConfig, batch_size: int, length: int,
                  key_length: int) -> int:
  """FLOPs of one forward pass over B x L positions attending to S slots
  (the per-position count of the module docstring, times B L):
  B L (2 `matmul_params` + 4 S H Dh per layer).

  Args:
    config: the model.
    batch_size: B, >= 1.
    length: L, query positions per row, >= 1.
    key_length: S, key slots each query attends to (computed, masked or
      not), >= 1.
  Raises:
    ValueError: a count below 1 (the message names it).
  """
  _check_counts(batch_size=batch_size, length=length, key_length=key_length)
  attention = 4 * key_length * config.num_heads * config.head_dim
  per_position = 2 * matmul_params(config) + config.num_layers * attention
  return batch_size * length * per_position


# Positions one training pass runs per row of L data tokens: AR predicts
# tokens[1:] from tokens[:-1]; MDLM denoises all L; BD3-LM runs [x_t ; x_0].
_TRAINED_POSITIONS = {"ar": lambda length: length - 1,
                      "mdlm": lambda length: length,
                      "uniform": lambda length: length,
                      "bd3lm": lambda length: 2 * length}
TRAINED_OBJECTIVES = tuple(_TRAINED_POSITIONS)


def objective_flops(config: TransformerConfig, objective: str,
                    batch_size: int, seq_len: int, backward: bool = True
                    ) -> int:
  """FLOPs of one training step of an LM objective on B x L data tokens.

  The model runs P positions per row (`_TRAINED_POSITIONS`: L - 1 for
  'ar', L for 'mdlm', 2 L for 'bd3lm'), each attending to all P (masked
  keys are computed, as in `forward_flops`). The backward pass costs twice
  the forward (a gradient for the activations and one for the weights),
  so a step is 3 forward passes; per position

    6 N + 12 n_layers S H Dh        (N = `matmul_params`, S = P),

  Kaplan et al. 2020's 6N plus the attention scores and their gradients,
  as PaLM (Chowdhery et al. 2022, appendix B) counts model FLOPs for MFU.
  The optimizer update, norms, softmax and the loss are left out.
  `backward=False` gives the forward pass alone, 2 N + 4 n_layers S H Dh
  per position: what one denoising step over the same batch costs. A
  self-conditioned model (`TransformerConfig.self_conditioning`; 'mdlm'
  and 'uniform') runs one more forward pass per training step, the first
  pass whose prediction it takes (`objectives.denoiser_logits`): 4
  forward passes.

  Args:
    config: the model.
    objective: one of TRAINED_OBJECTIVES.
    batch_size: B, rows, >= 1.
    seq_len: L, data tokens per row (>= 2 for 'ar').
    backward: count the backward pass (a training step) or not.
  Returns:
    FLOPs per step; divide by B L for FLOPs per data token.
  Raises:
    ValueError: an objective not in TRAINED_OBJECTIVES, or a count below 1
      (the message names it).
  """
  if objective not in _TRAINED_POSITIONS:
    raise ValueError(f"objective={objective!r}; allowed: "
                     f"{TRAINED_OBJECTIVES}")
  _check_counts(batch_size=batch_size, seq_len=seq_len)
  positions = _TRAINED_POSITIONS[objective](seq_len)
  if positions < 1:
    raise ValueError(f"seq_len={seq_len} must be >= 2 for objective "
                     f"{objective!r}")
  forward = forward_flops(config, batch_size, positions, positions)
  if not backward:
    return forward
  return (4 if config.self_conditioning else 3) * forward


def forward_bytes(config: TransformerConfig, batch_size: int, length: int,
                  key_length: int) -> int:
  """Bytes one forward pass must move: parameters once, B x S slots of keys
  and values, and the float32 logits B x L x V.

  Raises:
    ValueError: as `forward_flops`.
  """
  _check_counts(batch_size=batch_size, length=length, key_length=key_length)
  return (param_bytes(config)
          + batch_size * key_length * kv_bytes_per_slot(config)
          + batch_size * length * config.vocab_size * LOGITS_ITEMSIZE)


def step_s(config: TransformerConfig, batch_size: int, length: int,
           key_length: int, profile: HardwareProfile) -> float:
  """Roofline time of one forward pass, seconds:
  max(flops / peak_flops, bytes / bandwidth) + step_overhead_s.

  The bytes term is `cost.roofline_s` of the parameters and the rest.

  Raises:
    ValueError: as `forward_flops`.
  """
  flops = forward_flops(config, batch_size, length, key_length)
  params = param_bytes(config)
  other = forward_bytes(config, batch_size, length, key_length) - params
  memory_s = cost.roofline_s(params, other, profile.bandwidth)
  return max(flops / profile.peak_flops, memory_s) + profile.step_overhead_s


def _check_lengths(batch_size, prompt_length, output_length):
  _check_counts(batch_size=batch_size, prompt_length=prompt_length,
                output_length=output_length)


def prefill_s(config: TransformerConfig, batch_size: int, prompt_length: int,
              output_length: int, profile: HardwareProfile) -> float:
  """The AR prefill: one pass over B x P positions into a cache of P + T
  slots, seconds.

  Raises:
    ValueError: B, P or T below 1 (the message names it).
  """
  _check_lengths(batch_size, prompt_length, output_length)
  return step_s(config, batch_size, prompt_length,
                prompt_length + output_length, profile)


def ar_step_s(config: TransformerConfig, batch_size: int, prompt_length: int,
              output_length: int, profile: HardwareProfile) -> float:
  """One cached AR step: B x 1 new positions against the P + T cache slots,
  seconds. Bytes-bound at small B (parameters + cache over bandwidth).

  Raises:
    ValueError: B, P or T below 1 (the message names it).
  """
  _check_lengths(batch_size, prompt_length, output_length)
  return step_s(config, batch_size, 1, prompt_length + output_length, profile)


def ar_decode_s(config: TransformerConfig, batch_size: int,
                prompt_length: int, output_length: int,
                profile: HardwareProfile) -> float:
  """A whole AR decode of T tokens: prefill + (T - 1) cached steps, seconds.

  Raises:
    ValueError: B, P or T below 1 (the message names it).
  """
  return (prefill_s(config, batch_size, prompt_length, output_length, profile)
          + (output_length - 1) * ar_step_s(config, batch_size, prompt_length,
                                            output_length, profile))


def denoise_step_s(config: TransformerConfig, batch_size: int,
                   prompt_length: int, output_length: int,
                   profile: HardwareProfile) -> float:
  """One full denoising step: a pass over all B x (P + T) positions,
  seconds. FLOP-bound unless B (P + T) is small.

  Raises:
    ValueError: B, P or T below 1 (the message names it).
  """
  _check_lengths(batch_size, prompt_length, output_length)
  length = prompt_length + output_length
  return step_s(config, batch_size, length, length, profile)


def parallel_decode_s(config: TransformerConfig, batch_size: int,
                      prompt_length: int, output_length: int, steps: int,
                      profile: HardwareProfile,
                      block_length: int | None = None) -> float:
  """A K-step parallel decode, seconds.

  Without `block_length`: K full denoising steps. With a block length W
  (dividing T): T / W blocks, K steps in all (K a multiple of T / W), each
  step a pass over B x W positions against the P + T slots of a dual cache,
  plus one full pass per block that refreshes the cache (Fast-dLLM, Wu et
  al. 2025).

  Args:
    config, batch_size, prompt_length, output_length, profile: as
      `denoise_step_s`.
    steps: K, denoising steps in all, >= 1.
    block_length: W or None.
  Raises:
    ValueError: B, P, T, K or W below 1, W not dividing T, or K not a
      multiple of the number of blocks (the message names the argument).
  """
  _check_lengths(batch_size, prompt_length, output_length)
  _check_counts(steps=steps)
  full = denoise_step_s(config, batch_size, prompt_length, output_length,
                        profile)
  if block_length is None:
    return steps * full
  _check_counts(block_length=block_length)
  if output_length % block_length:
    raise ValueError(f"block_length={block_length} must divide "
                     f"output_length={output_length}")
  blocks = output_length // block_length
  if steps % blocks:
    raise ValueError(f"steps={steps} must be a multiple of the number of "
                     f"blocks T / block_length = {blocks}")
  block = step_s(config, batch_size, block_length,
                 prompt_length + output_length, profile)
  return blocks * full + steps * block


def block_decode_s(config: TransformerConfig, batch_size: int,
                   prompt_length: int, output_length: int, block_length: int,
                   calls: float, profile: HardwareProfile) -> float:
  """A BD3-LM decode over the exact prefix cache (`decoding.bd3lm`,
  kv_cache 'prefix') that made `calls` forward calls (its NFE), seconds.

  The NFE counts the prefill (B x P), the N - 1 writes of a finished
  block's clean keys (B x W each; N = T / W blocks, no write after the
  last) and calls - N denoising calls of B x W window positions (B x
  (W + 1) under `config.token_shift`, which also feeds the committed token
  before the window), each against the P + T cache slots.

  Args:
    config, batch_size, prompt_length, output_length, profile: as
      `denoise_step_s`.
    block_length: W, dividing T.
    calls: the decode's NFE (a mean over decodes allowed), >= 2 N (a
      prefill, the writes, at least one denoising call a block).
  Raises:
    ValueError: B, P, T or W below 1, W not dividing T, or calls not a
      number >= 2 N (the message names the argument).
  """
  _check_lengths(batch_size, prompt_length, output_length)
  _check_counts(block_length=block_length)
  if output_length % block_length:
    raise ValueError(f"block_length={block_length} must divide "
                     f"output_length={output_length}")
  blocks = output_length // block_length
  if not (is_number(calls) and 2 * blocks <= calls < math.inf):
    raise ValueError(f"calls={calls!r} must be at least {2 * blocks} (a "
                     f"prefill, {blocks - 1} block writes, a denoising call "
                     f"a block)")
  slots = prompt_length + output_length
  window = block_length + int(config.token_shift)
  return (prefill_s(config, batch_size, prompt_length, output_length, profile)
          + (blocks - 1) * step_s(config, batch_size, block_length, slots,
                                  profile)
          + (calls - blocks) * step_s(config, batch_size, window, slots,
                                      profile))


def crossover_steps(config: TransformerConfig, batch_size: int,
                    prompt_length: int, output_length: int,
                    profile: HardwareProfile) -> float:
  """K* = AR decode / one full denoising step: a parallel decoder making
  fewer than K* full passes beats AR at this B, P, T.

  Raises:
    ValueError: B, P or T below 1 (the message names it).
  """
  return (ar_decode_s(config, batch_size, prompt_length, output_length,
                      profile)
          / denoise_step_s(config, batch_size, prompt_length, output_length,
                           profile))


def crossover_length(config: TransformerConfig, batch_size: int,
                     prompt_length: int, steps: int, profile: HardwareProfile,
                     max_length: int) -> int | None:
  """T*: the shortest output length in [1, max_length] at which a K-step
  full-pass parallel decode is faster than the AR decode, or None if it is
  slower at every length there.

  Raises:
    ValueError: B, P, K or max_length below 1 (the message names it).
  """
  _check_counts(batch_size=batch_size, prompt_length=prompt_length,
                steps=steps, max_length=max_length)
  for t in range(1, max_length + 1):
    if (parallel_decode_s(config, batch_size, prompt_length, t, steps,
                          profile)
        < ar_decode_s(config, batch_size, prompt_length, t, profile)):
      return t
  return None


def comparison_row_s(row: dict, configs: dict[str, TransformerConfig],
                     prompt_length: int, profile: HardwareProfile
                     ) -> float | None:
  """Predicted seconds of one row of `comparison.run`, or None when the
  row's calls are not all of a shape the model costs.

  Per role (row["models"] is "role=member, ..."; row["calls"] and
  row["forward_tokens"] count per role): calls that each cover B x (P + T)
  positions are full passes (`step_s` each); a single causal role with T
  calls over B x (P + T - 1) positions is a cached AR decode
  (`ar_decode_s`). Other shapes (speculative verification, dual-cache
  blocks) give None.

  Args:
    row: a row dict with "models", "batch_size", "output_length", "calls"
      and "forward_tokens".
    configs: the model config of each member named in row["models"].
    prompt_length: P of the comparison, >= 1.
    profile: the hardware.
  Raises:
    ValueError: a member missing from `configs` (the message names it).
  """
  b, t = row["batch_size"], row["output_length"]
  length = prompt_length + t
  roles = dict(part.split("=") for part in row["models"].split(", "))
  total = 0.0
  for role, member in roles.items():
    if member not in configs:
      raise ValueError(f"configs lacks member={member!r}; given "
                       f"{sorted(configs)}")
    config = configs[member]
    calls, tokens = row["calls"][role], row["forward_tokens"][role]
    if tokens == calls * b * length:
      total += calls * step_s(config, b, length, length, profile)
    elif (len(roles) == 1 and calls == t
          and tokens == b * (prompt_length + t - 1)):
      total += ar_decode_s(config, b, prompt_length, t, profile)
    else:
      return None
  return total


def comparison_row_ms(configs: dict[str, TransformerConfig],
                      prompt_length: int, profile: HardwareProfile):
  """row -> predicted ms of a comparison row (`comparison_row_s` x 1e3),
  or None where that gives None."""
  def predict(row: dict) -> float | None:
    seconds = comparison_row_s(row, configs, prompt_length, profile)
    return None if seconds is None else seconds * 1e3
  return predict
