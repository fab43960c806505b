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

import os

from absl import app
from absl import flags
import matplotlib
from ml_collections import config_flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lm_decoding.evaluation import cost_model  # noqa: E402
from lm_decoding.evaluation.checklist import (  # noqa: E402
    Curves, crossover_from_curves, measured_curves, model_curves, recommend)
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


def _check(flag: str, value, ok: bool, allowed: str) -> None:
  if not ok:
    raise app.UsageError(f"--{flag}={value}: must be {allowed}")


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
  t_star = crossover_from_curves(curves, steps, _MAX_LENGTH.value)
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
