"""A researcher's own corpus: every format, 'auto' detection, size checks.

Small synthetic corpora written to tmp_path, a 325-id tokenizer (the
minimum): each prepare takes well under a second.
"""

from __future__ import annotations

import gzip

import ml_collections
import numpy as np
import pytest

from lm_decoding.data import corpus, pipeline
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE

VOCAB = MIN_VOCAB_SIZE


def make_documents(num: int, words: int, seed: int = 0) -> list[str]:
  """`num` documents of `words` pseudo-words each, with a period at the end."""
  rng = np.random.default_rng(seed)
  lexicon = ["".join(rng.choice(list("abcdefghijklmnoprstuvwy"), size=k))
             for k in rng.integers(2, 8, size=300)]
  return [" ".join(rng.choice(lexicon, size=words)) + "."
          for _ in range(num)]


def wrap(document: str, width: int = 60) -> list[str]:
  """The lines of `document` wrapped at spaces, at most ~width characters."""
  lines, line = [], ""
  for word in document.split(" "):
    if line and len(line) + 1 + len(word) > width:
      lines.append(line)
      line = word
    else:
      line = f"{line} {word}" if line else word
  return lines + [line]


def as_paragraphs(documents: list[str]) -> str:
  """Wrapped lines, blank lines between documents, indented, CRLF ends."""
  return "\r\n\r\n".join("\r\n".join("  " + l for l in wrap(d))
                         for d in documents) + "\r\n"


def as_lines(documents: list[str]) -> str:
  """One document per line, one stray blank line and no final newline."""
  return "\n".join(documents[:5]) + "\n\n" + "\n".join(documents[5:])


def config(seq_len=32, batch_size=4, batch_sizes=(1, 4), prompt_len=8,
           reference_len=16, evaluator_batch=None, compare=True):
  """The keys `check_corpus_size` reads, shaped like configs/tiny.py."""
  cfg = ml_collections.ConfigDict(dict(
      data=dict(seq_len=seq_len), train=dict(batch_size=batch_size),
      evaluator=dict(train=dict(num_steps=2))))
  if evaluator_batch:
    cfg.evaluator.train.batch_size = evaluator_batch
  if compare:
    cfg.compare = dict(batch_sizes=batch_sizes, prompt_len=prompt_len,
                       reference_len=reference_len)
  return cfg


DOCUMENTS = make_documents(300, 40)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """One corpus (DOCUMENTS) in every accepted layout: {name: (path, format)}."""
  root = tmp_path_factory.mktemp("sources")
  (root / "paragraphs.txt").write_text(as_paragraphs(DOCUMENTS), newline="")
  (root / "lines.txt").write_text(as_lines(DOCUMENTS))
  (root / "paragraphs.txt.gz").write_bytes(
      gzip.compress(as_paragraphs(DOCUMENTS).encode()))
  (root / "lines.gz").write_bytes(gzip.compress(as_lines(DOCUMENTS).encode()))
  for name, text in (("folder", as_paragraphs), ("folder_gz", as_lines)):
    (root / name / "b").mkdir(parents=True)
    for i, part in enumerate((DOCUMENTS[:100], DOCUMENTS[100:250],
                              DOCUMENTS[250:])):
      file = root / name / ("b" if i else "") / f"{i}.txt"
      if name == "folder_gz":
        file.with_suffix(".txt.gz").write_bytes(
            gzip.compress(text(part).encode()))
      else:
        file.write_text(text(part))
  return {"paragraphs.txt": (root / "paragraphs.txt", "paragraphs"),
          "lines.txt": (root / "lines.txt", "lines"),
          "paragraphs.txt.gz": (root / "paragraphs.txt.gz", "paragraphs"),
          "lines.gz": (root / "lines.gz", "lines"),
          "folder": (root / "folder", "paragraphs"),
          "folder_gz": (root / "folder_gz", "lines")}


@pytest.mark.parametrize("name", ["paragraphs.txt", "lines.txt",
                                  "paragraphs.txt.gz", "lines.gz", "folder",
                                  "folder_gz"])
