r"""The lineage table of a pretrained set: adapted members beside their parent
and the from-scratch members, at the compute each cost (issue 25).

  python experiments/adaptation_table.py --set=base \
      --out=experiments/results/adaptation/base

Writes lineage.csv and lineage.md under --out (`member_recipes.lineage_rows`).
"""

import os
import sys

from absl import app
from absl import flags

from lm_decoding.evaluation import records
from lm_decoding.training.pretrained import member_recipes, recipes

_SET = flags.DEFINE_string("set", "", "The pretrained set: '' (tiny) or "
                           "'base'.")
_OUT = flags.DEFINE_string("out", None, "Output folder.", required=True)

_COLUMNS = ("member", "objective", "block_length", "token_shift",
            "complementary", "anneal_steps", "init_from", "tokens",
            "compute_ar_tokens", "valid_ppl", "ratio_to_ar")


def _cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.2f}"
  if isinstance(value, int) and not isinstance(value, bool) and value > 9999:
    return f"{value / 1e6:.2f}M"
  return "" if value is None else str(value)


def main(argv):
  del argv
  try:
    rows = member_recipes.lineage_rows(recipes.set_dir(_SET.value))
  except ValueError as e:
    sys.exit(f"adaptation_table: error: {e}")
  os.makedirs(_OUT.value, exist_ok=True)
  records.write_csv(rows, os.path.join(_OUT.value, "lineage.csv"))
  lines = [f"Command: `{records.command()}`",
           "", "| " + " | ".join(_COLUMNS) + " |",
           "|" + "---|" * len(_COLUMNS)]
  lines += ["| " + " | ".join(_cell(r[c]) for c in _COLUMNS) + " |"
            for r in rows]
  with open(os.path.join(_OUT.value, "lineage.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
