"""The commit rules on the exact-answer tasks: TPF against exact match.

Issue 36, item 3 on the tasks. A self-paced commit rule (Fast-dLLM's
threshold tau and factor f, the EB-sampler's entropy bound gamma) commits as
many answer cells per forward pass as it trusts; each of its settings is one
point (tokens per forward, exact match), and the settings of one rule are its
curve. The reference is one cell a step (K = T) with the best of the
adaptive orderings (low-confidence, margin, entropy), the slowest and
safest greedy decode of the same model.

TPF is T / row_nfe, the answer cells over the forward passes a row takes
decoded alone (`task_scores.row_nfe`: the steps at which the row committed a
cell, plus the calls outside steps); the batch's NFE (every row decodes until the slowest
is done) is reported beside it. Exact match carries its binomial standard
error sqrt(p (1 - p) / n) over the n test problems; a point is "within one
SE" of the reference when its exact match is at least the reference's minus
the reference's standard error. Each curve is summed into d3LLM's AUP
(`evaluation.parallelism.aup`, exact match in percent, y_max the best exact
match of every curve of that model, the reference included).
"""

from __future__ import annotations

import csv
import math
import os
from typing import Mapping, Sequence

from matplotlib.figure import Figure

from lm_decoding.data.tasks import Split, Task
from lm_decoding.decoding.base import make_decoder
from lm_decoding.decoding.rules import ORDERINGS
from lm_decoding.evaluation import parallelism, records
from lm_decoding.models import Model
from lm_decoding.studies.task_scores import GREEDY, DecoderRun, score_decoder

REFERENCE = "one_a_step"  # the reference's rule name in labels
# The adaptive orderings of the reference (random order is not adaptive).
REFERENCE_ORDERINGS = tuple(o for o in ORDERINGS if o != "random")


SETTINGS = ("thresholds", "factors", "entropy_bounds")  # rule_grid's


