"""Writing members into a pretrained set and reading them back.

`export` copies a trained workdir's parameters into a set (optionally
rounded to bfloat16 or weight-only int8), `convert` rounds members already
in it, `write_member` is the staged, atomic write they use (and
`shipping.ship`); `find` loads a
member whose recipe matches a config (`recipes`), `load_member` reads any
member's parameters back as float; `load_trained_params` reads the latest
checkpoint of a `train.train` workdir; `seed_data_cache` puts a set's
tokenizer where the data pipeline looks.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import uuid
from typing import Any, Sequence

import jax
import ml_collections

from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.models import abstract_params
from lm_decoding.models import quantization
from lm_decoding.training import train as train_lib
from lm_decoding.training import train_step
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints
from lm_decoding.training.pretrained.recipes import (
    DEFAULT_DIR, MANIFEST_FILE, STORED_DTYPES, TOKENIZER_FILE, check_export,
    current_commit, read_manifest, recipe, recipe_differences,
    tokenizer_sha256)


def load_trained_params(config: ml_collections.ConfigDict, workdir: str):
  """Parameters of the latest checkpoint `train.train` wrote in `workdir`."""
  model_cfg = train_lib.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  abstract = train_step.abstract_state(model_cfg, optimizer)
  with Checkpoints(os.path.join(workdir, "checkpoints")) as checkpoints:
    state, _ = checkpoints.restore(abstract)
  return state.params


def _swap_in(staging: pathlib.Path, member: pathlib.Path) -> None:
  """Puts folder `staging` at `member` by renames. An existing member is
  first renamed to a hidden `.{name}-old-*` folder, put back if the second
  rename fails, and removed once the new one is in place."""
  if not member.exists():
    os.replace(staging, member)
    return
  old = member.with_name(f".{member.name}-old-{uuid.uuid4().hex}")
  os.replace(member, old)
  try:
    os.replace(staging, member)
  except BaseException:
    os.replace(old, member)
    raise
  shutil.rmtree(old, ignore_errors=True)


def _clear_leftovers(out_dir: pathlib.Path, name: str) -> None:
  """Undoes what a stopped export of `name` left: a staging folder is
  removed; an old member renamed away (a stop between `_swap_in`'s two
  renames) is put back where no member is, else removed."""
  for staging in out_dir.glob(f".{name}-staging-*"):
    shutil.rmtree(staging, ignore_errors=True)
  for old in sorted(out_dir.glob(f".{name}-old-*")):
    if (out_dir / name).exists():
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.replace(old, out_dir / name)


def export(config: ml_collections.ConfigDict, workdir: str, name: str,
           tokenizer: Tokenizer | None, command: str, metrics: dict,
           out_dir: str | pathlib.Path = DEFAULT_DIR,
           stored_dtype: str | None = None,
           extra: dict | None = None) -> pathlib.Path:
  """Copies the trained parameters of the `train.train` run `config` in
  `workdir` into the pretrained set `out_dir` as member `name`.

  The manifest holds `name`, `command` (the one that trained it), the
  commit, `recipe(config)`, the sha256 of `tokenizer` (None: a set without
  a tokenizer, such as a task set), `metrics` and the fields of `extra`
  (a task model's curve and export command).

  With `stored_dtype` (one of STORED_DTYPES) the parameters are written
  rounded and `find` turns them back into model.param_dtype: 'bfloat16'
  casts them (half the bytes of float32); 'int8' stores the weight-only int8
  layout of `quantization.quantize_params` (a quarter of the bytes of the
  matmul kernels and the embedding, one float32 scale per output channel or
  token) and `find` dequantises it. The manifest records it; the shipped
  model is the rounded one (its metrics in the manifest are those of the
  unrounded parameters).

  The member is written to a hidden staging folder and swapped in by
  renames (`_swap_in`): a failed export leaves the old member in place, and
  a run killed between the two renames (an instant) leaves it under a hidden
  `.{name}-old-*` name, which the next export of `name` puts back first.

  Raises:
    ValueError: the set already holds a different tokenizer, or `name`,
      `stored_dtype` or the folder the export would replace fails
      `check_export`.
  """
  check_export(name, stored_dtype, out_dir)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  manifest = {"name": name, "command": command, "commit": current_commit(),
              "recipe": recipe(config)}
  if tokenizer is not None:
    _write_tokenizer(out_dir / TOKENIZER_FILE, tokenizer)
    manifest["tokenizer_sha256"] = tokenizer_sha256(tokenizer)
  manifest.update(metrics=metrics, **(extra or {}))
  return write_member(name, load_trained_params(config, workdir),
                      train_lib.model_config(config), manifest, out_dir,
                      stored_dtype)


def _write_tokenizer(path: pathlib.Path, tokenizer: Tokenizer) -> None:
  """Writes the set's tokenizer at `path`, or checks the one there.

  Raises:
    ValueError: `path` holds another tokenizer.
  """
  if not path.exists():
    pipeline.write_atomic(path, tokenizer.model_proto)
  elif Tokenizer.load(str(path)).model_proto != tokenizer.model_proto:
    raise ValueError(f"{path} holds another tokenizer; export the whole set "
                     "again into an empty folder")


def convert(names: Sequence[str], stored_dtype: str, command: str,
            out_dir: str | pathlib.Path = DEFAULT_DIR) -> list[pathlib.Path]:
  """Rewrites float members `names` of the set `out_dir` stored as
  `stored_dtype` (see `export`), in place, each atomically.

  Every member is checked and loaded (from its own manifest's recipe and the
  set's tokenizer) before the first is rewritten, so a bad one leaves the
  set as it was. A manifest keeps the training's command, commit, recipe and
  metrics (of the float parameters) and gains `stored_dtype` and
  `conversion` (this `command` and the commit it ran at): a set can be
  shrunk without its training workdirs.

  Returns:
    The rewritten member folders, in the order of `names`.
  Raises:
    ValueError: `names` is empty or repeats a name; a name is not a plain
      folder name (`check_export`); `stored_dtype` is not one of
      STORED_DTYPES; or a member is stored rounded already (rounding it
      again would compound the error: export it from its training workdir).
    CheckpointError: a member is missing, its manifest is corrupt, names
      another member or lacks a field, or its parameters are unreadable or
      do not fit its recipe.
  """
  if not names or len(set(names)) != len(names):
    raise ValueError(f"names={list(names)!r} must be a non-empty list of "
                     "distinct members")
  if stored_dtype is None:
    raise ValueError(f"stored_dtype=None; allowed: one of {STORED_DTYPES}")
  out_dir = pathlib.Path(out_dir)
  loaded = [_load_float_member(name, stored_dtype, out_dir) for name in names]
  conversion = {"command": command, "commit": current_commit()}
  return [write_member(name, params, train_lib.model_config(config),
                       {**manifest, "conversion": conversion}, out_dir,
                       stored_dtype)
          for name, (manifest, config, params) in zip(names, loaded)]


def _load_float_member(name: str, stored_dtype: str, out_dir: pathlib.Path
                       ) -> tuple[dict, ml_collections.ConfigDict, Any]:
  """(manifest, recipe config, float parameters) of member `name`, for
  `convert` to `stored_dtype`; raises as `convert` says."""
  check_export(name, stored_dtype, out_dir)
  _clear_leftovers(out_dir, name)
  manifest = read_manifest(name, out_dir)
  if manifest.get("name") != name:
    raise CheckpointError(f"{out_dir / name / MANIFEST_FILE} names member "
                          f"{manifest.get('name')!r}, not {name!r}")
  if manifest.get("stored_dtype") is not None:
    raise ValueError(f"member {name!r} in {out_dir} is stored as "
                     f"{manifest['stored_dtype']} already; only float members "
                     "convert")
  try:
    config = ml_collections.ConfigDict(manifest["recipe"])
    tokenizer = Tokenizer.load(str(out_dir / TOKENIZER_FILE))
    params, reason = find(config, name, tokenizer, out_dir)
  except (KeyError, TypeError, OSError) as e:
    raise CheckpointError(f"member {name!r} in {out_dir} cannot be loaded "
                          f"from its manifest's recipe: {e!r}") from e
  if params is None:
    raise CheckpointError(reason)
  return manifest, config, params


def write_member(name: str, params: Any, model_config, manifest: dict,
                 out_dir: str | pathlib.Path,
                 stored_dtype: str | None) -> pathlib.Path:
  """Writes member `name` (`params` of the `TransformerConfig`
  `model_config`, rounded to `stored_dtype` as `export` says, and
  `manifest`, which gains `stored_dtype`) into `out_dir` (created if
  missing) by a staged swap (`export`), after undoing what a stopped export
  of `name` left (`_clear_leftovers`).

  Returns:
    The member folder, `out_dir / name`.
  Raises:
    ValueError: as `check_export`.
  """
  check_export(name, stored_dtype, out_dir)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  _clear_leftovers(out_dir, name)
  if stored_dtype == "int8":
    params = quantization.quantize_params(params, model_config)
  elif stored_dtype is not None:
    params = jax.tree.map(lambda x: x.astype(stored_dtype), params)
  if stored_dtype is not None:
    manifest = {**manifest, "stored_dtype": stored_dtype}
  member = out_dir / name
  staging = out_dir / f".{name}-staging-{uuid.uuid4().hex}"
  staging.mkdir()
  try:
    with Checkpoints(str(staging / "params"), keep=1) as checkpoints:
      checkpoints.save(0, params, {"name": name})
    (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    _swap_in(staging, member)
  finally:
    shutil.rmtree(staging, ignore_errors=True)  # gone after a swap
  return member


def seed_data_cache(config: ml_collections.ConfigDict, data_dir: str,
                    out_dir: str | pathlib.Path = DEFAULT_DIR) -> pathlib.Path:
  """Puts the set's tokenizer where `pipeline.prepare(..., data_dir)` looks.

  `prepare` then encodes the corpus with that tokenizer instead of training
  one, so a member trained with `data_dir` and added to the set matches the
  set's tokenizer byte for byte.

  Returns:
    The data cache folder (`{data_dir}/data/{cache_key}`).
  Raises:
    ValueError: the set has no tokenizer, or the cache already holds another
      one (its encoded splits would not match; remove `data_dir`).
  """
  tokenizer_path = pathlib.Path(out_dir) / TOKENIZER_FILE
  if not tokenizer_path.exists():
    raise ValueError(f"no tokenizer in {out_dir}: train the whole set")
  splits = corpus_lib.load_splits(config.data.path, config.data.format)
  cache_dir = (pathlib.Path(data_dir) / "data"
               / pipeline.cache_key(splits, config.data.vocab_size))
  cached = cache_dir / pipeline.TOKENIZER_FILE
  if not cached.exists():
    cache_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_path, cached)
  elif cached.read_bytes() != tokenizer_path.read_bytes():
    raise ValueError(f"{cached} is another tokenizer than {tokenizer_path}; "
                     f"remove {data_dir} or give another data folder")
  return cache_dir


def find(config: ml_collections.ConfigDict, name: str,
         tokenizer: Tokenizer | None,
         out_dir: str | pathlib.Path = DEFAULT_DIR) -> tuple[Any, str]:
  """Loads member `name` if its recipe is `recipe(config)` and it was
  trained with `tokenizer` (None: a set without one, a task set).

  Returns:
    (params, reason): params None when the member is missing or does not
    match, with `reason` saying why.
  Raises:
    CheckpointError: the member matches but its parameters are unreadable,
      or its manifest names an unknown stored_dtype.
  """
  member = pathlib.Path(out_dir) / name
  manifest_path = member / MANIFEST_FILE
  if not manifest_path.exists():
    return None, f"no pretrained {name!r} in {out_dir}"
  manifest = read_manifest(name, out_dir)
  shipped = manifest.get("recipe")
  differences = recipe_differences(
      shipped if isinstance(shipped, dict) else {},
      json.loads(json.dumps(recipe(config))))
  if differences:
    return None, (f"pretrained {name!r} was trained with another config ("
                  + "; ".join(differences) + ")")
  shipped_sha = str(manifest.get("tokenizer_sha256"))
  here = str(tokenizer and tokenizer_sha256(tokenizer))
  if shipped_sha != here:
    return None, (
        f"pretrained {name!r} was trained with another tokenizer (sha256 "
        f"{shipped_sha[:12]}, here {here[:12]}: the corpus text, its split "
        "or the tokenizer training differ)")
  params = load_member(member, manifest, train_lib.model_config(config))
  return params, f"pretrained {name!r} (commit {manifest['commit'][:10]})"


def load_member(member: pathlib.Path, manifest: dict, model_config):
  """The parameters of the member folder `member` (written by
  `write_member`) as the `TransformerConfig` `model_config`'s param_dtype,
  whatever dtype its manifest says they are stored in.

  Raises:
    CheckpointError: unreadable parameters, or an unknown stored_dtype.
  """
  manifest_path = member / MANIFEST_FILE
  stored = manifest.get("stored_dtype")
  if stored is not None and stored not in STORED_DTYPES:
    raise CheckpointError(f"manifest {manifest_path} has stored_dtype="
                          f"{stored!r}; allowed: absent or one of "
                          f"{STORED_DTYPES}")
  if stored == "int8":
    abstract = train_step.unbox(abstract_params(
        model_config.replace(quantization="int8_weights")))
  else:
    abstract = train_step.unbox(abstract_params(model_config))
    if stored is not None:
      abstract = jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape, stored), abstract)
  with Checkpoints(str(member / "params")) as checkpoints:
    params, _ = checkpoints.restore(abstract)
  if stored == "int8":
    return quantization.dequantize_params(params, model_config.param_dtype)
  if stored is not None:
    return jax.tree.map(lambda x: x.astype(model_config.param_dtype), params)
  return params


def load_stored(name: str, out_dir: str | pathlib.Path = DEFAULT_DIR):
  """Member `name` of the set in `out_dir` by its own manifest's recipe
  (also a member outside any config, e.g. a distilled student): (recipe
  ConfigDict, params as `train.model_config(recipe)`'s param_dtype).

  Raises:
    CheckpointError: as `read_manifest` and `load_member`.
  """
  manifest = read_manifest(name, out_dir)
  recipe_ = ml_collections.ConfigDict(manifest["recipe"])
  return recipe_, load_member(pathlib.Path(out_dir) / name, manifest,
                              train_lib.model_config(recipe_))
