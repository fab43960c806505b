"""Shipping a member no recipe derives (a distilled student) into a set.

`ship` copies it from the set it was trained in into another with its
lineage: the chain of runs it descends from, down to a member both sets
hold, and the data those runs read, so its compute is counted whole.
`member_recipes.stored_member_configs` reads it back for the main job.
"""

from __future__ import annotations

import pathlib

import ml_collections

from lm_decoding.training import train as train_lib
from lm_decoding.training.checkpoints import CheckpointError
from lm_decoding.training.pretrained.recipes import (
    MANIFEST_FILE, TOKENIZER_FILE, check_export, current_commit,
    read_manifest)
from lm_decoding.training.pretrained.store import load_member, write_member


def ship(name: str, from_dir: str | pathlib.Path, to_dir: str | pathlib.Path,
         as_name: str, command: str) -> pathlib.Path:
  """Copies member `name` of the set `from_dir` into the set `to_dir` as
  `as_name` (a derived model trained outside the config's members, e.g. a
  distilled student; `compare.stored_members` loads it), stored as it is.

  Its manifest keeps the training's command, commit, recipe and metrics and
  gains `lineage`: the chain of `train.init_from` parents in `from_dir` down
  to the first one `to_dir` holds (`root`; `to_dir`'s `as_name` counts only
  if it is that very model: a student shipped under a name a step of the
  chain bears replaces another model of that name), each step's member, commit,
  command, steps, tokens and training seconds, the distillation sets they
  read (each once, with the seconds their generation took), and the sums
  `train_s` and `data_s`, so the student's compute counts its data; and
  `shipping` (this `command`, the commit it ran at, the source name).

  Raises:
    ValueError: `as_name` or the folder it would replace fails
      `check_export`; the two sets hold different tokenizers; the chain
      reaches no member of `to_dir`, comes back to a member it passed (a
      cycle of `init_from`), or reaches one whose manifest differs from
      `from_dir`'s (other parameters under the same name); `as_name` is
      that member, the root (shipping would replace it).
    CheckpointError: a manifest on the chain is missing or corrupt (or
      lacks a field the lineage reads), or the parameters are unreadable.
  """
  from_dir, to_dir = pathlib.Path(from_dir), pathlib.Path(to_dir)
  check_export(as_name, None, to_dir)
  if ((from_dir / TOKENIZER_FILE).read_bytes()
      != (to_dir / TOKENIZER_FILE).read_bytes()):
    raise ValueError(f"{from_dir} and {to_dir} hold different tokenizers")
  manifest = read_manifest(name, from_dir)
  try:
    member, steps, data = _chain(name, manifest, from_dir, to_dir, as_name)
  except (KeyError, TypeError) as e:
    raise CheckpointError(f"a manifest on the init_from chain of {name!r} in "
                          f"{from_dir} lacks a field the lineage reads ({e})"
                          ) from e
  if read_manifest(member["name"], to_dir) != member:
    raise ValueError(f"{member['name']!r} differs between {from_dir} and "
                     f"{to_dir}: the chain's root must be the same model")
  if as_name == member["name"]:
    raise ValueError(f"as_name={as_name!r} is the root of the chain in "
                     f"{to_dir}; shipping would replace it: give another name")
  lineage = {"root": member["name"], "steps": steps,
             "data": [{"command": c, "wall_s": s} for c, s in data.items()],
             "train_s": sum(step["train_s"] for step in steps),
             "data_s": sum(data.values())}
  model_cfg = train_lib.model_config(
      ml_collections.ConfigDict(manifest["recipe"]))
  params = load_member(from_dir / name, manifest, model_cfg)
  stored = {key: value for key, value in manifest.items()
            if key != "stored_dtype"}
  return write_member(as_name, params, model_cfg,
                      {**stored, "name": as_name, "lineage": lineage,
                       "shipping": {"command": command,
                                    "commit": current_commit(),
                                    "source": name}},
                      to_dir, manifest.get("stored_dtype"))


def _chain(name: str, manifest: dict, from_dir: pathlib.Path,
           to_dir: pathlib.Path, as_name: str
           ) -> tuple[dict, list[dict], dict[str, float]]:
  """(the manifest of the root, the steps from it to `name`, {distillation
  set command: wall_s}) of `ship`'s lineage, `manifest` being `name`'s.

  Raises:
    ValueError, CheckpointError: as `ship`; KeyError, TypeError: a manifest
      without the fields it reads.
  """

  def is_root(member: dict) -> bool:
    held = to_dir / member["name"] / MANIFEST_FILE
    return held.exists() and (member["name"] != as_name
                              or read_manifest(as_name, to_dir) == member)

  steps, data, member = [], {}, manifest
  while not is_root(member):
    if any(step["member"] == member["name"] for step in steps):
      raise ValueError(f"member {name!r} of {from_dir}: train.init_from "
                       f"comes back to {member['name']!r} (a cycle: "
                       f"{[step['member'] for step in reversed(steps)]})")
    metrics, train = member["metrics"], member["recipe"]["train"]
    steps.insert(0, {"member": member["name"], "commit": member["commit"],
                     "command": member["command"], "steps": metrics["steps"],
                     "tokens": metrics["tokens"],
                     "train_s": metrics["train_s"]})
    source = metrics.get("distillation_set")
    if source:
      data = {source["command"]: source["wall_s"], **data}
    if not train.get("init_from"):
      raise ValueError(f"member {name!r} of {from_dir} descends from no "
                       f"member of {to_dir}")
    member = read_manifest(train["init_from"], from_dir)
  return member, steps, data
