"""loading.load_models: the models of the main job and the notebook."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lm_decoding.data import corpus
from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE
from lm_decoding.models import quantization
from lm_decoding.training.pretrained import loading, recipes, store
from lm_decoding.training import train
from lm_decoding.training.checkpoints import CheckpointError


def make_config(path: str) -> ml_collections.ConfigDict:
  """A one-layer AR member trained for 2 steps of 2 x 16 tokens."""
  return ml_collections.ConfigDict(dict(
      seed=0,
      data=dict(path=path, vocab_size=MIN_VOCAB_SIZE, seq_len=16,
                format="auto"),
      model=dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                 head_dim=16, mlp_dim=64, max_len=16),
      train=dict(objective="ar", batch_size=2, num_steps=2,
                 learning_rate=1e-2, warmup_steps=1, weight_decay=0.0,
                 grad_clip_norm=1.0, eval_every=2, eval_batches=1,
                 mdlm_eval_timesteps=2, checkpoint_every=2,
                 keep_checkpoints=1)))


def test_load_models_trains_then_takes_the_exported_member(tmp_path):
  """Trained (valid PPL from metrics.jsonl), then shipped (from the manifest)."""
  text = tmp_path / "text.txt"
  text.write_text("\n\n".join(corpus.load_paragraphs(None)[:400]))
  config = make_config(str(text))
  workdir, shipped_set = str(tmp_path / "work"), tmp_path / "set"
  tokenizer = pipeline.prepare(str(text), MIN_VOCAB_SIZE, workdir).tokenizer

  trained = loading.load_models({"ar": config}, workdir, tokenizer,
                                   progress=False, out_dir=shipped_set)["ar"]
  with open(tmp_path / "work" / "ar" / "metrics.jsonl") as f:
    logged = [json.loads(line) for line in f]
  assert logged[-1]["step"] == 2
  assert (trained.shipped, trained.objective) == (False, "ar")
  assert trained.valid_ppl == logged[-1]["valid_ppl"]
  assert trained.source.startswith(f"trained in {workdir}/ar (no pretrained")
  assert trained.describe("ar") == (
      f"ar: validation perplexity {logged[-1]['valid_ppl']:.1f} "
      f"(trained here, {trained.source})")

  store.export(config, f"{workdir}/ar", "ar", tokenizer, "cmd",
                    {"valid_ppl": 123.45}, out_dir=shipped_set)
  shipped = loading.load_models({"ar": config}, workdir, tokenizer,
                                   progress=False, out_dir=shipped_set)["ar"]
  assert shipped.shipped and shipped.valid_ppl == 123.45
  assert shipped.describe("ar").startswith(
      "ar: validation perplexity 123.5 (shipped, pretrained 'ar' (commit ")
  chex.assert_trees_all_equal(shipped.model.params, trained.model.params)
  assert shipped.model.logits_fn.vocab_size == MIN_VOCAB_SIZE


@pytest.fixture(scope="module")
def trained_member(tmp_path_factory):
  """(config, workdir, tokenizer, float params) of a member trained 2 steps."""
  tmp_path = tmp_path_factory.mktemp("member")
  text = tmp_path / "text.txt"
  text.write_text("\n\n".join(corpus.load_paragraphs(None)[:400]))
  config = make_config(str(text))
  workdir = str(tmp_path / "work")
  tokenizer = pipeline.prepare(str(text), MIN_VOCAB_SIZE, workdir).tokenizer
  params = loading.load_models({"ar": config}, workdir, tokenizer,
                                  progress=False, out_dir=tmp_path / "none"
                                  )["ar"].model.params
  return config, f"{workdir}/ar", tokenizer, params


def _stored_bytes(member: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in (member / "params").rglob("*")
             if p.is_file())


@pytest.mark.parametrize("stored_dtype", [None, "bfloat16", "int8"])
def test_stored_dtype_round_trips_within_its_rounding(trained_member,
                                                      tmp_path, stored_dtype):
  """`find` gives float32 parameters back: the trained ones exactly (None),
  each rounded to bfloat16, or their int8 quantisation dequantised (per
  channel: tests/test_quantization.py); the manifest
  says how they were stored, and the int8 member's files are well under the
  float32 one's."""
  config, workdir, tokenizer, params = trained_member
  member = store.export(config, workdir, "ar", tokenizer, "cmd", {},
                             out_dir=tmp_path, stored_dtype=stored_dtype)
  assert recipes.read_manifest("ar", tmp_path).get(
      "stored_dtype") == stored_dtype
  loaded, reason = store.find(config, "ar", tokenizer, tmp_path)
  assert loaded is not None, reason
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype("float32")}
  chex.assert_trees_all_equal_shapes_and_dtypes(loaded, params)
  if stored_dtype is None:
    chex.assert_trees_all_equal(loaded, params)
  elif stored_dtype == "bfloat16":
    chex.assert_trees_all_equal(loaded, jax.tree.map(
        lambda x: x.astype(jnp.bfloat16).astype(np.float32), params))
  if stored_dtype == "int8":  # exactly the dequantised int8 layout
    chex.assert_trees_all_equal(loaded, quantization.dequantize_params(
        quantization.quantize_params(params, train.model_config(config))))
    float_member = store.export(config, workdir, "f32", tokenizer, "cmd",
                                     {}, out_dir=tmp_path)
    # A quarter of the weights' bytes; this 1-layer model's float32 norms,
    # scales and checkpoint metadata keep the files at about half (0.51 in
    # one run, under 0.5 in another).
    assert _stored_bytes(member) < 0.6 * _stored_bytes(float_member)


