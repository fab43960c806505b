"""Shipped pretrained checkpoints: export, match against a config, load.

A pretrained set lives in one folder (by default `lm_decoding/pretrained/`):

  tokenizer.model      the sentencepiece model every member was trained with
  {name}/manifest.json the exact command, config, commit, validation metrics
  {name}/params/       orbax checkpoint of the parameters only

A member is used only when its recorded recipe (data, model and train config,
seed) equals the requested one and its tokenizer is byte-identical to the one
the data pipeline builds; otherwise the caller trains from scratch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import uuid
from typing import Any, Sequence

import jax
import ml_collections

from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.models import Model, abstract_params, make_logits_fn
from lm_decoding.models import quantization
from lm_decoding.training import train as train_lib
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

DEFAULT_DIR = pathlib.Path(__file__).resolve().parent.parent / "pretrained"
TOKENIZER_FILE = "tokenizer.model"
MANIFEST_FILE = "manifest.json"
# How `export` may store parameters: rounded to bfloat16, or weight-only int8.
STORED_DTYPES = ("bfloat16", "int8")


def set_dir(name: str) -> pathlib.Path:
  """The pretrained set `name`: '' is the shipped tiny set (`DEFAULT_DIR`),
  'base' its subfolder of configs/base.py's members (`config.compare.pretrained_set`).

  Raises:
    ValueError: `name` is not '' or the name of a set folder in `DEFAULT_DIR`.
  """
  if name == "":
    return DEFAULT_DIR
  path = DEFAULT_DIR / str(name)
  if (not isinstance(name, str) or pathlib.Path(name).name != name
      or not (path / TOKENIZER_FILE).exists()):
    sets = sorted(p.parent.name for p in DEFAULT_DIR.glob(f"*/{TOKENIZER_FILE}"))
    raise ValueError(f"compare.pretrained_set={name!r} must be '' (the shipped "
                     f"set) or one of the sets in {DEFAULT_DIR}: {sets}")
  return path


def recipe(config: ml_collections.ConfigDict) -> dict:
  """Everything that determines the trained parameters."""
  return {"seed": config.seed, "data": config.data.to_dict(),
          "model": config.model.to_dict(), "train": config.train.to_dict()}


_ABSENT = object()


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{dotted key: leaf} of nested dicts; a leaf: an empty dict or a non-dict."""
  if not isinstance(tree, dict) or (prefix and not tree):
    return {prefix.rstrip("."): tree}
  flat = {}
  for key, value in tree.items():
    flat.update(_flatten(value, f"{prefix}{key}."))
  return flat


def _show(value: Any) -> str:
  return "(absent)" if value is _ABSENT else json.dumps(value)


def recipe_differences(shipped: dict, requested: dict) -> list[str]:
  """'key: shipped X, requested Y' for each setting where two recipes differ.

  Keys are dotted paths ('model.d_model'), sorted; values are shown as JSON,
  or as '(absent)' where a recipe lacks the key.
  """
  flat_shipped, flat_requested = _flatten(shipped), _flatten(requested)
  differences = []
  for key in sorted(flat_shipped.keys() | flat_requested.keys()):
    a = flat_shipped.get(key, _ABSENT)
    b = flat_requested.get(key, _ABSENT)
    if a != b:
      differences.append(f"{key}: shipped {_show(a)}, requested {_show(b)}")
  return differences


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
  return hashlib.sha256(tokenizer.model_proto).hexdigest()


def current_commit() -> str:
  """The repository's HEAD commit, 'unknown' outside a git checkout."""
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True,
                          cwd=pathlib.Path(__file__).parent).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def load_trained_params(config: ml_collections.ConfigDict, workdir: str):
  """Parameters of the latest checkpoint `train.train` wrote in `workdir`."""
  model_cfg = train_lib.model_config(config)
  optimizer = train_lib.make_optimizer(config.train)
  abstract = train_lib.abstract_state(model_cfg, optimizer)
  with Checkpoints(os.path.join(workdir, "checkpoints")) as checkpoints:
    state, _ = checkpoints.restore(abstract)
  return state.params


