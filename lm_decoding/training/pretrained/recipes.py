"""What a pretrained set holds and what each member was trained with.

A pretrained set lives in one folder (by default `lm_decoding/pretrained/`):

  tokenizer.model      the sentencepiece model every member was trained with
                       (none in a task set: a task's ids are its own)
  {name}/manifest.json the exact command, recipe, commit, validation metrics
  {name}/params/       orbax checkpoint of the parameters only

A member's recipe (`recipe`) is what determines its parameters, read from
its `train.train` config; a member is used only when its recorded recipe
equals the requested one (`recipe_differences`) and, in a set with a
tokenizer, that tokenizer is byte-identical to the one the data pipeline
builds (`tokenizer_sha256`); otherwise the caller trains it (`store`,
`loading`).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
from typing import Any

import ml_collections

from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.training import data_sources
from lm_decoding.training.checkpoints import CheckpointError

DEFAULT_DIR = (pathlib.Path(__file__).resolve().parent.parent.parent
               / "pretrained")
TASK_SET_DIR = DEFAULT_DIR / "tasks"  # one set per task: {task}/{kind}/
TOKENIZER_FILE = "tokenizer.model"
MANIFEST_FILE = "manifest.json"
# How `store.export` may store parameters: rounded to bfloat16, or
# weight-only int8.
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
  """Everything that determines the parameters `train.train` trains from
  `config`: its seed and data, model and train sections; for a task model
  (data.source 'task', `task_training.train_config`) the task set's
  recipe, `_task_recipe`."""
  if config.data.get("source") == data_sources.TASK:
    return _task_recipe(config)
  return {"seed": config.seed, "data": config.data.to_dict(),
          "model": config.model.to_dict(), "train": config.train.to_dict()}


# What sets a task model's parameters, beside its task, backbone and seed
# (eval_every only spaces checkpoints and the curve; BD3-LM adds its block
# length, an adapted model its parent).
_TASK_TRAIN_KEYS = ("batch_size", "learning_rate", "warmup_steps",
                    "num_steps", "budget_s", "weight_decay", "grad_clip_norm")
_TASK_DATA_KEYS = ("train_size", "valid_size", "test_size", "puzzle_file")


def _task_recipe(config: ml_collections.ConfigDict) -> dict:
  """A task model's recipe as the task set's manifests record it: seed,
  kind, the task and its options, the split sizes (dealt test, valid,
  train from one stream) and puzzle file, the backbone, `_TASK_TRAIN_KEYS`
  (+ block_length for BD3-LM, init_from for an adapted model), as JSON
  values."""
  train = {key: config.train[key] for key in _TASK_TRAIN_KEYS}
  for key, kept in (("block_length", config.train.objective == "bd3lm"),
                    ("init_from", bool(config.train.get("init_from")))):
    if kept:
      train[key] = config.train[key]
  return json.loads(json.dumps({
      "seed": config.seed, "kind": config.train.objective,
      "task": config.data.task.to_dict(),
      "data": {key: config.data[key] for key in _TASK_DATA_KEYS},
      "model": config.model.to_dict(), "train": train}))


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


def is_member_name(name) -> bool:
  """Whether `name` is a plain folder name a member may have: ASCII
  letters, digits, '_' and '-', not empty and not starting with '-' (never
  a path, '.', '..', nor a hidden staging folder of `store.write_member`)."""
  return (isinstance(name, str) and bool(name) and not name.startswith("-")
          and all(c.isascii() and (c.isalnum() or c in "_-") for c in name))


def check_export(name: str, stored_dtype: str | None = None,
                 out_dir: str | pathlib.Path | None = None) -> None:
  """Validates `store.export`'s member name, storage dtype and (given
  `out_dir`) what the export would replace, so that a training run can
  refuse them before it trains.

  Raises:
    ValueError: `name` is not a plain folder name (letters, digits, '_' and
      '-', not starting with '-'; a path, '.', '..' or '' would put the
      member over the set or outside it); `out_dir / name` exists and is not
      a member (a member holds a manifest and no tokenizer: a set folder
      such as 'base', or a folder without a manifest, would be replaced);
      or `stored_dtype` is not None or one of STORED_DTYPES.
  """
  if not is_member_name(name):
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
