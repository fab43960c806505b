r"""The main job: sequential vs parallel decoding, cost and quality, measured.

  python experiments/compare_decoding.py --config=configs/tiny.py \
      --workdir=/tmp/compare [--config.mesh.shape="(-1, 1, 1)"]

configs/tiny.py's default grid (14 decoders, each decoding family at its
strongest setting, T = 256, B = 1 and 8; 14 in its record) took 445 s on 2 CPU cores
(experiments/results/tiny_cpu_2core/run.json); configs/full.py is the full
grid (24 decoders at T = 32, 128 and 256; its one record,
experiments/results/full_grid_cpu_2core/, ran the 19 it then held at T = 32
and 256 in 21 minutes). run.json names the hardware (`records.hardware`).

The default mesh (1, 1, 1) is one device, as always; another mesh shape
(`config.mesh`) runs every decoder sharded (`lm_decoding.decoding.sharded`)
and adds per-device weight bandwidth and FLOP/s columns to results.csv.

Checks every option first (the decoders of `compare.decoders`, built at
every output length, the sizes, the workdir), then prepares the corpus,
prints its splits and checks they are large enough, gets the models the
decoders bind plus the evaluator (shipped pretrained parameters when they
match the config, else trained under --workdir, or always with --retrain),
takes prompts from the held-out test split, runs every decoder at every
output length and batch size, and writes results.csv, report.md,
frontier.png, latency.png (speed-up over the baseline), quality.png,
frontier_<name>.png per --predict profile and run.json under --workdir,
and ends with the verdict (report.md opens with
it): per batch size the quality-cost Pareto front and the fastest decoder
within `compare.tolerance_*` of AR sampling. A bad option or a too small
corpus ends the job in its first seconds with a one-line message.
"""

import os
import platform
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from lm_decoding.data import pipeline
from lm_decoding.evaluation import (
    comparison, compare_config, cost, cost_model, entries, frontier, records,
    report)
from lm_decoding.parallel import sharding
from lm_decoding.training.pretrained import loading, member_recipes, recipes
from lm_decoding.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"),
    "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_compare",
                               "Output directory.")
_PREDICT = flags.DEFINE_list(
    "predict", ["h100_sxm", "tpu_v5e"], "Published cost-model profiles "
    "(cost_model.PROFILES) on which the frontier is also predicted from "
    "the measured calls (frontier_<name>.png); '' for none.")
_RETRAIN = flags.DEFINE_bool(
    "retrain", False, "Train all models here even if shipped ones match.")
_PROFILE = flags.DEFINE_string(
    "profile", "", "A cost-model hardware profile (e.g. cpu, after "
    "experiments/measure_cpu_profile.py): adds predicted ms beside the "
    "measured ones; '' (default): none.")


