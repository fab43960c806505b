"""The shipped translation set (lm_decoding/pretrained/translation): every
member matches configs/translation.py, loads with its manifest, and
translates test verses."""

import os
import sys

import jax
import numpy as np
import pytest

from lm_decoding.data import parallel_text as pt
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import sampling
from lm_decoding.decoding.autoregressive import AutoregressiveDecoder
from lm_decoding.decoding.ctc import CTCDecoder
from lm_decoding.decoding.mask_predict import MaskPredictDecoder
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import distillation, train
from lm_decoding.training.pretrained import member_recipes, recipes, store

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import translation  # noqa: E402

CONFIG = translation.get_config()
MEMBERS = member_recipes.translation_member_configs(CONFIG)
SET = member_recipes.TRANSLATION_DIR
N = 3  # test verses decoded
# The outputs recorded in experiments/results/translation/report.md
# (Samples) for the shipped models (2000 steps each).
EXPECTED = {
    "translation_ar": [
        "Y HABLÓ el rey de Jehová á Moisés, diciendo:",
        "Al Hijo, y décima, y conocimiento de su carne.",
        "Mas Jehová se olvió en la mar, y cada uno se lloró en la mar, que "
        "el santro."],
    "cmlm": [
        "Y el Jehová" + " de" * 11 + " Jehová de diciendo:",
        "Ysssss" + "," * 20 + " su sus.",
        "Y el" + " de" * 5 + "," * 15 + " de" * 17 + " des."],
    "ctc": [
        "Y palabra de á Jo hijo de Ami, diciendo:",
        "Ata, á N, grande ciudad, y clamo contra ella; porque su maldad "
        "delante de.",
        "Mas envió en la mar, y en la mar, la  como."],
    "cmlm_distilled": [
        "Y los" + " de" * 19 + " Jehová.",
        "Al oo  ,,,   ,,,  y y, y y ylll sus.",
        "Mas el  ss" + " " * 29 + "lts."],
    "ctc_distilled": [
        "Y fué palabra de Jehová á Jo hijo de Jo, diciendo:",
        "Al , y, y ó, su carne.",
        "Mas Jehová  en la, y se  en, que el ó."]}


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer.load(str(SET / recipes.TOKENIZER_FILE))


@pytest.fixture(scope="module")
def held_out_pairs(tokenizer):
  test = pt.split_pairs(pt.read_pairs())["test"][:40]
  return pt.encode_pairs(tokenizer, test, CONFIG.data.max_source_tokens,
                         CONFIG.data.max_target_tokens)


def test_set_is_small_and_holds_every_member():
  sizes = {}
  for path in SET.rglob("*"):
    if path.is_file():
      sizes[path] = path.stat().st_size
  assert sum(sizes.values()) < 15e6
  assert {p.parent.name for p in SET.glob("*/manifest.json")} == set(MEMBERS)


def _decoder(objective):
  limit = CONFIG.data.max_target_tokens
  if objective == "translation_ar":
    return AutoregressiveDecoder(
        sampling=sampling.SamplingConfig(temperature=0.0),
        output_length=limit + 1, eos_ids=(EOS_ID,), pad_id=PAD_ID,
        prompt_attention="bidirectional")
  if objective == "cmlm":
    return MaskPredictDecoder(output_length=limit, steps=1, length_beam=1,
                              lengths="head")
  return CTCDecoder(output_length=limit + 1,
                    upsample=CONFIG.train.ctc_upsample)


@pytest.mark.parametrize("name", list(MEMBERS))
def test_member_loads_with_its_manifest_and_translates(name, tokenizer,
                                                       held_out_pairs):
  member = MEMBERS[name]
  params, reason = store.find(member, name, tokenizer, SET)
  assert params is not None, reason
  manifest = recipes.read_manifest(name, SET)
  assert manifest["command"].startswith("python experiments/translate.py")
  assert manifest["stored_dtype"] == "bfloat16"
  assert manifest["recipe"]["train"]["num_steps"] == CONFIG.train.num_steps
  steps = manifest["metrics"]["steps"]
  assert steps == CONFIG.train.num_steps or (
      steps < CONFIG.train.num_steps
      and manifest["metrics"]["stopped_early"].startswith(
          f"stopped at step {steps} of"))
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype("float32")}
  model = Model(make_logits_fn(train.model_config(member)), params)
  prompts, lengths = pt.prompts(held_out_pairs)
  tokens, _ = distillation.translate_all(
      _decoder(member.train.objective), model, prompts[:N], lengths[:N], N)
  hypotheses, _ = distillation.texts(tokenizer, tokens)
  assert hypotheses == EXPECTED[name]
