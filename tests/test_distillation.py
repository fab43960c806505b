"""Sequence-level distillation (lm_decoding.training.distillation): the
teacher's outputs become the train targets, and a distilled config trains on
them."""

import dataclasses
import os
import sys
import types

import numpy as np
import pytest

from lm_decoding.data import parallel_text as pt
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import data_sources, distillation, train

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import translation  # noqa: E402

S, T = 24, 30  # source and target limits


@dataclasses.dataclass(frozen=True)
class ReversingTeacher:
  """Stub teacher decoder: each row's source reversed, then EOS.

  A row whose source has an odd number of tokens never stops: its output
  repeats the reversed source up to output_length with no EOS, as a
  teacher that runs past the target limit does.
  """

  output_length: int = T + 1
  calls: list = dataclasses.field(default_factory=list)

  def decode(self, models, prompts, prompt_lengths, key):
    del models, key
    self.calls.append(len(prompts))
    out = np.full((len(prompts), self.output_length), PAD_ID, np.int32)
    for b, (row, length) in enumerate(zip(prompts, prompt_lengths)):
      reversed_ids = list(row[:length - 1][::-1])
      ids = (reversed_ids + [EOS_ID] if (length - 1) % 2 == 0
             else reversed_ids * self.output_length)[:self.output_length]
      out[b, :len(ids)] = ids
    return types.SimpleNamespace(tokens=out, nfe=7)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A small pairs file (the 40 shortest train verses + the 2 shortest of
  each held-out book), its tokenizer cached in a data folder, and the
  encoded splits."""
  splits = pt.split_pairs(pt.read_pairs())

  def shortest(pairs, k):
    return sorted(pairs, key=lambda p: len(p.source) + len(p.target))[:k]

  held_out = [p for book in pt.VALID_BOOKS + pt.TEST_BOOKS
              for p in shortest([q for q in splits["valid"] + splits["test"]
                                 if q.group == book], 2)]
  pairs = shortest(splits["train"], 40) + held_out
  root = tmp_path_factory.mktemp("kd")
  path = root / "pairs.tsv"
  pt.write_pairs(path, pairs)
  tokenizer = pt.train_tokenizer(splits["train"][:400], MIN_VOCAB_SIZE + 100)
  data_dir = root / "data"
  data_dir.mkdir()
  (data_dir / pt.TOKENIZER_FILE).write_bytes(tokenizer.model_proto)
  data = pt.prepare(tokenizer.vocab_size, S, T, path, cache_dir=data_dir)
  return types.SimpleNamespace(path=str(path), data_dir=data_dir, data=data,
                               tokenizer=tokenizer)


def test_write_pairs_round_trips(tmp_path):
  pairs = [pt.Pair("Ruth 1:1", "a b", "c d"), pt.Pair("1 Peter 2:3", "e", "f")]
  for name in ("p.tsv", "p.tsv.gz"):
    pt.write_pairs(tmp_path / name, pairs)
    assert pt.read_pairs(tmp_path / name) == pairs
  with pytest.raises(ValueError, match="'Ruth 1:1': a field is empty"):
    pt.write_pairs(tmp_path / "bad.tsv", [pt.Pair("Ruth 1:1", "a\tb", "c")])


def test_texts_cut_each_row_at_its_first_eos_or_pad(corpus):
  tok = corpus.tokenizer
  ids = tok.encode("In the beginning")
  rows = np.array([ids + [EOS_ID, 9, 9], ids[:1] + [PAD_ID] + [9] * len(ids)
                   + [9], [EOS_ID] + ids + [9, 9]], np.int32)
  texts, counts = distillation.texts(tok, rows)
  assert texts == [tok.decode(ids), tok.decode(ids[:1]), ""]
  assert counts.tolist() == [len(ids), 1, 0]


def test_distil_replaces_targets_with_the_teachers_outputs(corpus):
  train_split = corpus.data.splits["train"]
  teacher = ReversingTeacher()
  distilled = distillation.distil(teacher, None, corpus.tokenizer,
                                  train_split, batch_size=16)
  n = len(train_split.pairs)
  assert teacher.calls == [16] * (n // 16) + ([n % 16] if n % 16 else [])
  fits = train_split.source_lengths % 2 == 0
  assert 0 < fits.sum() < n  # both cases occur
  assert distilled.kept_reference == n - fits.sum()
  for i, (before, after) in enumerate(zip(train_split.pairs,
                                          distilled.pairs)):
    assert (after.reference, after.source) == (before.reference,
                                               before.source)
    source = train_split.source[i, :train_split.source_lengths[i]]
    expected = (corpus.tokenizer.decode(source[::-1].tolist()) if fits[i]
                else before.target)
    assert after.target == expected


def test_distilled_config_trains_on_the_written_targets(corpus):
  distilled = distillation.distil(ReversingTeacher(), None, corpus.tokenizer,
                                  corpus.data.splits["train"], batch_size=64)
  path = distillation.write_distilled(corpus.data_dir, distilled, corpus.path)
  assert path == corpus.data_dir / pt.DISTILLED_FILE
  written = pt.split_pairs(pt.read_pairs(path))
  assert tuple(written["train"]) == distilled.pairs
  original = pt.split_pairs(pt.read_pairs(corpus.path))
  assert (written["valid"], written["test"]) == (original["valid"],
                                                 original["test"])
  config = translation.get_config()
  config.train.objective = "cmlm"
  config.data.update(path=corpus.path, vocab_size=corpus.tokenizer.vocab_size,
                     max_source_tokens=S, max_target_tokens=T,
                     targets="distilled")
  data, train_rows, valid_rows = data_sources.training_data(config,
                                                     str(corpus.data_dir))
  expected = pt.encode_pairs(corpus.tokenizer, distilled.pairs, S, T)
  np.testing.assert_array_equal(train_rows, pt.layout(expected))
  np.testing.assert_array_equal(
      valid_rows, pt.layout(corpus.data.splits["valid"]))
  config.data.targets = "reference"
  _, reference_rows, _ = data_sources.training_data(config, str(corpus.data_dir))
  assert not np.array_equal(reference_rows[:len(train_rows)], train_rows)


def test_distilled_targets_need_the_distilled_file(tmp_path):
  with pytest.raises(ValueError, match="distil the train split first"):
    pt.pairs_path("", "distilled", tmp_path)
  with pytest.raises(ValueError, match="data.targets='gold'"):
    pt.pairs_path("", "gold", tmp_path)
  config = translation.get_config()
  config.data.targets = "gold"
  with pytest.raises(ValueError, match="data.targets='gold'; allowed"):
    train.check_config(config)
