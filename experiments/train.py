r"""Trains the backbone with the AR or masked-diffusion (MDLM) objective.

  python experiments/train.py --config=configs/tiny.py --workdir=/tmp/ar \
      --config.train.objective=ar --config.train.num_steps=600

Multi-host: run the same command in every process with --coordinator_address
(process 0's host:port), --num_processes and --process_id (and a
config.mesh spanning the processes' devices, e.g.
--config.mesh.shape="(-1, 1, 1)"); each process reads its own rows of every
batch (`lm_decoding.parallel.multihost`). Without these flags it is one
process, as before.

Resumes from the latest complete checkpoint in --workdir automatically (a
killed run loses at most the steps since its last checkpoint). A bad option, a
checkpoint that does not fit, or a write that fails (full disk, read-only
workdir) ends the run with one line on stderr and exit status 1. With
--export_pretrained=NAME the trained parameters, tokenizer and a manifest (this
exact command, config, commit, validation metrics) are written into the
shipped pretrained set (`lm_decoding/pretrained/NAME`, or --export_dir) that
the main job uses when its config matches.

With --member=NAME the config is that member's
(`member_recipes.member_configs`: 'ar', 'mdlm', 'bd3lm', 'uniform', 'evaluator'
or a draft of config.drafts), the recipe the main job looks for:

  python experiments/train.py --config=configs/base.py --member=evaluator \
      --workdir=/tmp/base/evaluator

With --init_from=NAME_OR_WORKDIR (or a member whose recipe has
train.init_from, e.g. --member=bd3lm4_from_ar) training starts from a
parent's parameters: a member of the --export_dir set or a training
workdir, checked against the config (backbone, vocabulary, tokenizer)
before anything is compiled (`loading.parent_params`); the summary and
an exported manifest record the parent and the tokens of both phases:

  python experiments/train.py --config=configs/tiny.py --member=mdlm_from_ar \
      --workdir=/tmp/mdlm_from_ar --pretrained_tokenizer

With --config.train.teacher=NAME (certainty forcing, configs/distill.py) a
causal member of the --export_dir set supplies its next-token
distributions as the targets of each block's first masked position
(`loading.teacher_log_probs`); the summary records it.

With --config=configs/jacobi.py (Jacobi Forcing) the summary holds the
manifest of the --config.data.jacobi_set it trained on.
"""

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from lm_decoding.data import pipeline
from lm_decoding.parallel import multihost
from lm_decoding.evaluation import records
from lm_decoding.training import self_distillation
from lm_decoding.training.pretrained import loading, member_recipes, recipes, store
from lm_decoding.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"),
    "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_MEMBER = flags.DEFINE_string(
    "member", None,
    "Train this member of member_recipes.member_configs(config) (ar, mdlm, bd3lm, "
    "uniform, evaluator or a draft of config.drafts) instead of the config as given.")
_EXPORT = flags.DEFINE_string(
    "export_pretrained", None,
    "If set, export the trained model into the shipped pretrained set under "
    "this name (a member of member_recipes.member_configs: ar, mdlm, bd3lm, "
    "evaluator, draft_small, ...).")
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", str(recipes.DEFAULT_DIR),
    "The pretrained set --export_pretrained writes into (and whose tokenizer "
    "--pretrained_tokenizer reads): the shipped set by default; "
    "lm_decoding/pretrained/base for configs/base.py's members.")
_STORED_DTYPE = flags.DEFINE_enum(
    "stored_dtype", None, list(recipes.STORED_DTYPES),
    "Export the parameters rounded: 'bfloat16' (half the bytes of float32) "
    "or 'int8' (weight-only int8, per-channel scales: about a quarter); "
    "loading turns them back into model.param_dtype. Unset: as trained.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None,
    "Where the tokenizer and encoded splits are cached (runs on the same data "
    "share them); default: --workdir.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "Multi-host: host:port of process 0's coordinator (jax.distributed); "
    "unset: one process.")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Multi-host: number of processes (>= 1).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "Multi-host: this process's id in [0, num_processes).")
