r"""The main job: sequential vs parallel decoding, cost and quality, measured.

  python experiments/compare_decoding.py --config=configs/tiny.py \
      --workdir=/tmp/compare

Gets the AR, masked-diffusion (MDLM) and evaluator models (shipped pretrained
parameters when they match the config, else trained under --workdir, or
always with --retrain), takes prompts from the held-out test split, runs
every decoder for every output length and batch size, and writes
results.csv, report.md, latency.png and quality.png under --workdir.
"""

import json
import os
import platform
import time

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import EOS_ID
from lm_decoding.evaluation import comparison, report
from lm_decoding.models import make_logits_fn
from lm_decoding.training import pretrained
from lm_decoding.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"),
    "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/lm_decoding_compare",
                               "Output directory.")
_RETRAIN = flags.DEFINE_bool(
    "retrain", False, "Train all models here even if shipped ones match.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.time()
  config, workdir = _CONFIG.value, _WORKDIR.value
  cmp = config.compare
  longest = cmp.prompt_len + max(cmp.output_lengths)
  if longest > config.model.max_len:
    raise ValueError(
        f"compare.prompt_len + max(compare.output_lengths) = {longest} must be "
        f"<= model.max_len={config.model.max_len}; raise --config.model.max_len "
        "(the shipped models then no longer match and are retrained)")
  specs = comparison.standard_specs(cmp.mdlm_steps, cmp.llada_steps,
                                    cmp.llada_block_length)
  for spec in specs:  # every decoder option is checked before any work
    for t in cmp.output_lengths:
      try:
        spec.build(t, cmp.temperature, eos_ids=(EOS_ID,))
      except ValueError as e:
        raise ValueError(f"decoder {spec.label!r} at output length {t}: {e} "
                         "(set by --config.compare.*)") from e
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size, workdir)
  members = pretrained.member_configs(config)
  models, sources = {}, {}
  for name, member in members.items():
    params, sources[name] = pretrained.get_or_train(
        member, name, workdir, corpus.tokenizer, retrain=_RETRAIN.value)
    models[name] = comparison.Model(
        make_logits_fn(train.model_config(member)), params, name)
    print(f"{name}: {sources[name]}")
  prompts, references = pipeline.prompts(
      corpus, "test", max(cmp.batch_sizes), cmp.prompt_len, cmp.reference_len)
  rows, extras = comparison.run(
      specs, models["ar"], models["mdlm"], models["evaluator"],
      corpus.tokenizer, prompts, references, cmp.output_lengths,
      cmp.batch_sizes, cmp.temperature, cmp.timed_runs, seed=config.seed)
  header = "\n".join([
      "# Sequential vs parallel decoding",
      "",
      f"- device: {jax.devices()[0].device_kind} x{jax.device_count()} "
      f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
      "- models: " + "; ".join(f"{k}: {v}" for k, v in sources.items()),
      f"- prompts: {len(prompts)} held-out test paragraphs, first "
      f"{cmp.prompt_len} tokens; one sampling temperature for every decoder: "
      f"{cmp.temperature}",
      f"- gen-PPL is scored by the evaluator model (not the decoded one) at "
      f"batch {max(cmp.batch_sizes)}; timings are medians of "
      f"{cmp.timed_runs} runs after warm-up, compile time apart",
      f"- measured memory bandwidth: "
      f"{extras['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (roofline = AR "
      f"parameters + live KV cache read once per step)",
  ])
  paths = report.write(rows, extras, header, workdir)
  with open(os.path.join(workdir, "run.json"), "w") as f:
    json.dump({"sources": sources, "wall_s": time.time() - start,
               "config": config.to_dict()}, f, indent=2, default=str)
  print(f"wrote {', '.join(paths.values())} in {time.time() - start:.0f} s")


if __name__ == "__main__":
  app.run(main)
