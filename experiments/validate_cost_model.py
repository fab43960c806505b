r"""The cost model's predictions against measured decodes (CPU or GPU).

  python experiments/validate_cost_model.py \
      --workdir=experiments/results/cost_model

For each model size (--sizes) and batch size (--batch_sizes) it times, on
random parameters (cost does not depend on the weights):
  ar: the registered "ar" decoder (KV cache, `lax.scan`), P prompt and T
    new tokens, against `cost_model.ar_decode_s`;
  denoise step: the registered "mdlm" decoder with --steps full passes (no
    logit reuse, no early stop) over P + T positions, time / NFE, against
    `cost_model.denoise_step_s`.
The two are timed interleaved (ar, mdlm, ar, mdlm, ...) after compiling both;
the error is (predicted - measured) / measured on the fastest run (other jobs
only ever add time), the median shown beside it. Two profiles predict each
point: the saved profile (--profile: by default the measured CPU profile,
run experiments/measure_cpu_profile.py first; --profile_path; or a published
one such as h200), and the measured profile of --profile_path with its peak
FLOP/s and bandwidth re-measured right after the point's timed runs (same
methods, smaller: --point_matmul_size, --point_bandwidth_bytes), because the
load of a shared machine drifts between minutes. --dtype sets the models'
parameters and compute and the re-measured matmul (bfloat16 on a GPU:
experiments/gpu_record.py). Writes results.csv, report.md (with this
command and the predicted crossovers K* and T* for H100, H200 and TPU v5e)
and predicted_vs_measured.png under --workdir. --smoke: a tiny model, B 1,
one run: checks the pipeline in seconds.
"""

import dataclasses
import os

from absl import app
from absl import flags
import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lm_decoding.evaluation import cost, cost_model, records  # noqa: E402
from lm_decoding.studies import cost_model_check  # noqa: E402
from lm_decoding.models import TransformerConfig  # noqa: E402

# name -> model shape; "large" (29M parameters, 117 MB in float32) does not
# fit the 32 MiB L3 cache, "small" and "medium" do.
SIZES = {
    "tiny": dict(vocab_size=64, d_model=32, num_layers=1, num_heads=2,
                 num_kv_heads=2, head_dim=16, mlp_dim=64),
    "small": dict(vocab_size=4096, d_model=128, num_layers=2, num_heads=4,
                  num_kv_heads=4, head_dim=32, mlp_dim=512),
    "medium": dict(vocab_size=8192, d_model=256, num_layers=4, num_heads=8,
                   num_kv_heads=8, head_dim=32, mlp_dim=1024),
    "large": cost_model_check.CROSSOVER_MODELS["large"],
}

_WORKDIR = flags.DEFINE_string("workdir", "experiments/results/cost_model",
                               "Output directory.")
_SIZES = flags.DEFINE_list("sizes", ["small", "medium", "large"],
                           f"Model sizes, from {sorted(SIZES)}.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8", "32"],
                                 "Batch sizes.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens P.")
_OUTPUT_LENGTH = flags.DEFINE_integer("output_length", 64,
                                      "New tokens T.")
_STEPS = flags.DEFINE_integer("steps", 2, "MDLM steps timed per decode.")
_RUNS = flags.DEFINE_integer("runs", 3, "Timed rounds (ar, mdlm) per point.")
_PROFILE = flags.DEFINE_enum(
    "profile", "cpu", cost_model.PROFILE_NAMES,
    "The saved profile: 'cpu' reads --profile_path, the others are "
    "published (cost_model.PROFILES).")
_PROFILE_PATH = flags.DEFINE_string(
    "profile_path", cost_model.CPU_PROFILE_PATH,
    "The measured profile (JSON, experiments/measure_cpu_profile.py): the "
    "per-point profile's step overhead, and the saved one if --profile=cpu.")
_DTYPE = flags.DEFINE_enum(
    "dtype", "float32", ["float32", "bfloat16"],
    "Parameter and compute dtype of the timed models and of the per-point "
    "matmul peak.")
_POINT_MATMUL = flags.DEFINE_integer(
    "point_matmul_size", 1024, "Matmul size of the per-point peak FLOP/s.")
