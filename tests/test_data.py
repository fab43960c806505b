"""Tests of lm_decoding.data.corpus and lm_decoding.data.pipeline."""

from __future__ import annotations

import codecs
import gzip
import itertools

import numpy as np
import pytest

from lm_decoding.data import corpus, pipeline
from lm_decoding.data.tokenizer import (
    BOS_ID, EOS_ID, MASK_ID, PAD_ID, UNK_ID, Tokenizer)

VOCAB = 4096


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def austen(workdir):
  """The bundled corpus with a vocab-4096 tokenizer (trains in ~3 s)."""
  return pipeline.prepare(None, VOCAB, workdir)


# ----------------------------------------------------------------- corpus ---


def test_line_runs_strip_only_line_edges():
  text = ("  Title\r\n\r\n\r\nOne  line,\n   and\tthe next. \n\n \t \n"
          "Last")
  assert corpus.line_runs(text) == [["Title"], ["One  line,", "and\tthe next."],
                                    ["Last"]]
  assert corpus.line_runs("\n\n") == []


def test_split_rule_assigns_parts_of_equal_documents_by_index():
  texts = [f"d{i:04d}" for i in range(2000)]  # 10 cycles of 200 documents
  splits = corpus.split_documents(texts)
  for name, part in (("valid", 18), ("test", 19)):
    assert splits[name] == [t for i, t in enumerate(texts)
                            if (i // 10) % 20 == part]
  assert len(splits["train"]) == 1800
  assert corpus.split_documents([]) == {"train": [], "valid": [], "test": []}


def test_split_rule_holds_out_a_character_fraction_of_whole_documents():
  rng = np.random.default_rng(0)
  texts = ["x" * n for n in rng.integers(1, 3000, size=3000)]
  splits = corpus.split_documents(texts)
  total = sum(map(len, texts))
  for name in ("valid", "test"):  # ~5% of the characters, not of documents
    assert 0.045 < sum(map(len, splits[name])) / total < 0.055
  assert sum(len(v) for v in splits.values()) == len(texts)
  # Few documents: one cycle; the 19th and 20th twentieth of the text.
  few = ["a" * 10] * 18 + ["b" * 10, "c" * 10]
  assert corpus.split_documents(few) == {
      "train": ["a" * 10] * 18, "valid": ["b" * 10], "test": ["c" * 10]}


def test_split_rule_places_a_document_by_its_middle_character():
  # One cycle of 100 characters, parts of 5; no document is longer than one.
  texts = ["x" * 5] * 17 + ["b" * 4, "c" * 5, "d" * 5, "e"]
  # "b" 85-89 (middle 87: train), "c" 89-94 (starts in train, middle 91.5:
  # valid), "d" 94-99 and "e" 99-100 (test).
  assert corpus.split_documents(texts) == {
      "train": ["x" * 5] * 17 + ["b" * 4], "valid": ["c" * 5],
      "test": ["d" * 5, "e"]}


def test_documents_longer_than_a_part_are_cut_at_the_part_boundaries():
  # One cycle of 100 characters (parts of 5): "a" * 85 spans 17 parts and,
  # whole, would hold 85%. Without spaces the cuts are hard, at 5, 10, ...
  texts = ["a" * 85, "b" * 10, "c" * 5]
  assert corpus.split_documents(texts) == {
      "train": ["a" * 5] * 17 + ["b" * 5], "valid": ["b" * 5],
      "test": ["c" * 5]}
  # With spaces, the cut moves to the nearest one (within a tenth of a part)
  # and drops it: the pieces are whole words.
  words = " ".join(f"w{i:03d}" for i in range(400))  # 1,999 characters
  pieces = corpus.cut_long_documents([words], 1)
  assert len(pieces) == 20 and " ".join(pieces) == words
  assert all(p.startswith("w") and not p.endswith(" ") for p in pieces)
  for share in corpus.split_shares(corpus.split_documents([words])).values():
    assert share in (pytest.approx(18 / 20, abs=0.01),
                     pytest.approx(1 / 20, abs=0.01))
  # Documents up to one part are left alone (the same list comes back).
  short = ["x" * 5] * 20
  assert corpus.cut_long_documents(short, 1) is short


def giant_document_corpus(position):
  """8,000 paragraphs of 10-39 words and one of 400,000 characters (31% of
  the text) before paragraph `position`."""
  rng = np.random.default_rng(0)
  words = np.array(["the", "of", "and", "a", "to", "in", "letter", "house",
                    "walked", "Emma", "said", "very"])
  def paragraph(num_words):
    return " ".join(rng.choice(words, size=num_words))
  texts = [paragraph(n) for n in rng.integers(10, 40, size=8000)]
  giant = paragraph(100_000)[:400_000]
  return texts[:position] + [giant] + texts[position:]


@pytest.mark.parametrize("position", [0, 4000, 8000])
def test_a_giant_document_does_not_move_the_shares(position):
  texts = giant_document_corpus(position)
  # Whole, the giant paragraph would leave valid and test 3.0-3.5% each
  # (93.0-94.0% train); cut, every split is within 1 point of its share.
  shares = corpus.split_shares(corpus.split_documents(texts))
  for name in corpus.SPLITS:
    assert shares[name] == pytest.approx(corpus.SPLIT_FRACTIONS[name],
                                         abs=0.01), (name, shares)
  uncut = corpus.split_shares(corpus.split_documents(texts, cut=False))
  assert uncut["valid"] < 0.04  # the test can fail: the rule is what holds


def test_bundled_split_is_pinned():
  """The shipped models were trained on this split: the cut rule leaves the
  bundled corpus (no paragraph longer than a part) exactly as it was."""
  documents = corpus.load_documents(None)
  assert corpus.cut_long_documents(
      documents, corpus.num_cycles(len(documents))) is documents
  splits = corpus.split_documents(documents)
  assert {k: (len(v), sum(map(len, v))) for k, v in splits.items()} == {
      "train": (9172, 3599183), "valid": (493, 201045), "test": (633, 201498)}
  assert pipeline.cache_key(splits, VOCAB) == "8e8dc891ac2f5902"


def test_bundled_splits_are_deterministic_disjoint_and_complete():
  splits = corpus.load_splits(None)
  assert splits == corpus.load_splits("")
  everything = corpus.load_documents(None)
  assert everything == corpus.load_paragraphs(None)  # detected 'paragraphs'
  assert sum(len(v) for v in splits.values()) == len(everything)
  total = sum(map(len, everything))
  for name in ("valid", "test"):
    assert 0.045 < sum(map(len, splits[name])) / total < 0.055
    assert len(splits[name]) >= 400
  assert everything[0] == "PRIDE AND PREJUDICE" == splits["train"][0]


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", b"", "is empty"),
    ("blank.txt", b" \n\t\r\n\n", "is empty"),
    ("latin1.txt", "caf\xe9\n".encode("latin-1"), "is not UTF-8"),
    ("image.txt", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "is binary"),
    ("broken.txt.gz", b"\x1f\x8b\x08not really gzip", "cannot be read"),
    ("empty.txt.gz", gzip.compress(b"", mtime=0), "is empty"),
])
def test_bad_files_name_the_file_and_data_path(tmp_path, name, content,
                                               message):
  (tmp_path / name).write_bytes(content)
  for path in (tmp_path / name, tmp_path):  # the file, or a folder holding it
    with pytest.raises(ValueError,
                       match=f"data.path file '.*{name}' {message}"):
      corpus.load_documents(str(path))
  with pytest.raises(ValueError, match=f"data.path file .*{message}"):
    pipeline.prepare(str(tmp_path / name), VOCAB, tmp_path / "w")
  assert not (tmp_path / "w").exists()


