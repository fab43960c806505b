"""Members shipped outside a config's recipes: `shipping.ship` copies a derived
model (a distilled student) into a set with its lineage, and
`compare.stored_members` lets the main job load it by its own manifest."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import _loading
import stubs
from lm_decoding.config_reference import load_config
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.training import train as train_lib
from lm_decoding.training.checkpoints import CheckpointError
from lm_decoding.training.pretrained import (
    member_recipes, recipes, shipping, store)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENIZER = recipes.DEFAULT_DIR / recipes.TOKENIZER_FILE
DATA_SECONDS = {"data A": 100.0, "data B": 300.0}
DATA = stubs.small_config("").data  # the data every member of `sets` read


def _write(out_dir: pathlib.Path, name: str, parent: str, data: str,
           seed: int) -> dict:
  """Writes member `name` (random parameters, `train.init_from=parent`,
  read from distillation set `data`, '' for none) into `out_dir` as
  bfloat16; returns its manifest."""
  config = stubs.small_config("")
  config.train.init_from = parent
  metrics = {"steps": 2 + seed, "tokens": 64 * (seed + 1),
             "train_s": 10.0 * (seed + 1)}
  if data:
    metrics["distillation_set"] = {"command": data,
                                   "wall_s": DATA_SECONDS[data]}
  manifest = {"name": name, "command": f"train {name}", "commit": "c" * 40,
              "recipe": recipes.recipe(config), "metrics": metrics,
              "tokenizer_sha256": recipes.tokenizer_sha256(
                  Tokenizer.load(str(TOKENIZER)))}
  model_config = train_lib.model_config(config)
  store.write_member(name, stubs.random_params(model_config, seed),
                     model_config, manifest, out_dir, "bfloat16")
  return recipes.read_manifest(name, out_dir)


@pytest.fixture()
def sets(tmp_path):
  """A source set holding root -> first -> second (two steps on one
  distillation set, the third on another) and a target set holding root."""
  source, target = tmp_path / "source", tmp_path / "target"
  for folder in (source, target):
    folder.mkdir()
    (folder / recipes.TOKENIZER_FILE).write_bytes(TOKENIZER.read_bytes())
  _write(source, "root", "", "", 0)
  _write(target, "root", "", "", 0)
  _write(source, "first", "root", "data A", 1)
  _write(source, "second", "first", "data A", 2)
  _write(source, "third", "second", "data B", 3)
  return source, target


def test_ship_copies_the_parameters_with_the_chain_and_its_data(sets):
  source, target = sets
  shipping.ship("third", source, target, "student", "python ship")
  manifest = recipes.read_manifest("student", target)
  lineage = manifest["lineage"]
  assert lineage["root"] == "root"
  assert [s["member"] for s in lineage["steps"]] == ["first", "second",
                                                      "third"]
  assert [d["command"] for d in lineage["data"]] == ["data A", "data B"]
  assert lineage["train_s"] == 20.0 + 30.0 + 40.0
  assert lineage["data_s"] == 100.0 + 300.0  # data A counted once
  assert manifest["name"] == "student" and manifest["stored_dtype"] == (
      "bfloat16")
  assert manifest["shipping"]["source"] == "third"
  assert manifest["recipe"] == recipes.read_manifest("third", source)["recipe"]
  _, shipped = store.load_stored("student", target)
  _, original = store.load_stored("third", source)
  for a, b in zip(jax.tree.leaves(shipped), jax.tree.leaves(original)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ship_replaces_a_student_whose_name_a_step_of_the_chain_bears(sets):
  """A second student shipped as 'first' (the name of a step of its own
  chain, which the target set holds as an earlier, other student): the chain
  runs on to the root, and the new student replaces the old."""
  source, target = sets
  shipping.ship("second", source, target, "first", "python ship")
  _write(source, "fourth", "third", "", 4)
  shipping.ship("fourth", source, target, "first", "python ship")
  lineage = recipes.read_manifest("first", target)["lineage"]
  assert lineage["root"] == "root"
  assert [s["member"] for s in lineage["steps"]] == ["first", "second",
                                                      "third", "fourth"]
  _, shipped = store.load_stored("first", target)
  _, original = store.load_stored("fourth", source)
  for a, b in zip(jax.tree.leaves(shipped), jax.tree.leaves(original)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ship_refuses_a_chain_that_leaves_the_target_set(sets):
  source, target = sets
  (target / "root" / recipes.MANIFEST_FILE).unlink()
  with pytest.raises(ValueError, match="descends from no member of"):
    shipping.ship("third", source, target, "student", "python ship")
  assert not (target / "student").exists()


def test_ship_refuses_a_root_that_differs_between_the_sets(sets):
  source, target = sets
  _write(target, "root", "", "", 5)
  with pytest.raises(ValueError, match="'root' differs between"):
    shipping.ship("third", source, target, "student", "python ship")
  assert not (target / "student").exists()


def test_ship_refuses_another_tokenizer_and_a_bad_name(sets):
  source, target = sets
  with pytest.raises(ValueError, match="name"):
    shipping.ship("third", source, target, "../student", "python ship")
  (target / recipes.TOKENIZER_FILE).write_bytes(b"other")
  with pytest.raises(ValueError, match="different tokenizers"):
    shipping.ship("third", source, target, "student", "python ship")
  with pytest.raises(CheckpointError, match="no manifest"):
    shipping.ship("nobody", source, source, "student", "python ship")


def test_stored_member_configs_are_their_manifests_recipes(sets):
  """`store.find` then matches the recipe: the stored member loads, never
  trains."""
  source, _ = sets
  stored = member_recipes.stored_member_configs(("third",), {"ar"}, DATA, source)
  assert stored["third"].to_dict() == recipes.read_manifest(
      "third", source)["recipe"]
  params, reason = store.find(stored["third"], "third",
                              Tokenizer.load(str(TOKENIZER)), source)
  assert params is not None, reason


@pytest.mark.parametrize("names, match", [
    (("third", "third"), r"must be a tuple of distinct member names"),
    ("third", r"must be a tuple of distinct member names"),
    (None, r"must be a tuple of distinct member names"),
    ({"third": 1}, r"must be a tuple of distinct member names"),
    # Names that are paths, empty, or a stopped write's hidden folder.
    (("../source/third",), r"must be a tuple of distinct member names"),
    (("target/root",), r"must be a tuple of distinct member names"),
    (("",), r"must be a tuple of distinct member names"),
    ((".third-old-0",), r"must be a tuple of distinct member names"),
    (("ar",), r"'ar' is a member of the config"),
    (("nobody",), r"no member 'nobody' in .*shipped there: \['first', "
                  r"'root', 'second', 'third'\]"),
])
def test_stored_member_configs_refuse_bad_names(sets, names, match):
  """Also with what a stopped write left in the set (hidden copies of a
  member, manifests included): never a member, never listed."""
  source, _ = sets
  for leftover in (".third-old-0", ".third-staging-1"):
    shutil.copytree(source / "third", source / leftover)
  with pytest.raises(ValueError, match=f"compare.stored_members.*{match}"):
    member_recipes.stored_member_configs(names, {"ar"}, DATA, source)


def test_stored_member_configs_name_a_corrupt_manifest(sets):
  source, _ = sets
  (source / "third" / recipes.MANIFEST_FILE).write_text('{"recipe": ')
  with pytest.raises(ValueError, match="compare.stored_members: 'third' .* "
                     "no readable recipe"):
    member_recipes.stored_member_configs(("third",), {"ar"}, DATA, source)


def test_the_base_sets_students_load_by_their_own_manifests():
  """configs/base.py's stored members are in the base set, each loads by its
  manifest's recipe on the set's tokenizer (never trains), is a
  block-diffusion model with a token shift (what `self_speculative` and
  `bd3lm` need), and its lineage reaches the set's `bd3lm16_from_ar` and
  counts the seconds its distillation data took."""
  config = load_config(ROOT / "configs" / "base.py")
  folder = recipes.set_dir(config.compare.pretrained_set)
  stored = member_recipes.stored_member_configs(
      config.compare.stored_members, member_recipes.member_configs(config),
      config.data, folder)
  assert list(stored) == list(config.compare.stored_members)
  assert len(stored) == 2
  tokenizer = Tokenizer.load(str(folder / recipes.TOKENIZER_FILE))
  for name, recipe in stored.items():
    params, reason = store.find(recipe, name, tokenizer, folder)
    assert params is not None, reason
    model = train_lib.model_config(recipe)
    assert model.token_shift and recipe.train.block_length == 16
    lineage = recipes.read_manifest(name, folder)["lineage"]
    assert lineage["root"] == "bd3lm16_from_ar" and lineage["data_s"] > 0
    assert lineage["train_s"] == pytest.approx(sum(
        step["train_s"] for step in lineage["steps"]))


def test_cli_ships_or_exits_with_one_line(sets):
  """experiments/ship_member.py: one error line and exit 1 with the target
  set unchanged; then a run that ships and records its command."""
  source, target = sets
  def cli(member):
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "ship_member.py"),
         f"--from_set={source}", f"--member={member}", "--as_name=student",
         f"--to_set={target}"], capture_output=True, text=True, check=False,
        cwd=ROOT)
  before = sorted(p.name for p in target.iterdir())
  run = cli("nobody")
  assert run.returncode == 1
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: no manifest at")
  assert sorted(p.name for p in target.iterdir()) == before
  run = cli("third")
  assert run.returncode == 0, run.stderr
  assert recipes.read_manifest("student", target)["shipping"][
      "command"].endswith(f"--as_name=student --to_set={target}")


def _edit_manifest(folder: pathlib.Path, name: str, edit) -> None:
  """Rewrites member `name`'s manifest in `folder` as `edit(manifest)`."""
  path = folder / name / recipes.MANIFEST_FILE
  path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _with(manifest: dict, keys: str, value) -> dict:
  """`manifest` with the dotted key `keys` set to `value`."""
  *parents, last = keys.split(".")
  inner = manifest
  for key in parents:
    inner = inner[key]
  inner[last] = value
  return manifest


