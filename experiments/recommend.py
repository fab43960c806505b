r"""The decoder selection checklist as a tool: AR, parallel, speculative or
hybrid, with the reasoning and the latency curve it rests on.

  python experiments/recommend.py --profile=h100_sxm --batch_size=8 \
      --length_predictable --typical_length=256 --latency_limit_ms=50 \
      --structural_metric --hybrid_ok --workdir=/tmp/recommend

The checklist (the first source article's four questions, in order):
  1. Is the output length predictable? A parallel decoder fixes T (or
     predicts it, and length errors truncate or pad); if not, stay with a
     decoder that stops at EOS: AR, or speculative decoding to go faster.
  2. Is there a hard latency limit? If AR meets it at the typical length,
     AR (lossless, the best quality of the backbone) is the answer.
  3. Is a structural quality metric (repetition, omission) available? A
     parallel decoder trades quality for steps (repetition, omission under
     the conditional-independence assumption); without a metric that would
     catch it, do not ship it alone.
  4. Is a hybrid acceptable (a parallel draft refined or verified by AR)?
     It buys quality back at part of the parallel speed.
The recommendation is AR, parallel with K steps, speculative, or hybrid
with a K-step parallel draft.
Latencies come from the cost model (`cost_model`, profile --profile) or,
with --results (a results.csv of experiments/compare_decoding.py), from the
measured rows labelled --ar_label and --parallel_label at --batch_size,
interpolated in T (`router.CostCurve.latency_at`). The parallel decoder is
taken with the most steps K <= --steps that meets the limit. Prints the
recommendation with its reasons and the curve; writes latency.png (AR and
parallel latency against T, the crossover T* marked) under --workdir.
"""

import csv
import dataclasses
import os

from absl import app
from absl import flags
import matplotlib
from ml_collections import config_flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lm_decoding.evaluation import cost_model, router  # noqa: E402
from lm_decoding.models.config import TransformerConfig  # noqa: E402
from lm_decoding.training import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"),
    "Experiment configuration file: its model (ar shape; the denoiser is "
    "the same backbone, bidirectional).")
_LENGTH_PREDICTABLE = flags.DEFINE_bool(
    "length_predictable", False, "Is the output length known in advance?")
_TYPICAL_LENGTH = flags.DEFINE_integer("typical_length", 128,
                                       "Typical output length T, tokens.")
_LATENCY_LIMIT = flags.DEFINE_float(
    "latency_limit_ms", 0.0, "Hard latency limit per request, ms; 0: none.")
_STRUCTURAL = flags.DEFINE_bool(
    "structural_metric", False, "Is a structural quality metric "
    "(repetition, omission) available to check parallel outputs?")
_HYBRID_OK = flags.DEFINE_bool("hybrid_ok", False,
                               "Is a hybrid (parallel draft + AR) acceptable?")
_PROFILE = flags.DEFINE_string(
    "profile", "cpu", f"Hardware profile, one of {cost_model.PROFILE_NAMES}.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 1, "Batch size B.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt length P.")
_STEPS = flags.DEFINE_integer("steps", 32,
                              "Most parallel steps K worth taking.")
_RESULTS = flags.DEFINE_string(
    "results", "", "results.csv of compare_decoding.py: measured curves "
    "instead of the cost model.")
_AR_LABEL = flags.DEFINE_string("ar_label", "AR cached",
                                "The AR row label in --results.")
_PARALLEL_LABEL = flags.DEFINE_string(
    "parallel_label", "MDLM K=32", "The parallel row label in --results "
    "(its K is taken as --steps).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 1024,
                                   "Longest T on the curve.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_recommend",
                               "Where latency.png goes.")


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


def _check(flag: str, value, ok: bool, allowed: str) -> None:
  if not ok:
    raise app.UsageError(f"--{flag}={value}: must be {allowed}")


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


def crossover_length(curves: Curves, steps: int, max_length: int):
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


def _plot(curves: Curves, steps: int, length: int, limit_ms: float,
          t_star, max_length: int, path: str) -> None:
  ts = sorted({*range(1, max_length + 1, max(1, max_length // 200)),
               max_length})
  fig, ax = plt.subplots(figsize=(7, 5))
  ax.plot(ts, [curves.ar_ms(t) for t in ts], label="AR")
  ax.plot(ts, [curves.parallel_ms(t, steps) for t in ts],
          label=f"parallel, K={steps}")
  if t_star is not None:
    ax.axvline(t_star, color="k", ls=":", label=f"crossover T*={t_star}")
  ax.axvline(length, color="gray", ls="--", lw=0.8,
             label=f"typical T={length}")
  if limit_ms > 0:
    ax.axhline(limit_ms, color="red", lw=0.8, label=f"limit {limit_ms:g} ms")
  ax.set(xlabel="output length T (tokens)", ylabel="latency per request, ms",
         title=curves.source)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  batch, length = _BATCH_SIZE.value, _TYPICAL_LENGTH.value
  for flag, value in (("batch_size", batch), ("typical_length", length),
                      ("prompt_len", _PROMPT_LEN.value),
                      ("steps", _STEPS.value),
                      ("max_length", _MAX_LENGTH.value)):
    _check(flag, value, value >= 1, "an integer >= 1")
  _check("latency_limit_ms", _LATENCY_LIMIT.value,
         _LATENCY_LIMIT.value >= 0, ">= 0 (0: no limit)")
  _check("max_length", _MAX_LENGTH.value, _MAX_LENGTH.value >= length,
         f">= --typical_length={length}")
  try:
    if _RESULTS.value:
      curves = measured_curves(_RESULTS.value, batch, _AR_LABEL.value,
                               _PARALLEL_LABEL.value)
    else:
      profile = cost_model.load_profile(_PROFILE.value)
      lengths = (1, *range(16, _MAX_LENGTH.value + 1, 16))
      config = train.model_config(_CONFIG.value)
      config = config.replace(
          max_len=max(config.max_len, _PROMPT_LEN.value + _MAX_LENGTH.value))
      curves = model_curves(config, batch, _PROMPT_LEN.value,
                            sorted(set(lengths)), profile)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  choice = recommend(
      curves, _LENGTH_PREDICTABLE.value, length, _LATENCY_LIMIT.value,
      _STRUCTURAL.value, _HYBRID_OK.value, _STEPS.value)
  steps = choice.steps or min(_STEPS.value, length)
  t_star = crossover_length(curves, steps, _MAX_LENGTH.value)
  print(f"recommendation: {choice}")
  print(f"latencies: {curves.source}"
        + ("" if _RESULTS.value else f" ({profile.source})"))
  for reason in choice.reasons:
    print(f"  - {reason}")
  print(f"crossover: K={steps} parallel steps beat AR from T* = "
        f"{'never (up to ' + str(_MAX_LENGTH.value) + ')' if t_star is None else t_star}")
  print("T: AR ms, parallel ms")
  for t in sorted({1, 16, 64, length, 256, _MAX_LENGTH.value}):
    if t <= _MAX_LENGTH.value:
      print(f"  {t}: {curves.ar_ms(t):.2f}, "
            f"{curves.parallel_ms(t, steps):.2f}")
  os.makedirs(_WORKDIR.value, exist_ok=True)
  path = os.path.join(_WORKDIR.value, "latency.png")
  _plot(curves, steps, length, _LATENCY_LIMIT.value, t_star,
        _MAX_LENGTH.value, path)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