def test_export_refuses_an_unknown_stored_dtype(trained_member, tmp_path):
  config, workdir, tokenizer, _ = trained_member
  with pytest.raises(ValueError, match=r"stored_dtype='float16'; allowed"):
    store.export(config, workdir, "ar", tokenizer, "cmd", {},
                      out_dir=tmp_path, stored_dtype="float16")
  assert not (tmp_path / "ar").exists()


def _tree(folder: pathlib.Path) -> list:
  return sorted(p.relative_to(folder) for p in folder.rglob("*"))


@pytest.mark.parametrize("stored_dtype", ["bfloat16", "int8"])
def test_convert_stores_a_float_member_as_export_would(trained_member,
                                                       tmp_path, stored_dtype):
  """Converting a shipped float member gives the parameters a rounded export
  from the workdir gives, bit for bit, and its manifest keeps the training's
  command, commit and metrics beside the conversion's."""
  config, workdir, tokenizer, _ = trained_member
  store.export(config, workdir, "ar", tokenizer, "train cmd",
                    {"valid_ppl": 9.5}, out_dir=tmp_path / "set")
  before = recipes.read_manifest("ar", tmp_path / "set")
  assert store.convert(["ar"], stored_dtype, "convert cmd",
                            tmp_path / "set") == [tmp_path / "set" / "ar"]
  store.export(config, workdir, "ar", tokenizer, "cmd", {},
                    out_dir=tmp_path / "exported", stored_dtype=stored_dtype)
  converted, _ = store.find(config, "ar", tokenizer, tmp_path / "set")
  exported, _ = store.find(config, "ar", tokenizer, tmp_path / "exported")
  chex.assert_trees_all_equal(converted, exported)
  after = recipes.read_manifest("ar", tmp_path / "set")
  assert after.pop("stored_dtype") == stored_dtype
  assert after.pop("conversion")["command"] == "convert cmd"
  assert after == before
  assert sorted(p.name for p in (tmp_path / "set").iterdir()) == [
      "ar", "tokenizer.model"]  # no staging or old folder left


def _files(folder: pathlib.Path) -> dict:
  return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture()
def float_and_rounded(trained_member, tmp_path):
  """A set of 'f32' (float) and 'bf16' (stored as bfloat16)."""
  config, workdir, tokenizer, _ = trained_member
  store.export(config, workdir, "f32", tokenizer, "cmd", {},
                    out_dir=tmp_path)
  store.export(config, workdir, "bf16", tokenizer, "cmd", {},
                    out_dir=tmp_path, stored_dtype="bfloat16")
  return tmp_path