def test_every_layout_reads_the_same_documents(sources, name, tmp_path):
  path, expected_format = sources[name]
  documents, reading = corpus.read_corpus(str(path))
  assert documents == DOCUMENTS
  assert reading.format == expected_format and reading.requested == "auto"
  assert corpus.load_documents(str(path), expected_format) == DOCUMENTS
  prepared = pipeline.prepare(str(path), VOCAB, tmp_path)
  assert prepared.splits == corpus.split_documents(DOCUMENTS)
  described = prepared.describe()
  assert (f"data.format='auto' detected {expected_format!r}" in described)
  shares = corpus.split_shares(prepared.splits)
  assert ("train/valid/test 90%/5%/5% asked, " + "/".join(
      f"{shares[s]:.1%}" for s in corpus.SPLITS) + " got") in described
  for split in corpus.SPLITS:
    assert (f"{len(prepared.splits[split]):,} documents "
            f"{prepared.tokens[split].size:>12,} tokens") in described
  pipeline.check_corpus_size(prepared, config())


def test_explicit_format_overrides_detection(sources):
  path, _ = sources["paragraphs.txt"]
  lines = corpus.load_documents(str(path), "lines")
  assert lines == [l for d in DOCUMENTS for l in wrap(d)]
  documents, reading = corpus.read_corpus(str(sources["lines.txt"][0]),
                                          "paragraphs")
  assert documents == [" ".join(DOCUMENTS[:5]), " ".join(DOCUMENTS[5:])]
  assert reading.describe().endswith("data.format='paragraphs'")


@pytest.mark.parametrize("lines_per_run, expected", [
    (1, "paragraphs"), (20, "paragraphs"), (21, "lines"), (500, "lines")])
def test_auto_detection_threshold(tmp_path, lines_per_run, expected):
  runs = ["\n".join(f"line {r}.{i}" for i in range(lines_per_run))
          for r in range(3)]
  (tmp_path / "c.txt").write_text("\n\n".join(runs))
  documents, reading = corpus.read_corpus(str(tmp_path / "c.txt"))
  assert reading.format == expected
  assert reading.lines_per_run == lines_per_run
  assert len(documents) == (3 if expected == "paragraphs"
                            else 3 * lines_per_run)


def test_one_paragraph_per_line_file_is_not_one_document(tmp_path):
  """Regression: a file with one paragraph per line and no blank line was
  one paragraph and failed inside sentencepiece ('!sentences_.empty()')."""
  documents = make_documents(200, 400, seed=1)  # ~2,000 characters a line
  (tmp_path / "c.txt").write_text("\n".join(documents))
  prepared = pipeline.prepare(str(tmp_path / "c.txt"), VOCAB, tmp_path)
  assert prepared.reading.format == "lines"
  assert sum(len(v) for v in prepared.splits.values()) == 200
  # Read as one document on purpose, it still trains a tokenizer; the cut
  # rule (corpus docstring) cuts it at the 19 part boundaries inside it.
  whole = pipeline.prepare(str(tmp_path / "c.txt"), VOCAB, tmp_path / "w",
                           data_format="paragraphs")
  assert whole.reading.num_documents == 1
  assert {k: len(v) for k, v in whole.splits.items()} == {
      "train": 18, "valid": 1, "test": 1}


def test_small_corpus_has_held_out_splits(tmp_path):
  """Regression: under ~950 paragraphs valid and test were empty and training
  failed with 'seq_len=256 must be in [1, 0]'."""
  documents = make_documents(60, 30)
  (tmp_path / "c.txt").write_text("\n\n".join(documents))
  prepared = pipeline.prepare(str(tmp_path / "c.txt"), VOCAB, tmp_path)
  assert all(prepared.splits[name] for name in corpus.SPLITS)
  pipeline.check_corpus_size(
      prepared, config(seq_len=8, batch_size=2, batch_sizes=(1, 2)))


# ----------------------------------------------------------- size checks ---


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """~300 documents of ~40 words: train ~12k tokens, valid/test ~700 each."""
  root = tmp_path_factory.mktemp("small")
  (root / "c.txt").write_text("\n\n".join(DOCUMENTS))
  return pipeline.prepare(str(root / "c.txt"), VOCAB, root)


