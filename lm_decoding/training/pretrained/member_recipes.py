"""The recipes of a set's members, and what each cost to train.

`member_configs` derives the comparison's members from one experiment
config (AR, MDLM, BD3-LM, uniform, the evaluator, drafts, the members
adapted from AR and their from-scratch controls); `translation_member_configs`
the translation set's; `lineage_rows` tabulates a set's members with their
parents and compute.
"""

from __future__ import annotations

import pathlib
from collections.abc import Collection

import ml_collections

from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.training.checkpoints import CheckpointError
from lm_decoding.training.pretrained.recipes import (
    DEFAULT_DIR, MANIFEST_FILE, TOKENIZER_FILE, is_member_name, read_manifest,
    tokenizer_sha256)


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
  tokenizer, seed and training. Each entry of `config.member_train` (if
  present; e.g. base's 'mdlm') updates that member's `train` section last,
  after the adapted members and the controls are derived from the shared
  recipe; it may only set keys the member's train section has, other than
  'objective'. No member config holds the sections 'compare', 'evaluator',
  'drafts', 'member_train' or 'mesh', nor 'peak_flops' (where it runs and
  the MFU's peak are not part of the recipe; a member's training measures
  the peak), so a member's recipe does not change when they do.

  Raises:
    ValueError: a `member_train` entry naming no member, or setting a key
      its member's train section lacks, or 'objective'.
  """
  drafts = config.get("drafts", ml_collections.ConfigDict())
  members = {}
  for name in ("ar", "mdlm", "bd3lm", "uniform", "evaluator", *drafts):
    member = ml_collections.ConfigDict(config.to_dict())
    for section in ("compare", "evaluator", "drafts", "member_train", "mesh",
                    "peak_flops"):
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
  for name, train in config.get("member_train", {}).items():
    _check_member_train(members, name, train)
    members[name].train.update(train.to_dict())
  return members


def _check_member_train(members: dict[str, ml_collections.ConfigDict],
                        name: str, train: ml_collections.ConfigDict) -> None:
  """Raises ValueError unless `name` is one of `members` and each key of
  its `member_train` entry is a key of its train section other than
  'objective' (a new key would be added and never read; another objective
  makes another kind of model)."""
  if name not in members:
    raise ValueError(f"member_train.{name}: not a member; members: "
                     f"{sorted(members)}")
  for key in train:
    if key == "objective":
      raise ValueError(f"member_train.{name}.objective: the member's "
                       "objective is not an override (another objective "
                       "makes another kind of model)")
    if key not in members[name].train:
      raise ValueError(f"member_train.{name}.{key}: not a train key of "
                       f"{name!r}; its keys: {sorted(members[name].train)}")


def stored_member_configs(names, members: Collection[str],
                          data: ml_collections.ConfigDict,
                          out_dir: str | pathlib.Path = DEFAULT_DIR
                          ) -> dict[str, ml_collections.ConfigDict]:
  """The recipes of members shipped in a set outside any config's
  `member_configs`, e.g. a distilled student (docs/self_distillation.md),
  read from their own manifests: `store.find` then matches each one, so the
  main job loads it and never trains it (its recipe names a parent and a
  distillation set that are not in the repository).

  Args:
    names: `compare.stored_members`, member names in `out_dir`.
    members: the config's own member names, which a stored one may not take.
    data: the config's data section; a stored member must read the same
      corpus with the same tokenizer (`_TOKENIZER_DATA_KEYS`).
    out_dir: the pretrained set.
  Returns:
    {name: recipe as a ConfigDict}, in the order of `names`.
  Raises:
    ValueError: naming `compare.stored_members`: a name repeated, taken by
      the config's members, or not a member of `out_dir` (a plain folder
      name, `recipes.is_member_name`, with a readable manifest); a member
      trained on another corpus or vocabulary than `data`, or with another
      tokenizer than the set's (it could not load, and it cannot train).
  """
  if (not isinstance(names, (tuple, list))
      or not all(map(is_member_name, names)) or len(set(names)) < len(names)):
    raise ValueError(f"compare.stored_members={names!r} must be a tuple of "
                     "distinct member names (ASCII letters, digits, '_' "
                     "and '-')")
  out_dir = pathlib.Path(out_dir)
  shipped = sorted(p.parent.name for p in out_dir.glob(f"*/{MANIFEST_FILE}")
                   if is_member_name(p.parent.name))
  tokenizer = out_dir / TOKENIZER_FILE
  set_sha = (tokenizer_sha256(Tokenizer.load(str(tokenizer)))
             if tokenizer.is_file() else None)
  stored = {}
  for name in names:
    if name in members:
      raise ValueError(f"compare.stored_members: {name!r} is a member of the "
                       "config (member_recipes.member_configs); name a member "
                       "it does not derive")
    if name not in shipped:
      raise ValueError(f"compare.stored_members: no member {name!r} in "
                       f"{out_dir}; shipped there: {shipped}")
    stored[name] = _stored_recipe(name, out_dir, data, set_sha)
  return stored


def _stored_recipe(name: str, out_dir: pathlib.Path,
                   data: ml_collections.ConfigDict,
                   set_sha: str | None) -> ml_collections.ConfigDict:
  """The recipe of the stored member `name` of `out_dir`, which must read
  the corpus of `data` with the set's tokenizer (sha256 `set_sha`).

  Raises:
    ValueError: as `stored_member_configs` says of one member.
  """
  try:
    manifest = read_manifest(name, out_dir)
    recipe_ = ml_collections.ConfigDict(manifest["recipe"])
    recorded = {key: recipe_.data.get(key) for key in _TOKENIZER_DATA_KEYS}
  except (CheckpointError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"compare.stored_members: {name!r} in {out_dir} has "
                     f"no readable recipe ({e!r})") from e
  wanted = {key: data.get(key) for key in _TOKENIZER_DATA_KEYS}
  if recorded != wanted:
    raise ValueError(f"compare.stored_members: {name!r} in {out_dir} was "
                     f"trained on data {recorded}; the config reads "
                     f"{wanted}")
  if set_sha is None or manifest.get("tokenizer_sha256") != set_sha:
    raise ValueError(f"compare.stored_members: {name!r} in {out_dir} was "
                     f"trained with another tokenizer than the set's "
                     f"{out_dir / TOKENIZER_FILE} (sha256 "
                     f"{str(manifest.get('tokenizer_sha256'))[:12]}, set "
                     f"{str(set_sha)[:12]})")
  return recipe_


# What a stored member must share with the config's data section: the
# corpus and the vocabulary its tokenizer was trained with.
_TOKENIZER_DATA_KEYS = ("path", "format", "vocab_size")


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
