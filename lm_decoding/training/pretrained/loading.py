"""The members a run decodes: shipped when they match, else trained.

`load_models` is the one call the main job and the notebooks make: each
member is `get_or_train`'s (the shipped one when `store.find` matches, else
`train_member`: `train.train` in the workdir), bound to its logits_fn. A
member adapted from a parent (`train.init_from`) starts from
`parent_params`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import shutil
from typing import Any, Callable

import ml_collections

from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.training import train as train_lib
from lm_decoding.training.checkpoints import Checkpoints
from lm_decoding.training.objectives import certainty_forcing
from lm_decoding.training.pretrained import store
from lm_decoding.training.pretrained.recipes import (
    DEFAULT_DIR, MANIFEST_FILE, read_manifest, recipe_differences,
    tokenizer_sha256)


# What a parent may differ in from the model adapted from it.
_PARENT_MAY_DIFFER = ("model.token_shift", "data.seq_len",
                      # a student's own data, and how its rows end
                      "data.distillation_set", "data.eos_fill",
                      "data.jacobi_set")


def _sections(config: ml_collections.ConfigDict) -> dict:
  """The model and data sections of a training config, as JSON values."""
  return json.loads(json.dumps({"model": config.model.to_dict(),
                                "data": config.data.to_dict()}))


def _parent_differences(parent: dict, config: ml_collections.ConfigDict
                        ) -> list[str]:
  """`recipe_differences` of the model and data sections that an
  adaptation must share with its parent (all but `_PARENT_MAY_DIFFER`)."""
  differences = recipe_differences(
      {k: parent.get(k, {}) for k in ("model", "data")}, _sections(config))
  return [d.replace("shipped", "parent", 1) for d in differences
          if d.split(":")[0] not in _PARENT_MAY_DIFFER]


@dataclasses.dataclass(frozen=True)
class _Parent:
  """A parent found by `_find_parent`, nothing of it read yet but its
  record."""

  config: ml_collections.ConfigDict  # its training config (steps, batch)
  recorded: dict  # its model and data sections as recorded
  where: str
  commit: str
  load: Callable[[], Any]  # () -> its parameters
  tokenizer_sha256: str | None = None  # a member's


def _find_parent(init_from: str, config: ml_collections.ConfigDict,
                 out_dir: str | pathlib.Path,
                 trained: dict[str, Any] | None) -> _Parent:
  """The parent `init_from` names: a member loaded in this run
  (`trained`), a member of the set `out_dir`, or a training workdir.

  Raises:
    ValueError: nothing of that name.
  """
  member = pathlib.Path(out_dir) / init_from
  if trained is not None and init_from in trained:
    params, parent = trained[init_from]
    return _Parent(parent, _sections(parent),
                   f"trained in this run ({init_from!r})", "this run",
                   lambda: params)
  if (member / MANIFEST_FILE).is_file():
    manifest = read_manifest(init_from, out_dir)
    return _Parent(
        ml_collections.ConfigDict(manifest["recipe"]), manifest["recipe"],
        f"member {member}", manifest.get("commit", "unknown"),
        lambda: store.load_member(member, manifest,
                                  train_lib.model_config(config)),
        str(manifest.get("tokenizer_sha256")))
  if os.path.isdir(os.path.join(init_from, "checkpoints")):
    with Checkpoints(os.path.join(init_from, "checkpoints")) as checkpoints:
      fingerprint = checkpoints.read_meta().get("fingerprint", {})
      steps = checkpoints.latest_step()
    parent = ml_collections.ConfigDict(
        {**config.to_dict(), "model": fingerprint.get("model", {}),
         "data": fingerprint.get("data", {})})
    parent.train.objective = fingerprint.get("objective")
    parent.train.num_steps = steps
    return _Parent(parent, fingerprint, f"workdir {init_from}", "unknown",
                   lambda: store.load_trained_params(parent, init_from))
  raise ValueError(f"train.init_from={init_from!r} is neither a member of "
                   f"{out_dir} nor a training workdir (a folder holding "
                   "checkpoints/)")


def parent_params(config: ml_collections.ConfigDict,
                  tokenizer: Tokenizer | None,
                  out_dir: str | pathlib.Path = DEFAULT_DIR,
                  trained: dict[str, Any] | None = None
                  ) -> tuple[Any, dict] | tuple[None, None]:
  """The parameters `config.train.init_from` names, checked against `config`.

  Adapting an AR parent (DiffuLLaMA, Fast-dLLM v2, SDAR) starts the
  diffusion model from the parent's parameters. `train.init_from` is the
  name of a member (taken from `trained`, {name: (params, config)} of the
  members already loaded in this run, else from the pretrained set
  `out_dir`) or the path of a training workdir (`train.train`'s
  checkpoints). The parent must have this config's backbone and data
  (model.token_shift and data.seq_len may differ) and, for a member, this
  tokenizer; all is checked before any parameter is read.

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
  parent = _find_parent(init_from, config, out_dir, trained)
  differences = _parent_differences(parent.recorded, config)
  here = str(tokenizer and tokenizer_sha256(tokenizer))
  if parent.tokenizer_sha256 not in (None, here):
    differences.append(f"the tokenizer (sha256 {parent.tokenizer_sha256[:12]}"
                       f", here {here[:12]})")
  if differences:
    raise ValueError(f"train.init_from={init_from!r}: the parent "
                     f"({parent.where}) differs from this model in "
                     + "; ".join(differences))
  steps, train = parent.config.train.num_steps, parent.config.train
  return parent.load(), {
      "init_from": init_from, "commit": parent.commit, "steps": steps,
      "tokens": steps * train.batch_size * parent.config.data.seq_len}