def check_export(name: str, stored_dtype: str | None = None,
                 out_dir: str | pathlib.Path | None = None) -> None:
  """Validates `export`'s member name, storage dtype and (given `out_dir`)
  what the export would replace, so that a training run can refuse them
  before it trains.

  Raises:
    ValueError: `name` is not a plain folder name (letters, digits, '_' and
      '-', not starting with '-'; a path, '.', '..' or '' would put the
      member over the set or outside it); `out_dir / name` exists and is not
      a member (a member holds a manifest and no tokenizer: a set folder
      such as 'base', or a folder without a manifest, would be replaced);
      or `stored_dtype` is not None or one of STORED_DTYPES.
  """
  if (not isinstance(name, str) or not name or name.startswith("-")
      or not all(c.isascii() and (c.isalnum() or c in "_-") for c in name)):
    raise ValueError(f"export name={name!r} must be a plain folder name: "
                     "ASCII letters, digits, '_' and '-', not starting with '-'")
  if out_dir is not None:
    member = pathlib.Path(out_dir) / name
    if member.exists() and (not (member / MANIFEST_FILE).is_file()
                            or (member / TOKENIZER_FILE).exists()):
      raise ValueError(
          f"export name={name!r}: {member} exists and is not a member (a "
          f"member holds {MANIFEST_FILE} and no {TOKENIZER_FILE}); the export "
          "would replace it")
  if stored_dtype is not None and stored_dtype not in STORED_DTYPES:
    raise ValueError(f"stored_dtype={stored_dtype!r}; allowed: None or one of "
                     f"{STORED_DTYPES}")


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
           tokenizer: Tokenizer, command: str, metrics: dict,
           out_dir: str | pathlib.Path = DEFAULT_DIR,
           stored_dtype: str | None = None) -> pathlib.Path:
  """Copies the trained parameters of `workdir` into the pretrained set.

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
  tok_path = out_dir / TOKENIZER_FILE
  if tok_path.exists():
    if Tokenizer.load(str(tok_path)).model_proto != tokenizer.model_proto:
      raise ValueError(f"{tok_path} holds another tokenizer; export the "
                       "whole set again into an empty folder")
  else:
    pipeline.write_atomic(tok_path, tokenizer.model_proto)
  manifest = {"name": name, "command": command, "commit": current_commit(),
              "recipe": recipe(config),
              "tokenizer_sha256": tokenizer_sha256(tokenizer),
              "metrics": metrics}
  return write_member(name, load_trained_params(config, workdir),
                      train_lib.model_config(config), manifest, out_dir,
                      stored_dtype)


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


def find(config: ml_collections.ConfigDict, name: str, tokenizer: Tokenizer,
         out_dir: str | pathlib.Path = DEFAULT_DIR) -> tuple[Any, str]:
  """Loads member `name` if it matches `config` and `tokenizer`.

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
  if shipped_sha != tokenizer_sha256(tokenizer):
    return None, (
        f"pretrained {name!r} was trained with another tokenizer (sha256 "
        f"{shipped_sha[:12]}, here {tokenizer_sha256(tokenizer)[:12]}: the "
        "corpus text, its split or the tokenizer training differ)")
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
    abstract = train_lib.unbox(abstract_params(
        model_config.replace(quantization="int8_weights")))
  else:
    abstract = train_lib.unbox(abstract_params(model_config))
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


# What a parent may differ in from the model adapted from it.
_PARENT_MAY_DIFFER = ("model.token_shift", "data.seq_len",
                      "data.distillation_set")  # a student's own data


def _parent_differences(parent: dict, config: ml_collections.ConfigDict
                        ) -> list[str]:
  """`recipe_differences` of the model and data sections that an
  adaptation must share with its parent (all but `_PARENT_MAY_DIFFER`)."""
  wanted = recipe(config)
  differences = recipe_differences(
      {k: parent.get(k, {}) for k in ("model", "data")},
      json.loads(json.dumps({k: wanted[k] for k in ("model", "data")})))
  return [d.replace("shipped", "parent", 1) for d in differences
          if d.split(":")[0] not in _PARENT_MAY_DIFFER]