@pytest.mark.parametrize("names, stored_dtype, error, match", [
    (["f32", "bf16"], "int8", ValueError, r"'bf16' .* stored as bfloat16 "
     "already"),
    (["f32"], "float16", ValueError, r"stored_dtype='float16'; allowed"),
    (["f32", "f32"], "int8", ValueError, r"distinct members"),
    ([], "int8", ValueError, r"non-empty"),
    (["f32", "missing"], "int8", CheckpointError, r"no manifest"),
    (["../f32"], "int8", ValueError, r"plain folder name"),
    (["copy"], "int8", CheckpointError, r"names member 'f32', not 'copy'"),
])
def test_convert_refuses_before_rewriting_any_member(
    float_and_rounded, names, stored_dtype, error, match):
  """Rounding a rounded member again would compound its error; a copied
  folder whose manifest names another member would have rewritten that
  member. Each is refused before the first member is rewritten."""
  set_dir = float_and_rounded
  shutil.copytree(set_dir / "f32", set_dir / "copy")
  before = _files(set_dir)
  with pytest.raises(error, match=match):
    store.convert(names, stored_dtype, "cmd", set_dir)
  assert _files(set_dir) == before


def test_convert_refuses_a_member_whose_recipe_does_not_load(
    float_and_rounded):
  """A recipe that does not fit its parameters fails when it is loaded,
  before the member listed first is rewritten."""
  set_dir = float_and_rounded
  shutil.copytree(set_dir / "f32", set_dir / "wide")
  manifest = json.loads((set_dir / "wide" / "manifest.json").read_text())
  manifest["name"] = "wide"
  manifest["recipe"]["model"]["d_model"] *= 2
  (set_dir / "wide" / "manifest.json").write_text(json.dumps(manifest))
  before = _files(set_dir)
  with pytest.raises(CheckpointError):
    store.convert(["f32", "wide"], "int8", "cmd", set_dir)
  assert _files(set_dir) == before


def test_convert_puts_back_a_member_a_killed_swap_left_hidden(
    float_and_rounded):
  """A run stopped between `_swap_in`'s two renames leaves the member only
  under `.f32-old-*`; convert restores it first, as export does."""
  set_dir = float_and_rounded
  os.replace(set_dir / "f32", set_dir / ".f32-old-0123")
  store.convert(["f32"], "int8", "cmd", set_dir)
  assert recipes.read_manifest("f32", set_dir)["stored_dtype"] == "int8"
  assert not list(set_dir.glob(".f32-*"))


def test_cli_converts_every_member_or_none(float_and_rounded):
  """experiments/convert_pretrained.py: one error line and exit 1 with the
  set unchanged; then a run that converts and records its command."""
  set_dir = float_and_rounded
  script = pathlib.Path(__file__).parent.parent / "experiments" / (
      "convert_pretrained.py")
  def cli(*names):
    return subprocess.run([sys.executable, str(script), f"--set_dir={set_dir}",
                           "--stored_dtype=int8", *names],
                          capture_output=True, text=True, check=False)
  before = _files(set_dir)
  run = cli("f32", "bf16")
  assert run.returncode == 1
  assert run.stderr.strip().splitlines()[-1].startswith(
      "error: member 'bf16'"), run.stderr
  assert _files(set_dir) == before
  run = cli("f32")
  assert run.returncode == 0, run.stderr
  manifest = recipes.read_manifest("f32", set_dir)
  assert manifest["stored_dtype"] == "int8"
  assert manifest["conversion"]["command"].endswith(
      f"convert_pretrained.py --set_dir={set_dir} --stored_dtype=int8 f32")


@pytest.mark.parametrize("name", ["", ".", "..", "../ar", "a/b", "-x", ".ar",
                                  "ar ", "é"])
def test_export_refuses_a_name_that_is_not_a_plain_folder(trained_member,
                                                          tmp_path, name):
  """'.' or '' named the set itself, so the swap deleted every member; a path
  wrote outside the set. Refused before anything is written."""
  config, workdir, tokenizer, _ = trained_member
  store.export(config, workdir, "ar", tokenizer, "cmd", {},
                    out_dir=tmp_path)
  before = _tree(tmp_path)
  with pytest.raises(ValueError, match=r"export name=.* plain folder name"):
    store.export(config, workdir, name, tokenizer, "cmd", {},
                      out_dir=tmp_path)
  assert _tree(tmp_path) == before