def teacher_log_probs(config: ml_collections.ConfigDict,
                      tokenizer: Tokenizer | None,
                      out_dir: str | pathlib.Path = DEFAULT_DIR
                      ) -> tuple[Callable, dict] | tuple[None, None]:
  """The teacher `config.train.teacher` names, as certainty forcing takes it.

  `train.teacher` is a causal (AR) member of the set `out_dir` with this
  config's tokenizer and vocabulary and a max_len of at least data.seq_len
  (its width and depth may differ: a larger teacher is allowed). Checked
  before any parameter is read.

  Returns:
    (teacher, record): teacher tokens int32[B, L] -> float32[B, L, V],
    `certainty_forcing.next_token_log_probs` with the member's model bound;
    record {'teacher', 'commit'}. (None, None) when `teacher` is absent or
    ''.
  Raises:
    ValueError: naming train.teacher: not a member of `out_dir`, not
      causal, another tokenizer or vocabulary, or too short a max_len.
    CheckpointError: unreadable parameters.
  """
  name = config.train.get("teacher") or ""
  if not name:
    return None, None
  member = pathlib.Path(out_dir) / name
  if not (member / MANIFEST_FILE).is_file():
    raise ValueError(f"train.teacher={name!r} is not a member of {out_dir}")
  manifest = read_manifest(name, out_dir)
  model_cfg = train_lib.model_config(
      ml_collections.ConfigDict(manifest["recipe"]))
  here = str(tokenizer and tokenizer_sha256(tokenizer))
  differences = [what for what, differs in (
      ("is not causal (an AR model)", model_cfg.attention != "causal"),
      (f"has vocabulary {model_cfg.vocab_size}, here "
       f"{config.data.vocab_size}",
       model_cfg.vocab_size != config.data.vocab_size),
      (f"has max_len {model_cfg.max_len}, under data.seq_len="
       f"{config.data.seq_len}", model_cfg.max_len < config.data.seq_len),
      ("has another tokenizer", str(manifest.get("tokenizer_sha256"))
       not in ("None", here))) if differs]
  if differences:
    raise ValueError(f"train.teacher={name!r} ({member}) "
                     + "; ".join(differences))
  params = store.load_member(member, manifest, model_cfg)
  return (functools.partial(certainty_forcing.next_token_log_probs,
                            make_logits_fn(model_cfg), params),
          {"teacher": name, "commit": manifest.get("commit", "unknown")})


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
    params, reason = store.find(config, name, tokenizer, out_dir)
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
  return store.load_trained_params(config, member_dir), metrics



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
