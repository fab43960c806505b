"""The rows an objective trains on, and the objective a config trains.

`train.train` reads its data through one of these sources, each returning
(data, train int32[R, L], valid int32[R', L]) with `data.describe()`:

  text          the packed corpus (`pipeline`), by the data kind of the
                objective's registry entry (`registry.Objective.data`);
  distillation  a teacher's continuations (`self_distillation`);
  jacobi        Jacobi states beside their fixed points, [state row |
                block targets] rows of 2 data.seq_len
                (`jacobi_trajectories`; validation: the corpus's rows
                beside an empty block);
  pairs         the laid-out verse pairs (`parallel_text.layout`);
  task          the rows [prompt (P) | answer (T)] of an exact-answer task
                (`data.tasks`), held in memory by the caller (`task_rows`,
                passed as `train.train(..., data=...)`); a config says so
                with data.source = 'task'.

A config of data.source 'task' trains its objective ('ar', 'mdlm',
'bd3lm' or 'certainty_forcing') conditioned on the prompt of
train.prompt_length tokens: the prompt is never masked and never scored
(`objectives.tasks`, `registry.TASK_OBJECTIVES`). A new kind of data is one
function here and one entry of `SOURCES`.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from lm_decoding.checks import is_count
from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import parallel_text
from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE
from lm_decoding.parallel import multihost
from lm_decoding.parallel import sharding
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training import jacobi_trajectories
from lm_decoding.training import self_distillation
from lm_decoding.training.objectives import registry

TASK = registry.TASK  # the data.source of a task model's config


def text(config: ml_collections.ConfigDict, data_dir: str):
  """(corpus, train int32[R, L], valid int32[R', L]): the corpus of
  data.path (`pipeline.prepare`, tokenizer and encoding cached in
  `data_dir`) packed into rows of data.seq_len."""
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            data_dir, config.data.get("format", "auto"))
  seq_len = config.data.seq_len
  return (corpus, pipeline.pack(corpus.tokens["train"], seq_len),
          pipeline.pack(corpus.tokens["valid"], seq_len))


def pairs(config: ml_collections.ConfigDict, data_dir: str):
  """(pairs, train int32[R, L], valid int32[R', L]): the book-split verse
  pairs (`parallel_text.prepare`, tokenizer cached in `data_dir`) laid out
  by `parallel_text.layout`; with data.targets 'distilled' the pairs are
  `data_dir`'s distilled file (`parallel_text.pairs_path`), which must
  share that cached tokenizer."""
  path = parallel_text.pairs_path(
      config.data.path, config.data.get("targets", "reference"), data_dir)
  data = parallel_text.prepare(
      config.data.vocab_size, config.data.max_source_tokens,
      config.data.max_target_tokens, path, cache_dir=data_dir)
  return (data, parallel_text.layout(data.splits["train"]),
          parallel_text.layout(data.splits["valid"]))


def distillation(config: ml_collections.ConfigDict, data_dir: str):
  """(corpus, train int32[R, L], valid int32[R', L]): `text`, whose training
  rows are those of data.distillation_set when it is set (a folder of
  `self_distillation.write_distillation_set`), cut to their first
  data.seq_len tokens, the PAD after an EOS turned into EOS to the end of
  its block of train.block_length when data.eos_fill is set
  (`self_distillation.eos_filled`); validation stays the corpus's.

  Raises:
    ValueError: the set's rows are shorter than data.seq_len, its prefix
      length (its manifest's prompt_length) is not train.prompt_length (the
      loss would mask prefix tokens or never the first continuation
      tokens), or as `self_distillation.read_distillation_set`.
  """
  corpus, train, valid = text(config, data_dir)
  path, seq_len = config.data.get("distillation_set"), config.data.seq_len
  if not path:
    return corpus, train, valid
  rows, manifest = self_distillation.read_distillation_set(path)
  if rows.shape[1] < seq_len:
    raise ValueError(f"data.distillation_set rows hold {rows.shape[1]} "
                     f"tokens; data.seq_len={seq_len} must be at most that")
  prefix = manifest.get("prompt_length")
  prompt_length = config.train.get("prompt_length", 0)
  if prefix is not None and prompt_length != prefix:
    raise ValueError(f"train.prompt_length={prompt_length!r} must be the "
                     f"prefix length of data.distillation_set={path!r}, "
                     f"{prefix} (its rows continue {prefix}-token prefixes)")
  if config.data.get("eos_fill", False):
    rows = self_distillation.eos_filled(rows, config.train.block_length)
  return corpus, rows[:, :seq_len], valid


def jacobi(config: ml_collections.ConfigDict, data_dir: str):
  """(corpus, train int32[R, 2 L], valid int32[R', 2 L]), L =
  data.seq_len: the pairs [state row | block targets] of the Jacobi state
  set data.jacobi_set (`jacobi_trajectories.read_forcing_pairs`), and the
  corpus's validation rows, each beside an empty block [row | PAD], whose
  measure is the AR perplexity of the rows (`objectives.jacobi_forcing`).

  Raises:
    ValueError: as `jacobi_trajectories.read_forcing_pairs`.
  """
  corpus, _, valid = text(config, data_dir)
  pairs = jacobi_trajectories.read_forcing_pairs(config.data.jacobi_set,
                                                 config.data.seq_len)
  return corpus, pairs, np.concatenate(
      [valid, np.full_like(valid, PAD_ID)], 1)


SOURCES = {"text": text, "distillation": distillation, "pairs": pairs,
           "jacobi": jacobi}


@dataclasses.dataclass(frozen=True)
class TaskData:
  """What `task_rows` describes: a task's name and split sizes."""

  name: str
  vocab_size: int
  train_rows: int
  valid_rows: int

  def describe(self) -> str:
    return (f"task {self.name}: {self.train_rows} train and "
            f"{self.valid_rows} valid rows, vocabulary {self.vocab_size}")


def task_rows(name: str, vocab_size: int, train: np.ndarray,
              valid: np.ndarray):
  """(data, train int32[R, L], valid int32[R', L]): the rows [prompt |
  answer] of task `name` (its `Split.rows`), as `train.train(..., data=)`
  takes them.

  Raises:
    ValueError: rows that are not int[R, L] of one L, or ids outside
      [0, vocab_size).
  """
  for split, rows in (("train", train), ("valid", valid)):
    rows = np.asarray(rows)
    if (rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer)
        or rows.shape[1] != np.shape(train)[1] or not rows.size
        or rows.min() < 0 or rows.max() >= vocab_size):
      raise ValueError(f"{split} rows of task {name} must be int[R, L] with "
                       f"one L and ids in [0, {vocab_size})")
  data = TaskData(name, vocab_size, len(train), len(valid))
  return (data, np.asarray(train, np.int32), np.asarray(valid, np.int32))


def given_rows(data: tuple, seq_len: int, row_parts: int = 1) -> tuple:
  """`data` (a triple `task_rows` made, passed as `train.train(data=)`),
  checked against the config's `seq_len` and its objective's
  `registry.Objective.row_parts`.

  Raises:
    ValueError: rows not `row_parts` x `seq_len` wide (a task's prompt +
      answer; a 'jacobi_forcing' pair: 2 seq_len).
  """
  width, row_width = np.shape(data[1])[1], row_parts * seq_len
  if width != row_width:
    what = (" (a task's prompt + answer)" if row_parts == 1
            else f": its objective's rows hold {row_parts} x {seq_len}")
    raise ValueError(f"the rows passed (data=) are {width} tokens wide; "
                     f"data.seq_len={seq_len}{what}")
  return data


def training_data(config: ml_collections.ConfigDict, data_dir: str):
  """(data, train int32[R, L], valid int32[R', L]) of the objective of
  `config`: `SOURCES` of its entry's data kind. `data` has `.describe()`.

  Raises:
    ValueError: an unknown objective (`registry.get`); a config of
      data.source 'task' (its rows come from the caller, `task_rows`); a
      tokenizer of another vocabulary size than data.vocab_size; or as the
      source.
  """
  if config.data.get("source") == TASK:
    raise ValueError("data.source='task': pass the task's rows "
                     "(data_sources.task_rows) to train.train(data=...)")
  data = SOURCES[registry.get(config.train.objective).data](config, data_dir)
  vocab_size = data[0].tokenizer.vocab_size
  if vocab_size != config.data.vocab_size:
    raise ValueError(f"tokenizer vocab_size={vocab_size} does not match "
                     f"data.vocab_size={config.data.vocab_size}")
  return data


def validation_batches(data: tuple, batch_size: int,
                       eval_batch_size: int | None, eval_batches: int,
                       progress: bool) -> tuple[np.ndarray, np.ndarray]:
  """(train sequences int32[R, L], validation batches int32[n, B', L]): a
  source's triple `data` with its validation rows cut into batches of
  B' = `eval_batch_size` (default the train batch size B), n =
  min(eval_batches, what the split holds); with `progress`, prints what
  the data is.

  Raises:
    ValueError: a validation split with fewer than one batch.
  """
  source, train_rows, valid_rows = data
  if progress:
    print(source.describe())
  size = eval_batch_size or batch_size
  seq_len = train_rows.shape[1]
  num_valid = min(eval_batches, len(valid_rows) // size)
  if num_valid < 1:
    what = ("train.eval_batch_size" if eval_batch_size
            else "train.batch_size")
    raise ValueError(
        f"validation split has {len(valid_rows)} sequences of "
        f"seq_len={seq_len}: fewer than {what}={size}")
  return train_rows, valid_rows[:num_valid * size].reshape(
      num_valid, size, seq_len)


def train_batches(rows: np.ndarray, batch_size: int, seed: int, first: int,
                  mesh=None, rules=None):
  """The training batches int32[B, L] of steps first, first + 1, ... of
  `rows` int32[R, L] (`pipeline.batches`, drawn by `seed`): the same
  sequence on one device as on a `mesh`, where each process reads its rows
  only (`multihost.global_batches`, placed by `rules`)."""
  if mesh is None:
    return pipeline.batches(rows, batch_size, seed, start_step=first)
  return multihost.global_batches(
      rows, batch_size, seed,
      sharding.batch_sharding(mesh, (batch_size, rows.shape[1]), rules),
      start_step=first)


def check(config: ml_collections.ConfigDict) -> None:
  """Checks the data options of `config`'s source, before anything is read.

  Raises:
    ValueError: naming the key: data.vocab_size not an integer >= the
      tokenizer's minimum (a task: >= 1); data.eos_fill not True or False
      (when present), or True without a data.distillation_set its objective
      reads; data.jacobi_set not a non-empty string where
      train.objective reads it (`_check_jacobi_set`); data.format unknown;
      data.path missing; data.targets not in `parallel_text.TARGETS`; for a
      task, train.prompt_length not in [1, data.seq_len - 1].
  """
  _check_jacobi_set(config)
  eos_fill = config.data.get("eos_fill")
  if eos_fill is not None and not isinstance(eos_fill, bool):
    raise ValueError(f"data.eos_fill={eos_fill!r} must be True or False")
  objective = registry.of_config(config) if eos_fill else None
  if objective and not (objective.data == "distillation"
                        and config.data.get("distillation_set")):
    readers = tuple(name for name, o in registry.OBJECTIVES.items()
                    if o.data == "distillation")
    raise ValueError(
        "data.eos_fill=True fills the rows of data.distillation_set, which "
        f"train.objective in {readers} reads; got {objective.name!r} with "
        f"data.distillation_set={config.data.get('distillation_set')!r}")
  task = config.data.get("source") == TASK
  vocab_size = config.data.vocab_size
  minimum = 1 if task else MIN_VOCAB_SIZE
  if not is_count(vocab_size, minimum):
    raise ValueError(f"data.vocab_size={vocab_size!r} must be an integer >= "
                     f"{minimum}")
  if task:
    prompt, seq_len = config.train.get("prompt_length"), config.data.seq_len
    if not is_count(prompt) or prompt >= seq_len:
      raise ValueError(f"train.prompt_length={prompt!r} must be an integer in "
                       f"[1, {seq_len - 1}] (data.seq_len={seq_len})")
    return
  data_format = config.data.get("format", "auto")
  if data_format not in corpus_lib.FORMATS:
    raise ValueError(f"data.format={data_format!r} must be one of "
                     f"{corpus_lib.FORMATS}")
  corpus_lib.resolve_path(config.data.path)
  targets = config.data.get("targets", "reference")
  if targets not in parallel_text.TARGETS:
    raise ValueError(f"data.targets={targets!r}; allowed: "
                     f"{parallel_text.TARGETS}")


def _check_jacobi_set(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming data.jacobi_set unless it is a non-empty
  string for an objective of data kind 'jacobi' and absent or '' for the
  others."""
  path = config.data.get("jacobi_set")
  reader = (config.data.get("source") != TASK
            and registry.of_config(config).data == "jacobi")
  if reader and not (isinstance(path, str) and path):
    raise ValueError(f"data.jacobi_set={path!r} must name the folder "
                     "experiments/jacobi_data.py wrote (train.objective="
                     f"{config.train.objective!r} trains on it)")
  if not reader and path:
    raise ValueError(f"data.jacobi_set={path!r} is read by train.objective "
                     "'jacobi_forcing' only; got "
                     f"{config.train.objective!r}")
