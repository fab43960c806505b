"""Tests of dParallel's certainty-forcing loss
(lm_decoding/training/objectives/certainty_forcing.py) and its data set
(lm_decoding/training/self_distillation.py)."""

from __future__ import annotations

import functools
import json
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base
from lm_decoding.config_reference import load_config
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model, TransformerConfig, make_logits_fn
from lm_decoding.models.diffusion import subs_log_probs
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID
from lm_decoding.training import data_sources
from lm_decoding.training import self_distillation as sd
from lm_decoding.training import train
from lm_decoding.training import train_step
from lm_decoding.training.checkpoints import CheckpointError
from lm_decoding.training.objectives import certainty_forcing as cf
from lm_decoding.training.objectives import registry
from lm_decoding.training.pretrained import loading
from lm_decoding.training.pretrained.recipes import DEFAULT_DIR as PRETRAINED
from lm_decoding.training.objectives.bd3lm import bd3lm_logits

PARENT = TransformerConfig(vocab_size=32, d_model=32, num_layers=1,
                           num_heads=2, num_kv_heads=2, head_dim=16,
                           mlp_dim=64, max_len=40, attention="causal")
STUDENT = PARENT.replace(attention="bidirectional", token_shift=True)
PARAMS = stubs.random_params(PARENT)
DISTILL = pathlib.Path(__file__).parents[1] / "configs" / "distill.py"
# A causal teacher of the student's vocabulary, and rows [prefix 8 | 16].
PARENT_TEACHER = functools.partial(cf.next_token_log_probs,
                                   make_logits_fn(PARENT),
                                   stubs.random_params(PARENT, seed=1))
ROWS = jax.random.randint(jax.random.key(3), (2, 24), 5, 32)


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_terms_equal_their_definition_on_a_hand_example():
  # Vocabulary 6 (MASK = 4 is excluded from every softmax). Row 0: positions
  # 0 (masked, argmax right), 1 (masked, argmax wrong), 2 (not masked).
  logits = np.zeros((1, 3, 6), np.float32)
  logits[0, 0] = [0.1, 2.0, 0.3, 0.0, 50.0, -1.0]  # argmax (no MASK) = 1
  logits[0, 1] = [1.5, 0.2, 0.0, 0.7, 50.0, 0.4]   # argmax = 0
  logits[0, 2] = [3.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  x0 = np.array([[1, 5, 0]], np.int32)
  masked = np.array([[True, True, False]])
  loss, metrics = cf.certainty_forcing_terms(
      jnp.asarray(logits), jnp.asarray(x0), jnp.asarray(masked))
  keep = [0, 1, 2, 3, 5]
  ce = np.mean([-_log_softmax(logits[0, i, keep])[keep.index(x0[0, i])]
                for i in (0, 1)])
  log_q = _log_softmax(logits[0, 0, keep] / 0.5)  # only position 0 is right
  entropy = -(np.exp(log_q) * log_q).sum()
  np.testing.assert_allclose(float(metrics["ce"]), ce, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["entropy"]), entropy, rtol=1e-5)
  np.testing.assert_allclose(float(loss), ce + 2.0 * entropy, rtol=1e-5)
  assert float(metrics["correct"]) == 0.5 and int(metrics["tokens"]) == 2


def test_no_correct_position_gives_no_entropy_term():
  logits = jnp.zeros((1, 2, 6)).at[0, :, 0].set(5.0)  # always predicts 0
  loss, metrics = cf.certainty_forcing_terms(
      logits, jnp.array([[1, 2]]), jnp.array([[True, True]]))
  assert float(metrics["entropy"]) == 0.0
  np.testing.assert_allclose(float(loss), float(metrics["ce"]))


def test_masks_follow_the_recipe():
  x0 = jax.random.randint(jax.random.key(0), (64, 48), 5, 32).at[3, 40:].set(
      PAD_ID)
  masks = np.asarray(cf.semi_ar_masks(jax.random.key(1), x0, 16, True))
  first, second = masks[:64], masks[64:]
  maskable = (np.asarray(x0) != PAD_ID) & (np.arange(48) >= 16)[None]
  assert not masks[:, :16].any()  # the prefix is never masked
  assert not masks[3, 40:].any() and not masks[67, 40:].any()  # nor PAD
  np.testing.assert_array_equal(first ^ second, maskable)  # complementary
  assert not (first & second).any()
  rate = first[maskable].mean()
  assert abs(rate - 0.5) < 4 * np.sqrt(0.25 / maskable.sum())
  single = cf.semi_ar_masks(jax.random.key(1), x0, 16, True,
                            complementary=False)
  np.testing.assert_array_equal(np.asarray(single), first)
  # Under a token shift token 0 is never masked even without a prefix.
  assert not np.asarray(cf.semi_ar_masks(jax.random.key(2), x0, 0, True))[
      :, 0].any()


def test_left_to_right_masks_are_block_suffixes_with_uniform_cuts():
  """d3LLM's trajectory states for a left-to-right teacher: in every block
  of every row the masked positions are the maskable ones from a cut on,
  the cut uniform over the block's W offsets (chi-square), PAD and the
  prefix never masked."""
  width, block = 64, 8
  x0 = jax.random.randint(jax.random.key(0), (400, width), 5, 32).at[
      3, 45:].set(PAD_ID)
  masks = np.asarray(cf.semi_ar_masks(
      jax.random.key(1), x0, 16, True, complementary=False,
      order="left_to_right", block_length=block))
  assert masks.shape == (400, width)
  assert not masks[:, :16].any() and not masks[3, 45:].any()
  blocks = masks[:, 16:].reshape(400, -1, block)
  full = np.delete(blocks, 3, axis=0)  # rows without PAD
  cuts = block - full.sum(-1)  # masked suffix length W - k
  suffix = np.arange(block)[None, None, :] >= cuts[..., None]
  np.testing.assert_array_equal(full, suffix)
  counts = np.bincount(cuts.ravel(), minlength=block)
  expected = cuts.size / block
  chi2 = ((counts - expected) ** 2 / expected).sum()
  assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001
  # A prefix of 20 ends inside block 2 (16-23): its states (first masked
  # position 20-23) are equally likely, none of them drawn 5 times as often.
  ragged = np.asarray(cf.semi_ar_masks(
      jax.random.key(2), x0, 20, True, complementary=False,
      order="left_to_right", block_length=block))[:, 16:24]
  assert not ragged[:, :4].any()
  counts = np.bincount(ragged.argmax(1) + 16, minlength=24)[20:]
  chi2 = ((counts - 100) ** 2 / 100).sum()
  assert chi2 < 16.3  # chi-square, 3 degrees of freedom, p = 0.001
  with pytest.raises(ValueError, match="complementary"):
    cf.semi_ar_masks(jax.random.key(1), x0, 16, True, order="left_to_right",
                     block_length=block)
  with pytest.raises(ValueError, match="block_length"):
    cf.semi_ar_masks(jax.random.key(1), x0, 16, True, complementary=False,
                     order="left_to_right", block_length=7)
  with pytest.raises(ValueError, match="mask_order='shuffled' must be one"):
    cf.semi_ar_masks(jax.random.key(1), x0, 16, True, order="shuffled")


