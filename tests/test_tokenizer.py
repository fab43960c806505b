"""Tests of lm_decoding.data.tokenizer on small models trained from ASCII text."""

from __future__ import annotations

import io

import pytest
import sentencepiece as spm

from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import (
    BOS_ID, EOS_ID, MASK_ID, MIN_VOCAB_SIZE, PAD_ID, UNK_ID, Tokenizer,
    training_sample)

VOCAB = 400
RESERVED = {PAD_ID, BOS_ID, EOS_ID, MASK_ID}
TEXTS = [
    "hello 🤗 wörld",
    "Café naïve façade — “quoted” £20,000 ½",
    "日本語のテキスト、中文文本",
    "emoji 👩‍👩‍👧 flags 🇬🇧 and ☃",
    "tabs\tand  double  spaces   and trailing ",
    "  leading spaces",
    "line one\nline two\r\nline three",
    "ﬁ ligature, \u00c5 and A\u030a (NFC vs NFD), ① circled",
    "",
    " ",
    "<pad> <unk> <s> </s> <mask> <0x41>",
]


@pytest.fixture(scope="module")
def ascii_texts():
  texts = corpus.load_paragraphs(None)[:300]
  assert all(t.isascii() for t in texts)
  return texts


@pytest.fixture(scope="module")
def tokenizer(ascii_texts):
  return Tokenizer.train(ascii_texts, VOCAB)


def test_emoji_is_spelled_in_bytes_and_round_trips(tokenizer):
  text = "hello 🤗 wörld"
  pieces = tokenizer.pieces(text)
  emoji = ["<0xF0>", "<0x9F>", "<0xA4>", "<0x97>"]
  assert any(pieces[i:i + 4] == emoji for i in range(len(pieces)))
  assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_keeps_every_character(tokenizer, text):
  ids = tokenizer.encode(text)
  decoded = tokenizer.decode(ids)
  assert decoded == text
  assert "<0x" not in decoded or "<0x" in text
  assert UNK_ID not in ids


def test_reserved_ids_are_exactly_pad_unk_bos_eos_mask(tokenizer):
  assert [tokenizer.id_to_piece(i) for i in range(5)] == [
      "<pad>", "<unk>", "<s>", "</s>", "<mask>"]
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id,
          tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3, 4)
  assert tokenizer.id_to_piece(5) == "<0x00>"
  assert tokenizer.id_to_piece(260) == "<0xFF>"
  assert tokenizer.vocab_size == VOCAB


@pytest.mark.parametrize("text", ["<pad>", "<mask>", "<s>", "</s>", "<unk>",
                                  "a<mask>b</s><s>", "<mask> <mask>"])
def test_encoding_never_yields_reserved_ids(tokenizer, text):
  ids = tokenizer.encode(text)
  assert not RESERVED & set(ids)
  assert tokenizer.decode(ids) == text


def test_reserved_ids_never_appear_in_training_text(tokenizer, ascii_texts):
  for text in ascii_texts:
    assert not RESERVED & set(tokenizer.encode(text))


def test_decode_drops_pad_bos_eos_mask(tokenizer):
  ids = tokenizer.encode("It was a truth.")
  noisy = [BOS_ID, *ids[:2], MASK_ID, *ids[2:], EOS_ID, PAD_ID, PAD_ID]
  assert tokenizer.decode(noisy) == "It was a truth."
  assert tokenizer.decode([PAD_ID, BOS_ID, EOS_ID, MASK_ID]) == ""


def test_decode_rejects_ids_outside_vocabulary(tokenizer):
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tokenizer.decode([5, VOCAB])
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tokenizer.decode([-1])


def test_decoding_is_compositional_at_piece_boundaries(tokenizer):
  text = "Mr. Darcy  said, \"Hello 🤗\" to Ümit."
  ids = tokenizer.encode(text)
  for cut in range(len(ids) + 1):
    inside_bytes = 0 < cut < len(ids) and all(
        tokenizer.id_to_piece(i).startswith("<0x") for i in ids[cut - 1:cut + 1])
    if not inside_bytes:
      assert tokenizer.decode(ids[:cut]) + tokenizer.decode(ids[cut:]) == text


def test_vocab_size_below_minimum_raises(ascii_texts):
  with pytest.raises(ValueError, match=f"vocab_size=300 must be >= "
                     f"{MIN_VOCAB_SIZE}"):
    Tokenizer.train(ascii_texts, 300)


def test_vocab_size_too_large_for_texts_raises():
  with pytest.raises(ValueError, match="vocab_size=2000 does not fit"):
    Tokenizer.train(["ab ab", "ba"], 2000)


def test_training_is_deterministic_and_saves_and_loads(ascii_texts, tokenizer,
                                                       tmp_path):
  prefix = str(tmp_path / "tok")
  again = Tokenizer.train(ascii_texts, VOCAB, model_prefix=prefix)
  assert again.model_proto == tokenizer.model_proto
  loaded = Tokenizer.load(prefix + ".model")
  assert loaded.model_proto == tokenizer.model_proto
  assert loaded.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])


def test_load_missing_model_raises(tmp_path):
  with pytest.raises(ValueError, match="path="):
    Tokenizer.load(str(tmp_path / "absent.model"))


def test_load_of_a_file_that_is_not_a_model_raises(tmp_path):
  path = tmp_path / "not_a_tokenizer.model"
  path.write_bytes(b"\x00\x01 not a sentencepiece model")
  with pytest.raises(ValueError, match=r"path=.*not_a_tokenizer.model.* is "
                     r"not a SentencePiece tokenizer model"):
    Tokenizer.load(str(path))


def test_model_with_other_reserved_ids_is_rejected(ascii_texts):
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(ascii_texts), model_writer=model,
      vocab_size=200, minloglevel=2)  # SentencePiece defaults: UNK=0, BOS=1
  with pytest.raises(ValueError, match="expected"):
    Tokenizer.from_proto(model.getvalue())


def test_training_sample_thins_by_a_fixed_stride():
  texts = [f"{i:03d}" for i in range(100)]  # 300 characters
  assert training_sample(texts, max_chars=1000) == texts
  assert training_sample(texts, max_chars=100) == texts[::3]
  assert training_sample(["", "a"], max_chars=10) == ["a"]


def test_training_sample_cuts_long_texts_after_a_space():
  assert training_sample(["ab cd ef", "abcdefg", "a b"], piece_chars=4) == [
      "ab ", "cd ", "ef", "abcd", "efg", "a b"]


def test_trains_on_texts_longer_than_a_sentencepiece_sentence(ascii_texts):
  """Regression: one text over 64 KiB was skipped by SentencePiece, which then
  had no sentence at all ('!sentences_.empty()')."""
  huge = " ".join(ascii_texts)
  assert len(huge.encode()) > 1 << 16
  tokenizer = Tokenizer.train([huge], VOCAB)
  assert tokenizer.decode(tokenizer.encode(huge)) == huge
