"""The rows an objective trains on, by the data kind its registry entry
names (`registry.Objective.data`): 'text', the packed corpus;
'distillation', a teacher's continuations; 'pairs', the laid-out verse
pairs. A new kind of data is one function here and one
entry of `SOURCES`."""

from __future__ import annotations

import ml_collections

from lm_decoding.data import parallel_text
from lm_decoding.data import pipeline
from lm_decoding.training import self_distillation
from lm_decoding.training.objectives import registry


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
  data.seq_len tokens; validation stays the corpus's.

  Raises:
    ValueError: the set's rows are shorter than data.seq_len, or as
      `self_distillation.read_distillation_set`.
  """
  corpus, train, valid = text(config, data_dir)
  path, seq_len = config.data.get("distillation_set"), config.data.seq_len
  if not path:
    return corpus, train, valid
  rows, _ = self_distillation.read_distillation_set(path)
  if rows.shape[1] < seq_len:
    raise ValueError(f"data.distillation_set rows hold {rows.shape[1]} "
                     f"tokens; data.seq_len={seq_len} must be at most that")
  return corpus, rows[:, :seq_len], valid


SOURCES = {"text": text, "distillation": distillation, "pairs": pairs}


def training_data(config: ml_collections.ConfigDict, data_dir: str):
  """(data, train int32[R, L], valid int32[R', L]) of the objective of
  `config`: `SOURCES` of its entry's data kind. `data` has `.tokenizer` and
  `.describe()`.

  Raises:
    ValueError: an unknown objective (`registry.get`), or as the source.
  """
  return SOURCES[registry.get(config.train.objective).data](config, data_dir)