@pytest.mark.parametrize("keys, value, match", [
    ("recipe.data.vocab_size", 4096, r"trained on data .*'vocab_size': 4096"),
    ("recipe.data.path", "/elsewhere", r"trained on data .*'/elsewhere'"),
    ("tokenizer_sha256", "0" * 64, r"another tokenizer than the set's"),
    ("tokenizer_sha256", None, r"another tokenizer than the set's"),
    ("recipe.data", [], r"no readable recipe"),
    ("recipe", "text", r"no readable recipe"),
])
def test_stored_member_configs_refuse_what_could_not_load(sets, keys, value,
                                                          match):
  """A stored member on another corpus, vocabulary or tokenizer than the
  config and the set would not match at load time and would be trained
  from a recipe whose parents and data are elsewhere: refused here, as is
  a manifest whose recipe lacks its data."""
  source, _ = sets
  _edit_manifest(source, "third", lambda m: _with(m, keys, value))
  with pytest.raises(ValueError, match=f"compare.stored_members: 'third' .*"
                     f"{match}"):
    member_recipes.stored_member_configs(("third",), {"ar"}, DATA, source)


def test_stored_member_configs_take_a_list(sets):
  """--config.compare.stored_members='[...]' gives a list: read alike."""
  source, _ = sets
  assert list(member_recipes.stored_member_configs(
      ["third", "first"], {"ar"}, DATA, source)) == ["third", "first"]


