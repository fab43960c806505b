"""Hugging Face tokenizer.json behind the project's tokenizer interface
(lm_decoding/data/hf_tokenizer.py), checked against transformers' own
tokenizer on the same files: ids, decoding, the chat template's text."""

import pathlib

import numpy as np
import pytest

from lm_decoding.data import hf_tokenizer
from lm_decoding.data.hf_tokenizer import HFTokenizer, load_tokenizer
from lm_decoding.data.tokenizer import Tokenizer

import _hub_folders
import transformers  # noqa: E402  (the [peer] extra: fails, never skips)

SHIPPED = pathlib.Path(__file__).parents[1] / "lm_decoding" / "pretrained"
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  _hub_folders.write_tokenizer(str(path))
  return path


def test_matches_transformers_on_the_same_files(folder):
  ours = HFTokenizer.load(folder)
  theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
  text = "Tom has 3 apples<|im_end|> and déjà vu 🙂\n  x"
  assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
  ids = ours.encode(text)
  assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
  assert ours.decode(np.asarray(ids)) == ours.decode(ids)
  assert ours.vocab_size == len(theirs)
  assert ours.eos_id == theirs.eos_token_id == ours.token_id("<|im_end|>")
  for prompt in (True, False):
    assert ours.apply_chat_template(
        MESSAGES, add_generation_prompt=prompt) == theirs.apply_chat_template(
            MESSAGES, add_generation_prompt=prompt, tokenize=False)
  # '<|im_end|>' (eos) then the other end tokens the vocabulary has.
  assert ours.end_ids() == (ours.token_id("<|im_end|>"),
                            ours.token_id("<|endoftext|>"))


def test_one_interface_for_both_kinds(folder, tmp_path):
  assert isinstance(load_tokenizer(folder), HFTokenizer)
  assert isinstance(load_tokenizer(folder / "tokenizer.json"), HFTokenizer)
  sp_path = SHIPPED / "tokenizer.model"  # the shipped sets' sentencepiece
  assert isinstance(load_tokenizer(sp_path), Tokenizer)
  for tok in (load_tokenizer(sp_path), load_tokenizer(folder)):
    ids = tok.encode("Tom has 3 apples")
    assert tok.decode(ids) == "Tom has 3 apples"
    assert isinstance(tok.vocab_size, int) and tok.eos_id is not None
  with pytest.raises(ValueError, match="neither a sentencepiece"):
    load_tokenizer(tmp_path)


def test_template_errors_and_missing_templates_are_named(tmp_path):
  _hub_folders.write_tokenizer(str(tmp_path), chat_template=None)
  tok = HFTokenizer.load(tmp_path)
  with pytest.raises(ValueError, match="has no chat template"):
    tok.apply_chat_template(MESSAGES)
  with pytest.raises(ValueError, match="chat template: no system role"):
    hf_tokenizer.render_chat_template(
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('no system role') }}{% endif %}",
        messages=MESSAGES)
  with pytest.raises(ValueError, match="ids \\[-1\\] are negative"):
    tok.decode([-1])
  # A model's padded embedding rows past the tokenizer decode to nothing.
  assert tok.decode(tok.encode("3 apples") + [9999]) == "3 apples"
  with pytest.raises(ValueError, match="holds no tokenizer.json"):
    HFTokenizer.load(tmp_path / "nothing")
