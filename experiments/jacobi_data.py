r"""Writes a Jacobi state set: the AR model's own Jacobi trajectories over
fixed blocks of a distillation set's greedy rows, the data of Jacobi Forcing
(`lm_decoding.training.jacobi_trajectories`; CLLM, arXiv:2403.00835).

  python experiments/jacobi_data.py --set_dir=lm_decoding/pretrained \
      --model=ar --distillation_set=/tmp/jacobi/greedy --num_rows=64 \
      --num_blocks=4 --block_length=16 --states_per_block=4 \
      --out=/tmp/jacobi/states

The greedy rows ('... temperature=0', `self_distillation.greedy_rows`) of
--distillation_set (written by experiments/distill_data.py with --model as
its teacher) are [prefix (P) | the model's greedy continuation]; for the
first --num_rows rows and the first --num_blocks blocks of --block_length
after P, each block's trajectory g^0 = PAD, g^1, ... up to its fixed point
is computed with --model of --set_dir (uncached causal forwards), and up to
--states_per_block states per block (drawn by --seed) are written as rows
[row[:s] | state | PAD] with their block start and clean row (`tokens.npy`,
`block_starts.npy`, `row_index.npy`, `clean.npy`) beside a manifest (counts,
seconds, command, commit). `experiments/train.py --config=configs/jacobi.py
--config.data.jacobi_set=OUT` trains on it.
"""

import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from lm_decoding.evaluation import records
from lm_decoding.models import make_logits_fn
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training import jacobi_trajectories, self_distillation
from lm_decoding.training import train
from lm_decoding.training.pretrained import recipes, store

_SET_DIR = flags.DEFINE_string("set_dir", str(recipes.DEFAULT_DIR),
                               "The pretrained set holding --model.")
_MODEL = flags.DEFINE_string("model", "ar", "A causal member of --set_dir: "
                             "the teacher of --distillation_set.")
_DISTILLATION_SET = flags.DEFINE_string(
    "distillation_set", None, "A folder experiments/distill_data.py wrote, "
    "with a greedy decoder.", required=True)
_NUM_ROWS = flags.DEFINE_integer("num_rows", 64, "Greedy rows used (R).")
_NUM_BLOCKS = flags.DEFINE_integer("num_blocks", 4, "Blocks per row (K).")
_BLOCK_LENGTH = flags.DEFINE_integer("block_length", 16, "n, tokens.")
_STATES_PER_BLOCK = flags.DEFINE_integer("states_per_block", 4,
                                         "States kept per block, at most.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 16, "Rows per call.")
_SEED = flags.DEFINE_integer("seed", 0, "Which states are kept.")
_OUT = flags.DEFINE_string("out", None, "Output folder.", required=True)


def check_flags(rows, data_manifest: dict) -> None:
  """Raises ValueError naming the flag: --num_rows outside [1, the set's
  greedy rows]; --model not the teacher that wrote --distillation_set
  (its states would not reach the rows: another model's greedy text);
  the blocks, --states_per_block, --seed or --batch_size out of range
  (`jacobi_trajectories.block_starts`, `check_state_options`)."""
  if not 1 <= _NUM_ROWS.value <= len(rows):
    raise ValueError(f"--num_rows={_NUM_ROWS.value} must be in [1, "
                     f"{len(rows)}] (the set's greedy rows)")
  teacher = data_manifest.get("teacher")
  if teacher != _MODEL.value:
    raise ValueError(f"--model={_MODEL.value!r} is not the teacher of "
                     f"--distillation_set ({teacher!r}): the rows must be "
                     "--model's own greedy continuations")
  jacobi_trajectories.block_starts(
      data_manifest["prompt_length"], _BLOCK_LENGTH.value, _NUM_BLOCKS.value,
      rows.shape[1])
  jacobi_trajectories.check_state_options(
      _STATES_PER_BLOCK.value, _SEED.value, _BATCH_SIZE.value)


def check_teacher_export(data_manifest: dict) -> None:
  """Raises ValueError unless --model of --set_dir is the export that wrote
  --distillation_set (the member's commit is the set's teacher_commit,
  where both are recorded)."""
  commit = recipes.read_manifest(_MODEL.value, _SET_DIR.value).get("commit")
  written = data_manifest.get("teacher_commit")
  if commit and written and commit != written:
    raise ValueError(f"--model={_MODEL.value!r} of --set_dir={_SET_DIR.value}"
                     f" was exported at {commit}; --distillation_set was "
                     f"written by the one exported at {written}")


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)  # orbax's restore chatter
  start = time.time()
  try:
    tokens, data_manifest = self_distillation.read_distillation_set(
        _DISTILLATION_SET.value)
    rows = self_distillation.greedy_rows(tokens, data_manifest)
    check_flags(rows, data_manifest)  # before the model loads
    check_teacher_export(data_manifest)
    recipe, params = store.load_stored(_MODEL.value, _SET_DIR.value)
    logits_fn = make_logits_fn(train.model_config(recipe))
    if logits_fn.config.attention != "causal":
      raise ValueError(f"--model={_MODEL.value!r} is not causal")
    arrays, counts = jacobi_trajectories.state_set(
        logits_fn, params, rows[:_NUM_ROWS.value],
        prompt_length=data_manifest["prompt_length"],
        block_length=_BLOCK_LENGTH.value, num_blocks=_NUM_BLOCKS.value,
        per_block=_STATES_PER_BLOCK.value, seed=_SEED.value,
        batch_size=_BATCH_SIZE.value)
    seconds = time.time() - start
    out = self_distillation.write_set(_OUT.value, arrays, {
        "model": _MODEL.value, "set_dir": os.path.abspath(_SET_DIR.value),
        "distillation_set": _DISTILLATION_SET.value,
        "prompt_length": data_manifest["prompt_length"],
        "block_length": _BLOCK_LENGTH.value, "num_rows": _NUM_ROWS.value,
        "num_blocks": _NUM_BLOCKS.value,
        "states_per_block": _STATES_PER_BLOCK.value, "seed": _SEED.value,
        **counts, "tokens": int((arrays["tokens"] != PAD_ID).sum()),
        "seconds": seconds, "device": jax.devices()[0].device_kind,
        "command": records.command(), "commit": recipes.current_commit()})
  except (ValueError, OSError) as e:  # CheckpointError is a ValueError
    sys.exit(f"jacobi_data: error: {e}")
  print(f"wrote {counts['states']} states of {counts['live_blocks']} blocks "
        f"(mean trajectory {counts['mean_trajectory_length']:.2f} of "
        f"{_BLOCK_LENGTH.value}; {counts['blocks_off_fixed_point']} off "
        f"the rows' fixed point) to {out} ({seconds:.0f} s)")


if __name__ == "__main__":
  app.run(main)