_POINT_BYTES = flags.DEFINE_integer(
    "point_bandwidth_bytes", 1 << 28, "Bytes summed for the per-point "
    "bandwidth (well above the 32 MiB L3 cache).")
_SMOKE = flags.DEFINE_bool("smoke", False,
                           "Tiny model, B 1, T 8, one run.")


def _config(size: str, attention: str) -> TransformerConfig:
  if size not in SIZES:
    raise ValueError(f"size={size!r}; allowed: {sorted(SIZES)}")
  return TransformerConfig(max_len=_PROMPT_LEN.value + _OUTPUT_LENGTH.value,
                           attention=attention, dtype=_DTYPE.value,
                           param_dtype=_DTYPE.value, **SIZES[size])


def _point_profile(base):
  """`base` with peak FLOP/s and bandwidth measured now."""
  return dataclasses.replace(
      base, name=f"{base.name} (now)",
      peak_flops=cost.measure_peak_flops(_POINT_MATMUL.value, runs=3,
                                         dtype=_DTYPE.value),
      bandwidth=cost.measure_bandwidth(_POINT_BYTES.value, runs=3))


def _measure_point(size, batch, saved, base):
  rows = cost_model_check.measure_point(
      size, _config(size, "causal"), _config(size, "bidirectional"), batch,
      _PROMPT_LEN.value, _OUTPUT_LENGTH.value, _STEPS.value, _RUNS.value,
      saved, lambda: _point_profile(base))
  for row in rows:
    print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in row.items()), flush=True)
  return rows


