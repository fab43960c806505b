"""The columns of one row of the comparison (`comparison.run`): identity,
model calls and timing (`cost_row`), EOS mode (`eos_columns`), the
self-correction rate, per-device bandwidth and FLOP/s on a mesh, greedy
agreement with AR greedy, and the line printed when a row is finished.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base
from lm_decoding.decoding.rows import eos_counts
from lm_decoding.evaluation import cost, entries
from lm_decoding.evaluation.entries import Planned
from lm_decoding.models import Model, count_params

SPREAD_FLAG = 0.10  # timing spread (IQR / median) above which a row is flagged


def work_done(result: base.DecodeResult) -> tuple:
  return (tuple(sorted((r, int(c)) for r, c in result.calls.items())),
          tuple(sorted((r, int(c)) for r, c in result.forward_tokens.items())))


def timing_columns(timing: cost.Timing) -> dict:
  median = timing.median_s
  return {"ms_min": timing.min_s * 1e3, "ms_median": median * 1e3,
          "spread": timing.iqr_s / median if median > 0 else math.nan,
          "compile_s": timing.compile_s}


def cost_row(p: Planned, b: int, fixed: base.DecodeResult,
              timing: cost.Timing, prompt_len: int) -> dict:
  """A row's identity, model calls and timing columns, from the timed
  fixed-length run."""
  t = p.output_length
  row = {"decoder": p.label, "series": list(p.series),
         "models": ", ".join(f"{r}={m}" for r, m in p.roles),
         "batch_size": b, "output_length": t, "nfe": int(fixed.nfe),
         "calls": {r: int(c) for r, c in fixed.calls.items()},
         "forward_tokens": {r: int(c)
                            for r, c in fixed.forward_tokens.items()},
         **timing_columns(timing)}
  row["noisy"] = bool(row["spread"] > SPREAD_FLAG)
  row["full_pass"] = all(
      row["forward_tokens"][r] == c * b * (prompt_len + t)
      for r, c in row["calls"].items())
  row["cached"] = p.cached
  row["context"] = (p.decoder.context().record
                    if hasattr(p.decoder, "context") else "")
  row["reference"] = p.reference_label
  row["judged_against"] = p.judged_against
  row["ms_per_token"] = row["ms_min"] / t
  return row


def eos_columns(eos_fn, args: tuple, fixed: base.DecodeResult,
                 eos: base.DecodeResult, same_work: bool,
                 timing: cost.Timing, eos_ids: tuple[int, ...], runs: int
                 ) -> dict:
  """Tokens up to EOS and their rate; the EOS run (`eos_fn`, the jitted
  EOS-stopping decode) is timed apart only when it did other work than the
  fixed-length run (`work_done`)."""
  b = args[1].shape[0]
  eos_tokens, eos_lengths = eos.tokens[:b], np.asarray(eos.lengths[:b])
  eos_s = timing.min_s
  if not same_work:
    eos_s = cost.measure(eos_fn, args, 0, runs)[0].min_s
  real_tokens = int(eos_lengths.sum())
  return dict(
      eos_tokens_per_row=real_tokens / b,
      eos_timed_apart=not same_work,
      real_tokens_per_s=real_tokens / eos_s,
      all_eos=int(eos_counts(fixed.tokens, eos_ids)[1]),
      empty=int(eos_counts(eos_tokens, eos_ids)[0]))


def self_correction(result: base.DecodeResult) -> dict:
  """For a decoder whose stats count acceptances ('accepted') and those that
  revised an earlier one ('revised'): revised / accepted, pooled over the
  rows; {} for the others."""
  if "revised" not in result.stats:
    return {}
  accepted = int(jnp.sum(result.stats["accepted"]))
  return dict(self_correction=int(jnp.sum(result.stats["revised"]))
              / max(accepted, 1))


def per_device_columns(row: dict, models: Mapping[str, Model],
                        roles, seconds: float, devices: int) -> dict:
  """Weight bandwidth and model FLOP/s per device of a row.

  Each forward call reads every weight of its model once (the bytes
  roofline's assumption, `cost.roofline_s`) and does 2 FLOPs per parameter
  per token position (attention scores excluded); both are summed over the
  roles' calls and positions and divided by the time and the device count.
  """
  weight_bytes = flops = 0.0
  for role, member in roles:
    params = models[member].params
    weight_bytes += row["calls"][role] * cost.tree_bytes(params)
    flops += 2.0 * row["forward_tokens"][role] * count_params(params)
  return {"devices": devices,
          "weight_GBps_per_device": weight_bytes / seconds / devices / 1e9,
          "GFLOPs_per_device": flops / seconds / devices / 1e9}


def greedy_agreement(rows: Sequence[dict], planned: Sequence[Planned],
                      fixed_tokens: Mapping[tuple, jax.Array],
                      quality_batch: int) -> None:
  """Adds "greedy_agreement" to each greedy row at the largest batch that is
  judged against another greedy row (AR greedy): the fraction of its fixed-length
  tokens [B, T] equal to that row's, position by position (same prompts; a
  decoder that reproduces AR greedy scores 1)."""
  by_label = {(p.label, p.output_length): p for p in planned
              if entries.greedy(p.decoder)}
  for row, p in zip(rows, planned):
    ref = by_label.get((p.judged_against, p.output_length))
    if (row["batch_size"] == quality_batch and ref is not None
        and ref is not p and entries.greedy(p.decoder)):
      row["greedy_agreement"] = float(jnp.mean(
          fixed_tokens[p.decoder, p.roles, quality_batch]
          == fixed_tokens[ref.decoder, ref.roles, quality_batch]))


def summary(row: dict) -> str:
  """The one line printed when a row is finished."""
  fwd = ", ".join(f"{r} {n:,}" for r, n in row["forward_tokens"].items())
  line = (f"{row['decoder']} | T={row['output_length']} "
          f"B={row['batch_size']} | NFE {row['nfe']}, fwd tokens {fwd} | "
          f"{row['ms_min']:.1f} ms min, {row['ms_median']:.1f} median, "
          f"spread {row['spread']:.0%}{' (noisy)' if row['noisy'] else ''} | "
          f"real tok/s {row['real_tokens_per_s']:.0f}")
  if "gen_ppl" in row:
    line += (f" | gen-PPL {row['gen_ppl']:.1f}, entropy "
             f"{row['entropy']:.2f}")
  if "max_logit_error" in row:
    line += (f" | cache error {row['max_logit_error']:.3g}, agreement "
             f"{row['agreement']:.1%}")
  return line
