r"""The cost model's prediction of self-speculation against cached AR.

Reads a record of self_speculation.py (its rows' member, B, gamma and
rounds: a batch runs as many rounds as its slowest row) and predicts, per hardware profile
(`cost_model.PROFILES` and the measured CPU one), the time of one decode of
T tokens after a prompt of P:
  cached AR         prefill + (T - 1) steps of B x 1 positions;
  self-speculation  prefill + that many rounds, each a draft call and a
                    verify call of B x (gamma + 1) positions,
all against a cache of P + T slots (`cost_model.step_s`, the roofline plus
the profile's per-step overhead), and their ratio (< 1: self-speculation is
faster). The models are the members' own (from their manifests in
--set_dir). Beside them, the ratio the record's own call costs give on the
machine that measured them (`measured_ratio`).

  python benchmarks/self_speculation/predict.py \
      --record=benchmarks/self_speculation/distilled/record.json \
      --set_dir=/work/runs/distill/set \
      --out=benchmarks/self_speculation/distilled/predicted.md
"""

import json
import pathlib

from absl import app
from absl import flags
import ml_collections

from lm_decoding.evaluation import cost_model
from lm_decoding.training.pretrained import recipes
from lm_decoding.training import train as train_lib

_RECORD = flags.DEFINE_string("record", None, "record.json of "
                              "self_speculation.py.", required=True)
_SET_DIR = flags.DEFINE_string("set_dir", None, "The set holding the "
                               "record's members.", required=True)
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 16, "P, tokens.")
_PROFILES = flags.DEFINE_list("profiles", ["cpu", "h100_sxm", "tpu_v5e"],
                              f"Of {cost_model.PROFILE_NAMES}.")
_OUT = flags.DEFINE_string("out", None, "A markdown file to write.")


def predicted_ratio(config, batch: int, prompt_length: int,
                    output_length: int, gamma: int, rounds: int,
                    profile: cost_model.HardwareProfile) -> float:
  """Self-speculation's predicted time over cached AR's (module docstring).

  Raises:
    ValueError: B, P or T below 1 (`cost_model.ar_decode_s`), rounds below 1.
  """
  if rounds < 1:
    raise ValueError(f"rounds={rounds} must be at least 1")
  ar = cost_model.ar_decode_s(config, batch, prompt_length, output_length,
                              profile)
  cache = prompt_length + output_length
  call = cost_model.step_s(config, batch, gamma + 1, cache, profile)
  prefill = cost_model.prefill_s(config, batch, prompt_length, output_length,
                                 profile)
  return (prefill + rounds * 2 * call) / ar


def measured_ratio(row: dict) -> float:
  """rounds x (draft call + verify call) / (T x AR step), from a record
  row's measured call costs (`call_ms`, medians) and its slowest row's
  rounds; the prefill, common to both decodes, left out."""
  calls = row["call_ms"]
  return (max(row["rounds_per_row"]) * (calls["draft"] + calls["verify"])
          / (row["output_length"] * calls["ar_step"]))


def main(_):
  record = json.loads(pathlib.Path(_RECORD.value).read_text())
  profiles = {n: cost_model.load_profile(n) for n in _PROFILES.value}
  lines = ["# Self-speculation over cached AR, predicted", "",
           f"Command: `python {' '.join(__import__('sys').argv)}`  ",
           f"Record: `{_RECORD.value}` (commit {record['commit'][:10]}); "
           f"P = {_PROMPT_LENGTH.value}; `cost_model.step_s` per call "
           "(roofline + the profile's per-step overhead).", "",
           "| member | B | gamma | TPF (measured) | rounds | from measured calls | "
           + " | ".join(f"{n} ratio" for n in profiles) + " |",
           "|---|---|---|---|---|---|" + "---|" * len(profiles)]
  configs = {}
  for row in record["rows"]:
    if "gamma" not in row:
      continue
    name = row["member"]
    if name not in configs:
      recipe = recipes.read_manifest(name, _SET_DIR.value)["recipe"]
      configs[name] = train_lib.model_config(
          ml_collections.ConfigDict(recipe))
    ratios = [predicted_ratio(configs[name], row["batch"],
                              _PROMPT_LENGTH.value, row["output_length"],
                              row["gamma"], max(row["rounds_per_row"]), p)
              for p in profiles.values()]
    lines.append(f"| {name} | {row['batch']} | {row['gamma']} | "
                 f"{row['tpf']:.2f} | {max(row['rounds_per_row'])} | "
                 f"{measured_ratio(row):.2f}x | "
                 + " | ".join(f"{r:.2f}x" for r in ratios) + " |")
  text = "\n".join(lines) + "\n"
  if _OUT.value:
    pathlib.Path(_OUT.value).write_text(text)
  print(text)


if __name__ == "__main__":
  app.run(main)