_INIT_FROM = flags.DEFINE_string(
    "init_from", None,
    "Start from this parent's parameters (sets config.train.init_from): a "
    "member of the --export_dir set (e.g. 'ar') or a training workdir.")
_PRETRAINED_TOKENIZER = flags.DEFINE_bool(
    "pretrained_tokenizer", False,
    "Encode the data with the shipped set's tokenizer (copied into the "
    "--data_dir cache first) instead of training one, so a member added to "
    "the set matches its tokenizer byte for byte.")


def member_config(config, name: str):
  """`member_recipes.member_configs(config)[name]`.

  Raises:
    ValueError: naming --member and the config's members.
  """
  members = member_recipes.member_configs(config)
  if name not in members:
    raise ValueError(f"--member={name!r}; the config's members: "
                     + ", ".join(members))
  return members[name]


def main(argv):
  del argv
  # orbax logs every failure of its writer threads with full tracebacks; the
  # one-line error below says what failed.
  logging.set_verbosity(logging.FATAL)
  config, workdir = _CONFIG.value, _WORKDIR.value
  data_dir = _DATA_DIR.value or workdir
  try:
    if _EXPORT.value is not None:
      recipes.check_export(_EXPORT.value, _STORED_DTYPE.value,
                              _EXPORT_DIR.value)
    if _MEMBER.value is not None:
      config = member_config(config, _MEMBER.value)
      if _EXPORT.value not in (None, _MEMBER.value):
        raise ValueError(
            f"--export_pretrained={_EXPORT.value!r} must equal "
            f"--member={_MEMBER.value!r}: the member's recipe is what is "
            "trained, and under another name it would replace that member")
    if _INIT_FROM.value is not None:
      config.train.init_from = _INIT_FROM.value
    train.check_config(config)
    multihost.initialize(_COORDINATOR.value, _NUM_PROCESSES.value,
                         _PROCESS_ID.value)
    if _PRETRAINED_TOKENIZER.value:
      store.seed_data_cache(config, data_dir, _EXPORT_DIR.value)
    parent, record, teacher, teacher_record = None, None, None, None
    if config.train.get("init_from") or config.train.get("teacher"):
      tokenizer = pipeline.prepare(config.data.path, config.data.vocab_size,
                                   data_dir, config.data.format).tokenizer
      parent, record = loading.parent_params(config, tokenizer,
                                             _EXPORT_DIR.value)
      teacher, teacher_record = loading.teacher_log_probs(
          config, tokenizer, _EXPORT_DIR.value)
    summary = train.train(config, workdir, data_dir=data_dir,
                          init_params=parent, teacher=teacher)
    summary["tokens"] = (summary["steps"] * config.train.batch_size
                         * config.data.seq_len)
    if record is not None:
      summary["parent"] = record
    if teacher_record is not None:
      summary["teacher"] = teacher_record
    if config.data.get("distillation_set"):  # its compute counts too
      summary["distillation_set"] = self_distillation.read_distillation_set(
          config.data.distillation_set)[1]
    if config.data.get("jacobi_set"):  # so does the Jacobi states'
      summary["jacobi_set"] = self_distillation.read_set(
          config.data.jacobi_set, [], "data.jacobi_set",
          "experiments/jacobi_data.py")[1]
  except (ValueError, OSError) as e:  # CheckpointError, CheckpointWriteError
    sys.exit(f"error: {e}")
  print(json.dumps(summary, indent=2))
  if _EXPORT.value:
    corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                              data_dir, config.data.format)
    command = records.command()
    path = store.export(config, workdir, _EXPORT.value, corpus.tokenizer,
                             command, summary, _EXPORT_DIR.value,
                             stored_dtype=_STORED_DTYPE.value)
    print(f"exported to {path}")


if __name__ == "__main__":
  app.run(main)