def test_check_config_refuses_a_mask_order_it_cannot_train():
  """train.mask_order is checked with the config, before any data is read
  or step traced: an unknown order, 'left_to_right' beside the shipped
  recipe's complementary masks, and a trajectory order for an objective
  that would ignore it (bd3lm, a task's certainty forcing)."""
  config = load_config(DISTILL)  # complementary_masks=True, mask_order random
  train.check_config(config)
  for order, complementary, match in (
      ("shuffled", False, "train.mask_order='shuffled' must be one of"),
      ("left_to_right", True, "train.mask_order='left_to_right' takes no "
                              "complementary rows")):
    config.train.update(dict(mask_order=order,
                             complementary_masks=complementary))
    with pytest.raises(ValueError, match=match):
      train.check_config(config)
  config.train.complementary_masks = False
  train.check_config(config)  # left_to_right without complementary rows
  # A checkpoint trained on other masks is not resumed as this run.
  assert registry.fingerprint(config)["mask_order"] == "left_to_right"
  assert registry.fingerprint(load_config(DISTILL))["mask_order"] == "random"
  config.train.objective = "bd3lm"
  with pytest.raises(ValueError, match="applies to train.objective "
                                       "'certainty_forcing'.*'bd3lm'"):
    train.check_config(config)
  config.train.objective, config.data.source = "certainty_forcing", "task"
  with pytest.raises(ValueError, match="'task_certainty_forcing'"):
    registry.check_options(config)
  config.train.mask_order = "random"  # the default: every objective's
  registry.check_options(config)


def test_the_mask_order_reaches_the_loss():
  logits_fn = make_logits_fn(STUDENT)
  tokens = ROWS
  key = jax.random.key(4)
  loss, metrics = cf.certainty_forcing_loss(
      logits_fn, PARAMS, tokens, key, block_length=8, prompt_length=8,
      complementary=False, mask_order="left_to_right")
  masked = cf.semi_ar_masks(key, tokens, 8, True, complementary=False,
                            order="left_to_right", block_length=8)
  logits = bd3lm_logits(logits_fn, PARAMS, tokens,
                         jnp.where(masked, MASK_ID, tokens), 8)
  expected, _ = cf.certainty_forcing_terms(logits, tokens, masked)
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
  assert int(metrics["tokens"]) == int(masked.sum())
  wired = train_step.objective_loss("certainty_forcing", 8, prompt_length=8,
                                    complementary=False,
                                    mask_order="left_to_right")
  np.testing.assert_allclose(
      float(wired(logits_fn, PARAMS, tokens, key)[0]), float(loss),
      rtol=1e-6)


def test_loss_is_the_terms_on_the_bd3lm_layout_and_hides_later_blocks():
  """The loss equals `certainty_forcing_terms` of the logits of the masked
  rows in the BD3-LM layout, and a block's loss ignores the blocks after
  it: changing the last block's tokens leaves block 1's terms unchanged."""
  logits_fn = make_logits_fn(STUDENT)
  tokens = ROWS
  key = jax.random.key(4)
  loss, metrics = cf.certainty_forcing_loss(
      logits_fn, PARAMS, tokens, key, block_length=8, prompt_length=8)
  masked = cf.semi_ar_masks(key, tokens, 8, True)
  x0 = jnp.tile(tokens, (2, 1))
  logits = bd3lm_logits(logits_fn, PARAMS, x0,
                         jnp.where(masked, MASK_ID, x0), 8)
  expected, _ = cf.certainty_forcing_terms(logits, x0, masked)
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
  assert int(metrics["tokens"]) == 2 * 16  # every continuation token once
  only_block1 = masked & (jnp.arange(24) < 16)[None]
  changed = tokens.at[:, 17:].set(7)  # the last block (16..23), past its
  x0c = jnp.tile(changed, (2, 1))     # first token (predicted from 15)
  logits_c = bd3lm_logits(logits_fn, PARAMS, x0c,
                           jnp.where(masked, MASK_ID, x0c), 8)
  a, _ = cf.certainty_forcing_terms(logits, x0, only_block1)
  b, _ = cf.certainty_forcing_terms(logits_c, x0c, only_block1)
  np.testing.assert_allclose(float(a), float(b), rtol=1e-6)


def test_gradients_flow():
  logits_fn = make_logits_fn(STUDENT)
  tokens = jax.random.randint(jax.random.key(5), (2, 16), 5, 32).at[1, 13:].set(
      PAD_ID)
  loss_fn = functools.partial(cf.certainty_forcing_loss, logits_fn,
                              block_length=4, prompt_length=4)
  (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      PARAMS, tokens, jax.random.key(6))
  assert np.isfinite(float(loss)) and float(loss) > 0
  norms = [float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads)]
  assert all(np.isfinite(norms)) and sum(norms) > 0


def test_bad_options_raise():
  logits_fn = make_logits_fn(STUDENT)
  tokens = jnp.full((1, 16), 5, jnp.int32)
  for kwargs, match in (({"block_length": 5}, "block_length"),
                        ({"block_length": 4, "prompt_length": 16},
                         "prompt_length"),
                        ({"block_length": 4, "weight": -1.0}, "weight"),
                        ({"block_length": 4, "temperature": 0.0},
                         "temperature"),
                        ({"block_length": 4, "mask_rate": 1.0}, "mask_rate")):
    with pytest.raises(ValueError, match=match):
      cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, jax.random.key(0),
                                **kwargs)
  with pytest.raises(ValueError, match="certainty_forcing_loss"):
    cf.certainty_forcing_loss(make_logits_fn(PARENT), PARAMS, tokens,
                              jax.random.key(0), block_length=4)


def test_data_generation_is_deterministic_for_a_seed(tmp_path):
  stream = (5 + np.arange(200) % 27).astype(np.int32)  # no reserved id
  prefixes = sd.distillation_prefixes(stream, 6, 5, seed=0)
  np.testing.assert_array_equal(prefixes,
                                sd.distillation_prefixes(stream, 6, 5, seed=0))
  assert not np.array_equal(prefixes,
                            sd.distillation_prefixes(stream, 6, 5, seed=1))
  assert prefixes.shape == (5, 6)
  positions = sd.distillation_prefixes(np.arange(200), 6, 33, seed=0)
  assert len(set(positions[:, 0])) == 33  # no prefix drawn twice
  assert set(positions[:, 0] % 6) == {0}  # cut at multiples of P
  np.testing.assert_array_equal(  # the records' draws (before `at`) stand
      positions[:, 0], np.random.default_rng(0).choice(33, 33, False) * 6)
  teacher = Model(make_logits_fn(PARENT), PARAMS)
  decoders = {f"t={t}": base.make_decoder(
      "ar", output_length=8, sampling=SamplingConfig(
          temperature=t, suppress_ids=sd.UNTARGETED_IDS))
              for t in (0.0, 1.0)}
  runs = [sd.timed_continuations(decoders, teacher, prefixes,
                                 jax.random.key(seed), batch_size=2)[0]
          for seed in (0, 0, 1)]
  np.testing.assert_array_equal(runs[0], runs[1])
  assert runs[0].shape == (10, 14)
  np.testing.assert_array_equal(runs[0][:5, :6], prefixes)
  np.testing.assert_array_equal(runs[0][:5], runs[2][:5])  # greedy: no key
  assert not np.array_equal(runs[0][5:], runs[2][5:])  # sampled: the key
  # Rows decode alike in any batch: chunks of 2 (padded) or all at once.
  greedy = sd.teacher_continuations(decoders["t=0.0"], teacher, prefixes,
                                    jax.random.key(0), batch_size=5)
  np.testing.assert_array_equal(greedy, runs[0][:5])
  out = sd.write_distillation_set(tmp_path / "set", runs[0], {"teacher": "x"})
  tokens, manifest = sd.read_distillation_set(out)
  np.testing.assert_array_equal(tokens, runs[0])
  assert manifest["rows"] == 10 and manifest["teacher"] == "x"
  with pytest.raises(ValueError, match="distillation_set"):
    sd.read_distillation_set(tmp_path / "none")
  with pytest.raises(ValueError, match="count"):
    sd.distillation_prefixes(stream, 6, 40, seed=0)


