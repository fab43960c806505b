r"""Training throughput and model FLOP utilisation (MFU) per objective.

  python experiments/benchmark_training.py --config=configs/base.py \
      --workdir=experiments/results/benchmark_training/base
  python experiments/benchmark_training.py --config=configs/tiny.py \
      --workdir=experiments/results/benchmark_training/tiny
  # tokens/s against the batch shape at a fixed 4,096 tokens a step:
  python experiments/benchmark_training.py --config=configs/base.py \
      --objectives=ar --shapes=4x1024,8x512,16x256,32x128,64x64 \
      --config.model.max_len=1024 \
      --workdir=experiments/results/benchmark_training/base_shapes

For each objective (--objectives) and batch shape (--shapes, B x L; the
config's own by default) `throughput.measure` times the train step (forward,
backward, AdamW; the state donated) and the forward pass alone (one
denoising step over the same batch) on random tokens: compile time apart,
medians of --runs calls after --warmup. FLOPs per token are the model's
(`cost_model.objective_flops`): per position of the pass

  train step   6 N + 12 n_layers S H Dh
  forward      2 N +  4 n_layers S H Dh

N the matmul parameters (`cost_model.matmul_params`: q, k, v, out and MLP
kernels of every layer, the LM head), S the positions attended to (all of
them, masked or not): L - 1 for 'ar', L for 'mdlm', 2 L for 'bd3lm' (which
runs [x_t ; x_0]); over the L data tokens of a row. MFU = FLOPs / time /
peak, the peak a float32 jnp.dot of two 2048^2 matrices
(`cost.measure_peak_flops`) measured in the same process before and after
the rows: the higher of the two, as a busy machine only ever lowers a
reading.

Writes results.csv, results.md (the command, the peak, the load averages
and the table) and mfu.png under --workdir. `--smoke` runs a two-layer
d32 model at B 2, L 16, one timed call: seconds, for the test.
"""

import os
import platform

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from lm_decoding.evaluation import cost
from lm_decoding.evaluation import records
from lm_decoding.evaluation import report
from lm_decoding.training import throughput

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "base.py"), "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_OBJECTIVES = flags.DEFINE_list("objectives", ["ar", "mdlm", "bd3lm"],
                                "Objectives to time.")
_SHAPES = flags.DEFINE_list(
    "shapes", [], "Batch shapes BxL (e.g. 16x256); default: the config's.")
_RUNS = flags.DEFINE_integer("runs", 5, "Timed calls per program (>= 1).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls after compiling.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny model, seconds (the test).")

COLUMNS = (
    ("objective", "objective", 0, "training objective"),
    ("program", "program", 0, "'train step' (forward, backward, AdamW "
     "update) or 'forward' (the loss alone: one denoising step)"),
    ("batch_size", "B", 0, "rows a step"),
    ("seq_len", "L", 0, "data tokens a row"),
    ("median_ms", "ms", 1, "median wall time of a call, ms"),
    ("iqr_ms", "IQR ms", 1, "interquartile range of the calls, ms"),
    ("tokens_per_s", "tokens/s", 0, "B L / median time"),
    (lambda r: r["flops_per_token"] / 1e6, "MFLOP/token", 1, "model FLOPs "
     "per data token / 1e6 (the formula above)"),
    ("gflops_per_s", "GFLOP/s", 1, "model FLOPs / median time / 1e9"),
    ("mfu", "MFU", 3, "GFLOP/s / the higher measured peak"),
    ("compile_s", "compile s", 1, "XLA compile time, s (not in the times)"),
)


def _shapes(config) -> list[tuple[int, int]]:
  """(B, L) pairs of --shapes, or the config's. Raises ValueError."""
  if not _SHAPES.value:
    return [(config.train.batch_size, config.data.seq_len)]
  shapes = []
  for text in _SHAPES.value:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
      raise ValueError(f"--shapes entry {text!r} must be BxL with B, L >= 1")
    shapes.append((int(parts[0]), int(parts[1])))
  return shapes


def _smoke(config) -> None:
  config.model.update(dict(d_model=32, num_layers=2, num_heads=2,
                           num_kv_heads=2, head_dim=16, mlp_dim=64,
                           max_len=32))
  config.data.vocab_size = 512
  config.data.seq_len, config.train.batch_size = 16, 2
  config.train.block_length = 8


def _plot(rows: list[dict], path: str) -> None:
  import matplotlib.pyplot as plt  # Agg, set by `report`
  labels = [f"{r['objective']} {r['batch_size']}x{r['seq_len']}"
            for r in rows if r["program"] == "train step"]
  fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(labels)), 3.5))
  for offset, program in ((-0.2, "train step"), (0.2, "forward")):
    values = [r["mfu"] for r in rows if r["program"] == program]
    ax.bar([i + offset for i in range(len(values))], values, 0.4,
           label=program)
  ax.set_xticks(range(len(labels)), labels, fontsize=8)
  ax.set_ylabel("MFU (of the measured f32 matmul peak)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _markdown(command, peaks, loads, rows) -> str:
  return "\n".join([
      "# Training throughput and MFU", "", f"`{command}`", "",
      f"Peak: float32 jnp.dot, {peaks[0] / 1e9:.1f} GFLOP/s before the rows, "
      f"{peaks[1] / 1e9:.1f} after; the MFU is against the higher. "
      f"{cost.load_summary(loads)}. {platform.platform()}, jax "
      f"{jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}.",
      "", "Model FLOPs per position of the pass: train step 6 N + 12 "
      "n_layers S H Dh, forward 2 N + 4 n_layers S H Dh (N matmul "
      "parameters; S = L - 1 positions for ar, L for mdlm, 2 L for bd3lm), "
      "over the L data tokens of a row (`cost_model.objective_flops`).",
      "", report.markdown_table(rows, COLUMNS), "",
      report.definitions(COLUMNS), ""])


def main(argv):
  del argv
  config = _CONFIG.value
  if _SMOKE.value:
    _smoke(config)
  shapes = _shapes(config)
  runs, warmup = (1, 1) if _SMOKE.value else (_RUNS.value, _WARMUP.value)
  size = 256 if _SMOKE.value else 2048
  command = records.command()
  loads = [os.getloadavg()[0]]
  peaks = [cost.measure_peak_flops(size)]
  rows = []
  for objective in _OBJECTIVES.value:
    for batch, length in shapes:
      config.train.objective = objective
      config.train.batch_size, config.data.seq_len = batch, length
      for record in throughput.measure(config, warmup, runs):
        rows.append(dict(record.__dict__, record=record))
        print(record, flush=True)
  peaks.append(cost.measure_peak_flops(size))
  loads.append(os.getloadavg()[0])
  for row in rows:
    row["mfu"] = row.pop("record").mfu(max(peaks))
  os.makedirs(_WORKDIR.value, exist_ok=True)
  records.write_csv(rows, os.path.join(_WORKDIR.value, "results.csv"))
  with open(os.path.join(_WORKDIR.value, "results.md"), "w") as f:
    f.write(_markdown(command, peaks, loads, rows))
  _plot(rows, os.path.join(_WORKDIR.value, "mfu.png"))


if __name__ == "__main__":
  app.run(main)
