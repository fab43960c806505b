"""Tests of lm_decoding.data.parallel_text: reading, book split, encoding,
the prefix-LM layout."""

import gzip

import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.data import parallel_text as pt
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE
from lm_decoding.special_tokens import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture(scope="module")
def pairs():
  return pt.read_pairs()


@pytest.fixture(scope="module")
def tokenizer(pairs):
  return pt.train_tokenizer(pt.split_pairs(pairs)["train"][:400],
                            MIN_VOCAB_SIZE + 100)


def test_split_is_by_whole_book_deterministic_and_disjoint(pairs):
  first, again = pt.split_pairs(pairs), pt.split_pairs(list(pairs))
  assert first == again
  references = {name: {p.reference for p in split}
                for name, split in first.items()}
  assert sum(len(r) for r in references.values()) == len(pairs)
  assert not references["train"] & references["valid"]
  assert not references["train"] & references["test"]
  assert not references["valid"] & references["test"]
  books = {name: {p.group for p in split} for name, split in first.items()}
  assert books["valid"] == set(pt.VALID_BOOKS)
  assert books["test"] == set(pt.TEST_BOOKS)
  assert not books["train"] & (books["valid"] | books["test"])
  assert len(books["train"]) == 66 - 8


def test_book_of_numbered_book():
  assert pt.Pair("1 Peter 2:3", "a", "b").group == "1 Peter"


def test_read_pairs_rejects_a_malformed_line(tmp_path):
  path = tmp_path / "bad.tsv.gz"
  path.write_bytes(gzip.compress(
      "Ruth 1:1\ta\tb\nRuth 1:2\tonly two\n".encode(), mtime=0))
  with pytest.raises(ValueError, match=r"bad.tsv.gz:2"):
    pt.read_pairs(path)


def test_encode_text_rejects_empty_and_long_sources(tokenizer):
  with pytest.raises(ValueError, match="source is empty.*max_source_tokens=8"):
    pt.encode_text(tokenizer, "  ", 8)
  long = "In the beginning God created the heaven and the earth. " * 3
  with pytest.raises(ValueError, match="limit is max_source_tokens=8"):
    pt.encode_text(tokenizer, long, 8)
  assert pt.encode_text(tokenizer, "God", 8) == tokenizer.encode("God")


def test_encode_pairs_drops_pairs_over_the_limits(pairs, tokenizer):
  some = pairs[:50]
  encoded = pt.encode_pairs(tokenizer, some, 60, 70)
  expect = [p for p in some if len(tokenizer.encode(p.source)) <= 60
            and len(tokenizer.encode(p.target)) <= 70]
  assert list(encoded.pairs) == expect
  assert encoded.dropped == len(some) - len(expect)
  for i, pair in enumerate(encoded.pairs):
    n, m = encoded.source_lengths[i], encoded.target_lengths[i]
    assert tokenizer.decode(encoded.source[i, :n]) == pair.source
    assert tokenizer.decode(encoded.target[i, :m]) == pair.target
    assert (encoded.source[i, n:] == PAD_ID).all()
  with pytest.raises(ValueError, match="max_target_tokens=0"):
    pt.encode_pairs(tokenizer, some, 20, 0)


def test_layout_prompts_and_lengths_agree(pairs, tokenizer):
  encoded = pt.encode_pairs(tokenizer, pairs[:30], 80, 80)
  rows = pt.layout(encoded)
  prefix, target = pt.prefix_and_target_lengths(jnp.asarray(rows))
  np.testing.assert_array_equal(prefix, encoded.source_lengths + 1)
  np.testing.assert_array_equal(target, encoded.target_lengths)
  prompts, prompt_lengths = pt.prompts(encoded)
  np.testing.assert_array_equal(prompt_lengths, prefix)
  for i in range(len(rows)):
    p, t = prefix[i], target[i]
    np.testing.assert_array_equal(rows[i, :p], prompts[i, :p])
    assert rows[i, p - 1] == BOS_ID and rows[i, p + t] == EOS_ID
    np.testing.assert_array_equal(rows[i, p:p + t],
                                  encoded.target[i, :t])
    assert (rows[i, p + t + 1:] == PAD_ID).all()