@pytest.mark.parametrize("entries, match", [
    (["0", "abc"], "--temperatures entry 'abc' must be a number"),
    (["0", ""], "--temperatures entry '' must be a number"),
    (["-0.5"], "--temperatures entry '-0.5' must be a number in"),
    (["nan"], "entry 'nan'"), (["inf"], "entry 'inf'"), ([], "at least one"),
    # Greedy entries (0, -0, a temperature below the greedy floor) repeat
    # the same rows: one at most.
    (["0", "0.7", "0"], "2 greedy entries"), (["0", "-0"], "2 greedy"),
    (["0", "1e-39"], "2 greedy"), (["0.0", "1e-30", "0.5"], "2 greedy")])
def test_teacher_temperatures_are_refused_naming_the_flag(entries, match):
  with pytest.raises(ValueError, match=match):
    sd.temperature_labels(entries)


def test_repeated_teacher_temperatures_get_distinct_labels():
  # The records' labels stand ('sample <index in the list>'); a repeat is
  # found by value, so '0.7' and '0.70' are labelled as samples too.
  assert sd.temperature_labels(["0", "0.7", "0.7", "0.7"]) == {
      "temperature=0": 0.0, "temperature=0.7 sample 1": 0.7,
      "temperature=0.7 sample 2": 0.7, "temperature=0.7 sample 3": 0.7}
  assert list(sd.temperature_labels(["0.7", "1", "0.70"])) == [
      "temperature=0.7 sample 0", "temperature=1",
      "temperature=0.70 sample 2"]


@pytest.mark.parametrize("temperatures, match", [
    ("0,abc", "--temperatures entry 'abc'"), ("0,0", "2 greedy entries")])