_TEXT = "Première ligne\tdeux\n\nEncore une\n"


@pytest.mark.parametrize("name, content", [
    ("utf8.txt", _TEXT.encode("utf-8")),
    ("utf8_bom.txt", codecs.BOM_UTF8 + _TEXT.encode("utf-8")),
    ("utf16le_bom.txt", codecs.BOM_UTF16_LE + _TEXT.encode("utf-16-le")),
    ("utf16be_bom.txt", codecs.BOM_UTF16_BE + _TEXT.encode("utf-16-be")),
    ("crlf.txt", _TEXT.replace("\n", "\r\n").encode("utf-8")),
    ("cr.txt", _TEXT.replace("\n", "\r").encode("utf-8")),
    ("bom_crlf.txt.gz", gzip.compress(codecs.BOM_UTF8 + _TEXT.replace(
        "\n", "\r\n").encode("utf-8"), mtime=0)),
])
def test_what_editors_write_reads_as_the_same_text(tmp_path, name, content):
  """The reading rules of corpus.py: signatures dropped, UTF-16 with its
  mark decoded, CRLF and CR ends read as LF; two documents either way."""
  (tmp_path / name).write_bytes(content)
  assert corpus.read_text(tmp_path / name) == _TEXT
  assert corpus.load_documents(str(tmp_path / name), "paragraphs") == [
      "Première ligne\tdeux", "Encore une"]


