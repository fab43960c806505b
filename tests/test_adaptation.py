"""Adapting an AR parent into diffusion models (issue 25).

The token shift (`TransformerConfig.token_shift`), complementary masks and
attention-mask annealing of the objectives, parents (`train.init_from`) and
the decoders on token-shifted models.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import types

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import stubs
from lm_decoding.decoding.base import bind
from lm_decoding.decoding.bd3lm import BD3LMDecoder
from lm_decoding.decoding.fast_dllm import ThresholdDecoder
from lm_decoding.decoding.mdlm import MDLMDecoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import TransformerConfig, make_logits_fn
from lm_decoding.models import masks
from lm_decoding.models.diffusion import shift_logits
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training import objectives
from lm_decoding.training.pretrained import loading, member_recipes, recipes, store
from lm_decoding.training import train as train_lib
from lm_decoding.training.objectives import registry

PARENT = TransformerConfig(vocab_size=32, d_model=32, num_layers=2,
                           num_heads=2, num_kv_heads=2, head_dim=16,
                           mlp_dim=64, max_len=40, attention="causal")
SHIFTED = PARENT.replace(attention="bidirectional", token_shift=True)


PARAMS = stubs.random_params(PARENT)
TOKENS = jax.random.randint(jax.random.key(1), (4, 16), 5, 32).at[1, 12:].set(
    PAD_ID)
GREEDY = SamplingConfig(temperature=0.0)


def _ar_nll_without_mask(tokens):
  """Per-token NLL of the causal parent with MASK taken out of its softmax
  (SUBS), over the targets tokens[:, 1:] that are not PAD."""
  inputs = tokens[:, :-1]
  logits = make_logits_fn(PARENT)(
      PARAMS, inputs, jnp.broadcast_to(jnp.arange(inputs.shape[1]),
                                       inputs.shape)).logits
  log_probs = jax.nn.log_softmax(logits.at[..., MASK_ID].set(-jnp.inf), -1)
  nll = -jnp.take_along_axis(log_probs, tokens[:, 1:, None], -1)[..., 0]
  scored = tokens[:, 1:] != PAD_ID
  return float(jnp.sum(jnp.where(scored, nll, 0.0)) / scored.sum())


def test_block_one_with_token_shift_is_the_ar_parent():
  # The parent is already a block-1 model: at step 0 the adapted model's
  # bound is the parent's NLL (its softmax without MASK, which a trained
  # parent gives ~0 probability), to float precision.
  bound, metrics = objectives.bd3lm_bound(
      make_logits_fn(SHIFTED), PARAMS, TOKENS, jax.random.key(2), 4,
      block_length=1)
  np.testing.assert_allclose(float(bound), _ar_nll_without_mask(TOKENS),
                             rtol=1e-5)
  assert float(metrics["tokens"]) == float(jnp.sum(TOKENS[:, 1:] != PAD_ID))
  # Without the shift the same parameters are another (worse-aligned) model.
  unshifted, _ = objectives.bd3lm_bound(
      make_logits_fn(SHIFTED.replace(token_shift=False)), PARAMS, TOKENS,
      jax.random.key(2), 4, block_length=1)
  assert abs(float(unshifted) - float(bound)) > 1e-3


@pytest.mark.parametrize("shift", [False, True])
def test_one_block_of_the_whole_sequence_is_the_mdlm_loss(shift):
  config = SHIFTED.replace(token_shift=shift)
  key = jax.random.key(3)
  block, _ = objectives.bd3lm_loss(make_logits_fn(config), PARAMS, TOKENS,
                                   key, block_length=TOKENS.shape[1])
  mdlm, _ = objectives.mdlm_loss(make_logits_fn(config), PARAMS, TOKENS, key)
  np.testing.assert_allclose(float(block), float(mdlm), rtol=1e-6)


def test_shift_logits_moves_each_prediction_to_its_token():
  logits = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
  shifted = shift_logits(logits)
  np.testing.assert_array_equal(shifted[:, 1:], logits[:, :-1])
  np.testing.assert_array_equal(shifted[:, 0], logits[:, 0])


@pytest.mark.parametrize("shift", [False, True])
def test_complementary_masks_mask_each_token_in_exactly_one_of_the_pair(
    shift):
  keep = objectives.maskable(TOKENS, shift)
  t_B = objectives.sample_times(jax.random.key(4), TOKENS.shape[0])
  x_t = jnp.where(keep, objectives.mask_at_time(jax.random.key(5), TOKENS,
                                               t_B), TOKENS)
  x0, pair, t_pair = objectives.complement(TOKENS, x_t, t_B, keep)
  batch = TOKENS.shape[0]
  masked_a, masked_b = pair[:batch] == MASK_ID, pair[batch:] == MASK_ID
  np.testing.assert_array_equal(masked_a ^ masked_b, keep)
  assert not np.any(np.asarray(masked_a & masked_b))
  np.testing.assert_array_equal(x0[batch:], TOKENS)
  assert not np.any(np.asarray(pair[:, 0] == MASK_ID)) or not shift
  # Masking probabilities (1 - eps) t and (1 - eps) t' add up to 1.
  eps = objectives.common.EPS
  np.testing.assert_allclose((1 - eps) * (t_pair[:batch] + t_pair[batch:]),
                             1.0, rtol=1e-6)


def test_complementary_loss_scores_each_maskable_token_twice():
  logits_fn, key = make_logits_fn(SHIFTED), jax.random.key(6)
  loss, metrics = objectives.bd3lm_loss(logits_fn, PARAMS, TOKENS, key,
                                        block_length=4, complementary=True)
  keep = objectives.maskable(TOKENS, True)
  assert float(metrics["tokens"]) == 2 * float(keep.sum())
  assert np.isfinite(float(loss)) and float(loss) > 0


def test_annealing_goes_from_causal_to_bidirectional():
  length = TOKENS.shape[1]
  assert int(objectives.visible_ahead(0, 30, length)) == 0
  assert int(objectives.visible_ahead(15, 30, length)) == (length - 1) // 2
  assert int(objectives.visible_ahead(30, 30, length)) == length - 1
  assert int(objectives.visible_ahead(99, 30, length)) == length - 1
  assert int(objectives.visible_ahead(0, 0, length)) == length - 1
  seen = []

  def recording(params, tokens, positions, cache=None, attention_mask=None):
    del params, positions, cache
    seen.append(attention_mask)
    return ModelOutput(jnp.zeros(tokens.shape + (32,)), None, None)

  for ahead in (0, length - 1):
    objectives.mdlm_loss(recording, None, TOKENS, jax.random.key(7),
                         ahead=jnp.int32(ahead))
  padding = masks.key_padding_mask(TOKENS != PAD_ID, length)
  causal = masks.causal_mask(TOKENS.shape[0], length)
  np.testing.assert_array_equal(seen[0], padding & causal)
  np.testing.assert_array_equal(seen[1], padding)


def _decode(decoder, prompts, lengths, config=SHIFTED):
  return decoder.denoise(bind(make_logits_fn(config), PARAMS), prompts,
                         lengths, jax.random.key(8), measure_error=True)


PROMPTS = jnp.array([[7, 8, 9, 10], [11, 12, 0, 0], [13, 0, 0, 0]])
PROMPT_LENGTHS = jnp.array([4, 2, 1])


@pytest.mark.parametrize("remasking", ["ancestral", "threshold"])
def test_cached_blocks_of_a_shifted_model_equal_uncached_recomputation(
    remasking):
  decoder = BD3LMDecoder(output_length=8, steps=8, block_length=4,
                         sampling=GREEDY, remasking=remasking, threshold=0.2)
  cached = _decode(decoder, PROMPTS, PROMPT_LENGTHS)
  uncached = _decode(dataclasses.replace(decoder, kv_cache="none"), PROMPTS,
                     PROMPT_LENGTHS)
  np.testing.assert_array_equal(cached.tokens, uncached.tokens)
  assert float(cached.max_logit_error) < 1e-4
  assert not np.any(np.asarray(cached.tokens) == MASK_ID)


def test_the_shift_changes_what_a_block_decoder_commits():
  decoder = BD3LMDecoder(output_length=8, steps=8, block_length=4,
                         sampling=GREEDY, kv_cache="none")
  shifted = _decode(decoder, PROMPTS, PROMPT_LENGTHS)
  unshifted = _decode(decoder, PROMPTS, PROMPT_LENGTHS,
                      SHIFTED.replace(token_shift=False))
  assert not np.array_equal(shifted.tokens, unshifted.tokens)


def test_threshold_above_one_is_one_token_per_step():
  one_per_step = BD3LMDecoder(output_length=8, steps=8, block_length=4,
                              sampling=GREEDY, remasking="low_confidence")
  above = dataclasses.replace(one_per_step, remasking="threshold",
                              threshold=1.5)
  a = _decode(one_per_step, PROMPTS, PROMPT_LENGTHS)
  b = _decode(above, PROMPTS, PROMPT_LENGTHS)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(b.committed, np.ones_like(b.committed))


@pytest.mark.parametrize("kv_cache", ["none", "prefix", "dual"])
def test_iterative_decoders_decode_shifted_models(kv_cache):
  decoder = ThresholdDecoder(output_length=8, block_length=4,
                             kv_cache=kv_cache, threshold=0.5)
  out = _decode(decoder, PROMPTS, PROMPT_LENGTHS)
  assert not np.any(np.asarray(out.tokens) == MASK_ID)
  if kv_cache == "none":
    assert float(out.max_logit_error) == 0.0


def test_step_refreshed_cache_of_a_shifted_model_is_exact():
  decoder = MDLMDecoder(output_length=8, steps=8, block_length=4,
                        sampling=GREEDY, kv_cache="dual",
                        cache_refresh="step")
  cached = _decode(decoder, PROMPTS, PROMPT_LENGTHS)
  uncached = _decode(dataclasses.replace(decoder, kv_cache="none",
                                         cache_refresh="block"),
                     PROMPTS, PROMPT_LENGTHS)
  assert float(cached.max_logit_error) < 1e-4
  np.testing.assert_array_equal(cached.tokens, uncached.tokens)


def test_shifted_models_need_a_prompt_token():
  decoder = MDLMDecoder(output_length=4, steps=4)
  with pytest.raises(ValueError, match="prompt_lengths"):
    _decode(decoder, PROMPTS, jnp.array([4, 0, 1]))
  with pytest.raises(ValueError, match="position 0"):
    decoder.infill(bind(make_logits_fn(SHIFTED), PARAMS), TOKENS,
                   jnp.zeros(TOKENS.shape, bool).at[:, 0].set(True),
                   jax.random.key(0))


# ----------------------------------------------------------------------------
# Parents.

def _tiny_config():
  from configs import tiny  # pylint: disable=import-outside-toplevel
  return tiny.get_config()


def _adapted(**changes):
  """The tiny set's bd3lm4_from_ar recipe with `changes` ('section.key':
  value, of any type)."""
  config = member_recipes.member_configs(_tiny_config())["bd3lm4_from_ar"]
  tree = config.to_dict()
  for key, value in changes.items():
    section, name = key.split(".")
    tree[section][name] = value
  return ml_collections.ConfigDict(tree)


def test_adapted_members_keep_the_parent_backbone_and_a_tenth_of_its_steps():
  members = member_recipes.member_configs(_tiny_config())
  parent = members["ar"]
  for name in member_recipes.ADAPTED_MEMBERS:
    member = members[name]
    assert member.train.init_from == "ar"
    assert member.model.token_shift
    assert member.train.num_steps <= 0.1 * parent.train.num_steps
    train_lib.check_config(member)
    assert not loading._parent_differences(recipes.recipe(parent),
                                              member)
  assert members["bd3lm4_from_ar"].train.block_length == 4
  assert members["bd3lm16_from_ar"].train.complementary_masks
  assert members["mdlm_from_ar"].train.anneal_steps > 0


@pytest.mark.parametrize("config_name", ("tiny", "base"))
def test_controls_spend_the_whole_compute_of_their_adapted_member(
    config_name):
  """Each from-scratch control trains the adapted member's objective and
  block length, from no parent, for the AR-row tokens its parent and its
  adaptation spent together (the lineage table's compute_ar_tokens)."""
  members = member_recipes.member_configs(
      importlib.import_module(f"configs.{config_name}").get_config())

  def compute(name):
    member = members[name]
    return (member.train.num_steps * member.train.batch_size
            * member.data.seq_len
            * member_recipes._forward_copies(member.to_dict()))

  for control, adapted in member_recipes.CONTROL_MEMBERS.items():
    member, target = members[control], members[adapted]
    assert not member.train.get("init_from")
    assert not member.model.get("token_shift")
    assert member.train.objective == target.train.objective
    if target.train.objective == "bd3lm":
      assert member.train.block_length == target.train.block_length
    row = (member.train.batch_size * member.data.seq_len
           * member_recipes._forward_copies(member.to_dict()))
    assert abs(compute(control) - compute("ar") - compute(adapted)) < row
    train_lib.check_config(member)
  tiny_steps = {"bd3lm4_scratch": 210, "mdlm_scratch": 330}
  if config_name == "tiny":  # 300 + 30 x 4 AR rows over 2; 300 + 30 over 1
    assert {n: members[n].train.num_steps for n in tiny_steps} == tiny_steps


@pytest.mark.parametrize("set_name", ("", "base"))
def test_lineage_puts_each_shipped_control_at_its_adapted_members_compute(
    set_name):
  """A shipped set's lineage table (the records of docs/adaptation.md): an
  adapted member's compute is its parent's tokens plus its own at four AR
  rows each (BD3-LM's [x_t ; x_0] and complementary masks), and each
  from-scratch control spent exactly that."""
  rows = {r["member"]: r for r in member_recipes.lineage_rows(
      recipes.set_dir(set_name))}
  adapted = rows["bd3lm4_from_ar"]
  assert adapted["compute_ar_tokens"] == (rows["ar"]["tokens"]
                                          + 4 * adapted["tokens"])
  for control, name in member_recipes.CONTROL_MEMBERS.items():
    assert rows[control]["init_from"] == ""
    assert (rows[control]["compute_ar_tokens"]
            == rows[name]["compute_ar_tokens"])


@pytest.mark.parametrize("change, named", [
    ({"model.d_model": 64}, "model.d_model"),
    ({"data.vocab_size": 2048}, "data.vocab_size"),
    ({"model.num_layers": 3}, "model.num_layers"),
])
def test_init_from_refuses_another_backbone_before_reading(change, named):
  with pytest.raises(ValueError, match=f"train.init_from='ar'.*{named}"):
    loading.parent_params(_adapted(**change), types.SimpleNamespace(
        model_proto=b"unused"))


def test_init_from_refuses_another_tokenizer():
  with pytest.raises(ValueError, match="train.init_from='ar'.*tokenizer"):
    loading.parent_params(_adapted(), types.SimpleNamespace(
        model_proto=b"another tokenizer"))


def test_init_from_refuses_what_it_cannot_find(tmp_path):
  with pytest.raises(ValueError, match="neither a member"):
    loading.parent_params(_adapted(**{"train.init_from": str(tmp_path)}),
                             types.SimpleNamespace(model_proto=b""))


@pytest.mark.parametrize("key, value", [
    ("model.token_shift", "yes"), ("train.complementary_masks", 1),
    ("train.anneal_steps", -1), ("train.init_from", 3)])
def test_adaptation_keys_are_checked(key, value):
  with pytest.raises(ValueError, match=key):
    train_lib.check_config(_adapted(**{key: value}))


def test_adaptation_keys_apply_to_diffusion_objectives_only():
  off = {"train.objective": "ar", "model.token_shift": False,
         "train.complementary_masks": False}
  train_lib.check_config(_adapted(**off))  # present but off: allowed
  for key in ("model.token_shift", "train.complementary_masks"):
    with pytest.raises(ValueError, match=f"{key}=True applies to"):
      train_lib.check_config(_adapted(**{**off, key: True}))


def test_init_from_a_workdir_starts_from_its_parameters(tmp_path):
  config = _tiny_config()
  config.model.update(dict(d_model=32, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=16, mlp_dim=64))
  config.data.update(dict(vocab_size=512, seq_len=32))
  config.model.max_len = 32
  config.train.update(dict(num_steps=2, batch_size=4, eval_every=2,
                           checkpoint_every=2, warmup_steps=1,
                           eval_batches=1))
  parent_dir = str(tmp_path / "ar")
  train_lib.train(config, parent_dir, progress=False,
                  data_dir=str(tmp_path))
  child = ml_collections.ConfigDict(config.to_dict())
  child.train.update(dict(objective="bd3lm", block_length=4,
                          init_from=parent_dir, num_steps=1))
  child.model.token_shift = True
  child.data.eos_fill = False  # a student's key: the parent never had it
  params, record = loading.parent_params(
      child, types.SimpleNamespace(model_proto=b""))
  parent = store.load_trained_params(config, parent_dir)
  chex.assert_trees_all_equal(params, parent)
  assert record["init_from"] == parent_dir and record["steps"] == 2
  summary = train_lib.train(child, str(tmp_path / "child"), progress=False,
                            data_dir=str(tmp_path), init_params=params)
  assert summary["steps"] == 1

  # A block-size schedule trains its first step with blocks of 32 (the
  # whole sequence): the loss of a child trained with blocks of 32, not 4.
  def first_loss(name, **train):
    run = ml_collections.ConfigDict(child.to_dict())
    run.train.update(train)
    train_lib.train(run, str(tmp_path / name), progress=False,
                    data_dir=str(tmp_path), init_params=params)
    with open(tmp_path / name / "metrics.jsonl") as f:
      return [json.loads(line) for line in f][1]["loss"]

  scheduled = first_loss("scheduled", block_schedule="0:32,1:4")
  assert scheduled == first_loss("blocks32", block_length=32)
  assert scheduled != first_loss("blocks4", block_length=4)


def test_block_schedule_parses_and_looks_up():
  schedule = objectives.parse_block_schedule("0:1,50:16,100:256,200:4",
                                             256, 4)
  assert schedule == ((0, 1), (50, 16), (100, 256), (200, 4))
  assert [objectives.block_length_at(schedule, step)
          for step in (0, 49, 50, 150, 199, 200, 10**6)] == [
              1, 1, 16, 256, 256, 4, 4]
  config = _adapted(**{"train.block_schedule": "0:16,5:4"})
  assert registry.block_schedule(config) == ((0, 16), (5, 4))
  assert registry.block_schedule(_adapted()) == ((0, 4),)


@pytest.mark.parametrize("text", [
    "4:4", "0:4,0:4", "0:3,5:4", "0:16,5:8", "0:4,x:4", "0:4:1", "",
    "0:512,5:4"])
def test_block_schedule_refuses_bad_schedules(text):
  with pytest.raises(ValueError, match="train.block_schedule="):
    train_lib.check_config(_adapted(**{"train.block_schedule": text}))


def test_block_schedule_applies_to_bd3lm_only():
  with pytest.raises(ValueError, match="applies to train.objective"):
    train_lib.check_config(_adapted(**{"train.block_schedule": "0:4",
                                       "train.objective": "mdlm"}))