def test_distill_data_refuses_bad_temperatures_before_any_work(
    tmp_path, temperatures, match):
  root = pathlib.Path(__file__).resolve().parents[1]
  proc = subprocess.run(
      [sys.executable, str(root / "experiments" / "distill_data.py"),
       f"--config={root / 'configs' / 'tiny.py'}",
       f"--set_dir={root / 'lm_decoding' / 'pretrained'}",
       f"--temperatures={temperatures}", "--num_prefixes=2",
       "--output_length=4", f"--out={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=120, cwd=root)
  lines = [line for line in (proc.stdout + proc.stderr).splitlines()
           if line.strip()]
  assert proc.returncode != 0 and len(lines) == 1, lines
  assert "distill_data: error:" in lines[0] and match in lines[0], lines[0]
  assert not (tmp_path / "out").exists()  # nothing read nor written


def test_no_distillation_row_holds_mask(tmp_path):
  # An AR model gives MASK a small but nonzero probability (3 draws in
  # 196,637 tokens of the base parent at temperature 1); as a target MASK
  # scores SUBS's finite log 0, a loss near 1e35. Here a stub makes it the
  # likeliest token: the teacher's decoder must never draw it (nor PAD),
  # and a set holding it is neither written nor read.
  stub = stubs.TableLogitsFn.random(0, 32, 16)
  stub.table[..., MASK_ID] = 5.0
  teacher = Model(stub, None)
  prefixes = np.full((4, 4), 9, np.int32)
  rows = {ids: sd.teacher_continuations(base.make_decoder(
      "ar", output_length=12, sampling=SamplingConfig(
          temperature=1.0, suppress_ids=ids)), teacher, prefixes,
      jax.random.key(0), batch_size=4) for ids in ((), sd.UNTARGETED_IDS)}
  assert (rows[()] == MASK_ID).any()
  drawn = rows[sd.UNTARGETED_IDS][:, 4:]
  assert not (drawn == MASK_ID).any()  # and PAD only after a row's EOS:
  assert not ((drawn == PAD_ID) & (np.cumsum(drawn == EOS_ID, 1) == 0)).any()
  with pytest.raises(ValueError, match=r"row\(s\) hold the MASK id 4"):
    sd.write_distillation_set(tmp_path / "bad", rows[()], {})
  assert not (tmp_path / "bad").exists()
  out = sd.write_distillation_set(tmp_path / "set",
                                  rows[sd.UNTARGETED_IDS], {})
  np.save(out / sd.TOKENS_FILE, rows[()])  # a set written before the check
  with pytest.raises(ValueError, match="data.distillation_set=.*rows \\["):
    sd.read_distillation_set(out)


def test_document_start_prefixes_are_the_starts_of_long_enough_documents():
  # Documents of 7, 3, 9 and 6 ids, each ended by EOS.
  lengths = (7, 3, 9, 6)
  stream = np.concatenate([np.r_[np.full(n, 10 + d), EOS_ID]
                           for d, n in enumerate(lengths)]).astype(np.int32)
  prefixes = sd.distillation_prefixes(stream, 6, 3, seed=0,
                                      at="document_starts")
  # Every document but the 3-id one, each once, never across an EOS.
  assert sorted(prefixes[:, 0]) == [10, 12, 13]
  np.testing.assert_array_equal(prefixes, prefixes[:, :1].repeat(6, 1))
  with pytest.raises(ValueError, match="count=4 .* holds 3"):
    sd.distillation_prefixes(stream, 6, 4, seed=0, at="document_starts")
  with pytest.raises(ValueError, match="at='middles'"):
    sd.distillation_prefixes(stream, 6, 1, seed=0, at="middles")


def test_train_wires_the_objective():
  assert "certainty_forcing" in train.OBJECTIVES
  loss = train_step.objective_loss("certainty_forcing", 4, prompt_length=4)
  tokens = jax.random.randint(jax.random.key(7), (2, 16), 5, 32)
  direct, _ = cf.certainty_forcing_loss(
      make_logits_fn(STUDENT), PARAMS, tokens, jax.random.key(8),
      block_length=4, prompt_length=4)
  wired, _ = loss(make_logits_fn(STUDENT), PARAMS, tokens, jax.random.key(8))
  np.testing.assert_allclose(float(wired), float(direct))


@pytest.mark.parametrize("block_length", [1, 2, 4, 8])
def test_eos_filled_ends_the_eos_block_and_nothing_else(block_length):
  rng = np.random.default_rng(block_length)
  length = 16
  rows = []
  for end in range(length + 1):  # the EOS at end - 1; none when end = 0
    row = rng.integers(5, 32, length)
    row[:2] = (EOS_ID, 7)  # an EOS inside the prefix changes nothing
    if 2 < end:
      row[end - 1], row[end:] = EOS_ID, PAD_ID
    rows.append(row)
  rows.append(np.r_[rng.integers(5, 32, 4), [PAD_ID] * 12])  # PAD, no EOS
  tokens = np.stack(rows).astype(np.int32)
  filled = sd.eos_filled(tokens, block_length)
  assert filled.dtype == np.int32
  changed = filled != tokens
  np.testing.assert_array_equal(filled[changed], EOS_ID)  # only PAD -> EOS
  assert (tokens[changed] == PAD_ID).all()
  for row, new in zip(tokens, filled):
    pads = np.flatnonzero(row == PAD_ID)
    if not len(pads) or row[pads[0] - 1] != EOS_ID:
      np.testing.assert_array_equal(new, row)
      continue
    eos_block = (pads[0] - 1) // block_length
    block_of = np.arange(length) // block_length
    np.testing.assert_array_equal(
        new[pads], np.where(block_of[pads] == eos_block, EOS_ID, PAD_ID))
  with pytest.raises(ValueError, match="block_length"):
    sd.eos_filled(tokens, 0)


def test_check_config_refuses_an_eos_fill_it_would_not_apply():
  """A truthy non-bool (the string 'False') would fill the rows; True with
  no distillation set, or for an objective that reads none, would fill
  nothing."""
  config = load_config(DISTILL)
  for value in ("False", 1):
    config.data = ml_collections.ConfigDict(
        {**config.data.to_dict(), "eos_fill": value})
    with pytest.raises(ValueError,
                       match=f"data.eos_fill={value!r} must be True or False"):
      train.check_config(config)
  config = load_config(DISTILL)
  config.data.eos_fill = True
  with pytest.raises(ValueError, match="data.eos_fill=True fills the rows "
                                       ".*distillation_set=''"):
    train.check_config(config)
  config.data.distillation_set = "/a/set"
  data_sources.check(config)
  config.train.objective = "bd3lm"
  with pytest.raises(ValueError, match="got 'bd3lm'"):
    train.check_config(config)


def test_eos_fill_reaches_the_training_rows(tmp_path, monkeypatch):
  rows = np.array([[9, 9, 9, 9, 8, EOS_ID, PAD_ID, PAD_ID]] * 2, np.int32)
  sd.write_distillation_set(tmp_path / "set", rows, {})
  monkeypatch.setattr(data_sources, "text",
                      lambda config, data_dir: ("corpus", None, "valid"))
  config = ml_collections.ConfigDict(
      {"data": {"distillation_set": str(tmp_path / "set"), "seq_len": 8},
       "train": {"block_length": 4}})
  assert (data_sources.distillation(config, "")[1] == rows).all()
  config.data.eos_fill = True
  np.testing.assert_array_equal(
      data_sources.distillation(config, "")[1][0],
      [9, 9, 9, 9, 8, EOS_ID, EOS_ID, EOS_ID])


def test_the_sets_prefix_length_must_be_the_prompt_length(tmp_path,
                                                         monkeypatch):
  rows = np.full((2, 8), 9, np.int32)
  sd.write_distillation_set(tmp_path / "set", rows, {"prompt_length": 4})
  monkeypatch.setattr(data_sources, "text",
                      lambda config, data_dir: ("corpus", None, "valid"))
  config = ml_collections.ConfigDict(
      {"data": {"distillation_set": str(tmp_path / "set"), "seq_len": 8},
       "train": {"block_length": 4, "prompt_length": 4}})
  assert (data_sources.distillation(config, "")[1] == rows).all()
  for prompt_length in (0, 2, 5):  # shorter (masks the prefix) or longer
    config.train.prompt_length = prompt_length
    with pytest.raises(ValueError, match=(
        f"train.prompt_length={prompt_length} must be the prefix length of "
        "data.distillation_set=.*, 4")):
      data_sources.distillation(config, "")


@pytest.mark.parametrize("token_shift", [False, True])
def test_block_anchors_are_each_blocks_first_masked_position_before_the_end(
    token_shift):
  masked = jnp.array([[0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0],
                      [0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1],
                      [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
                      [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]], bool)
  x0 = jnp.array([[EOS_ID, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],  # EOS in prefix
                  [9, 9, 9, 9, 9, EOS_ID, 9, 9, 9, 9, 9, 9],  # ends at 5
                  [9, 9, 9, 9, 9, 9, PAD_ID, PAD_ID] + [PAD_ID] * 4,
                  [9] * 12])
  anchors = cf.block_anchors(masked, x0, block_length=4, prompt_length=2,
                             token_shift=token_shift)
  # Row 0: 2 (3 after it masked); 4 shows 5 after it: only a shifted
  # model's block start, predicted from the clean pass, sees none of it.
  # Row 1: 1 shows 2; 8 is after the row's end. Row 2: 5 (the PAD after
  # it is hidden). Row 3: index 0 has no context for a teacher.
  expected = np.zeros((4, 12), bool)
  expected[0, 2] = expected[2, 5] = True
  expected[0, 4] = token_shift
  np.testing.assert_array_equal(np.asarray(anchors), expected)
  with pytest.raises(ValueError, match="block_length=5 must be"):
    cf.block_anchors(masked, x0, block_length=5, prompt_length=2)
  with pytest.raises(ValueError, match="must be one"):
    cf.block_anchors(masked[:2], x0, block_length=4, prompt_length=2)


@pytest.mark.parametrize("token_shift", [False, True])
@pytest.mark.parametrize("mask_order, complementary",
                         [("random", True), ("left_to_right", False)])
def test_a_students_prediction_at_an_anchor_sees_no_later_token(
    token_shift, mask_order, complementary):
  # The teacher's target is exact only where the student's context is the
  # teacher's: changing every token after an anchor leaves the student's
  # logits there unchanged.
  student = STUDENT.replace(token_shift=token_shift)
  logits_fn, params = make_logits_fn(student), stubs.random_params(student)
  tokens = jax.random.randint(jax.random.key(7), (4, 16), 5, 32).at[
      3, 13:].set(PAD_ID)
  masked = cf.semi_ar_masks(jax.random.key(8), tokens, 2, token_shift,
                            complementary=complementary, order=mask_order,
                            block_length=4)
  x0 = jnp.tile(tokens, (masked.shape[0] // 4, 1))
  anchors = np.asarray(cf.block_anchors(masked, x0, 4, 2,
                                        token_shift=token_shift))
  run = jax.jit(lambda x0: bd3lm_logits(
      logits_fn, params, x0, jnp.where(masked, MASK_ID, x0), 4))
  before = np.asarray(run(x0))
  assert anchors.sum() >= 2
  for b, i in zip(*np.nonzero(anchors)):
    later = np.asarray(x0).copy()
    real = later[b, i + 1:] != PAD_ID
    later[b, i + 1:] = np.where(real, 5 + (later[b, i + 1:] - 5 + 11) % 27,
                                PAD_ID)
    np.testing.assert_allclose(np.asarray(run(jnp.asarray(later)))[b, i],
                               before[b, i], atol=1e-5,
                               err_msg=f"anchor ({b}, {i})")


@pytest.mark.parametrize("block_length", [1, 4])
def test_a_teacher_index_is_the_token_a_shifted_student_index_predicts(
    block_length):
  # A token-shifted student with its causal parent's weights predicts a
  # block's first token from the clean pass at the position before it,
  # which sees exactly the earlier tokens: there its SUBS log-probabilities
  # are the parent's `next_token_log_probs` at the same index (an
  # off-by-one in either would differ).
  tokens = jax.random.randint(jax.random.key(5), (2, 16), 5, 32).at[
      1, 11:].set(PAD_ID)
  masked = cf.semi_ar_masks(jax.random.key(6), tokens, 2, True,
                            block_length=block_length)
  x0 = jnp.tile(tokens, (2, 1))
  x_t = jnp.where(masked, MASK_ID, x0)
  student = np.asarray(subs_log_probs(bd3lm_logits(
      make_logits_fn(STUDENT), PARAMS, x0, x_t, block_length), x_t))
  teacher = np.tile(np.asarray(cf.next_token_log_probs(
      make_logits_fn(PARENT), PARAMS, tokens)), (2, 1, 1))
  starts = np.asarray(masked) & (np.arange(16) % block_length == 0)
  keep = [v for v in range(32) if v != MASK_ID]
  assert starts.sum() >= 4
  np.testing.assert_allclose(student[starts][:, keep],
                             teacher[starts][:, keep], atol=2e-5)


def test_teacher_inputs_are_checked_before_tracing():
  logits = jnp.zeros((1, 3, 6))
  x0, masked = jnp.array([[1, 3, 0]]), jnp.array([[True, True, False]])
  teacher = jnp.zeros((1, 3, 6))
  with pytest.raises(ValueError, match="together or not at all"):
    cf.certainty_forcing_terms(logits, x0, masked,
                               teacher_log_probs_BxLxV=teacher)
  with pytest.raises(ValueError, match="together or not at all"):
    cf.certainty_forcing_terms(logits, x0, masked, anchors_BxL=masked)
  for bad in (jnp.zeros((1, 3, 1)), jnp.zeros((1, 3, 7))):
    with pytest.raises(ValueError, match="teacher_log_probs_BxLxV"):
      cf.certainty_forcing_terms(logits, x0, masked,
                                 teacher_log_probs_BxLxV=bad,
                                 anchors_BxL=masked)
  tokens = jax.random.randint(jax.random.key(3), (2, 8), 5, 32)
  one_row = lambda t: jnp.zeros((1, 8, 32))  # broadcast over the batch
  for teacher, match in ((one_row, "teacher_log_probs_BxLxV"),
                         (PARAMS, "teacher must be None or a function")):
    with pytest.raises(ValueError, match=match):  # while tracing
      jax.eval_shape(lambda: cf.certainty_forcing_loss(
          make_logits_fn(STUDENT), PARAMS, tokens, jax.random.key(0),
          block_length=4, prompt_length=4, teacher=teacher))


def test_a_teacher_shorter_than_the_rows_is_refused():
  # A learned position table has no row past max_len: NaN under jit.
  short = PARENT.replace(max_len=8, positional="learned")
  teacher = jax.jit(functools.partial(
      cf.next_token_log_probs, make_logits_fn(short),
      stubs.random_params(short)))
  with pytest.raises(ValueError, match="exceed the teacher's max_len=8"):
    teacher(jnp.full((1, 16), 9, jnp.int32))
  config = load_config(DISTILL)
  config.train.teacher = "ar"
  config.data.seq_len = 400
  tokenizer = types.SimpleNamespace(model_proto=(
      PRETRAINED / "tokenizer.model").read_bytes())
  with pytest.raises(ValueError, match="train.teacher='ar'.*max_len 320, "
                                       "under data.seq_len=400"):
    loading.teacher_log_probs(config, tokenizer, PRETRAINED)


def test_next_token_log_probs_are_the_causal_models_shifted_without_mask():
  tokens = jax.random.randint(jax.random.key(9), (2, 12), 5, 32)
  log_p = np.asarray(cf.next_token_log_probs(make_logits_fn(PARENT), PARAMS,
                                             tokens))
  logits = np.asarray(make_logits_fn(PARENT)(
      PARAMS, tokens, jnp.broadcast_to(jnp.arange(12), (2, 12))).logits)
  keep = [v for v in range(32) if v != MASK_ID]
  for i in range(1, 12):  # index i: the prediction made at i - 1
    np.testing.assert_allclose(log_p[:, i, keep],
                               _log_softmax(logits[:, i - 1, keep]),
                               rtol=1e-5, atol=1e-5)
  assert np.isfinite(log_p).all() and not np.exp(log_p[..., MASK_ID]).any()
  np.testing.assert_allclose(log_p[:, 0, keep], -np.log(31), rtol=1e-6)
  with pytest.raises(ValueError, match="next_token_log_probs"):
    cf.next_token_log_probs(make_logits_fn(STUDENT), PARAMS, tokens)


def test_a_teacher_replaces_the_target_at_the_anchors_only():
  # Vocabulary 6, MASK = 4. Positions 0 and 1 masked, 2 not; 0 is an
  # anchor (its argmax is right, so without the teacher it is in C).
  logits = np.zeros((1, 3, 6), np.float32)
  logits[0, 0] = [0.1, 2.0, 0.3, 0.0, 50.0, -1.0]
  logits[0, 1] = [1.5, 0.2, 0.0, 3.7, 50.0, 0.4]  # argmax 3 = x0: in C
  x0 = jnp.array([[1, 3, 0]], jnp.int32)
  masked = jnp.array([[True, True, False]])
  anchors = jnp.array([[True, False, False]])
  keep = [0, 1, 2, 3, 5]
  teacher = np.full((1, 3, 6), -np.inf, np.float32)
  teacher[0, :, keep] = _log_softmax(np.array(
      [[0.5, 1.0, -0.5, 0.0, 2.0]] * 3)).T
  loss, metrics = cf.certainty_forcing_terms(
      jnp.asarray(logits), x0, masked, teacher_log_probs_BxLxV=teacher,
      anchors_BxL=anchors)
  log_s0 = _log_softmax(logits[0, 0, keep])
  soft = -(np.exp(teacher[0, 0, keep]) * log_s0).sum()
  hard = -_log_softmax(logits[0, 1, keep])[3]
  log_q = _log_softmax(logits[0, 1, keep] / 0.5)  # C = {1}: 0 is an anchor
  entropy = -(np.exp(log_q) * log_q).sum()
  np.testing.assert_allclose(float(metrics["ce"]), (soft + hard) / 2,
                             rtol=1e-5)
  np.testing.assert_allclose(float(metrics["teacher_ce"]), soft, rtol=1e-5)
  np.testing.assert_allclose(float(loss), (soft + hard) / 2 + 2.0 * entropy,
                             rtol=1e-5)
  assert int(metrics["anchors"]) == 1 and float(metrics["correct"]) == 0.5
  # teacher_target 'masked' keeps the anchors in C: both positions are.
  kept_loss, kept = cf.certainty_forcing_terms(
      jnp.asarray(logits), x0, masked, teacher_log_probs_BxLxV=teacher,
      anchors_BxL=anchors, anchors_in_certainty=True)
  log_q0 = _log_softmax(logits[0, 0, keep] / 0.5)
  both = (entropy - (np.exp(log_q0) * log_q0).sum()) / 2
  assert float(kept["correct"]) == 1.0
  np.testing.assert_allclose(float(kept["entropy"]), both, rtol=1e-5)
  np.testing.assert_allclose(float(kept_loss), (soft + hard) / 2 + 2.0 * both,
                             rtol=1e-5)
  # A teacher sure of the row's token is the row's target: the CE is the
  # same as without a teacher.
  sure = np.where(np.arange(6) == np.asarray(x0)[..., None], 0.0, -np.inf)
  _, with_sure = cf.certainty_forcing_terms(
      jnp.asarray(logits), x0, masked,
      teacher_log_probs_BxLxV=jnp.asarray(sure, jnp.float32),
      anchors_BxL=anchors)
  _, without = cf.certainty_forcing_terms(jnp.asarray(logits), x0, masked)
  np.testing.assert_allclose(float(with_sure["ce"]), float(without["ce"]),
                             rtol=1e-6)


@pytest.mark.parametrize("mask_order, complementary",
                         [("random", True), ("left_to_right", False)])
def test_the_teacher_reaches_the_loss_on_the_bd3lm_layout(mask_order,
                                                         complementary):
  logits_fn = make_logits_fn(STUDENT)
  tokens = ROWS.at[1, 20].set(EOS_ID)
  key = jax.random.key(4)
  teacher = PARENT_TEACHER
  options = dict(block_length=8, prompt_length=8, complementary=complementary,
                 mask_order=mask_order)
  loss, metrics = cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, key,
                                            teacher=teacher, **options)
  masked = cf.semi_ar_masks(key, tokens, 8, True, complementary=complementary,
                            order=mask_order, block_length=8)
  copies = masked.shape[0] // 2
  x0 = jnp.tile(tokens, (copies, 1))
  logits = bd3lm_logits(logits_fn, PARAMS, x0,
                        jnp.where(masked, MASK_ID, x0), 8)
  anchors = cf.block_anchors(masked, x0, 8, 8, token_shift=True)
  expected, _ = cf.certainty_forcing_terms(
      logits, x0, masked, teacher_log_probs_BxLxV=jnp.tile(
          teacher(tokens), (copies, 1, 1)), anchors_BxL=anchors)
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
  assert int(metrics["anchors"]) == int(anchors.sum()) > 0
  plain, _ = cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, key,
                                       **options)
  assert abs(float(plain) - float(loss)) > 1e-3
  wired = train_step.objective_loss("certainty_forcing", 8, teacher=teacher,
                                    **{k: v for k, v in options.items()
                                       if k != "block_length"})
  np.testing.assert_allclose(
      float(wired(logits_fn, PARAMS, tokens, key)[0]), float(loss),
      rtol=1e-6)


def test_the_masked_target_scores_every_masked_position_before_the_end():
  # The teacher replaces the row's token at every masked position at index
  # >= 1 before the row's EOS, and those positions stay in C.
  logits_fn = make_logits_fn(STUDENT)
  tokens = ROWS.at[1, 17].set(EOS_ID)
  key = jax.random.key(4)
  teacher = PARENT_TEACHER
  options = dict(block_length=8, prompt_length=8, complementary=False,
                 mask_order="left_to_right")
  masked = cf.semi_ar_masks(key, tokens, 8, True, complementary=False,
                            order="left_to_right", block_length=8)
  # Row 0's masked tokens of the last block become the student's own
  # predictions there (which no token of that block's x0 copy changes), so
  # that C holds teacher-scored positions.
  logits = bd3lm_logits(logits_fn, PARAMS, tokens,
                        jnp.where(masked, MASK_ID, tokens), 8)
  last = masked & (jnp.arange(24) >= 16)[None] & (jnp.arange(2) == 0)[:, None]
  tokens = jnp.where(last, jnp.argmax(logits[..., 5:], -1) + 5, tokens)
  logits = bd3lm_logits(logits_fn, PARAMS, tokens,
                        jnp.where(masked, MASK_ID, tokens), 8)
  loss, metrics = cf.certainty_forcing_loss(
      logits_fn, PARAMS, tokens, key, teacher=teacher,
      teacher_target="masked", **options)
  ended = np.zeros((2, 24), bool)
  ended[1, 18:] = True
  positions = np.asarray(masked) & ~ended
  assert 0 < positions.sum() < np.asarray(masked).sum()
  log_p = np.asarray(subs_log_probs(logits, jnp.where(masked, MASK_ID, tokens),
                                    MASK_ID), np.float64)
  target = np.asarray(teacher(tokens), np.float64)
  row = -np.take_along_axis(log_p, np.asarray(tokens)[..., None], -1)[..., 0]
  soft = -np.where(np.exp(target) > 0, np.exp(target) * log_p, 0).sum(-1)
  ce = np.where(positions, soft, row)[np.asarray(masked)].mean()
  np.testing.assert_allclose(float(metrics["ce"]), ce, rtol=1e-5)
  assert int(metrics["anchors"]) == int(positions.sum())
  _, plain_metrics = cf.certainty_forcing_terms(logits, tokens, masked)
  assert float(plain_metrics["correct"]) > 0  # C is not empty here
  np.testing.assert_allclose(float(metrics["correct"]),
                             float(plain_metrics["correct"]), rtol=1e-6)
  np.testing.assert_allclose(float(loss), ce + 2.0 * float(
      plain_metrics["entropy"]), rtol=1e-5)
  with pytest.raises(ValueError, match="teacher_target='masked' needs a "
                                       "teacher"):
    cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, key,
                              teacher_target="masked", **options)


def test_train_teacher_is_checked_and_fingerprinted():
  config = load_config(DISTILL)
  assert "teacher" not in registry.fingerprint(config)  # '' is none
  config.train.teacher = "ar"
  train.check_config(config)
  assert registry.fingerprint(config)["teacher"] == "ar"
  config.train = ml_collections.ConfigDict({**config.train.to_dict(),
                                            "teacher": 3})
  with pytest.raises(ValueError, match="train.teacher=3 must be a string"):
    train.check_config(config)
  config = load_config(DISTILL)
  config.train.update(dict(teacher="ar", objective="bd3lm"))
  with pytest.raises(ValueError, match="train.teacher='ar' applies to "
                                       "train.objective 'certainty_forcing'"):
    train.check_config(config)
  config = load_config(DISTILL)
  config.train.teacher = "ar"
  config.data.source = "task"  # a task's certainty forcing: no anchors
  with pytest.raises(ValueError, match="got 'task_certainty_forcing'"):
    registry.check_options(config)


def test_teacher_log_probs_loads_a_causal_member_of_the_set():
  config = load_config(DISTILL)
  tokenizer = types.SimpleNamespace(model_proto=(
      PRETRAINED / "tokenizer.model").read_bytes())
  assert loading.teacher_log_probs(config, tokenizer, PRETRAINED) == (
      None, None)
  config.train.teacher = "ar"
  teacher, record = loading.teacher_log_probs(config, tokenizer, PRETRAINED)
  assert record["teacher"] == "ar"
  tokens = jnp.full((1, 8), 9, jnp.int32)
  log_p = np.asarray(teacher(tokens))
  assert log_p.shape == (1, 8, config.data.vocab_size)
  np.testing.assert_allclose(np.exp(log_p).sum(-1), 1.0, rtol=1e-5)
  for name, match in (("mdlm", "is not causal"), ("none", "not a member")):
    config.train.teacher = name
    with pytest.raises(ValueError, match=f"train.teacher='{name}'.*{match}"):
      loading.teacher_log_probs(config, tokenizer, PRETRAINED)
  config.train.teacher = "ar"
  with pytest.raises(ValueError, match="another tokenizer"):
    loading.teacher_log_probs(config, types.SimpleNamespace(
        model_proto=b"another"), PRETRAINED)


def tiny_distill_config():
  """configs/distill.py at a 1-layer d32 model, rows of 16 tokens, blocks
  of 4 after a 4-token prompt, one step from scratch."""
  config = load_config(DISTILL)
  config.model.update(dict(d_model=32, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=16, mlp_dim=64,
                           max_len=16))
  config.data.update(dict(vocab_size=512, seq_len=16))
  config.train.update(dict(num_steps=1, batch_size=2, eval_every=1,
                           checkpoint_every=1, warmup_steps=0,
                           eval_batches=1, init_from="", prompt_length=4,
                           block_length=4))
  return config


def test_train_takes_a_teacher_exactly_when_the_config_names_one(tmp_path):
  config = tiny_distill_config()
  rows = np.asarray(jax.random.randint(jax.random.key(2), (4, 16), 5, 512))
  data = (types.SimpleNamespace(describe=lambda: "rows"), rows, rows)
  causal = PARENT.replace(vocab_size=512)
  teacher = functools.partial(cf.next_token_log_probs, make_logits_fn(causal),
                              stubs.random_params(causal))
  with pytest.raises(ValueError, match="train.teacher='' needs"):
    train.train(config, str(tmp_path / "a"), progress=False, data=data,
                teacher=teacher)
  config.train.teacher = "ar"
  with pytest.raises(ValueError, match="train.teacher='ar' needs"):
    train.train(config, str(tmp_path / "b"), progress=False, data=data)
  with pytest.raises(ValueError, match="teacher= must be a function"):
    train.train(config, str(tmp_path / "b"), progress=False, data=data,
                teacher=PARAMS)
  assert not (tmp_path / "b").exists()
  summary = train.train(config, str(tmp_path / "c"), progress=False,
                        data=data, teacher=teacher)
  assert summary["steps"] == 1
  with open(tmp_path / "c" / "metrics.jsonl") as f:
    assert "teacher_ce" in [json.loads(line) for line in f][1]
  config.train.teacher_target = "causal_view"
  train.train(config, str(tmp_path / "d"), progress=False, data=data,
              teacher=teacher)
  with open(tmp_path / "d" / "metrics.jsonl") as f:
    record = [json.loads(line) for line in f][1]
  assert "view_ce" in record and "teacher_ce" not in record
  config.train.teacher_target = "anchors"
  # A checkpoint is resumed only with the teacher it was trained with.
  config.train.update(dict(teacher="", num_steps=2))
  with pytest.raises(CheckpointError, match="use another workdir"):
    train.train(config, str(tmp_path / "c"), progress=False, data=data)


def test_no_gradient_reaches_the_teacher_and_bfloat16_stays_finite():
  student = STUDENT.replace(dtype="bfloat16")
  teacher_cfg = PARENT.replace(dtype="bfloat16")
  tokens = jax.random.randint(jax.random.key(3), (3, 16), 5, 32).at[
      1, 6].set(EOS_ID).at[1, 7:].set(PAD_ID).at[2, 4:].set(PAD_ID)

  def loss(params, teacher_params):
    teacher = functools.partial(cf.next_token_log_probs,
                                make_logits_fn(teacher_cfg), teacher_params)
    return cf.certainty_forcing_loss(
        make_logits_fn(student), params, tokens, jax.random.key(1),
        block_length=4, prompt_length=4, teacher=teacher)

  (value, metrics), (grads, teacher_grads) = jax.jit(jax.value_and_grad(
      loss, argnums=(0, 1), has_aux=True))(stubs.random_params(student),
                                          stubs.random_params(teacher_cfg))
  assert np.isfinite(float(value)) and int(metrics["anchors"]) > 0
  assert all(np.isfinite(np.asarray(g, np.float32)).all()
             for g in jax.tree.leaves(grads))
  assert all(not np.asarray(g, np.float32).any()
             for g in jax.tree.leaves(teacher_grads))


def test_the_causal_view_term_is_the_teachers_cross_entropy_to_the_view():
  # A token-shifted student with its causal parent's weights has the
  # parent as its causal view, so against the parent as teacher the term is
  # the parent's own entropy, averaged over the scored tokens only: index >=
  # max(P, 1), not PAD, up to the row's first EOS at or after P (included).
  tokens = np.array(jax.random.randint(jax.random.key(7), (3, 12), 5, 32))
  tokens[1, 8], tokens[1, 9:] = EOS_ID, PAD_ID  # ends at 8
  tokens[2, 2], tokens[2, 7] = EOS_ID, EOS_ID  # the prefix's EOS: not an end
  tokens[2, 9:] = 6
  teacher = cf.next_token_log_probs(make_logits_fn(PARENT), PARAMS,
                                    jnp.asarray(tokens))
  log_p = np.asarray(teacher, np.float64)
  entropy = -np.where(log_p > -1e30, np.exp(log_p) * log_p, 0.0).sum(-1)
  scored = np.zeros((3, 12), bool)
  scored[0, 4:], scored[1, 4:9], scored[2, 4:8] = True, True, True
  for prompt_length, rows in ((4, scored), (0, None)):
    if rows is None:  # P = 0: index 0 has no context; row 2 ends at 2
      rows = np.zeros((3, 12), bool)
      rows[0, 1:], rows[1, 1:9], rows[2, 1:3] = True, True, True
    term = cf.causal_view_cross_entropy(
        make_logits_fn(STUDENT), PARAMS, jnp.asarray(tokens), teacher,
        prompt_length)
    np.testing.assert_allclose(float(term), entropy[rows].mean(), rtol=1e-5)
  other = cf.next_token_log_probs(make_logits_fn(PARENT),
                                  stubs.random_params(PARENT, seed=1),
                                  jnp.asarray(tokens))
  assert float(cf.causal_view_cross_entropy(
      make_logits_fn(STUDENT), PARAMS, jnp.asarray(tokens), other, 4)) > (
          entropy[scored].mean() + 1e-3)  # Gibbs: CE > H for another teacher


def test_the_causal_view_target_adds_its_term_and_leaves_the_anchors():
  logits_fn = make_logits_fn(STUDENT)
  tokens = ROWS
  key = jax.random.key(4)
  teacher = PARENT_TEACHER
  options = dict(block_length=8, prompt_length=8)
  plain, _ = cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, key,
                                       **options)
  loss, metrics = cf.certainty_forcing_loss(
      logits_fn, PARAMS, tokens, key, teacher=teacher,
      teacher_target="causal_view", **options)
  view = cf.causal_view_cross_entropy(logits_fn, PARAMS, tokens,
                                      teacher(tokens), 8)
  np.testing.assert_allclose(float(metrics["view_ce"]), float(view),
                             rtol=1e-6)
  np.testing.assert_allclose(float(loss), float(plain) + float(view),
                             rtol=1e-6)
  heavier, _ = cf.certainty_forcing_loss(
      logits_fn, PARAMS, tokens, key, teacher=teacher,
      teacher_target="causal_view", view_weight=3.0, **options)
  np.testing.assert_allclose(float(heavier), float(plain) + 3 * float(view),
                             rtol=1e-6)
  with pytest.raises(ValueError, match="view_weight=-1.0 must be a number"):
    cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, key, teacher=teacher,
                              teacher_target="causal_view", view_weight=-1.0,
                              **options)
  assert "anchors" not in metrics
  wired = train_step.objective_loss("certainty_forcing", 8, teacher=teacher,
                                    teacher_target="causal_view",
                                    prompt_length=8)
  np.testing.assert_allclose(
      float(wired(logits_fn, PARAMS, tokens, key)[0]), float(loss),
      rtol=1e-6)
  grads = jax.grad(lambda p: cf.causal_view_cross_entropy(
      logits_fn, p, tokens, teacher(tokens), 8))(PARAMS)
  assert any(np.asarray(g).any() for g in jax.tree.leaves(grads))
  for target, extra, match in (
      ("logits", {"teacher": teacher}, "teacher_target='logits' must be one"),
      ("causal_view", {}, "teacher_target='causal_view' needs a teacher")):
    with pytest.raises(ValueError, match=match):
      cf.certainty_forcing_loss(logits_fn, PARAMS, tokens, key,
                                teacher_target=target, **extra, **options)