def test_control_characters_read_as_spaces(tmp_path):
  path = tmp_path / "controls.txt"
  path.write_bytes("a\x0cb\x0bc\x1bd\x7fe\x85f\tg\n".encode("utf-8"))
  assert corpus.read_text(path) == "a b c d e f\tg\n"


@pytest.mark.parametrize("content, message", [
    ("un\ncaf\xe9\n".encode("latin-1"), r"line 2 holds byte 0xe9"),
    ("caf\xe9".encode("utf-16-le"), r"is binary .*byte-order mark"),
])
def test_undecodable_text_names_the_line(tmp_path, content, message):
  (tmp_path / "bad.txt").write_bytes(content)
  with pytest.raises(ValueError, match=f"'.*bad.txt' .*{message}"):
    corpus.read_text(tmp_path / "bad.txt")


def test_missing_path_names_data_path(tmp_path):
  with pytest.raises(ValueError, match="data.path=.*absent.* does not exist"):
    corpus.load_splits(str(tmp_path / "absent"))
  with pytest.raises(ValueError, match="data.path="):
    pipeline.prepare(str(tmp_path / "absent"), VOCAB, tmp_path)


def test_folder_without_text_files_raises(tmp_path):
  (tmp_path / "notes.md").write_text("text\n")
  (tmp_path / ".hidden").mkdir()
  (tmp_path / ".hidden" / "x.txt").write_text("text\n")
  with pytest.raises(ValueError,
                     match="data.path=.*without \\*.txt or \\*.txt.gz"):
    corpus.load_documents(str(tmp_path))


def test_unknown_format_names_data_format(tmp_path):
  with pytest.raises(ValueError, match="data.format='words' must be one of"):
    corpus.read_corpus(None, "words")
  with pytest.raises(ValueError, match="data.format='words'"):
    pipeline.prepare(None, VOCAB, tmp_path, data_format="words")


def test_folder_reads_text_files_recursively_in_sorted_order(tmp_path):
  (tmp_path / "b.txt").write_text("B one\n\nB two\n")
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / "z.txt").write_text("A/Z\n")
  (tmp_path / "a" / "skip.md").write_text("no\n")
  (tmp_path / ".git").mkdir()
  (tmp_path / ".git" / "skip.txt").write_text("no\n")
  (tmp_path / "c.txt.gz").write_bytes(gzip.compress(b"C gz\nwrapped\n"))
  documents, reading = corpus.read_corpus(str(tmp_path))
  assert documents == ["A/Z", "B one", "B two", "C gz wrapped"]
  assert (reading.num_files, reading.format) == (3, "paragraphs")
  assert corpus.load_documents(str(tmp_path / "c.txt.gz")) == ["C gz wrapped"]


