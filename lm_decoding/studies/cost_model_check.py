"""The cost model's predictions against measured decodes.

`measure_point` times, for one model shape and batch size, a whole cached
AR decode (`cost_model.ar_decode_s`) and one full denoising pass of an MDLM
decode (`cost_model.denoise_step_s`), the two in turns after compiling both
(`cost.interleaved`), and predicts both with two hardware profiles: one
measured right after the point's runs (the load of a shared machine drifts)
and a saved one. `crossover_lines` predicts K* and T* on accelerators
(experiments/validate_cost_model.py writes both).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from lm_decoding.decoding import base, bind, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost, cost_model
from lm_decoding.models import TransformerConfig, init_params
from lm_decoding.models import make_logits_fn

# Models whose crossovers are predicted on accelerators, in bfloat16.
CROSSOVER_MODELS = {
    "large": dict(vocab_size=4096, d_model=512, num_layers=8, num_heads=8,
                  num_kv_heads=8, head_dim=64, mlp_dim=1536),
    "gpt2_small": dict(vocab_size=50257, d_model=768, num_layers=12,
                       num_heads=12, num_kv_heads=12, head_dim=64,
                       mlp_dim=3072, mlp_activation="gelu"),
}
CROSSOVER_PROFILES = ("h100_sxm", "h200", "tpu_v5e")
CROSSOVER_T = 256  # output length of the predicted K*
CROSSOVER_K = 32  # steps of the predicted T*
CROSSOVER_MAX_T = 8192


def _decoder(name: str, output_length: int, **options) -> Any:
  """A registered decoder of fixed length, sampling at temperature 1."""
  return make_decoder(name, output_length=output_length, eos_ids=(),
                      sampling=SamplingConfig(temperature=1.0), **options)


def _predict(causal, bidirectional, batch, prompt_len, output_length,
             profile) -> dict[str, float]:
  return {"ar": cost_model.ar_decode_s(causal, batch, prompt_len,
                                       output_length, profile),
          "denoise_step": cost_model.denoise_step_s(
              bidirectional, batch, prompt_len, output_length, profile)}


def _step_columns(kind: str, config: TransformerConfig, batch: int,
                  width: int, nfe: int,
                  profile: cost_model.HardwareProfile) -> dict:
  """A row's step columns: the roofline term that bounds one step of `kind`
  over `width` positions ('bound'), NFE and the profile measured now."""
  step_shape = {"ar": (1, width), "denoise_step": (width, width)}[kind]
  flops = cost_model.forward_flops(config, batch, *step_shape)
  moved = cost_model.forward_bytes(config, batch, *step_shape)
  return dict(
      bound=("FLOPs" if flops / profile.peak_flops
             > moved / profile.bandwidth else "bytes"),
      nfe=nfe, point_gflops=profile.peak_flops / 1e9,
      point_gbps=profile.bandwidth / 1e9)


def measure_point(size: str, causal: TransformerConfig,
                  bidirectional: TransformerConfig, batch: int,
                  prompt_len: int, output_length: int, steps: int, runs: int,
                  saved: cost_model.HardwareProfile,
                  profile_now: Callable[[], cost_model.HardwareProfile]
                  ) -> list[dict]:
  """Two rows ('ar', 'denoise_step') of one (model, batch) point.

  Args:
    size: the model's name in the rows.
    causal, bidirectional: the model for AR and for MDLM (random weights:
      cost does not depend on them).
    batch: B; prompt_len: P; output_length: T.
    steps: MDLM steps of the timed decode (full passes: no logit reuse, no
      early stop); a denoising step's time is the decode's over its NFE.
    runs: timed rounds (ar, mdlm), >= 1.
    saved: the saved hardware profile.
    profile_now: measures the profile right after the timed runs.
  Returns:
    Rows: measured min and median ms, predicted ms under both profiles,
    error = (predicted - measured min) / measured min (other jobs only ever
    add time), the roofline term that dominates one step ('bound').
  """
  params = init_params(causal, jax.random.key(0))
  prompts = jnp.full((batch, prompt_len), 5, jnp.int32)
  lengths = jnp.full((batch,), prompt_len, jnp.int32)
  systems = {"ar": (_decoder("ar", output_length), causal),
             "denoise_step": (_decoder("mdlm", output_length, steps=steps,
                                       reuse_logits=False, early_stop=False),
                              bidirectional)}
  args = {kind: (bind(make_logits_fn(config), params), prompts, lengths,
                 jax.random.key(1)) for kind, (_, config) in systems.items()}
  compiled = {kind: cost.compile_timed(base.jit_decode(decoder), args[kind])
              for kind, (decoder, _) in systems.items()}
  times, outputs = cost.interleaved(
      {kind: functools.partial(c, *args[kind]) for kind, (c, _) in
       compiled.items()}, runs, warmup=1)
  profile = profile_now()
  predicted = _predict(causal, bidirectional, batch, prompt_len,
                       output_length, profile)
  predicted_saved = _predict(causal, bidirectional, batch, prompt_len,
                             output_length, saved)
  rows = []
  for kind, runs_s in times.items():
    row = dict(size=size, params=cost_model.param_count(causal),
               param_mb=cost_model.param_bytes(causal) / 2 ** 20,
               batch_size=batch, prompt_len=prompt_len,
               output_length=output_length, kind=kind,
               **_step_columns(kind, causal, batch, prompt_len + output_length,
                               int(outputs[kind].nfe), profile),
               predicted_ms=predicted[kind] * 1e3,
               predicted_saved_ms=predicted_saved[kind] * 1e3)
    per_call = 1 if kind == "ar" else row["nfe"]  # a decode of NFE steps
    ms_min = min(runs_s) / per_call * 1e3
    row.update(measured_min_ms=ms_min, measured_median_ms=sorted(runs_s)[
        len(runs_s) // 2] / per_call * 1e3, compile_s=compiled[kind][1])
    row["error"] = (row["predicted_ms"] - ms_min) / ms_min
    row["error_saved"] = (row["predicted_saved_ms"] - ms_min) / ms_min
    rows.append(row)
  return rows


def crossover_lines(prompt_len: int) -> list[str]:
  """Markdown table of the predicted K* (at T = CROSSOVER_T) and T* (at
  K = CROSSOVER_K, searched up to CROSSOVER_MAX_T) of CROSSOVER_MODELS in
  bfloat16 on CROSSOVER_PROFILES, B = 1, 8, 32."""
  lines = [f"| model | params | hardware | B | K* at T={CROSSOVER_T} | "
           f"T* at K={CROSSOVER_K} |", "|---|---|---|---|---|---|"]
  for model, shape in CROSSOVER_MODELS.items():
    config = TransformerConfig(
        max_len=prompt_len + CROSSOVER_MAX_T, attention="bidirectional",
        dtype="bfloat16", param_dtype="bfloat16", **shape)
    for name in CROSSOVER_PROFILES:
      profile = cost_model.load_profile(name)
      for batch in (1, 8, 32):
        k = cost_model.crossover_steps(config, batch, prompt_len,
                                       CROSSOVER_T, profile)
        t = cost_model.crossover_length(config, batch, prompt_len,
                                        CROSSOVER_K, profile,
                                        CROSSOVER_MAX_T)
        lines.append(f"| {model} | {cost_model.param_count(config) / 1e6:.1f}"
                     f"M | {name} | {batch} | {k:.0f} | "
                     f"{'never' if t is None else t} |")
  return lines