def test_train_teacher_target_is_checked_and_fingerprinted():
  config = load_config(DISTILL)
  assert "teacher_target" not in registry.fingerprint(config)
  config.train.teacher_target = "causal_view"
  with pytest.raises(ValueError, match="causal_view.* needs a teacher"):
    train.check_config(config)
  config.train.teacher = "ar"
  train.check_config(config)
  assert registry.fingerprint(config)["teacher_target"] == "causal_view"
  assert registry.of_config(config).options(config)["teacher_target"] == "causal_view"
  config.train.view_weight = 4.0
  assert registry.fingerprint(config)["view_weight"] == 4.0
  assert registry.of_config(config).options(config)["view_weight"] == 4.0
  config.train.view_weight = -1.0
  with pytest.raises(ValueError, match="train.view_weight=-1.0 must be"):
    train.check_config(config)
  config.train.view_weight = 1.0
  config.train.teacher_target = "anchors"
  train.check_config(config)
  config.train.view_weight = 4.0  # the term it weighs is 'causal_view''s
  with pytest.raises(ValueError, match="train.view_weight=4.0 weighs the "
                     "'causal_view' term; teacher_target='anchors' has none"):
    train.check_config(config)
  config.train.view_weight = 1.0
  config.train.teacher_target = "all"
  with pytest.raises(ValueError, match="train.teacher_target='all' must be "
                                       "one of"):
    train.check_config(config)


