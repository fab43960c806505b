r"""Stores float members of a shipped pretrained set rounded, in place.

  python experiments/convert_pretrained.py --set_dir=lm_decoding/pretrained \
      --stored_dtype=bfloat16 ar mdlm bd3lm evaluator draft_small draft_medium

Each member is loaded from its own manifest's recipe and the set's tokenizer
and rewritten as `store.convert` does (bfloat16: half the bytes of
float32; int8: weight-only int8 with per-channel scales). Its manifest keeps
the training command and metrics and records this command under
`conversion`. Every member is checked and loaded before the first is
rewritten: a bad option or member ends the run with one line on stderr and
exit status 1, the set as it was.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from lm_decoding.evaluation import records
from lm_decoding.training.pretrained import recipes, store

_SET_DIR = flags.DEFINE_string(
    "set_dir", str(recipes.DEFAULT_DIR),
    "The pretrained set whose members are rewritten (the shipped tiny set by "
    "default; lm_decoding/pretrained/base for configs/base.py's members).")
_STORED_DTYPE = flags.DEFINE_enum(
    "stored_dtype", "bfloat16", list(recipes.STORED_DTYPES),
    "How the members are stored from now on.")


def main(argv):
  logging.set_verbosity(logging.FATAL)
  command = records.command()
  try:
    paths = store.convert(argv[1:], _STORED_DTYPE.value, command,
                               _SET_DIR.value)
  except (ValueError, OSError) as e:  # CheckpointError is a ValueError
    sys.exit(f"error: {e}")
  for path in paths:
    print(f"{path.name}: stored as {_STORED_DTYPE.value} in {path}")


if __name__ == "__main__":
  app.run(main)
