"""Tests of lm_decoding.data.corpus and lm_decoding.data.pipeline."""

from __future__ import annotations

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


def test_paragraphs_join_lines_and_strip_only_line_edges():
  text = ("  Title\r\n\r\n\r\nOne  line,\n   and\tthe next. \n\n \t \n"
          "Last")
  assert corpus.paragraphs(text) == ["Title", "One  line, and\tthe next.",
                                     "Last"]
  assert corpus.paragraphs("\n\n") == []


def test_split_rule_assigns_chunks_by_index():
  texts = [f"p{i}" for i in range(2100)]
  splits = corpus.split_paragraphs(texts)
  for name, chunks in (("valid", (18, 38)), ("test", (19, 39))):
    assert splits[name] == [f"p{i}" for k in chunks
                            for i in range(50 * k, 50 * k + 50)]
  assert len(splits["train"]) == 2100 - 200
  assert corpus.split_paragraphs(texts[:5], chunk_paragraphs=1) == {
      "train": texts[:5], "valid": [], "test": []}
  with pytest.raises(ValueError, match="chunk_paragraphs=0"):
    corpus.split_paragraphs(texts, chunk_paragraphs=0)


def test_bundled_splits_are_deterministic_disjoint_and_complete():
  splits = corpus.load_splits(None)
  assert splits == corpus.load_splits("")
  everything = corpus.load_paragraphs(None)
  assert sum(len(v) for v in splits.values()) == len(everything)
  # Reassembling the splits chunk by chunk gives back the corpus in order.
  parts = {name: iter(v) for name, v in splits.items()}
  chunk_names = ["train"] * 18 + ["valid", "test"]
  rebuilt = []
  for k in range(0, len(everything), 50):
    name = chunk_names[(k // 50) % 20]
    rebuilt.extend(itertools.islice(parts[name],
                                    min(50, len(everything) - k)))
  assert rebuilt == everything
  assert len(splits["valid"]) >= 400 and len(splits["test"]) >= 400
  assert everything[0] == "PRIDE AND PREJUDICE"


def test_missing_path_names_data_path(tmp_path):
  with pytest.raises(ValueError, match="data.path="):
    corpus.load_splits(str(tmp_path / "absent"))
  with pytest.raises(ValueError, match="data.path="):
    pipeline.prepare(str(tmp_path / "absent"), VOCAB, tmp_path)


def test_folder_without_txt_files_raises(tmp_path):
  (tmp_path / "notes.md").write_text("text\n")
  with pytest.raises(ValueError, match="data.path=.*without \\*.txt"):
    corpus.load_paragraphs(str(tmp_path))


def test_non_utf8_file_raises(tmp_path):
  (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
  with pytest.raises(ValueError, match="not UTF-8"):
    corpus.load_paragraphs(str(tmp_path / "latin1.txt"))


def test_folder_reads_txt_files_recursively_in_sorted_order(tmp_path):
  (tmp_path / "b.txt").write_text("B one\n\nB two\n")
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / "z.txt").write_text("A/Z\n")
  (tmp_path / "a" / "skip.md").write_text("no\n")
  (tmp_path / "c.txt.gz").write_bytes(gzip.compress(b"not in a folder\n"))
  assert corpus.load_paragraphs(str(tmp_path)) == ["A/Z", "B one", "B two"]
  assert corpus.load_paragraphs(str(tmp_path / "c.txt.gz")) == [
      "not in a folder"]


def test_prepare_on_a_folder(tmp_path):
  paragraphs = corpus.load_paragraphs(None)[:200] + ["caf\u00e9 \U0001f917"]
  (tmp_path / "corpus" / "sub").mkdir(parents=True)
  (tmp_path / "corpus" / "a.txt").write_text("\n\n".join(paragraphs[:100]))
  (tmp_path / "corpus" / "sub" / "b.txt").write_text(
      "\n\n".join(paragraphs[100:]))
  prepared = pipeline.prepare(str(tmp_path / "corpus"), 400, tmp_path / "w")
  assert prepared.splits["train"] == paragraphs
  assert prepared.tokenizer.vocab_size == 400
  stream = prepared.tokens["train"]
  assert int((stream == EOS_ID).sum()) == len(paragraphs)
  assert prepared.tokenizer.decode(stream) == "".join(paragraphs)
  assert prepared.tokens["valid"].shape == (0,)


# -------------------------------------------------- tokenizer on the corpus ---


def test_round_trip_on_every_validation_paragraph(austen):
  tokenizer = austen.tokenizer
  assert tokenizer.vocab_size == VOCAB
  for text in austen.splits["valid"]:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_streams_are_paragraph_ids_followed_by_eos(austen):
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
  monkeypatch.setattr(pipeline, "encode_paragraphs", fail)
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
  with pytest.raises(ValueError, match="vocab_size=100 must be >= 325"):
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


def test_prompts_take_the_first_long_enough_paragraphs(austen):
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