@pytest.mark.parametrize("key, value, match", [
    ("prompt_length", -1, r"train.prompt_length=-1 must be an integer in "
                          r"\[0, 15\]"),
    ("prompt_length", 16, "train.prompt_length=16 must be"),
    ("prompt_length", 2.0, "train.prompt_length=2.0 must be"),
    ("certainty_weight", -1.0, "train.certainty_weight=-1.0 must be"),
    ("certainty_weight", float("nan"), "train.certainty_weight=nan must be"),
    ("certainty_temperature", 0.0,
     "train.certainty_temperature=0.0 must be")])
def test_certainty_options_are_refused_before_the_workdir(tmp_path, key,
                                                          value, match):
  # Checked with the config, as the teacher options are: not first when the
  # loss is traced, after the workdir (metrics, checkpoints) was written.
  config = tiny_distill_config()
  config.train = ml_collections.ConfigDict({**config.train.to_dict(),
                                            key: value})
  with pytest.raises(ValueError, match=match):
    train.check_config(config)
  rows = np.asarray(jax.random.randint(jax.random.key(2), (4, 16), 5, 512))
  data = (types.SimpleNamespace(describe=lambda: "rows"), rows, rows)
  with pytest.raises(ValueError, match=match):
    train.train(config, str(tmp_path / "w"), progress=False, data=data)
  assert not (tmp_path / "w").exists()