def parent_params(config: ml_collections.ConfigDict, tokenizer: Tokenizer,
                  out_dir: str | pathlib.Path = DEFAULT_DIR,
                  trained: dict[str, Any] | None = None
                  ) -> tuple[Any, dict] | tuple[None, None]:
  """The parameters `config.train.init_from` names, checked against `config`.

  Adapting an AR parent (DiffuLLaMA, Fast-dLLM v2, SDAR) starts the
  diffusion model from the parent's parameters. `train.init_from` is the
  name of a member (taken from `trained`, {name: (params, config)} of the
  members already loaded in this run, else from the pretrained set
  `out_dir`) or the path of a training workdir
  (`train.train`'s checkpoints). The parent must have this config's
  backbone and data (model.token_shift and data.seq_len may differ) and, for
  a member, this tokenizer; all is checked before any parameter is read.

  Returns:
    (params, record), record {'init_from', 'commit', 'steps', 'tokens'} (the
    parent's training steps and tokens, steps x batch x sequence length; a
    workdir's batch size is taken as this config's); (None, None) when
    `init_from` is absent or ''.
  Raises:
    ValueError: naming train.init_from: nothing of that name, or a parent
      with another tokenizer, vocabulary, width or any other shape.
    CheckpointError: an unreadable parent.
  """
  init_from = config.train.get("init_from") or ""
  if not init_from:
    return None, None
  model_config = train_lib.model_config(config)
  member = pathlib.Path(out_dir) / init_from
  if trained is not None and init_from in trained:
    params, parent = trained[init_from]
    differences = _parent_differences(recipe(parent), config)
    where = f"trained in this run ({init_from!r})"
  elif (member / MANIFEST_FILE).is_file():
    manifest = read_manifest(init_from, out_dir)
    parent = ml_collections.ConfigDict(manifest["recipe"])
    differences = _parent_differences(manifest["recipe"], config)
    if manifest.get("tokenizer_sha256") != tokenizer_sha256(tokenizer):
      differences.append("the tokenizer (sha256 "
                         f"{str(manifest.get('tokenizer_sha256'))[:12]}, here "
                         f"{tokenizer_sha256(tokenizer)[:12]})")
    where = f"member {member}"
    params = None
  elif os.path.isdir(os.path.join(init_from, "checkpoints")):
    with Checkpoints(os.path.join(init_from, "checkpoints")) as checkpoints:
      fingerprint = checkpoints.read_meta().get("fingerprint", {})
      steps = checkpoints.latest_step()
    parent = ml_collections.ConfigDict(
        {**config.to_dict(), "model": fingerprint.get("model", {}),
         "data": fingerprint.get("data", {})})
    parent.train.objective = fingerprint.get("objective")
    parent.train.num_steps = steps
    differences = _parent_differences(fingerprint, config)
    where, params = f"workdir {init_from}", None
  else:
    raise ValueError(f"train.init_from={init_from!r} is neither a member of "
                     f"{out_dir} nor a training workdir (a folder holding "
                     "checkpoints/)")
  if differences:
    raise ValueError(f"train.init_from={init_from!r}: the parent ({where}) "
                     "differs from this model in " + "; ".join(differences))
  if params is None and (member / MANIFEST_FILE).is_file():
    params = load_member(member, manifest, model_config)
    commit = manifest.get("commit", "unknown")
  elif params is None:
    params = load_trained_params(parent, init_from)
    commit = "unknown"
  else:
    commit = "this run"
  record = {"init_from": init_from, "commit": commit,
            "steps": parent.train.num_steps,
            "tokens": (parent.train.num_steps * parent.train.batch_size
                       * parent.data.seq_len)}
  return params, record


def read_manifest(name: str, out_dir: str | pathlib.Path = DEFAULT_DIR) -> dict:
  """The manifest of member `name`.

  Raises:
    CheckpointError: the member has no manifest, or it is not valid JSON.
  """
  path = pathlib.Path(out_dir) / name / MANIFEST_FILE
  if not path.exists():
    raise CheckpointError(f"no manifest at {path}")
  try:
    return json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"manifest {path} is corrupt: {e}") from e