def _plot(rows, path):
  fig, ax = plt.subplots(figsize=(6.5, 5.5))
  markers = dict(zip(SIZES, "vos^"))
  for kind, color in (("ar", "tab:blue"), ("denoise_step", "tab:orange")):
    for size in dict.fromkeys(r["size"] for r in rows):
      pts = [r for r in rows if r["kind"] == kind and r["size"] == size]
      ax.scatter([r["measured_min_ms"] for r in pts],
                 [r["predicted_ms"] for r in pts], c=color,
                 marker=markers[size], s=[20 + 2 * r["batch_size"] for r in pts],
                 label=f"{kind}, {size}")
  values = [v for r in rows for v in (r["measured_min_ms"], r["predicted_ms"])]
  lo, hi = min(values) / 1.5, max(values) * 1.5
  ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
  ax.fill_between([lo, hi], [lo / 2, hi / 2], [lo * 2, hi * 2], color="gray",
                  alpha=0.15, label="within 2x")
  ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
         xlabel="measured ms (min of runs)", ylabel="predicted ms (roofline)",
         title=f"cost model on {jax.devices()[0].device_kind} "
         "(marker size ~ batch)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _report(rows, profile, load, path):
  errors = sorted(abs(r["error"]) for r in rows)
  saved_errors = sorted(abs(r["error_saved"]) for r in rows)
  device = jax.devices()[0]
  on_cpu = device.platform == "cpu"
  lines = [
      f"# Cost model against measured decodes on {device.device_kind}", "",
      "Command:", "", "```", records.command(), "```", "",
      f"Saved profile {profile.name}: peak {profile.peak_flops / 1e9:.1f} "
      f"GFLOP/s, bandwidth {profile.bandwidth / 1e9:.2f} GB/s, overhead "
      f"{profile.step_overhead_s * 1e6:.2f} us/step ({profile.source}).", ""]
  if on_cpu:
    lines += [
        cost.load_summary(load).capitalize() + ".", ""]
  lines += [
      f"P = {_PROMPT_LEN.value}, T = {_OUTPUT_LENGTH.value}, {_DTYPE.value} "
      "parameters and compute; ar: a whole "
      "decode (prefill + T - 1 cached steps); denoise_step: one full pass "
      f"over P + T positions (an MDLM decode of {_STEPS.value} steps / NFE). "
      "error = (predicted - measured min) / measured min. bound: the "
      "roofline term that dominates one step (FLOPs / peak or bytes / "
      "bandwidth). MB: parameter megabytes (MiB)"
      + ("; the CPU's L3 cache holds "
         "32 MiB, so the small and medium models are read from cache, not "
         "from DRAM, and the bandwidth term (DRAM) overestimates their "
         "bytes-bound steps" if on_cpu else "")
      + ". The measured decodes also sample (Gumbel noise "
      "in `mode=\"high\"`, per position and vocabulary entry) and update "
      "their state; the model counts the forward passes only.", "",
      "| size | params | MB | B | kind | bound | GFLOP/s now | GB/s now | "
      "predicted ms | measured min ms | measured median ms | error | "
      f"predicted ms (saved: {profile.name}) | error (saved) |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['size']} | {r['params'] / 1e6:.2f}M | {r['param_mb']:.0f} | "
        f"{r['batch_size']} | {r['kind']} | {r['bound']} | "
        f"{r['point_gflops']:.1f} | {r['point_gbps']:.2f} | "
        f"{r['predicted_ms']:.2f} | "
        f"{r['measured_min_ms']:.2f} | {r['measured_median_ms']:.2f} | "
        f"{r['error']:+.0%} | {r['predicted_saved_ms']:.2f} | "
        f"{r['error_saved']:+.0%} |")
  lines += ["", f"Median |error| {errors[len(errors) // 2]:.0%}, largest "
            f"{errors[-1]:.0%} over {len(rows)} points with the profile "
            "measured right after each point's runs; with the saved profile "
            f"{saved_errors[len(saved_errors) // 2]:.0%} and "
            f"{saved_errors[-1]:.0%}.", "",
            "Measured against predicted K* (AR decode / one denoising step) "
            "at these P and T:", "",
            "| size | B | K* measured | K* predicted |", "|---|---|---|---|"]
  for size in dict.fromkeys(r["size"] for r in rows):
    for b in dict.fromkeys(r["batch_size"] for r in rows):
      pair = {r["kind"]: r for r in rows
              if r["size"] == size and r["batch_size"] == b}
      if len(pair) == 2:
        lines.append(
            f"| {size} | {b} | "
            f"{pair['ar']['measured_min_ms'] / pair['denoise_step']['measured_min_ms']:.1f}"
            f" | {pair['ar']['predicted_ms'] / pair['denoise_step']['predicted_ms']:.1f} |")
  lines += ["", "## Predicted crossovers on accelerators", "",
            f"bfloat16 parameters and cache, P = {_PROMPT_LEN.value}; "
            "published peak bf16 FLOP/s and HBM bandwidth, 20 us per step "
            "assumed (`cost_model.PROFILES`). K*: a parallel decoder making "
            f"fewer than K* full passes beats AR at T = "
            f"{cost_model_check.CROSSOVER_T}. T*: the shortest output length "
            f"at which {cost_model_check.CROSSOVER_K} full passes beat AR "
            f"(searched up to {cost_model_check.CROSSOVER_MAX_T}).", ""]
  lines += cost_model_check.crossover_lines(_PROMPT_LEN.value)
  lines += ["", "![predicted vs measured](predicted_vs_measured.png)", ""]
  with open(path, "w") as f:
    f.write("\n".join(lines))


def main(argv):
  del argv
  if _SMOKE.value:
    flags.FLAGS.sizes, flags.FLAGS.batch_sizes = ["tiny"], ["1"]
    flags.FLAGS.output_length, flags.FLAGS.runs = 8, 1
    flags.FLAGS.point_matmul_size = 128
    flags.FLAGS.point_bandwidth_bytes = 1 << 22
  for size in _SIZES.value:
    if size not in SIZES:
      raise app.UsageError(f"--sizes: {size!r}; allowed: {sorted(SIZES)}")
  measured = cost_model.profile_from_json(_PROFILE_PATH.value)
  profile = cost_model.load_profile(_PROFILE.value, _PROFILE_PATH.value)
  load_start = os.getloadavg()[0]
  rows = []
  for size in _SIZES.value:
    for batch in map(int, _BATCH_SIZES.value):
      rows += _measure_point(size, batch, profile, measured)
  os.makedirs(_WORKDIR.value, exist_ok=True)
  records.write_csv(rows, os.path.join(_WORKDIR.value, "results.csv"))
  _plot(rows, os.path.join(_WORKDIR.value, "predicted_vs_measured.png"))
  _report(rows, profile, (load_start, os.getloadavg()[0]),
          os.path.join(_WORKDIR.value, "report.md"))
  print(f"wrote {_WORKDIR.value}")


if __name__ == "__main__":
  app.run(main)