def test_prepare_on_a_folder(tmp_path):
  paragraphs = corpus.load_paragraphs(None)[:200] + ["caf\u00e9 \U0001f917"]
  (tmp_path / "corpus" / "sub").mkdir(parents=True)
  (tmp_path / "corpus" / "a.txt").write_text("\n\n".join(paragraphs[:100]))
  (tmp_path / "corpus" / "sub" / "b.txt").write_text(
      "\n\n".join(paragraphs[100:]))
  prepared = pipeline.prepare(str(tmp_path / "corpus"), 400, tmp_path / "w")
  assert prepared.splits == corpus.split_documents(paragraphs)
  assert prepared.splits["test"][-1] == paragraphs[-1]
  assert prepared.tokenizer.vocab_size == 400
  for name in corpus.SPLITS:
    stream = prepared.tokens[name]
    assert int((stream == EOS_ID).sum()) == len(prepared.splits[name]) > 0
    assert prepared.tokenizer.decode(stream) == "".join(prepared.splits[name])


# -------------------------------------------------- tokenizer on the corpus ---


def test_round_trip_on_every_validation_paragraph(austen):
  tokenizer = austen.tokenizer
  assert tokenizer.vocab_size == VOCAB
  for text in austen.splits["valid"]:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_streams_are_document_ids_followed_by_eos(austen):
  for name in corpus.SPLITS:
    stream = austen.tokens[name]
    assert stream.dtype == np.int32 and stream.ndim == 1
    assert int((stream == EOS_ID).sum()) == len(austen.splits[name])
    assert stream[-1] == EOS_ID
    assert not np.isin(stream, [PAD_ID, UNK_ID, BOS_ID, MASK_ID]).any()
    assert stream.max() < VOCAB
  first = austen.splits["valid"][:3]
  expected = [i for t in first for i in (*austen.tokenizer.encode(t), EOS_ID)]
  np.testing.assert_array_equal(austen.tokens["valid"][:len(expected)],
                                expected)


# ------------------------------------------------------------------ cache ---


def test_second_prepare_reuses_the_cache(austen, workdir, monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("cache not used")

  monkeypatch.setattr(Tokenizer, "train", fail)
  monkeypatch.setattr(pipeline, "encode_documents", fail)
  again = pipeline.prepare("", VOCAB, workdir)
  assert again.cache_dir == austen.cache_dir
  assert again.tokenizer.model_proto == austen.tokenizer.model_proto
  for name in corpus.SPLITS:
    np.testing.assert_array_equal(again.tokens[name], austen.tokens[name])
  files = sorted(p.name for p in austen.cache_dir.iterdir())
  assert files == ["meta.json", "test.npy", "tokenizer.model", "train.npy",
                   "valid.npy"]  # no temporary files left behind


def test_missing_stream_is_encoded_again_without_retraining(
    austen, tmp_path, monkeypatch):
  workdir = tmp_path / "w"
  cache_dir = workdir / "data" / austen.cache_dir.name
  cache_dir.mkdir(parents=True)
  for name in ("tokenizer.model", "train.npy", "test.npy"):
    (cache_dir / name).write_bytes((austen.cache_dir / name).read_bytes())
  monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: 1 / 0)
  again = pipeline.prepare(None, VOCAB, workdir)
  np.testing.assert_array_equal(np.load(cache_dir / "valid.npy"),
                                austen.tokens["valid"])
  np.testing.assert_array_equal(again.tokens["valid"], austen.tokens["valid"])


def test_cache_key_depends_on_text_and_vocab_size():
  splits = {"train": ["a b"], "valid": ["c"], "test": []}
  key = pipeline.cache_key(splits, 512)
  assert len(key) == 16 and key == pipeline.cache_key(dict(splits), 512)
  assert key != pipeline.cache_key(splits, 513)
  assert key != pipeline.cache_key({**splits, "train": ["a  b"]}, 512)
  assert key != pipeline.cache_key(
      {"train": ["a b", "c"], "valid": [], "test": []}, 512)


def test_vocab_size_too_small_raises_before_caching(tmp_path):
  with pytest.raises(ValueError, match="data.vocab_size=100 must be >= 325"):
    pipeline.prepare(None, 100, tmp_path)
  assert not (tmp_path / "data").exists()