def member_configs(config: ml_collections.ConfigDict
                   ) -> dict[str, ml_collections.ConfigDict]:
  """Training configs of the comparison's models, by member name.

  'ar' (causal), 'mdlm' (bidirectional), 'bd3lm' (block diffusion with
  blocks of `config.train.block_length`) and 'uniform' (uniform-noise
  diffusion, bidirectional) share the backbone shape, data and training
  budget of `config`, each with its objective (which sets the attention);
  'uniform_sc' is 'uniform' with self-conditioning (its previous prediction
  fed back, `TransformerConfig.self_conditioning`; the same steps, a third
  more forward work per step); 'evaluator' is a larger causal model with another seed
  (`config.evaluator`) that scores samples and is never decoded. Each entry
  of `config.drafts` (if present; e.g. 'draft_small') is a smaller causal
  model, the draft of speculative decoding (Leviathan et al. 2023): the
  backbone of 'ar' with the entry's model overrides, and the same data,
  tokenizer, seed and training. No member config holds the sections
  'compare', 'evaluator', 'drafts' or 'mesh', nor 'peak_flops' (where it
  runs and the MFU's peak are not part of the recipe; a member's training
  measures the peak), so a member's recipe does not change when they do.
  """
  drafts = config.get("drafts", ml_collections.ConfigDict())
  members = {}
  for name in ("ar", "mdlm", "bd3lm", "uniform", "evaluator", *drafts):
    member = ml_collections.ConfigDict(config.to_dict())
    for section in ("compare", "evaluator", "drafts", "mesh", "peak_flops"):
      if section in member:
        del member[section]
    member.train.objective = (name if name in ("mdlm", "bd3lm", "uniform")
                              else "ar")
    if name == "evaluator":
      member.seed = config.evaluator.seed
      member.model.update(config.evaluator.model.to_dict())
      member.train.update(config.evaluator.train.to_dict())
    elif name in drafts:
      member.model.update(drafts[name].to_dict())
    members[name] = member
  members["uniform_sc"] = ml_collections.ConfigDict(
      members["uniform"].to_dict())
  members["uniform_sc"].model.self_conditioning = True
  for name, (objective, block_length) in ADAPTED_MEMBERS.items():
    members[name] = adapted_config(members["ar"], objective, block_length)
  for name, adapted in CONTROL_MEMBERS.items():
    members[name] = control_config(members, adapted)
  return members


# Diffusion members adapted from 'ar': name -> (objective, block length).
ADAPTED_MEMBERS = {"bd3lm4_from_ar": ("bd3lm", 4),
                   "bd3lm16_from_ar": ("bd3lm", 16),
                   "mdlm_from_ar": ("mdlm", None)}
# The adaptation's share of the parent's training tokens.
ADAPTATION_FRACTION = 0.1
# From-scratch controls: name -> the adapted member whose whole compute (its
# parent's training and its own) the control spends.
CONTROL_MEMBERS = {"bd3lm4_scratch": "bd3lm4_from_ar",
                   "bd3lm16_scratch": "bd3lm16_from_ar",
                   "mdlm_scratch": "mdlm_from_ar"}


