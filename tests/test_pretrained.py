"""Tests of lm_decoding.training.pretrained: why a shipped member is not used."""

from __future__ import annotations

import json

import ml_collections
import pytest

from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE, Tokenizer
from lm_decoding.training import pretrained


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer.train(corpus.load_paragraphs(None)[:200], MIN_VOCAB_SIZE)


def make_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      seed=0,
      data=dict(path="", vocab_size=MIN_VOCAB_SIZE, seq_len=16,
                format="auto"),
      model=dict(d_model=128, num_layers=1, num_heads=2, num_kv_heads=2,
                 head_dim=16, mlp_dim=64, max_len=16),
      train=dict(objective="ar", batch_size=2, num_steps=2)))


@pytest.fixture()
def shipped(tmp_path, tokenizer):
  """A one-member set ('ar') whose manifest records `make_config()`."""
  member = tmp_path / "set" / "ar"
  member.mkdir(parents=True)
  manifest = {"name": "ar", "commit": "0" * 40,
              "recipe": pretrained.recipe(make_config()),
              "tokenizer_sha256": pretrained.tokenizer_sha256(tokenizer)}
  (member / pretrained.MANIFEST_FILE).write_text(json.dumps(manifest))
  return member.parent


def test_config_mismatch_names_every_differing_key(shipped, tokenizer):
  config = make_config()
  config.model.d_model = 256
  config.train.num_steps = 3
  del config.data["format"]
  config.data.extra = [1, 2]
  params, reason = pretrained.find(config, "ar", tokenizer, shipped)
  assert params is None
  assert reason == (
      "pretrained 'ar' was trained with another config (data.extra: shipped "
      "(absent), requested [1, 2]; data.format: shipped \"auto\", requested "
      "(absent); model.d_model: shipped 128, requested 256; train.num_steps: "
      "shipped 2, requested 3)")


def test_tokenizer_mismatch_names_both_digests(shipped, tokenizer):
  other = Tokenizer.train(corpus.load_paragraphs(None)[200:400],
                          MIN_VOCAB_SIZE)
  params, reason = pretrained.find(make_config(), "ar", other, shipped)
  assert params is None
  assert reason.startswith("pretrained 'ar' was trained with another "
                           f"tokenizer (sha256 "
                           f"{pretrained.tokenizer_sha256(tokenizer)[:12]}, "
                           f"here {pretrained.tokenizer_sha256(other)[:12]}")


def test_recipe_differences():
  shipped = {"seed": 0, "model": {"d_model": 128, "norm": "rmsnorm"},
             "train": {}}
  assert pretrained.recipe_differences(shipped, shipped) == []
  assert pretrained.recipe_differences(
      shipped, {"seed": 0, "model": {"d_model": 128, "norm": "layernorm"},
                "train": {"lr": 0.1}}) == [
                    'model.norm: shipped "rmsnorm", requested "layernorm"',
                    "train: shipped {}, requested (absent)",
                    "train.lr: shipped (absent), requested 0.1"]
  assert pretrained.recipe_differences({}, {"seed": 1}) == [
      "seed: shipped (absent), requested 1"]