def test_the_causal_view_target_refuses_an_unshifted_student_and_a_bad_teacher():
  # Without a token shift the student's logits at i predict token i, so its
  # block-size-1 view is no next-token model (self_speculative refuses it):
  # the term would train logits nothing decodes with. A teacher of another
  # vocabulary (narrower: broadcast against the student's, MASK's finite
  # log 0 gives a term near 1e36) is refused as under 'anchors'.
  tokens = ROWS
  key = jax.random.key(4)
  teacher = PARENT_TEACHER
  options = dict(block_length=8, prompt_length=8, teacher_target="causal_view")
  with pytest.raises(ValueError, match="needs a student with a token shift"):
    cf.certainty_forcing_loss(
        make_logits_fn(STUDENT.replace(token_shift=False)), PARAMS, tokens,
        key, teacher=teacher, **options)
  for bad in (lambda t: teacher(t)[..., :1],
              lambda t: jnp.pad(teacher(t), ((0, 0), (0, 0), (0, 1)))):
    with pytest.raises(ValueError, match="must have the shape of the"):
      cf.certainty_forcing_loss(make_logits_fn(STUDENT), PARAMS, tokens, key,
                                teacher=bad, **options)
  config = load_config(DISTILL)
  config.train.update(teacher="ar", teacher_target="causal_view")
  config.model.token_shift = False
  with pytest.raises(ValueError, match="needs a student with a token shift"):
    train.check_config(config)