def adapted_config(parent: ml_collections.ConfigDict, objective: str,
                   block_length: int | None) -> ml_collections.ConfigDict:
  """The recipe of a diffusion model adapted from the AR member `parent`.

  The field's recipes on this backbone: block diffusion from AR with blocks
  of `block_length`, token shift and complementary masks (Fast-dLLM v2, Wu
  et al. 2025; SDAR, Cheng et al. 2025, uses blocks of 4), or full-sequence
  MDLM with token shift and attention-mask annealing over the first third
  of the steps (DiffuLLaMA, Gong et al. 2025). Each trains
  `ADAPTATION_FRACTION` of the parent's steps at its batch and length (so
  that share of its tokens) from the parent's parameters
  (`train.init_from='ar'`), at 0.3x its peak learning rate with a warmup of
  a tenth of the steps.
  """
  member = ml_collections.ConfigDict(parent.to_dict())
  train = member.train
  steps = max(1, round(train.num_steps * ADAPTATION_FRACTION))
  train.update(dict(objective=objective, init_from="ar", num_steps=steps,
                    warmup_steps=max(1, steps // 10),
                    learning_rate=0.3 * train.learning_rate,
                    eval_every=max(1, steps // 2),
                    checkpoint_every=max(1, steps // 4)))
  member.model.token_shift = True
  if objective == "bd3lm":
    train.block_length = block_length
    train.complementary_masks = True
  else:
    train.anneal_steps = steps // 3
  return member


def control_config(members: dict[str, ml_collections.ConfigDict],
                   adapted: str) -> ml_collections.ConfigDict:
  """The from-scratch control of the adapted member `adapted`.

  The set's own from-scratch recipe for the adapted member's objective (and
  block length), trained for the steps that spend the adapted member's whole
  compute: its parent's training plus its own, in AR-row equivalents
  (`_forward_copies`), so that the saving of adapting is measured at equal
  compute, not assumed (issue 25).

  Args:
    members: the set's member configs so far (`member_configs`), holding
      `adapted`, its parent and the from-scratch member of its objective.
    adapted: an `ADAPTED_MEMBERS` name.
  """
  target = members[adapted]
  member = ml_collections.ConfigDict(
      members[target.train.objective].to_dict())
  if target.train.objective == "bd3lm":
    member.train.block_length = target.train.block_length
  compute = sum(_compute_ar_tokens(recipe_, recipe_["train"]["num_steps"])
                for recipe_ in (members[target.train.init_from].to_dict(),
                                target.to_dict()))
  per_step = _compute_ar_tokens(member.to_dict(), 1)
  member.train.num_steps = max(1, round(compute / per_step))
  return member


TRANSLATION_DIR = DEFAULT_DIR / "translation"
# name -> (train.objective, data.targets)
TRANSLATION_MEMBERS = {"translation_ar": ("translation_ar", "reference"),
                       "cmlm": ("cmlm", "reference"),
                       "ctc": ("ctc", "reference"),
                       "cmlm_distilled": ("cmlm", "distilled"),
                       "ctc_distilled": ("ctc", "distilled")}


def translation_member_configs(config: ml_collections.ConfigDict
                               ) -> dict[str, ml_collections.ConfigDict]:
  """Training configs of the translation set (TRANSLATION_DIR), by name.

  Every member shares the data, backbone, seed and training budget of
  `config` (configs/translation.py) with its objective and targets
  (TRANSLATION_MEMBERS); the distilled ones (trained on the AR member's
  outputs, Kim & Rush 2016) only when `config.translate.distill`.
  """
  members = {}
  for name, (objective, targets) in TRANSLATION_MEMBERS.items():
    if targets == "distilled" and not config.translate.distill:
      continue
    member = ml_collections.ConfigDict(config.to_dict())
    member.train.objective, member.data.targets = objective, targets
    members[name] = member
  return members


def get_or_train(config: ml_collections.ConfigDict, name: str, workdir: str,
                 tokenizer: Tokenizer, retrain: bool = False,
                 progress: bool = True,
                 out_dir: str | pathlib.Path = DEFAULT_DIR,
                 trained: dict[str, Any] | None = None) -> tuple[Any, str]:
  """Parameters of member `name`: shipped if they match, else trained.

  Training writes `{workdir}/{name}/` and resumes from (or, if finished,
  reuses) what is there, sharing the data cache of `{workdir}/data/` that
  `pipeline.prepare(..., workdir)` wrote; `retrain` ignores shipped
  parameters and deletes that folder first. A member adapted from a parent
  (`train.init_from`) starts from `parent_params(config, tokenizer,
  out_dir, trained)`. With `progress`, says why it trains and shows the
  training bar.

  Returns:
    (params, source): `source` says where the parameters came from.
  """
  member_dir = os.path.join(workdir, name)
  reason = "--retrain"
  if not retrain:
    params, reason = find(config, name, tokenizer, out_dir)
    if params is not None:
      return params, reason
  if progress:
    print(f"{name}: {reason}; training {config.train.num_steps} steps in "
          f"{member_dir}")
  params, _ = train_member(config, member_dir, tokenizer, fresh=retrain,
                           progress=progress, out_dir=out_dir,
                           trained=trained, data_dir=workdir)
  return params, f"trained in {member_dir} ({reason})"


def train_member(config: ml_collections.ConfigDict, member_dir: str,
                 tokenizer: Tokenizer, fresh: bool = False,
                 progress: bool = True,
                 out_dir: str | pathlib.Path = DEFAULT_DIR,
                 trained: dict[str, Any] | None = None,
                 data_dir: str | None = None,
                 stop_at: int | None = None) -> tuple[Any, dict]:
  """Trains a member under `member_dir` and loads what it reached.

  `train.train` resumes from (or, if finished, reuses) `member_dir`; `fresh`
  deletes it first. A member adapted from a parent (`train.init_from`)
  starts from `parent_params(config, tokenizer, out_dir, trained)`.
  `data_dir` is the data cache (`train.train`'s), `stop_at` ends the run
  early at that step.

  Returns:
    (params, metrics): the trained parameters and `train.train`'s summary.
  Raises:
    ValueError, CheckpointError: as `parent_params` and `train.train`.
  """
  if fresh:
    shutil.rmtree(member_dir, ignore_errors=True)
  parent, _ = parent_params(config, tokenizer, out_dir, trained)
  metrics = train_lib.train(config, member_dir, progress=progress,
                            data_dir=data_dir, stop_at=stop_at,
                            init_params=parent)
  return load_trained_params(config, member_dir), metrics


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A member of the comparison, ready to decode.

  Attributes:
    model: its logits_fn bound to its parameters (what a decoder role binds).
    objective: `train.objective` ('ar', 'mdlm' or 'bd3lm').
    shipped: whether the parameters are the shipped ones (else trained).
    source: where the parameters came from, as `get_or_train` says.
    valid_ppl: validation perplexity (an upper bound for the diffusion
      objectives): the shipped manifest's, or the last one training logged
      in `{workdir}/{name}/metrics.jsonl`; None when none was recorded.
  """

  model: Model
  objective: str
  shipped: bool
  source: str
  valid_ppl: float | None

  def describe(self, name: str) -> str:
    """'ar: validation perplexity 193.8 (shipped, pretrained 'ar' ...)'."""
    measure = ("perplexity" if self.objective == "ar"
               else "perplexity bound")
    value = "—" if self.valid_ppl is None else f"{self.valid_ppl:.1f}"
    where = "shipped" if self.shipped else "trained here"
    return f"{name}: validation {measure} {value} ({where}, {self.source})"


def _logged_valid_ppl(member_dir: str) -> float | None:
  """The last valid_ppl of `{member_dir}/metrics.jsonl`, None if none."""
  with open(os.path.join(member_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return next((r["valid_ppl"] for r in reversed(records)
               if "valid_ppl" in r), None)


def load_models(members: dict[str, ml_collections.ConfigDict], workdir: str,
                tokenizer: Tokenizer, retrain: bool = False,
                progress: bool = True,
                out_dir: str | pathlib.Path = DEFAULT_DIR
                ) -> dict[str, Loaded]:
  """Every member of `members`, shipped if it matches, else trained.

  The one call the main job and the notebook make after
  `pipeline.prepare(path, vocab_size, workdir)`: for each member in order,
  `get_or_train` (training under `{workdir}/{name}/` on the data cache of
  `workdir`), then binds the parameters to the member's `logits_fn`.

  Args:
    members: {name: member config}, e.g. a subset of `member_configs`.
    workdir: the folder `pipeline.prepare` cached the corpus in.
    tokenizer: the tokenizer of that corpus (a shipped member must match it).
    retrain: train every member even if a shipped one matches.
    progress: print why each member trains, its training bar, and a line
      per member (`Loaded.describe`) when it is ready.
    out_dir: the pretrained set to look in.

  Returns:
    {name: Loaded}, in the order of `members`.
  Raises:
    ValueError, CheckpointError: as `get_or_train` and `train.train`.
  """
  loaded, trained = {}, {}
  for name, member in members.items():
    params, source = get_or_train(member, name, workdir, tokenizer,
                                  retrain=retrain, progress=progress,
                                  out_dir=out_dir, trained=trained)
    trained[name] = (params, member)
    shipped = source.startswith("pretrained")
    ppl = (read_manifest(name, out_dir)["metrics"].get("valid_ppl")
           if shipped else _logged_valid_ppl(os.path.join(workdir, name)))
    loaded[name] = Loaded(
        model=Model(make_logits_fn(train_lib.model_config(member)), params),
        objective=member.train.objective, shipped=shipped, source=source,
        valid_ppl=ppl)
    if progress:
      print(loaded[name].describe(name))
  return loaded


def _tokens(recipe_: dict, steps: int) -> int:
  """The training tokens of `steps` steps of a recipe."""
  return steps * recipe_["train"]["batch_size"] * recipe_["data"]["seq_len"]


def _compute_ar_tokens(recipe_: dict, steps: int) -> int:
  """The training compute of `steps` steps of a recipe, in AR-row token
  equivalents (`_forward_copies`)."""
  return _tokens(recipe_, steps) * _forward_copies(recipe_)


def _forward_copies(recipe_: dict) -> int:
  """Sequence copies one training row costs relative to an AR row: BD3-LM's
  [x_t ; x_0] (when the block is shorter than the sequence) and
  complementary masks each double it."""
  train = recipe_["train"]
  copies = 2 if train.get("complementary_masks") else 1
  if (train["objective"] == "bd3lm"
      and train["block_length"] < recipe_["data"]["seq_len"]):
    copies *= 2
  return copies


def lineage_rows(out_dir: str | pathlib.Path = DEFAULT_DIR) -> list[dict]:
  """One row per LM member of a pretrained set: recipe, tokens, compute
  and validation perplexity (a bound for diffusion), with its parent.

  `tokens` are the member's own training tokens (steps x batch x length);
  `compute_ar_tokens` counts its training and its parent's in AR-row
  equivalents (`_forward_copies`: BD3-LM's doubled sequence and
  complementary masks each count twice), so an adapted member and a
  from-scratch one compare at equal compute; `ratio_to_ar` is the
  perplexity over that of the set's 'ar'.

  Raises:
    CheckpointError: a member's manifest is unreadable.
  """
  out_dir = pathlib.Path(out_dir)
  names = sorted(p.parent.name for p in out_dir.glob(f"*/{MANIFEST_FILE}"))
  manifests = {n: read_manifest(n, out_dir) for n in names}
  ar_ppl = manifests["ar"]["metrics"]["valid_ppl"] if "ar" in manifests else None
  rows = []
  for name, manifest in manifests.items():
    recipe_, metrics = manifest["recipe"], manifest["metrics"]
    train = recipe_["train"]
    if train["objective"] not in ("ar", "mdlm", "bd3lm"):
      continue
    tokens = _tokens(recipe_, metrics["steps"])
    compute = _compute_ar_tokens(recipe_, metrics["steps"])
    parent = train.get("init_from") or ""
    if parent:
      compute += _compute_ar_tokens(manifests[parent]["recipe"],
                                    manifests[parent]["metrics"]["steps"])
    rows.append({
        "member": name, "objective": train["objective"],
        "block_length": (train.get("block_length")
                         if train["objective"] == "bd3lm" else None),
        "token_shift": bool(recipe_["model"].get("token_shift", False)),
        "complementary": bool(train.get("complementary_masks", False)),
        "anneal_steps": train.get("anneal_steps", 0),
        "init_from": parent, "tokens": tokens,
        "compute_ar_tokens": compute,
        "valid_ppl": metrics["valid_ppl"],
        "ratio_to_ar": (metrics["valid_ppl"] / ar_ppl if ar_ppl else None)})
  return rows
