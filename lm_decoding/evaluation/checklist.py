"""The decoder selection checklist (the first source article's four questions).

`recommend(curves, ...)` answers, in order: is the output length
predictable? is there a hard latency limit? is a structural quality metric
available? is a hybrid acceptable? -- with AR, parallel with K steps,
speculative, or hybrid (a K-step parallel draft refined or verified by AR),
and the reasons. The latencies come from `Curves`: predicted by the cost
model (`model_curves`) or measured by the main job (`measured_curves`).
`experiments/recommend.py` is the command-line tool over it.
"""

from __future__ import annotations

import csv
import dataclasses
import os

from lm_decoding.evaluation import cost_model, router
from lm_decoding.models.config import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Curves:
  """AR latency and the parallel latency per step count, in ms, at T."""

  ar: router.CostCurve
  parallel_step: router.CostCurve  # one parallel step (ms per step)
  source: str

  def ar_ms(self, length: int) -> float:
    return self.ar.latency_at(length)

  def parallel_ms(self, length: int, steps: int) -> float:
    return steps * self.parallel_step.latency_at(length)


def model_curves(config: TransformerConfig, batch: int, prompt_len: int,
                 lengths, profile: cost_model.HardwareProfile) -> Curves:
  """Curves from the cost model (the denoiser: `config`, bidirectional)."""
  denoiser = config.replace(attention="bidirectional")
  return Curves(
      ar=router.predicted_curve("ar", "ar", 1.0, lengths, config, batch,
                                prompt_len, profile),
      parallel_step=router.predicted_curve(
          "parallel step", "parallel", 1.0, lengths, denoiser, batch,
          prompt_len, profile, steps=1),
      source=f"cost model, profile {profile.name}, B={batch}")


def measured_curves(path: str, batch: int, ar_label: str,
                    parallel_label: str) -> Curves:
  """Curves from a compare_decoding results.csv (ms min at each T).

  Raises:
    ValueError: a label with fewer than 2 lengths at this batch size.
  """
  with open(path) as f:
    rows = [r for r in csv.DictReader(f) if int(r["batch_size"]) == batch]

  def curve(label, per_step):
    pts = sorted((int(r["output_length"]), float(r["ms_min"])
                  / (int(r["nfe"]) if per_step else 1))
                 for r in rows if r["decoder"] == label)
    if len(pts) < 2:
      raise ValueError(f"{path} has {len(pts)} rows labelled {label!r} at "
                       f"batch_size={batch}; need >= 2 output lengths")
    return router.CostCurve(label, "parallel" if per_step else "ar",
                            tuple(p[0] for p in pts),
                            tuple(p[1] for p in pts), 1.0)

  return Curves(ar=curve(ar_label, False),
                parallel_step=curve(parallel_label, True),
                source=f"measured, {os.path.basename(path)}, B={batch}")


def crossover_from_curves(curves: Curves, steps: int, max_length: int):
  """The shortest T in [1, max_length] at which K parallel steps beat AR."""
  return next((t for t in range(1, max_length + 1)
               if curves.parallel_ms(t, steps) < curves.ar_ms(t)), None)


@dataclasses.dataclass(frozen=True)
class Recommendation:
  """decoder: "AR", "parallel", "speculative" or "hybrid" (a parallel draft
  + AR); steps: K of the parallel part (None for AR and speculative);
  reasons: the checklist's answers, in order."""

  decoder: str
  steps: int | None
  reasons: tuple[str, ...]

  def __str__(self):
    return self.decoder + ("" if self.steps is None else f" K={self.steps}")


def recommend(curves: Curves, length_predictable: bool, length: int,
              limit_ms: float, structural_metric: bool, hybrid_ok: bool,
              max_steps: int) -> Recommendation:
  """The checklist of the module docstring; limit_ms 0 means no limit."""
  choice, reasons = _checklist(curves, length_predictable, length, limit_ms,
                               structural_metric, hybrid_ok, max_steps)
  decoder, _, steps = choice.partition(" K=")
  return Recommendation(decoder, int(steps) if steps else None,
                        tuple(reasons))


def _checklist(curves, length_predictable, length, limit_ms,
               structural_metric, hybrid_ok, max_steps):
  ar_ms, step_ms = curves.ar_ms(length), curves.parallel_ms(length, 1)
  k_star = ar_ms / step_ms
  reasons = [f"AR at T={length}: {ar_ms:.2f} ms; one parallel step: "
             f"{step_ms:.2f} ms, so K* = {k_star:.1f} (parallel with fewer "
             f"than K* steps beats AR)"]
  fits = limit_ms <= 0 or ar_ms <= limit_ms
  steps = min(max_steps, length)
  if limit_ms > 0:
    steps = min(steps, int(limit_ms // step_ms))
    reasons.append(f"limit {limit_ms:g} ms: AR {'meets' if fits else 'misses'}"
                   f" it; at most {max(steps, 0)} parallel steps fit in it")
  if not length_predictable:
    reasons.append("output length not predictable: a parallel decoder must "
                   "fix or predict T (length errors truncate or pad), so "
                   "stay with a decoder that stops at EOS")
    if fits:
      return "AR", reasons + ["AR meets the limit (or there is none)"]
    reasons.append("AR misses the limit: speculative decoding keeps AR's "
                   "output distribution and goes faster only when the draft "
                   "agrees with the target (measure its acceptance rate)")
    return "speculative", reasons
  if fits and (limit_ms > 0 or k_star <= steps):
    reasons.append("AR is lossless and meets the limit" if limit_ms > 0 else
                   f"no limit, and the parallel decoder needs up to {steps} "
                   f"steps, not fewer than K* = {k_star:.1f}")
    return "AR", reasons
  if steps < 1:
    reasons.append("not even one parallel step fits the limit: nothing "
                   "meets it; AR-family speculative decoding is the fastest "
                   "lossless option to try")
    return "speculative", reasons
  if not structural_metric:
    reasons.append("no structural quality metric to catch the repetition "
                   "and omission of parallel decoding")
    if hybrid_ok:
      reasons.append("a hybrid lets AR verify or refine the parallel draft")
      return f"hybrid K={steps}", reasons
    reasons.append("without one, and with no hybrid allowed, speculative "
                   "decoding is the lossless way to gain speed")
    return "speculative", reasons
  reasons.append(f"parallel with K={steps} steps: "
                 f"{curves.parallel_ms(length, steps):.2f} ms; check it "
                 "with the structural metric (repetition, omission)")
  return f"parallel K={steps}", reasons