def test_fitting_config_passes(small):
  pipeline.check_corpus_size(small, config())
  pipeline.check_corpus_size(small, config(compare=False))


def test_too_few_tokens_for_a_validation_batch_names_the_minimum(small):
  have = small.tokens["valid"].size
  seq_len = have // 4 + 1  # one batch of 4 is a token more than the split
  pipeline.check_corpus_size(small, config(seq_len=seq_len - 1))
  minimum = int(np.ceil(4 * seq_len / 0.05))
  with pytest.raises(ValueError) as error:
    pipeline.check_corpus_size(small, config(seq_len=seq_len))
  message = str(error.value)
  assert message.startswith(
      f"corpus too small for the config: the valid split has {have:,} tokens, "
      f"fewer than train.batch_size x data.seq_len = 4 x {seq_len} = "
      f"{4 * seq_len:,} tokens (one valid batch); the valid split is 5% of the "
      f"text, so data.path needs at least {minimum:,} tokens")
  assert message.endswith("lower data.seq_len or train.batch_size")


def test_train_split_checked_on_its_own(small):
  """With the validation batch fitting, a too-short train split still fails
  (a stand-in corpus whose train stream is cut short)."""
  short = pipeline.Corpus(
      tokenizer=small.tokenizer, splits=small.splits,
      tokens={**small.tokens, "train": small.tokens["train"][:100]},
      cache_dir=small.cache_dir, reading=small.reading)
  with pytest.raises(ValueError, match=(
      "the train split has 100 tokens, fewer than train.batch_size x "
      "data.seq_len = 4 x 32 = 128 tokens .* the train split is 90% of the "
      "text, so data.path needs at least 143 tokens")):
    pipeline.check_corpus_size(short, config())


def test_evaluator_batch_size_counts_when_larger(small):
  seq_len = small.tokens["valid"].size // 8
  pipeline.check_corpus_size(small, config(seq_len=seq_len))
  with pytest.raises(ValueError, match=(
      "fewer than evaluator.train.batch_size x data.seq_len = 16 x ")):
    pipeline.check_corpus_size(
        small, config(seq_len=seq_len, evaluator_batch=16))


def test_test_documents_too_short_for_prompts_names_the_minimum(small):
  longest = int(max(len(small.tokenizer.encode(t))
                    for t in small.splits["test"]))
  pipeline.check_corpus_size(
      small, config(prompt_len=8, reference_len=longest - 8, batch_sizes=(1,)))
  with pytest.raises(ValueError, match=(
      "the test split has 0 documents of at least compare.prompt_len \\+ "
      f"compare.reference_len = 8 \\+ {longest - 7} = {longest + 1} tokens "
      f".*the longest {longest} tokens.*fewer than "
      "max\\(compare.batch_sizes\\) = 1 prompts")):
    pipeline.check_corpus_size(
        small, config(prompt_len=8, reference_len=longest - 7,
                      batch_sizes=(1,)))


def test_too_few_test_prompts_for_the_largest_batch(small):
  count = len(small.splits["test"])
  pipeline.check_corpus_size(small, config(batch_sizes=(1, count)))
  with pytest.raises(ValueError, match=(
      f"the test split has {count} documents .* fewer than "
      f"max\\(compare.batch_sizes\\) = {count + 1} prompts")):
    pipeline.check_corpus_size(small, config(batch_sizes=(count + 1, 1)))
  # The same numbers `prompts` would fail on, later.
  with pytest.raises(ValueError, match=f"only {count} documents"):
    pipeline.prompts(small, "test", count + 1, 8, 16)


def test_too_large_vocabulary_names_data_vocab_size(tmp_path):
  (tmp_path / "c.txt").write_text("\n\n".join(make_documents(30, 5)))
  with pytest.raises(ValueError, match=(
      "data.vocab_size=4096 does not fit the texts.*the train split of .*c.txt "
      "has \\d+ documents")):
    pipeline.prepare(str(tmp_path / "c.txt"), 4096, tmp_path)
