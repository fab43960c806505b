r"""Copies a derived member (a distilled student) into a shipped set.

  python experiments/ship_member.py --from_set=/work/runs/distill/set \
      --member=bd3lm16_distilled_g256 --as_name=bd3lm16_distilled \
      --to_set=lm_decoding/pretrained/base

`shipping.ship`: the member's parameters as they are stored, its manifest with
the chain of parents it was trained through (down to the member both sets
hold), the distillation sets they read and the seconds each took, and this
command. A config loads it through `compare.stored_members`. A bad option
or member ends the run with one line on stderr and exit status 1, the set as
it was.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from lm_decoding.evaluation import records
from lm_decoding.training.pretrained import shipping

_FROM_SET = flags.DEFINE_string("from_set", None, "The set holding the "
                                "member and its parents.", required=True)
_MEMBER = flags.DEFINE_string("member", None, "The member to ship.",
                              required=True)
_AS_NAME = flags.DEFINE_string("as_name", None, "Its name in --to_set "
                               "(default: --member).")
_TO_SET = flags.DEFINE_string("to_set", None, "The shipped set, e.g. "
                              "lm_decoding/pretrained/base.", required=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)
  try:
    path = shipping.ship(_MEMBER.value, _FROM_SET.value, _TO_SET.value,
                      _AS_NAME.value or _MEMBER.value, records.command())
  except (ValueError, OSError) as e:  # CheckpointError is a ValueError
    sys.exit(f"error: {e}")
  print(f"{_MEMBER.value}: shipped as {path}")


if __name__ == "__main__":
  app.run(main)