def check_workdir(workdir: str) -> None:
  """Creates `workdir` if needed; raises ValueError if it cannot be used."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir} is a file; give a directory")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f"--workdir={workdir} cannot be created: "
                     f"{e.strerror}") from e
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise ValueError(f"--workdir={workdir} is not writable")


def plan(config, workdir: str, retrain: bool = False):
  """Checks every option of the job (`retrain`: --retrain); returns
  (planned decoders, members).

  Raises:
    ValueError: naming the config key or flag (--retrain with
      compare.stored_members, which load and never train); nothing is
      prepared, trained or written before (except the workdir folder itself,
      last).
  """
  cmp = config.compare
  members = member_recipes.member_configs(config)
  members.update(member_recipes.stored_member_configs(
      cmp.stored_members, members, config.data,
      recipes.set_dir(cmp.pretrained_set)))
  if retrain and cmp.stored_members:
    raise ValueError(f"--retrain would train compare.stored_members="
                     f"{tuple(cmp.stored_members)}, which only load (their "
                     "recipes read parents and data outside the repository); "
                     "set --config.compare.stored_members=() to retrain")
  for member in members.values():
    train.check_config(member)
  compare_config.check_options(
      cmp, {name: m.model.max_len for name, m in members.items()})
  parsed = entries.parse_entries(cmp.decoders)
  compare_config.check_baseline(cmp.baseline, parsed)
  planned = entries.judged_against(
      entries.plan(parsed, cmp.output_lengths, cmp.temperature, members),
      cmp.baseline, cmp.greedy_baseline)
  entries.check_served(planned, {name: train.model_config(m)
                                 for name, m in members.items()})
  check_workdir(workdir)
  return planned, members


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start, load_start = time.time(), os.getloadavg()[0]
  config, workdir = _CONFIG.value, _WORKDIR.value
  cmp = config.compare
  try:
    profile = (cost_model.load_profile(_PROFILE.value) if _PROFILE.value
               else None)
    other_hardware = [cost_model.load_profile(name)
                      for name in _PREDICT.value if name]
    planned, members = plan(config, workdir, _RETRAIN.value)
    mesh = sharding.mesh_or_none(config.get("mesh"))
    rules = sharding.rules_from_config(config.get("mesh"))
    corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                              workdir, data_format=config.data.format)
    print(corpus.describe())
    pipeline.check_corpus_size(corpus, config)
  except ValueError as e:
    sys.exit(f"compare_decoding: error: {e}")
  # The machine's own throughput, measured before any model is loaded:
  # run.json's "hardware" and the report's setup name it.
  matmul_flops, bandwidth = cost.measure_peak_flops(), cost.measure_bandwidth()
  needed = {m for p in planned for _, m in p.roles} | {entries.EVALUATOR}
  loaded = loading.load_models(
      {n: m for n, m in members.items() if n in needed}, workdir,
      corpus.tokenizer, retrain=_RETRAIN.value,
      out_dir=recipes.set_dir(cmp.pretrained_set))
  models = {name: member.model for name, member in loaded.items()}
  lines = [member.describe(name) for name, member in loaded.items()]
  prompts, references = pipeline.prompts(
      corpus, "test", max(cmp.batch_sizes), cmp.prompt_len, cmp.reference_len)
  decode_start = time.time()
  result = comparison.run(
      planned, models, models[entries.EVALUATOR], corpus.tokenizer,
      prompts, references, cmp.batch_sizes, cmp.timed_runs, seed=config.seed,
      mesh=mesh, rules=rules)
  decode_s = time.time() - decode_start
  hardware = records.hardware(
      [load_start, os.getloadavg()[0]], cmp.timed_runs, matmul_flops,
      bandwidth, f"{jax.devices()[0].device_kind} x{jax.device_count()}")
  header = "\n".join([
      f"- device: {hardware['device']} "
      f"({platform.machine()}, {hardware['cores']} cores)",
      f"- hardware: {records.describe_hardware(hardware)}",
      *([] if mesh is None else [
          f"- mesh: {dict(mesh.shape)} ({mesh.size} devices); per-device "
          "weight GB/s and GFLOP/s in results.csv"]),
      "- models (validation perplexity; a bound for diffusion objectives):",
      *[f"  - {line}" for line in lines],
      f"- prompts: {len(prompts)} held-out test documents, first "
      f"{cmp.prompt_len} tokens (P); sampling temperature "
      f"{cmp.temperature} for every decoder whose entry sets none; output lengths T = "
      f"{tuple(cmp.output_lengths)}, batch sizes B = {tuple(cmp.batch_sizes)}",
      f"- timings: {cmp.timed_runs} timed runs per row right after "
      "compiling, compile time apart; speeds are compared on the minimum",
      f"- decoding took {decode_s / 60:.1f} min of the job's "
      f"{(time.time() - start) / 60:.1f} min",
  ])
  configs = {name: train.model_config(m) for name, m in members.items()}
  predict_ms = None
  if profile is not None:
    header += (f"\n- predicted ms: the cost model on profile {profile.name} "
               f"({profile.source})")
    predict_ms = cost_model.comparison_row_ms(configs, cmp.prompt_len,
                                              profile)
  elsewhere = {p.name: cost_model.comparison_row_ms(configs, cmp.prompt_len, p)
               for p in other_hardware}
  tolerance = frontier.Tolerance(cmp.tolerance_gen_ppl, cmp.tolerance_entropy)
  paths = report.write(result, header, cmp.baseline, workdir, tolerance,
                       predict_ms, elsewhere)
  verdict = frontier.summarize(result.rows, cmp.baseline, tolerance).lines
  run_json = os.path.join(workdir, "run.json")
  records.write_json({"models": lines, "wall_s": time.time() - start,
                      "decode_s": decode_s, "hardware": hardware,
                      "verdict": verdict, "config": config.to_dict()},
                     run_json)
  print(f"wrote {', '.join([*paths.values(), run_json])} in "
        f"{time.time() - start:.0f} s")
  print("\n".join(verdict))


if __name__ == "__main__":
  app.run(main)