def settings(rules: Mapping) -> dict[str, list[float]]:
  """rule_grid's settings from a config section `rules` whose SETTINGS
  keys hold comma-separated numbers (configs/tasks.py's config.rules).

  Raises:
    ValueError: a key missing, empty or not numbers, naming it.
  """
  out = {}
  for key in SETTINGS:
    value = rules.get(key, "")
    try:
      out[key] = [float(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
      out[key] = []
    if not out[key]:
      raise ValueError(f"rules.{key}={value!r} must be numbers, "
                       "comma-separated")
  return out


def rule_grid(kind: str, answer_length: int, block_length: int,
              thresholds: Sequence[float], factors: Sequence[float],
              entropy_bounds: Sequence[float]) -> list[DecoderRun]:
  """The greedy decoders of the rule curves of one diffusion model `kind`.

  MDLM: `threshold` at each tau, `factor` at each f, `entropy_bound` at
  each gamma (one block of T), and `llada` with K = T in each adaptive
  ordering. BD3-LM (blocks of `block_length`, the exact block cache):
  `bd3lm` with remasking='threshold' at each tau and each adaptive ordering
  with K = T (one cell a step); it has no factor or entropy-bound rule.
  Labels are '<rule>/<setting>' (rule 'threshold', 'factor',
  'entropy_bound' or REFERENCE, whose setting is the ordering).

  Raises:
    ValueError: a kind other than 'mdlm' and 'bd3lm', or (from the decoder
      configs) a setting out of its range.
  """
  t = dict(output_length=answer_length, eos_ids=(), sampling=GREEDY)
  if kind == "mdlm":
    out = [DecoderRun(f"threshold/{tau}", None,
                      make_decoder("threshold", **t, threshold=tau))
           for tau in thresholds]
    out += [DecoderRun(f"factor/{f}", None,
                       make_decoder("factor", **t, factor=f)) for f in factors]
    out += [DecoderRun(f"entropy_bound/{g}", None,
                       make_decoder("entropy_bound", **t, entropy_bound=g))
            for g in entropy_bounds]
    return out + [DecoderRun(f"{REFERENCE}/{o}", answer_length,
                             make_decoder("llada", **t, steps=answer_length,
                                          remasking=o))
                  for o in REFERENCE_ORDERINGS]
  if kind != "bd3lm":
    raise ValueError(f"kind={kind!r}; allowed: ('mdlm', 'bd3lm')")
  block = dict(t, steps=answer_length, block_length=block_length)
  out = [DecoderRun(f"threshold/{tau}", None,
                    make_decoder("bd3lm", **block, remasking="threshold",
                                 threshold=tau)) for tau in thresholds]
  return out + [DecoderRun(f"{REFERENCE}/{o}", answer_length,
                           make_decoder("bd3lm", **block, remasking=o))
                for o in REFERENCE_ORDERINGS]


def standard_error(p: float, n: int) -> float:
  """The binomial standard error of a rate p over n problems."""
  return math.sqrt(p * (1 - p) / n)


def with_tpf(row: dict, answer_length: int) -> dict:
  """A `score_decoder` row with rule, setting, tpf (T / row_nfe),
  batch_tpf (T / nfe) and exact_se added."""
  rule, _, setting = str(row["decoder"]).partition("/")
  return dict(row, rule=rule, setting=setting,
              tpf=answer_length / row["row_nfe"],
              batch_tpf=answer_length / row["nfe"],
              exact_se=standard_error(row["exact"], row["problems"]))


def reference(rows: Sequence[dict]) -> dict:
  """The REFERENCE row of highest exact match (one model's rows).

  Raises:
    ValueError: no REFERENCE row.
  """
  found = [r for r in rows if r["rule"] == REFERENCE]
  if not found:
    raise ValueError(f"no {REFERENCE} row among {len(rows)} rows")
  return max(found, key=lambda r: r["exact"])


def summary(rows: Sequence[dict]) -> list[dict]:
  """One row per (task, model, rule) of `with_tpf` rows: its points, the
  highest TPF, the exact match there, the highest TPF whose exact match is
  within one SE of the model's reference (0 when none), and the AUP.
  REFERENCE's summary is its best ordering's point."""
  out = []
  for key in dict.fromkeys((r["task"], r["model"]) for r in rows):
    mine = [r for r in rows if (r["task"], r["model"]) == key]
    ref = reference(mine)
    floor = ref["exact"] - ref["exact_se"]
    best = 100 * max(r["exact"] for r in mine)
    for rule in dict.fromkeys(r["rule"] for r in mine):
      points = sorted((r for r in mine if r["rule"] == rule),
                      key=lambda r: r["tpf"])
      if rule == REFERENCE:
        points = [ref]
      fastest = points[-1]
      held = [r["tpf"] for r in points if r["exact"] >= floor]
      out.append(dict(
          task=key[0], model=key[1], rule=rule, points=len(points),
          max_tpf=fastest["tpf"], exact_at_max_tpf=fastest["exact"],
          se_at_max_tpf=fastest["exact_se"],
          max_tpf_within_1se=max(held, default=0.0),
          reference_exact=ref["exact"], reference_se=ref["exact_se"],
          aup=parallelism.aup([r["tpf"] for r in points],
                              [100 * r["exact"] for r in points], best)))
  return out


PANELS_PER_ROW = 3


def plot(rows: Sequence[dict]) -> Figure:
  """Exact match (with one-SE bars) against TPF, one line per rule, one
  panel per (task, model); the reference's one-SE band shaded."""
  keys = list(dict.fromkeys((r["task"], r["model"]) for r in rows))
  cols = min(len(keys), PANELS_PER_ROW)
  lines = -(-len(keys) // cols)
  fig = Figure(figsize=(4.5 * cols, 3.8 * lines), layout="constrained")
  axes = fig.subplots(lines, cols, squeeze=False).ravel()
  for ax in axes[len(keys):]:
    ax.set_axis_off()
  for ax, key in zip(axes, keys):
    mine = [r for r in rows if (r["task"], r["model"]) == key]
    ref = reference(mine)
    ax.axhspan(ref["exact"] - ref["exact_se"], ref["exact"] + ref["exact_se"],
               color="grey", alpha=0.25,
               label=f"one a step ({ref['setting']}) ± 1 SE")
    for rule in dict.fromkeys(r["rule"] for r in mine):
      if rule == REFERENCE:
        continue
      points = sorted((r for r in mine if r["rule"] == rule),
                      key=lambda r: r["tpf"])
      ax.errorbar([r["tpf"] for r in points], [r["exact"] for r in points],
                  yerr=[r["exact_se"] for r in points], marker="o",
                  capsize=2, label=rule)
    ax.set(title=f"{key[0]}: {key[1]}", xlabel="cells per forward (T / NFE "
           "of a row)", ylabel="exact match")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  return fig


def measure(task: Task, split: Split, model: str,
            grid: Sequence[DecoderRun], models: Mapping[str, Model],
            seed: int, log=print) -> list[dict]:
  """Every decoder of `grid` on `split` (`score_decoder`), as `with_tpf`
  rows with 'task' and 'model' (the model's name in the record) added;
  `log` gets one line per row."""
  rows = []
  for entry in grid:
    row = with_tpf(dict(task=task.name, model=model, **score_decoder(
        task, split, entry, models, seed)), task.answer_length)
    log(f"{task.name}/{model} {row['decoder']}: exact {row['exact']:.3f} "
        f"± {row['exact_se']:.3f}, TPF {row['tpf']:.2f} (batch "
        f"{row['batch_tpf']:.2f})")
    rows.append(row)
  return rows


POINT_COLUMNS = ("task", "model", "rule", "setting", "tpf", "row_nfe",
                 "batch_tpf", "nfe", "exact", "exact_se", "valid",
                 "token_accuracy", "ms_per_problem", "problems")


def read_points(path: str, task: str, model: str) -> list[dict]:
  """The rows of `model` on `task` in a points CSV `write_record` wrote
  (numbers read back as numbers), e.g. a teacher's curve to draw beside
  its student's.

  Raises:
    ValueError: the file holds no such row.
  """
  with open(path) as f:
    found = [{k: records.number(v) if k not in ("task", "model", "rule",
                                                 "setting") else v
              for k, v in r.items()}
             for r in csv.DictReader(f)
             if r["task"] == task and r["model"] == model]
  if not found:
    raise ValueError(f"{path} holds no row of model {model!r} on {task!r}")
  return found


def _cell(value) -> str:
  return f"{value:.3f}" if isinstance(value, float) else str(value)


def _table(rows: Sequence[dict], keys: Sequence[str]) -> list[str]:
  return (["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
          + ["| " + " | ".join(_cell(r[k]) for k in keys) + " |"
             for r in rows])


def write_record(rows: Sequence[dict], out_dir: str, header: Sequence[str],
                 name: str = "rules") -> list[dict]:
  """Writes the record of `with_tpf` rows into `out_dir`: {name}.csv (every
  point), {name}_summary.csv (`summary`), {name}.md (`header` lines, the
  summary and the points) and {name}.png (`plot`).

  Returns:
    The summary rows.
  """
  os.makedirs(out_dir, exist_ok=True)
  points = [{k: r[k] for k in POINT_COLUMNS} for r in rows]
  table = summary(rows)
  records.write_csv(points, os.path.join(out_dir, f"{name}.csv"))
  records.write_csv(table, os.path.join(out_dir, f"{name}_summary.csv"))
  fig = plot(rows)
  fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=110)
  lines = [*header, "", "## One row per rule", "", *_table(table, list(
      table[0])), "", "## Every point", "", *_table(points, POINT_COLUMNS)]
  with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return table
