r"""The main job on imported checkpoints: an AR model against diffusion LMs,
cost and quality on a grid, and accuracy on an exact-answer benchmark.

  python experiments/compare_hub.py --config=configs/hub.py \
      --config.hub.models="ar=/ckpt/qwen, dllm=/ckpt/dream" \
      --config.hub.evaluator=/ckpt/qwen \
      --config.hub.benchmark=/data/gsm8k_test.jsonl --workdir=/tmp/hub

Inspects every folder of `config.hub` (config, conventions, tokenizer) and
plans every decoder of `compare.decoders` with the ids of the models it
binds, refusing any option, model or decoder by name before a tensor is
read (`lm_decoding.evaluation.hub_comparison`); then loads the weights,
takes the benchmark's first `hub.num_problems` problems, and writes:
  - with hub.grid: the main job's records (results.csv, report.md with the
    verdict, frontier.png, latency.png, quality.png) on prompts that are
    the last `compare.prompt_len` tokens of each benchmark prompt;
  - exact_answer.csv: accuracy, NFE, tokens per forward and ms per problem
    for every decoder at every output length (EOS mode, in batches of the
    largest of compare.batch_sizes);
  - run.json: the models and their conventions, the verdict, the config.
"""

import functools
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from lm_decoding.checkpoints import hub
from lm_decoding.evaluation import (comparison, compare_config, entries,
                                    frontier, records)
from lm_decoding.evaluation import exact_answer as ea
from lm_decoding.evaluation import hub_comparison, report
from lm_decoding.parallel import sharding


def define_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """(--config, --workdir), defined when the script runs as a program, so
  that loading it as a module (the tests call `plan`) defines no flag."""
  return (config_flags.DEFINE_config_file(
      "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                             "hub.py"), "Experiment configuration file."),
          flags.DEFINE_string("workdir", "/tmp/lm_decoding_hub",
                              "Output directory."))


def plan(config):
  """(planned decoders, inspected folders, problems, prompt texts); every
  check of the job, no tensor read.

  Raises:
    ValueError: naming the config key, model or decoder.
  """
  h, cmp = config.hub, config.compare
  for key in ("evaluator", "benchmark"):
    if not h[key]:
      raise ValueError(f"hub.{key} is empty; give a path")
  folders = hub_comparison.parse_models(h.models)
  seen = hub_comparison.inspect_all(folders, h.evaluator, h.grid,
                                    dtype=h.dtype, param_dtype=h.param_dtype)
  compare_config.check_options(cmp, {n: s.config.max_len for n, s in seen.items()})
  parsed = entries.parse_entries(cmp.decoders)
  compare_config.check_baseline(cmp.baseline, parsed)
  planned = hub_comparison.adopt_all(
      entries.plan(parsed, cmp.output_lengths, cmp.temperature, folders),
      seen)
  problems = ea.read_problems(h.benchmark, h.kind, h.num_problems)
  shots = (ea.read_problems(h.shots, "gsm8k", h.num_shots)
           if h.shots else [])
  texts = ea.prompt_texts(problems, shots)
  hub_comparison.check_room(seen, texts, h.chat, max(cmp.output_lengths))
  if len(problems) < max(cmp.batch_sizes):
    raise ValueError(f"hub.num_problems={len(problems)} problems read; "
                     f"compare.batch_sizes needs {max(cmp.batch_sizes)}")
  return planned, seen, problems, texts


def main(config_flag, workdir_flag, argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.time()
  config, workdir = config_flag.value, workdir_flag.value
  h, cmp = config.hub, config.compare
  try:
    planned, seen, problems, texts = plan(config)
    mesh = sharding.mesh_or_none(config.get("mesh"))
    rules = sharding.rules_from_config(config.get("mesh"))
    evaluator_tok = seen[entries.EVALUATOR].tokenizer
    prompts = (hub_comparison.grid_prompts(evaluator_tok, texts,
                                           cmp.prompt_len, h.chat)
               if h.grid else None)
  except ValueError as e:
    sys.exit(f"compare_hub: error: {e}")
  os.makedirs(workdir, exist_ok=True)
  lines = [hub_comparison.describe(n, s) for n, s in seen.items()]
  print("\n".join(lines))
  by_folder = {}  # a folder named twice (the AR model as evaluator) loads once
  for s in seen.values():
    key = (os.path.realpath(s.folder), s.config)
    if key not in by_folder:
      by_folder[key] = hub.load(s)[0]
  models = {name: by_folder[os.path.realpath(s.folder), s.config]
            for name, s in seen.items()}
  verdict, paths = [], {}
  if h.grid:
    references = [p.answer for p in problems]
    result = comparison.run(
        planned, models, models[entries.EVALUATOR], evaluator_tok, prompts,
        references, cmp.batch_sizes, cmp.timed_runs, seed=config.seed,
        mesh=mesh, rules=rules)
    header = "\n".join([
        f"- device: {jax.devices()[0].device_kind} x{jax.device_count()}",
        "- models (hub folders):", *[f"  - {line}" for line in lines],
        f"- prompts: the last {cmp.prompt_len} tokens of the first "
        f"{len(problems)} {h.kind} prompts of {h.benchmark}; temperature "
        f"{cmp.temperature}; T = {tuple(cmp.output_lengths)}, B = "
        f"{tuple(cmp.batch_sizes)}"])
    tolerance = frontier.Tolerance(cmp.tolerance_gen_ppl,
                                   cmp.tolerance_entropy)
    paths = report.write(result, header, cmp.baseline, workdir, tolerance)
    verdict = frontier.summarize(result.rows, cmp.baseline, tolerance).lines
  scores = hub_comparison.score_benchmark(
      planned, models, seen, problems, texts, h.chat, config.seed,
      h.timeout_s, max(cmp.batch_sizes))
  paths["exact_answer"] = os.path.join(workdir, "exact_answer.csv")
  records.write_csv(scores, paths["exact_answer"])
  run_json = os.path.join(workdir, "run.json")
  records.write_json({"models": lines, "wall_s": time.time() - start,
                      "verdict": verdict, "exact_answer": scores,
                      "command": records.command(),
                      "config": config.to_dict()}, run_json)
  print(f"wrote {', '.join([*paths.values(), run_json])} in "
        f"{time.time() - start:.0f} s")
  for row in scores:
    print(f"{row['decoder']}: exact {row['exact']:.3f}, NFE {row['nfe']}, "
          f"TPF {row['tokens_per_forward']:.2f}, "
          f"{row['ms_per_problem']:.1f} ms/problem")
  print("\n".join(verdict))


if __name__ == "__main__":
  app.run(functools.partial(main, *define_flags()))
