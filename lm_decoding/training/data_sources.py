"""The rows an objective trains on, by the data kind its registry entry
names (`registry.Objective.data`): 'text', the packed corpus; 'pairs', the
laid-out verse pairs. A new kind of data is one function here and one
entry of `SOURCES`."""

from __future__ import annotations

import ml_collections

from lm_decoding.data import parallel_text
from lm_decoding.data import pipeline
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


SOURCES = {"text": text, "pairs": pairs}


def training_data(config: ml_collections.ConfigDict, data_dir: str):
  """(data, train int32[R, L], valid int32[R', L]) of the objective of
  `config`: `SOURCES` of its entry's data kind. `data` has `.tokenizer` and
  `.describe()`.

  Raises:
    ValueError: an unknown objective (`registry.get`), or as the source.
  """
  return SOURCES[registry.get(config.train.objective).data](config, data_dir)