# ------------------------------------------------------------ pack, batch ---


def test_pack_cuts_consecutive_rows_and_drops_the_tail():
  stream = np.arange(23, dtype=np.int32)
  packed = pipeline.pack(stream, 5)
  assert packed.dtype == np.int32
  np.testing.assert_array_equal(packed, np.arange(20).reshape(4, 5))
  for bad in (0, 24):
    with pytest.raises(ValueError, match=f"seq_len={bad}"):
      pipeline.pack(stream, bad)
  with pytest.raises(ValueError, match="1-D"):
    pipeline.pack(stream.reshape(1, -1), 5)


def _packed(num=10, seq_len=3):
  return pipeline.pack(np.arange(num * seq_len, dtype=np.int32), seq_len)


def test_batches_are_a_function_of_seed_and_step():
  packed = _packed()
  first = list(itertools.islice(pipeline.batches(packed, 3, seed=7), 12))
  again = list(itertools.islice(pipeline.batches(packed, 3, seed=7), 12))
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  for step in (0, 2, 3, 7, 11):
    resumed = next(pipeline.batches(packed, 3, seed=7, start_step=step))
    np.testing.assert_array_equal(resumed, first[step])
  other = list(itertools.islice(pipeline.batches(packed, 3, seed=8), 12))
  assert any((a != b).any() for a, b in zip(first, other))


def test_each_epoch_is_a_permutation_without_repeats():
  packed = _packed()
  batches = list(itertools.islice(pipeline.batches(packed, 3, seed=0), 9))
  assert all(b.shape == (3, 3) and b.dtype == np.int32 for b in batches)
  epochs = [np.concatenate(batches[i:i + 3])[:, 0] // 3 for i in (0, 3, 6)]
  for rows in epochs:
    assert len(set(rows.tolist())) == 9  # 3 steps x 3 rows; 1 row sits out
  assert not all((a == b).all() for a, b in zip(epochs, epochs[1:]))


def test_batches_validates_arguments_when_called():
  packed = _packed()
  for kwargs, name in ((dict(batch_size=11, seed=0), "batch_size=11"),
                       (dict(batch_size=0, seed=0), "batch_size=0"),
                       (dict(batch_size=2, seed=-1), "seed=-1"),
                       (dict(batch_size=2, seed=0, start_step=-1),
                        "start_step=-1")):
    with pytest.raises(ValueError, match=name):
      pipeline.batches(packed, **kwargs)


# ---------------------------------------------------------------- prompts ---


def test_prompts_take_the_first_long_enough_documents(austen):
  prompt_tokens, references = pipeline.prompts(austen, "valid", 4, 16, 24)
  tokenizer = austen.tokenizer
  encoded = [tokenizer.encode(t) for t in austen.splits["valid"]]
  chosen = [ids for ids in encoded if len(ids) >= 40][:4]
  assert prompt_tokens.dtype == np.int32 and prompt_tokens.shape == (4, 16)
  np.testing.assert_array_equal(prompt_tokens, [ids[:16] for ids in chosen])
  assert references == [tokenizer.decode(ids[16:40]) for ids in chosen]
  for ids, prompt, reference in zip(chosen, prompt_tokens, references):
    assert (tokenizer.decode(prompt) + reference
            == tokenizer.decode(ids[:40]))
  again = pipeline.prompts(austen, "valid", 4, 16, 24)
  np.testing.assert_array_equal(again[0], prompt_tokens)
  assert again[1] == references


def test_prompts_validate_arguments(austen):
  with pytest.raises(ValueError, match="split='dev'"):
    pipeline.prompts(austen, "dev", 1, 8, 8)
  with pytest.raises(ValueError, match="prompt_len=0"):
    pipeline.prompts(austen, "valid", 1, 0, 8)
  with pytest.raises(ValueError, match="num=100000: only"):
    pipeline.prompts(austen, "test", 100000, 8, 8)