def test_the_job_refuses_to_retrain_stored_members(tmp_path):
  """--retrain would train a stored member from a recipe whose parents and
  data are not in the repository (after hours of the others): refused
  first, nothing written."""
  module = _loading.load("compare_decoding",
                         ROOT / "experiments" / "compare_decoding.py")
  config = load_config(ROOT / "configs" / "base.py")
  with pytest.raises(ValueError, match=r"--retrain would train "
                     r"compare.stored_members=\('bd3lm16_distilled', "
                     r"'bd3lm16_distilled_view'\)"):
    module.plan(config, str(tmp_path / "work"), retrain=True)
  assert not (tmp_path / "work").exists()


def _loop(source: pathlib.Path, *chain: str) -> None:
  """Writes members `chain[i]` with init_from `chain[i + 1]` into `source`
  (the last one's parent is the first: a cycle)."""
  for i, name in enumerate(chain):
    _write(source, name, chain[(i + 1) % len(chain)], "data A", i)


@pytest.mark.parametrize("chain", [("loop_a",), ("loop_a", "loop_b"),
                                   ("tip", "loop_a", "loop_b", "loop_a")])
def test_ship_refuses_a_cycle_of_parents(sets, chain):
  """a -> a, a -> b -> a, and a tail into a cycle end with an error naming
  the member reached twice (they used to loop forever)."""
  source, target = sets
  _loop(source, *dict.fromkeys(chain))
  if chain[0] == "tip":  # tip -> loop_a -> loop_b -> loop_a
    _write(source, "loop_b", "loop_a", "", 5)
  with pytest.raises(ValueError, match=r"init_from comes back to 'loop_"):
    shipping.ship(chain[0], source, target, "student", "python ship")
  assert not (target / "student").exists()


def test_ship_names_a_missing_parent_and_a_manifest_without_metrics(sets):
  """A parent that is not in the set, and a manifest without the fields the
  lineage reads, are CheckpointErrors naming them (the CLI's one line),
  not a KeyError."""
  source, target = sets
  _write(source, "orphan", "gone", "", 1)
  with pytest.raises(CheckpointError, match="no manifest at .*gone"):
    shipping.ship("orphan", source, target, "student", "python ship")
  _edit_manifest(source, "second", lambda m: _with(m, "metrics", {}))
  with pytest.raises(CheckpointError, match=r"chain of 'third' .* lacks a "
                     r"field the lineage reads \('steps'\)"):
    shipping.ship("third", source, target, "student", "python ship")
  assert not (target / "student").exists()


def test_ship_keeps_the_root_and_replaces_another_member_whole(
    sets, monkeypatch):
  """as_name the chain's root is refused (the root would become the
  student); as_name another member replaces it, after clearing a stopped
  write's staging folder; a write that fails leaves the old member as it
  was and no staging folder."""
  source, target = sets
  root = recipes.read_manifest("root", target)
  with pytest.raises(ValueError, match="as_name='root' is the root"):
    shipping.ship("third", source, target, "root", "python ship")
  assert recipes.read_manifest("root", target) == root
  _write(target, "old", "", "", 7)
  shutil.copytree(target / "old", target / ".old-staging-0")
  shipping.ship("first", source, target, "old", "python ship")
  assert recipes.read_manifest("old", target)["shipping"]["source"] == "first"
  assert sorted(p.name for p in target.iterdir()) == [
      "old", "root", recipes.TOKENIZER_FILE]
  def fail(*args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(store.Checkpoints, "save", fail)
  with pytest.raises(OSError, match="disk full"):
    shipping.ship("third", source, target, "old", "python ship")
  assert recipes.read_manifest("old", target)["shipping"]["source"] == "first"
  assert sorted(p.name for p in target.iterdir()) == [
      "old", "root", recipes.TOKENIZER_FILE]
