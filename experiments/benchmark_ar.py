r"""Our cached AR decoder against `transformers` `generate` on the same weights.

  python experiments/benchmark_ar.py --workdir=experiments/results/benchmark_ar \
      --sizes=9m,36m,110m --batch_sizes=1,8 --output_lengths=128 --runs=3

A randomly initialised Hugging Face model (GPT-2 or LLaMA family, `--family`)
is imported with `lm_decoding.checkpoints`, so both libraries run identical
weights in float32. For each (size, batch, new tokens):
  decode   ours: the registered 'ar' decoder (KV cache, `lax.scan`, greedy,
           fixed length, no EOS), compiled ahead of time (compile time
           reported apart); HF: `model.generate(use_cache=True,
           do_sample=False, min_new_tokens=T, max_new_tokens=T)`.
  forward  one full-sequence forward over [B, P + T] tokens (what one
           denoising step of a parallel decoder costs), both libraries.
Calls alternate A, B, A, B in one process after one warm-up call each
(`cost.interleaved`); the tables give medians of `--runs` calls and the
median of the per-pair ratios (robust to the machine's load drifting between
pairs). torch runs
`--threads` threads; XLA's CPU client uses every core of the machine, so set
`--threads` to the core count (the 2-core machine this was written on).

Bounds, measured in the same process:
  bandwidth  a jitted sum over a 1 GiB float32 array (`cost.measure_bandwidth`)
  peak       a jitted float32 jnp.dot of two 2048 x 2048 matrices
           (`cost.measure_peak_flops`)
  decode roofline per step = max(bytes / bandwidth, FLOPs / peak), bytes =
           parameter bytes + the live KV cache of the batch (prompt + tokens
           so far), FLOPs = `cost_model.forward_flops` of one position per
           row over the keys so far; summed over the T steps.
  forward  % of peak = FLOPs / time / peak, FLOPs =
           `cost_model.forward_flops` over B x L positions attending to L.
  matmul floor per step, both libraries: x[B, D] through float32 matrices
           of the model's shapes in its order, nothing else
           (`versus_transformers.matmul_floor`); the step time the dot kernels alone allow
           (XLA's, torch's) where the roofline assumes perfect ones. "x
           floor" = a decoder's step time over its own library's floor.

Writes results.csv, results.json (`records`), results.md (with the
command) and tokens_per_s.png under --workdir. `--smoke` runs a tiny model
for seconds (used by the test).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.checkpoints import hf_gpt2, hf_llama
from lm_decoding.evaluation import cost
from lm_decoding.evaluation import records
from lm_decoding.studies import versus_transformers as vs
from lm_decoding.models import count_params


@dataclasses.dataclass(frozen=True)
class Size:
  """One model shape (the same numbers serve both families)."""

  d_model: int
  num_layers: int
  num_heads: int
  vocab_size: int


SIZES = {
    "tiny": Size(64, 2, 4, 97),
    "9m": Size(256, 6, 4, 16384),     # ~9M parameters, fits the 32 MiB LLC
    "36m": Size(512, 10, 8, 16384),   # ~40M: 150 MiB in f32
    "110m": Size(768, 12, 12, 32000),  # ~110M: 420 MiB in f32
}
FAMILIES = {"gpt2": hf_gpt2, "llama": hf_llama}

_WORKDIR = flags.DEFINE_string(
    "workdir", "experiments/results/benchmark_ar", "Output directory.")
_FAMILY = flags.DEFINE_enum("family", "gpt2", list(FAMILIES),
                            "HF architecture to initialise and import.")
_SIZES = flags.DEFINE_list("sizes", ["9m", "36m", "110m"],
                           f"Model sizes, of {list(SIZES)}.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "Batch sizes.")
_NEW_TOKENS = flags.DEFINE_list("output_lengths", ["128", "512"],
                                "Output lengths T.")
_PROMPT = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens P.")
_RUNS = flags.DEFINE_integer("runs", 3, "Timed calls per system (>= 1).")
_THREADS = flags.DEFINE_integer("threads", 2, "torch threads.")
_FORWARD = flags.DEFINE_bool("forward", True,
                             "Also time the full-sequence forward.")
_SMOKE = flags.DEFINE_bool(
    "smoke", False, "Tiny model, batch 2, 6 tokens, one run, a 64 MiB "
    "bandwidth array and a 256^2 matmul: seconds, for the test.")


def _hf_model(family: str, size: Size, max_len: int):
  import torch  # the [peer] extra
  import transformers
  torch.manual_seed(0)
  if family == "gpt2":
    config = transformers.GPT2Config(
        n_layer=size.num_layers, n_embd=size.d_model, n_head=size.num_heads,
        vocab_size=size.vocab_size, n_positions=max_len)
    return transformers.GPT2LMHeadModel(config).eval()
  config = transformers.LlamaConfig(
      vocab_size=size.vocab_size, hidden_size=size.d_model,
      intermediate_size=4 * size.d_model, num_hidden_layers=size.num_layers,
      num_attention_heads=size.num_heads,
      num_key_value_heads=max(1, size.num_heads // 2),
      max_position_embeddings=max_len)
  return transformers.LlamaForCausalLM(config).eval()


def _markdown(out: dict, rows: list[dict]) -> str:
  m = out["machine"]
  lines = [
      "# Cached AR decoding: lm_decoding vs transformers (same weights)", "",
      f"Command: `{out['command']}`", "",
      f"Family {out['family']}, float32, prompt {out['prompt_length']} "
      f"tokens, greedy, fixed length (no EOS), medians of {out['runs']} "
      f"interleaved calls after one warm-up each; speedup = median of the "
      f"per-pair ratios hf/ours. torch {m['torch']} with {m['threads']} "
      f"threads, transformers {m['transformers']}, jax {m['jax']}; "
      f"{m['cpus']} CPUs. Measured bandwidth {m['bandwidth_GBps']:.1f} GB/s "
      f"(sum over {m['bandwidth_array_MiB']} MiB), matmul peak "
      f"{m['peak_GFLOPs']:.1f} GFLOP/s (jnp.dot {m['matmul_n']}^2 f32). "
      f"Load average (2 = both cores busy) at start "
      f"{m['load_average_start']:.2f}, at end "
      f"{m['load_average_end']:.2f}. Matmul floor: the step time of x[B, D] "
      f"through random f32 matrices of the model's shapes in its order and "
      f"nothing else, each library's own kernels (ms/step, ours / torch); x floor = "
      f"step time / own floor.", "",
      "## Decode", "",
      "| size | params | batch | T | ours tok/s | HF tok/s | speedup | "
      "ours x roofline | HF x roofline | roofline (bytes, FLOPs) ms/step | "
      "matmul floor ms/step | ours x floor | HF x floor | "
      "ours compile s | same tokens |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if r["kind"] == "decode":
      lines.append(
          f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['batch']} | "
          f"{r['new_tokens']} | {r['ours_tok_s']:.3g} | {r['hf_tok_s']:.3g} | "
          f"{r['speedup']:.2f} | {r['ours_x_roofline']:.2f} | "
          f"{r['hf_x_roofline']:.2f} | "
          f"{r['bytes_roofline_s'] / r['new_tokens'] * 1e3:.2f}, "
          f"{r['flops_roofline_s'] / r['new_tokens'] * 1e3:.2f} | "
          f"{r['ours_floor_ms']:.2f}, {r['hf_floor_ms']:.2f} | "
          f"{r['ours_x_floor']:.2f} | {r['hf_x_floor']:.2f} | "
          f"{r['compile_s']:.1f} | {r['same_tokens']} |")
  lines += ["", "## Full-sequence forward (one denoising step)", "",
            "| size | batch | L | ours ms | HF ms | speedup | ours % peak | "
            "HF % peak |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if r["kind"] == "forward":
      lines.append(
          f"| {r['size']} | {r['batch']} | {r['length']} | {r['ours_ms']:.1f} "
          f"| {r['hf_ms']:.1f} | {r['speedup']:.2f} | "
          f"{r['ours_pct_peak']:.0f} | {r['hf_pct_peak']:.0f} |")
  return "\n".join(lines) + "\n"


def _plot(rows: list[dict], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  decode = [r for r in rows if r["kind"] == "decode"]
  labels = [f"{r['size']}\nB{r['batch']} T{r['new_tokens']}" for r in decode]
  x = np.arange(len(decode))
  fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(decode)), 4))
  ax.bar(x - 0.2, [r["ours_tok_s"] for r in decode], 0.4,
         label="lm_decoding 'ar'")
  ax.bar(x + 0.2, [r["hf_tok_s"] for r in decode], 0.4,
         label="transformers generate")
  ax.set_xticks(x, labels, fontsize=7)
  ax.set_yscale("log")
  ax.set_ylabel("tokens/s (median)")
  ax.set_title("Greedy cached decoding, same weights, float32, CPU")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  import torch
  import transformers
  smoke = _SMOKE.value
  sizes = ["tiny"] if smoke else _SIZES.value
  batches = [2] if smoke else [int(b) for b in _BATCHES.value]
  new_tokens = [6] if smoke else [int(t) for t in _NEW_TOKENS.value]
  runs = 1 if smoke else _RUNS.value
  prompt_length = 4 if smoke else _PROMPT.value
  unknown = set(sizes) - set(SIZES)
  if unknown:
    raise ValueError(f"--sizes {sorted(unknown)} unknown; allowed: "
                     f"{list(SIZES)}")
  if runs < 1 or prompt_length < 1 or min(batches) < 1 or min(new_tokens) < 1:
    raise ValueError("--runs, --prompt_len, --batch_sizes and "
                     "--output_lengths must be >= 1")
  torch.set_num_threads(_THREADS.value)
  load_start = os.getloadavg()[0]
  bandwidth_bytes = (1 << 26) if smoke else (1 << 30)
  bandwidth = cost.measure_bandwidth(bandwidth_bytes)
  matmul_n = 256 if smoke else 2048
  peak = cost.measure_peak_flops(matmul_n)
  max_len = prompt_length + max(new_tokens)
  family = FAMILIES[_FAMILY.value]
  rows = []
  out = {
      "command": records.command(),
      "family": _FAMILY.value, "prompt_length": prompt_length, "runs": runs,
      "machine": {
          "cpus": os.cpu_count(), "platform": platform.platform(),
          "threads": _THREADS.value, "torch": torch.__version__,
          "transformers": transformers.__version__, "jax": jax.__version__,
          "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "bandwidth_GBps": bandwidth / 1e9,
          "bandwidth_array_MiB": bandwidth_bytes >> 20,
          "peak_GFLOPs": peak / 1e9, "matmul_n": matmul_n,
          "load_average_start": load_start},
      "rows": rows}
  for name in sizes:
    model = _hf_model(_FAMILY.value, SIZES[name], max_len)
    config = family.config_from_hf(model.config)
    params = jax.tree.map(jnp.asarray,
                          family.params_from_hf(model.state_dict(), config))
    n_params = count_params(params)
    for batch in batches:
      floor = vs.matmul_floor(config, batch, runs)  # the same for every T
      for t in new_tokens:
        row = vs.decode_row(model, config, params, batch, t, prompt_length,
                          runs, bandwidth, peak, floor)
        rows.append({"size": name, "params": n_params, **row})
        print(json.dumps({k: v for k, v in rows[-1].items()
                          if not k.endswith("_s") or "roofline" in k}),
              flush=True)
        _write(out)
      if _FORWARD.value:
        row = vs.forward_row(model, config, params, batch, max_len, runs, peak)
        rows.append({"size": name, "params": n_params, **row})
        print(json.dumps({k: v for k, v in rows[-1].items()
                          if not k.endswith("_s")}), flush=True)
        _write(out)


def _write(out: dict) -> None:
  """Writes every output for the rows so far (a cut-short run keeps them)."""
  rows = out["rows"]
  out["machine"]["load_average_end"] = os.getloadavg()[0]
  os.makedirs(_WORKDIR.value, exist_ok=True)
  records.write_json(out, os.path.join(_WORKDIR.value, "results.json"),
                     out["command"])
  records.write_csv([{k: v for k, v in r.items() if not isinstance(v, list)}
                     for r in rows],
                    os.path.join(_WORKDIR.value, "results.csv"))
  with open(os.path.join(_WORKDIR.value, "results.md"), "w") as f:
    f.write(_markdown(out, rows))
  _plot(rows, os.path.join(_WORKDIR.value, "tokens_per_s.png"))


if __name__ == "__main__":
  app.run(main)
