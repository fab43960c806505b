"""Checkpoints in the Hugging Face hub layout, read from a local folder.

A folder as `huggingface-cli download` leaves it:

  config.json                 the model config (its `model_type` picks the
                              family: `lm_decoding.checkpoints.family`)
  model.safetensors, or       the weights (several shards are read
    model-*.safetensors       together)
  generation_config.json      optional: more end ids (`eos_token_id`)
  tokenizer.json              optional: the Hugging Face tokenizer, with
  tokenizer_config.json       its special tokens and chat template
  (chat_template.jinja)       (`lm_decoding.data.hf_tokenizer`)

`inspect(folder)` reads the configs and tokenizer only: every refusal
(an unknown option, a MoE variant, a tokenizer that does not fit the model)
comes from it, before a tensor is read; `load(folder)` then reads the
weights into a `Model` that carries the checkpoint's generation
conventions. `save(folder, ...)` writes config.json and model.safetensors
back (the families with a hub layout: GPT-2, the LLaMA-style ones, LLaDA).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

from lm_decoding.checkpoints import family as family_of
from lm_decoding.checkpoints import layout as layout_lib
from lm_decoding.data.hf_tokenizer import TOKENIZER_FILE, HFTokenizer
from lm_decoding.models.binding import Conventions, Model
from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.transformer import make_logits_fn

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"


@dataclasses.dataclass(frozen=True)
class Inspected:
  """A hub folder read without its weights.

  Attributes:
    folder: the path.
    hf_config: config.json's fields.
    config: our `TransformerConfig` (overrides applied).
    ids: the generation conventions (MASK, EOS / EOT, PAD ids).
    tokenizer: the folder's `HFTokenizer`, None if it has no
      tokenizer.json.
  """

  folder: str
  hf_config: dict
  config: TransformerConfig
  ids: Conventions
  tokenizer: HFTokenizer | None


def _json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def weight_files(folder: str) -> list[str]:
  """The folder's `.safetensors` files, sorted.

  Raises:
    ValueError: none there.
  """
  files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
  if not files:
    raise ValueError(f"checkpoint folder {folder!r} holds no .safetensors "
                     f"file")
  return files


def inspect(folder: str | os.PathLike, **overrides) -> Inspected:
  """The folder's config, conventions and tokenizer; no tensor is read.

  End ids: config.json's eos_token_id, generation_config.json's, then the
  tokenizer's eos and end-of-turn tokens (`HFTokenizer.end_ids`), in that
  order, without repeats.

  Args:
    folder: a hub-layout folder (module docstring).
    **overrides: `options.OVERRIDES` fields (e.g. dtype='bfloat16').
  Raises:
    ValueError: no config.json; any refusal of the family's importer
      (named); a tokenizer with more ids than the model's vocabulary, or
      whose mask_token is not the model's MASK id.
  """
  folder = os.fspath(folder)
  path = os.path.join(folder, CONFIG_FILE)
  if not os.path.isfile(path):
    raise ValueError(f"checkpoint folder {folder!r} has no {CONFIG_FILE}")
  hf = _json(path)
  module = family_of(hf)
  config = module.config_from_hf(hf, **overrides)
  ids = module.conventions_from_hf(hf)
  extra = []
  if os.path.isfile(os.path.join(folder, GENERATION_FILE)):
    generation = _json(os.path.join(folder, GENERATION_FILE))
    if generation.get("eos_token_id") is not None:
      extra += layout_lib.eos_ids(generation, "generation_config.json")
  tokenizer = None
  if os.path.isfile(os.path.join(folder, TOKENIZER_FILE)):
    tokenizer = HFTokenizer.load(folder)
    if tokenizer.vocab_size > config.vocab_size:
      raise ValueError(f"tokenizer.json has {tokenizer.vocab_size} ids; the "
                       f"model's vocabulary is {config.vocab_size} (a "
                       f"tokenizer of another model?)")
    if tokenizer.mask_id is not None and tokenizer.mask_id != ids.mask_id:
      raise ValueError(f"tokenizer mask_token id {tokenizer.mask_id} is not "
                       f"the model's MASK id {ids.mask_id}")
    extra += tokenizer.end_ids()
  eos = tuple(dict.fromkeys(ids.eos_ids + tuple(extra)))
  bad = [i for i in eos + (ids.mask_id or 0,) if i >= config.vocab_size]
  if bad:
    raise ValueError(f"token ids {bad} (EOS / MASK) are outside the model's "
                     f"vocabulary of {config.vocab_size}")
  return Inspected(folder, hf, config, dataclasses.replace(ids, eos_ids=eos),
                   tokenizer)


def load(folder: str | os.PathLike | Inspected, **overrides
         ) -> tuple[Model, HFTokenizer | None]:
  """(Model carrying its conventions, tokenizer or None) of a hub folder.

  Args:
    folder: the folder, or what `inspect` returned for it.
    **overrides: as `inspect` (not with an `Inspected`).
  Raises:
    ValueError: as `inspect`; a missing, misshapen or unexpected tensor
      (named).
  """
  seen = folder if isinstance(folder, Inspected) else inspect(folder,
                                                              **overrides)
  params = family_of(seen.hf_config).params_from_hf(
      weight_files(seen.folder), seen.config)
  return Model(make_logits_fn(seen.config), params, seen.ids), seen.tokenizer


def save(folder: str | os.PathLike, params: Any, config: TransformerConfig,
         hf_config: dict) -> None:
  """Writes config.json (`hf_config`) and model.safetensors (our `params`
  in the layout of `hf_config`'s family) into `folder`.

  Raises:
    ValueError: `config` is not what `hf_config` imports as (the files
      would not load back to the same model).
  """
  from safetensors.numpy import save_file  # the [peer] extra
  module = family_of(hf_config)
  if module.config_from_hf(hf_config) != config:
    raise ValueError(f"config {config} is not the import of hf_config "
                     f"{hf_config}")
  folder = os.fspath(folder)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, CONFIG_FILE), "w") as f:
    json.dump(hf_config, f, indent=2)
  save_file(module.params_to_hf(params, config),
            os.path.join(folder, "model.safetensors"))
