r"""The commit rules' curves and AUP from a run of configs/rules.py (issue 36).

  python experiments/compare_decoding.py --config=configs/rules.py \
      --workdir=/tmp/rules
  python experiments/commit_rules.py --results=/tmp/rules/results.csv \
      --workdir=experiments/results/rules_tiny

Writes rules.csv (one row per member x rule: its points, the highest TPF,
the AUP of agreement with AR greedy against TPF), rules.md (the table and
the command) and rules.png (agreement against TPF, one panel per member).
"""

import csv
import os
import sys

from absl import app
from absl import flags
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lm_decoding.evaluation import parallelism, records

_RESULTS = flags.DEFINE_string("results", None, "results.csv of the "
                               "comparison (configs/rules.py).", required=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder.",
                               required=True)
ACCURACY = "greedy_agreement"


def _table(found) -> list[dict]:
  best = max(a for points in found.values() for _, a, _ in points)
  def fastest(points):
    return max(points, key=lambda p: p[0])
  return [dict(member=member, rule=rule, points=len(points),
               max_tpf=fastest(points)[0],
               agreement_at_max_tpf=fastest(points)[1],
               best_agreement=max(a for _, a, _ in points),
               gen_ppl_at_max_tpf=float(fastest(points)[2]["gen_ppl"]),
               aup=parallelism.aup([t for t, _, _ in points],
                                   [a for _, a, _ in points], best))
          for (member, rule), points in sorted(found.items())]


def _plot(found, path: str) -> None:
  members = sorted({m for m, _ in found})
  fig = Figure(figsize=(4.5 * len(members), 4), layout="constrained")
  FigureCanvasAgg(fig)
  axes = fig.subplots(1, len(members), squeeze=False)[0]
  for ax, member in zip(axes, members):
    for (m, rule), points in sorted(found.items()):
      if m == member:
        ax.plot([t for t, _, _ in points], [a for _, a, _ in points],
                marker="o", label=rule)
    ax.set(title=member, xlabel="tokens per forward (T / NFE)",
           ylabel="agreement with AR greedy, %")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.savefig(path, dpi=110)


def main(argv):
  del argv
  with open(_RESULTS.value) as f:
    rows = list(csv.DictReader(f))
  found = parallelism.curves(rows, ACCURACY)
  if not found:
    sys.exit(f"commit_rules: error: no row of {_RESULTS.value} has "
             f"{ACCURACY} (run configs/rules.py)")
  table = _table(found)
  os.makedirs(_WORKDIR.value, exist_ok=True)
  records.write_csv(table, os.path.join(_WORKDIR.value, "rules.csv"))
  _plot(found, os.path.join(_WORKDIR.value, "rules.png"))
  keys = list(table[0])
  lines = [f"Command: `{records.command()}`", "",
           "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                              for v in r.values()) + " |" for r in table]
  with open(os.path.join(_WORKDIR.value, "rules.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