@pytest.mark.parametrize("occupant", ["set", "no_manifest"])
def test_export_refuses_to_replace_a_folder_that_is_not_a_member(
    trained_member, tmp_path, occupant):
  """Exporting 'base' into the folder holding the base set would have
  swapped the whole set out for one member; a folder without a manifest
  (not a member) is refused alike. Refused before training, by train.py's
  check_export, and by export itself; nothing is written."""
  config, workdir, tokenizer, _ = trained_member
  store.export(config, workdir, "ar", tokenizer, "cmd", {},
                    out_dir=tmp_path / "base")  # a set: a tokenizer, members
  if occupant == "no_manifest":
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
  name = "base" if occupant == "set" else "notes"
  before = _tree(tmp_path)
  with pytest.raises(ValueError, match=rf"export name='{name}': .* is not a "
                     "member"):
    recipes.check_export(name, None, tmp_path)
  with pytest.raises(ValueError, match="is not a member"):
    store.export(config, workdir, name, tokenizer, "cmd", {},
                      out_dir=tmp_path)
  assert _tree(tmp_path) == before


def test_a_failed_swap_puts_the_old_member_back(trained_member, tmp_path,
                                                monkeypatch):
  config, workdir, tokenizer, _ = trained_member
  store.export(config, workdir, "ar", tokenizer, "first", {},
                    out_dir=tmp_path)
  real_replace = store.os.replace

  def failing_replace(src, dst):
    if ".ar-staging-" in str(src):
      raise OSError("disk full")
    return real_replace(src, dst)

  monkeypatch.setattr(store.os, "replace", failing_replace)
  with pytest.raises(OSError, match="disk full"):
    store.export(config, workdir, "ar", tokenizer, "second", {},
                      out_dir=tmp_path)
  assert recipes.read_manifest("ar", tmp_path)["command"] == "first"
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "ar", recipes.TOKENIZER_FILE]


def test_export_restores_a_member_left_renamed_by_a_killed_swap(
    trained_member, tmp_path):
  """A run killed between the swap's two renames left the old member under
  '.ar-old-*' and no 'ar'; `_clear_leftovers`, which every export runs
  before its own swap, puts it back and removes a killed run's staging
  folder. (Called directly: after a whole export the new member would hide
  whether the old one had come back.)"""
  config, workdir, tokenizer, _ = trained_member
  store.export(config, workdir, "ar", tokenizer, "first", {},
                    out_dir=tmp_path)
  (tmp_path / "ar").rename(tmp_path / ".ar-old-1234")
  (tmp_path / ".ar-staging-5678").mkdir()
  store._clear_leftovers(tmp_path, "ar")
  assert recipes.read_manifest("ar", tmp_path)["command"] == "first"
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "ar", recipes.TOKENIZER_FILE]


def test_export_replaces_a_member_and_leaves_nothing_else(trained_member,
                                                         tmp_path):
  config, workdir, tokenizer, _ = trained_member
  for command in ("first", "second"):
    store.export(config, workdir, "ar", tokenizer, command, {},
                      out_dir=tmp_path)
  assert recipes.read_manifest("ar", tmp_path)["command"] == "second"
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "ar", recipes.TOKENIZER_FILE]  # no staging or old copies left
  # The modes of a plain write (mkstemp and mkdtemp would give 0o600/0o700).
  umask = os.umask(0)
  os.umask(umask)
  assert (tmp_path / recipes.TOKENIZER_FILE).stat().st_mode & 0o777 == (
      0o666 & ~umask)
  assert (tmp_path / "ar").stat().st_mode & 0o777 == 0o777 & ~umask


def test_find_refuses_a_manifest_with_an_unknown_stored_dtype(trained_member,
                                                              tmp_path):
  config, workdir, tokenizer, _ = trained_member
  member = store.export(config, workdir, "ar", tokenizer, "cmd", {},
                             out_dir=tmp_path, stored_dtype="bfloat16")
  manifest = json.loads((member / recipes.MANIFEST_FILE).read_text())
  manifest["stored_dtype"] = "int4"
  (member / recipes.MANIFEST_FILE).write_text(json.dumps(manifest))
  with pytest.raises(CheckpointError, match=r"stored_dtype='int4'; allowed"):
    store.find(config, "ar", tokenizer, tmp_path)