def test_member_widths_parse_and_refuse_a_member_named_twice():
  assert sd.member_widths(["a", "b:8"], 16) == {"a": 16, "b": 8}
  for entries, match in ((["a:8", "a:4"], "names 'a' twice"),
                         (["a:x"], "integer >= 1"), (["a:0"], "integer >= 1"),
                         (["a:-1"], "integer >= 1")):
    with pytest.raises(ValueError, match=match):
      sd.member_widths(entries, 16)


def test_later_states_are_later_suffixes_of_the_same_trajectory():
  """Each block of a later state is the drawn block's masked suffix cut
  at k' uniform in [k + 1, W] (chi-square): a subset, never the drawn
  state itself, empty where the block was."""
  width, block = 64, 8
  x0 = jax.random.randint(jax.random.key(0), (600, width), 5, 32)
  masked = cf.semi_ar_masks(jax.random.key(1), x0, 8, True,
                            complementary=False, order="left_to_right",
                            block_length=block)
  later = np.asarray(cf.later_states(jax.random.key(2), masked, block))
  masked = np.asarray(masked)
  assert not (later & ~masked).any()
  k = block - masked[:, 8:].reshape(600, -1, block).sum(-1)
  k_later = block - later[:, 8:].reshape(600, -1, block).sum(-1)
  np.testing.assert_array_equal(
      later[:, 8:].reshape(600, -1, block),
      np.arange(block)[None, None] >= k_later[..., None])
  assert (k_later > k)[k < block].all() and (k_later == block)[k == block].all()
  # Given k = 2, k' is uniform over [3, 8] (6 values).
  counts = np.bincount(k_later[k == 2], minlength=block + 1)[3:]
  expected = counts.sum() / 6
  assert ((counts - expected) ** 2 / expected).sum() < 20.5  # 5 dof, p=0.001


def test_the_consistency_term_is_the_later_states_cross_entropy():
  """By hand on one row: the mean over the positions masked in both states
  of -sum_v p_later(v) log p(v) (MASK excluded), and no gradient reaches
  the later state's logits."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(1, 4, 6)).astype(np.float32)
  later_logits = rng.normal(size=(1, 4, 6)).astype(np.float32)
  x_t = jnp.asarray([[5, MASK_ID, MASK_ID, MASK_ID]], jnp.int32)
  later = jnp.asarray([[False, False, True, True]])
  got = cf.consistency_cross_entropy(jnp.asarray(logits), x_t,
                                     jnp.asarray(later_logits), later)

  def log_probs(x):
    x = x.copy()
    x[..., MASK_ID] = -np.inf
    return _log_softmax(np.where(np.isinf(x), -1e30, x))
  p_later = np.exp(log_probs(later_logits))[0, 2:]
  expected = -(p_later * log_probs(logits)[0, 2:]).sum(-1).mean()
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)
  grad = jax.grad(lambda ll: cf.consistency_cross_entropy(
      jnp.asarray(logits), x_t, ll, later))(jnp.asarray(later_logits))
  assert not np.asarray(grad).any()


def test_the_consistency_weight_adds_its_term_to_the_same_masks():
  """Weight 0 is the loss without the term (the same masks: the later
  states draw from a folded key); weight w adds w x the term, which is
  positive on a random model; a random mask order is refused."""
  logits_fn = make_logits_fn(STUDENT)
  loss_fn = functools.partial(
      cf.certainty_forcing_loss, logits_fn, PARAMS, ROWS, jax.random.key(4),
      block_length=8, prompt_length=8, complementary=False,
      mask_order="left_to_right")
  base_loss, base_metrics = loss_fn()
  zero, zero_metrics = loss_fn(consistency_weight=0.0)
  assert float(zero) == float(base_loss) and "consistency" not in zero_metrics
  loss, metrics = loss_fn(consistency_weight=0.5)
  assert float(metrics["consistency"]) > 0
  np.testing.assert_allclose(
      float(loss), float(base_loss) + 0.5 * float(metrics["consistency"]),
      rtol=1e-6)
  assert float(metrics["ce"]) == float(base_metrics["ce"])
  for weight, order, match in ((0.5, "random", "needs mask_order "
                                "'left_to_right'"),
                               (-1.0, "left_to_right", r"\[0, inf\)")):
    with pytest.raises(ValueError, match=match):
      cf.certainty_forcing_loss(
          logits_fn, PARAMS, ROWS, jax.random.key(4), block_length=8,
          prompt_length=8, complementary=False, mask_order=order,
          consistency_weight=weight)


def test_check_config_refuses_a_consistency_term_it_cannot_train():
  config = load_config(DISTILL)
  config.train.consistency_weight = 1.0
  with pytest.raises(ValueError, match="train.consistency_weight=1.0 needs "
                                       "mask_order 'left_to_right'"):
    train.check_config(config)
  config.train.update(dict(mask_order="left_to_right",
                           complementary_masks=False))
  train.check_config(config)
  assert registry.get("certainty_forcing").options(config)[
      "consistency_weight"] == 1.0
  # A task's certainty forcing (one block, no trajectory) takes none.
  config.train.mask_order = "random"
  config.data.source = "task"
  with pytest.raises(ValueError, match="train.consistency_weight=1.0 applies "
                                       "to .*'task_certainty_forcing'"):
    registry.check_options(config)
  config.train.consistency_weight = 0.0  # no term: accepted anywhere
  registry.check_options(config)


def test_the_consistency_term_reaches_the_training_log(tmp_path):
  """One step through `train.train` with the term logs it beside the loss
  (`run_log.LOSS_TERMS`), and a step without it does not."""
  config = tiny_distill_config()
  config.train.update(dict(mask_order="left_to_right",
                           complementary_masks=False,
                           consistency_weight=0.5))
  rows = np.asarray(jax.random.randint(jax.random.key(2), (4, 16), 5, 512))
  data = (types.SimpleNamespace(describe=lambda: "rows"), rows, rows)
  for weight, folder in ((0.5, "with"), (0.0, "without")):
    config.train.consistency_weight = weight
    train.train(config, str(tmp_path / folder), progress=False, data=data)
    with open(tmp_path / folder / "metrics.jsonl") as f:
      record = [json.loads(line) for line in f][1]
    assert ("consistency" in record) == (weight > 0), record
    if weight:
      assert record["consistency"] > 0
