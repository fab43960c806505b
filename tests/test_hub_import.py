"""The diffusion LMs people run, imported with parity: Dream, SDAR and
Fast-dLLM v2 against transformers' own Qwen2 / Qwen3 models run under the
family's attention pattern (an explicit 4-D mask), LLaDA against the logits
of its authors' modeling code (a committed golden: tests/goldens/
llada_reference.npz, written by benchmarks/hub_import/llada_golden.py), and
our 'llada' decoder against LLaDA's own generate on a stub (tests/goldens/
llada_sampler.npz, benchmarks/hub_import/llada_sampler_golden.py);
their generation conventions (MASK / EOS ids, token shift, attention) and
the refusals (MoE variants, unknown options), named before a tensor is read.

Needs the [peer] extra (torch, transformers, safetensors).
"""

import functools
import pathlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from lm_decoding import checkpoints
from lm_decoding.checkpoints import hf_llada, hf_llama
from lm_decoding.models import make_logits_fn
from lm_decoding.models.binding import Conventions, Model, check_serves
from lm_decoding.models.binding import conventions as conventions_of

import _hub_folders
import torch  # noqa: E402  (the [peer] extra: fails, never skips)
import transformers  # noqa: E402

GOLDEN = pathlib.Path(__file__).parent / "goldens" / "llada_reference.npz"
VOCAB = 97
_QWEN = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
             num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128,
             rms_norm_eps=1e-6, rope_theta=1000.0, eos_token_id=96,
             pad_token_id=95, tie_word_embeddings=False)
# config.json dicts of the Qwen-based diffusion LMs, each with the
# transformers model that has its layout and the mask it is run under.
CASES = {
    "Dream": (dict(_QWEN, model_type="Dream", mask_token_id=90), "qwen2"),
    "sdar": (dict(_QWEN, model_type="sdar", head_dim=24, block_size=4,
                  mask_token_id=91, fuse_cross_entropy=True, ep_size=1,
                  attn_implementation="flex_attention"), "qwen3"),
    "Fast_dLLM_Qwen": (dict(_QWEN, model_type="Fast_dLLM_Qwen", bd_size=8),
                       "qwen2"),
}


@functools.lru_cache(maxsize=None)
def reference(case):
  """The transformers model of the case's layout, random and perturbed."""
  torch.manual_seed(0)
  fields, parent = CASES[case]
  keep = {k: v for k, v in fields.items() if k in _QWEN or k == "head_dim"}
  config = transformers.AutoConfig.for_model(parent, **keep)
  return _hub_folders.perturbed(
      transformers.AutoModelForCausalLM.from_config(config))


def _allowed(config, length):
  """bool[L, L]: the attention pattern the config says (query i, key j)."""
  i = np.arange(length)
  if config.attention == "bidirectional":
    return np.ones((length, length), bool)
  assert config.attention == "block_causal"
  return i[None] // config.block_length <= i[:, None] // config.block_length


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_under_the_family_mask(case):
  fields, _ = CASES[case]
  config = checkpoints.config_from_hf(fields)
  params = jax.tree.map(jnp.asarray, checkpoints.family(fields).params_from_hf(
      reference(case).state_dict(), config))
  tokens = np.random.RandomState(0).randint(0, VOCAB, (3, 16))
  allowed = np.broadcast_to(_allowed(config, 16), (3, 16, 16))
  mask = np.where(allowed, 0.0, -1e9).astype(np.float32)[:, None]
  with torch.no_grad():
    want = reference(case)(torch.tensor(tokens),
                           attention_mask=torch.tensor(mask)).logits.numpy()
  positions = jnp.broadcast_to(jnp.arange(16), (3, 16))
  got = np.asarray(make_logits_fn(config)(params, jnp.asarray(tokens),
                                          positions).logits)
  error = np.abs(got - want).max()
  print(f"{case}: max |logit difference| {error:.2e}")
  assert error < 1e-5
  # The pattern matters: the causal model's logits are far from these.
  with torch.no_grad():
    causal = reference(case)(torch.tensor(tokens)).logits.numpy()
  assert np.abs(causal - want).max() > 1e-2
  exported = checkpoints.family(fields).params_to_hf(params, config)
  original = reference(case).state_dict()
  assert sorted(exported) == sorted(original)
  for name, tensor in original.items():
    np.testing.assert_array_equal(exported[name], tensor.numpy(), name)


def test_the_families_carry_their_conventions():
  dream = checkpoints.config_from_hf(CASES["Dream"][0])
  sdar = checkpoints.config_from_hf(CASES["sdar"][0])
  fast = checkpoints.config_from_hf(CASES["Fast_dLLM_Qwen"][0])
  assert (dream.attention, dream.token_shift, dream.qkv_bias,
          dream.qk_norm) == ("bidirectional", True, True, False)
  assert (sdar.attention, sdar.block_length, sdar.token_shift, sdar.qk_norm,
          sdar.head_dim) == ("block_causal", 4, False, True, 24)
  assert (fast.attention, fast.block_length, fast.token_shift,
          fast.qkv_bias) == ("block_causal", 8, True, True)
  ids = {case: checkpoints.conventions_from_hf(CASES[case][0])
         for case in CASES}
  assert ids["Dream"] == Conventions(mask_id=90, eos_ids=(96,), pad_id=95)
  assert ids["sdar"].mask_id == 91
  # Fast-dLLM v2's MASK is its sampler's (not in its config); sub-blocks 8.
  assert (ids["Fast_dLLM_Qwen"].mask_id,
          ids["Fast_dLLM_Qwen"].sub_block_length) == (151665, 8)
  qwen3 = checkpoints.conventions_from_hf(dict(_QWEN, model_type="qwen3"))
  assert qwen3.mask_id is None and qwen3.eos_ids == (96,)
  llada = checkpoints.conventions_from_hf(_llada("llama_block"))
  assert (llada.mask_id, llada.eos_ids) == (60, (59,))
  assert hf_llada.conventions_from_hf(
      {k: v for k, v in _llada("llama_block").items()
       if k != "mask_token_id"}).mask_id == 126336
  # A model carries them; conventions() adds its config's pattern and shift.
  model = Model(make_logits_fn(fast), None, ids["Fast_dLLM_Qwen"])
  c = conventions_of(model)
  assert (c.mask_id, c.attention, c.block_length, c.token_shift) == (
      151665, "block_causal", 8, True)
  # A model without ids (trained here, a stub) has the project's.
  assert conventions_of(Model(make_logits_fn(dream), None)).mask_id == 4


def test_a_decoder_the_model_cannot_serve_is_refused_by_name():
  dream = Model(make_logits_fn(checkpoints.config_from_hf(
      CASES["Dream"][0])), None)
  sdar = Model(make_logits_fn(checkpoints.config_from_hf(CASES["sdar"][0])),
               None)
  qwen3 = Model(make_logits_fn(checkpoints.config_from_hf(
      dict(_QWEN, model_type="qwen3"))), None,
      checkpoints.conventions_from_hf(dict(_QWEN, model_type="qwen3")))
  with pytest.raises(ValueError, match="decoder 'ar' needs 'causal' "
                     "attention; the model's is 'bidirectional'"):
    check_serves(dream, "decoder 'ar'", causal=True)
  with pytest.raises(ValueError, match="block_length=8; the model is "
                     "block-causal with block_length=4"):
    check_serves(sdar, "decoder 'bd3lm'", causal=False, block_length=8)
  with pytest.raises(ValueError, match="the model has no MASK id"):
    check_serves(qwen3, "decoder 'ar'", masked=True)
  with pytest.raises(ValueError, match="needs non-causal attention"):
    check_serves(qwen3, "decoder 'mdlm'", causal=False)
  check_serves(sdar, "decoder 'bd3lm'", causal=False, block_length=4,
               masked=True)
  check_serves(dream, "decoder 'mdlm'", causal=False, masked=True)


# --- LLaDA against its authors' forward (the golden) -------------------------

# The configs of benchmarks/hub_import/llada_golden.py, as config.json has
# them (LLaDA-8B's block type 'llama'; OLMo's fused 'sequential' block,
# tied, MQA, q/k/v biases).
_LLADA = dict(model_type="llada", rope=True, layer_norm_type="rms",
              include_bias=False, max_sequence_length=64, mask_token_id=60,
              eos_token_id=59, alibi=False, attention_dropout=0.0,
              residual_dropout=0.0, embedding_dropout=0.0, d_model=32,
              n_heads=4, n_layers=2, vocab_size=61)
LLADA = {
    "llama_block": dict(_LLADA, block_type="llama", activation_type="silu",
                        n_kv_heads=2, mlp_hidden_size=48, embedding_size=64,
                        weight_tying=False, rope_theta=500.0,
                        rms_norm_eps=1e-5, include_qkv_bias=False,
                        pad_token_id=59),
    "sequential_block": dict(_LLADA, block_type="sequential",
                             activation_type="swiglu", n_kv_heads=None,
                             multi_query_attention=True, mlp_hidden_size=64,
                             embedding_size=61, weight_tying=True,
                             rope_theta=10000.0, rms_norm_eps=1e-6,
                             include_qkv_bias=True),
}


def _llada(case):
  return dict(LLADA[case])


def _golden_weights(names_and_shapes):
  """The golden's weights (benchmarks/hub_import/llada_golden.py):
  tensor k of the sorted names is RandomState(k).standard_normal * 0.2
  (norm weights 1 + that)."""
  out = {}
  for k, (name, shape) in enumerate(sorted(names_and_shapes)):
    x = np.random.RandomState(k).standard_normal(shape) * 0.2
    out[name] = (x + ("norm" in name or "ln_f" in name)).astype(np.float32)
  return out


@pytest.mark.parametrize("case", LLADA)
def test_llada_logits_match_its_reference_forward(case):
  config = checkpoints.config_from_hf(_llada(case))
  block = LLADA[case]["block_type"]
  shapes = [(t.name, t.shape) for t in hf_llada.layout(config, block).tensors]
  state = _golden_weights(shapes)
  params = checkpoints.family(_llada(case)).params_from_hf(state, config)
  golden = np.load(GOLDEN)
  tokens = golden["tokens"]
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  got = np.asarray(make_logits_fn(config)(
      jax.tree.map(jnp.asarray, params), jnp.asarray(tokens),
      positions).logits)
  error = np.abs(got - golden[case]).max()
  print(f"LLaDA {case}: max |logit difference| {error:.2e}")
  assert got.shape == golden[case].shape
  assert error < 1e-5
  assert (config.attention, config.token_shift) == ("bidirectional", False)
  exported = hf_llada.params_to_hf(params, config, block)
  assert sorted(exported) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(exported[name], state[name], name)


# --- refusals, named, before any tensor is read -------------------------------

@pytest.mark.parametrize("fields, message", [
    (dict(model_type="qwen3_moe"), "Qwen3-MoE, a mixture-of-experts"),
    (dict(model_type="sdar_moe"), "SDAR-MoE"),
    (dict(model_type="lladamoe"), "LLaDA-MoE"),
    (dict(model_type="llada2_moe"), "LLaDA 2.0"),
    (dict(CASES["sdar"][0], block_size=0), "block_size=0 must be an int"),
    (dict(CASES["sdar"][0], attention_bias=True), "attention_bias=True"),
    (dict(CASES["Fast_dLLM_Qwen"][0], bd_size=12), "bd_size=12 must be a "
     "multiple"),
    (dict(CASES["Dream"][0], diffusion_steps=3), "diffusion_steps=3"),
    (dict(_QWEN, model_type="qwen3", attention_bias=True),
     "attention_bias=True"),
    (dict(LLADA["llama_block"], alibi=True), "alibi=True"),
    (dict(LLADA["llama_block"], activation_type="swiglu"),
     "activation_type='swiglu' is not supported with block_type='llama'"),
    (dict(LLADA["llama_block"], block_group_size=2), "block_group_size=2"),
    (dict(LLADA["llama_block"], layer_norm_type="default"),
     "layer_norm_type='default'"),
    (dict(LLADA["llama_block"], scale_logits=True), "scale_logits=True"),
    (dict(LLADA["llama_block"], attention_layer_norm=True),
     "attention_layer_norm=True"),
    (dict(LLADA["llama_block"], n_kv_heads=2, multi_query_attention=True),
     "n_kv_heads=2 and multi_query_attention=True disagree"),
    (dict(LLADA["llama_block"], new_knob=1), "new_knob=1"),
])
def test_unsupported_options_are_refused_by_name(fields, message,
                                                 monkeypatch):
  def no_reads(*args, **kwargs):
    raise AssertionError("a tensor was read before the refusal")
  monkeypatch.setattr(checkpoints.layout, "read_state_dict", no_reads)
  with pytest.raises(ValueError, match=message):
    checkpoints.config_from_hf(fields)


# --- hub-layout folders: inspect, load, adopt ---------------------------------

_TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=False, vocab_size=320)


def test_a_hub_folder_loads_with_its_conventions(tmp_path, monkeypatch):
  from lm_decoding.checkpoints import hub
  from lm_decoding.decoding import base, conventions
  fields = _hub_folders.write_checkpoint(str(tmp_path), dict(
      _TINY, model_type="Dream"))
  seen = hub.inspect(tmp_path)
  tok = seen.tokenizer
  # End ids: the config's, then the tokenizer's eos and end-of-turn tokens.
  assert seen.ids.eos_ids == (tok.token_id("<|endoftext|>"),
                              tok.token_id("<|im_end|>"))
  assert seen.ids.mask_id == fields["mask_token_id"] == tok.token_id(
      "<|mask|>")
  model, _ = hub.load(seen)
  assert model.ids == seen.ids and model.logits_fn.config == seen.config
  # A decoder takes the model's ids; one that cannot serve it is refused.
  mdlm = conventions.adopt(base.make_decoder("mdlm", output_length=8,
                                             steps=4), {"model": model})
  assert (mdlm.mask_id, mdlm.eos_ids, mdlm.pad_id) == (
      seen.ids.mask_id, seen.ids.eos_ids, seen.ids.fill_id)
  with pytest.raises(ValueError, match=r"decoder 'ar' \(role 'model'\) "
                     r"needs 'causal' attention"):
    conventions.adopt(base.make_decoder("ar", output_length=8),
                      {"model": model})
  with pytest.raises(ValueError, match="mask_id=7 is set on the decoder"):
    conventions.adopt(base.make_decoder("mdlm", output_length=8, steps=4,
                                        mask_id=7), {"model": model})
  # Refusals come before any tensor is read: a tokenizer too big.
  def no_reads(*args, **kwargs):
    raise AssertionError("a tensor was read before the refusal")
  monkeypatch.setattr(checkpoints.layout, "read_state_dict", no_reads)
  small = tmp_path / "small"
  small.mkdir()
  (small / "config.json").write_text(__import__("json").dumps(
      dict(fields, vocab_size=200)))
  (small / "tokenizer.json").write_bytes((tmp_path / "tokenizer.json")
                                         .read_bytes())
  with pytest.raises(ValueError, match="tokenizer.json has 300 ids; the "
                     "model's vocabulary is 200"):
    hub.load(small)


def test_block_decoders_must_use_the_models_block_length(tmp_path):
  from lm_decoding.checkpoints import hub
  from lm_decoding.decoding import base, conventions
  _hub_folders.write_checkpoint(str(tmp_path), dict(
      _TINY, model_type="sdar", head_dim=16, block_size=4))
  model, _ = hub.load(tmp_path)
  bd3lm = base.make_decoder("bd3lm", output_length=8, block_length=4,
                            steps=2)
  assert conventions.adopt(bd3lm, {"model": model}).mask_id == (
      model.ids.mask_id)
  with pytest.raises(ValueError, match="decoder 'threshold' \\(role "
                     "'model'\\) attends over the whole canvas; the model is "
                     "block-causal"):
    conventions.adopt(base.make_decoder("threshold", output_length=8,
                                        block_length=4), {"model": model})
  with pytest.raises(ValueError, match="block_length=8; the model is "
                     "block-causal with block_length=4"):
    conventions.adopt(base.make_decoder("bd3lm", output_length=8,
                                        block_length=8, steps=2),
                      {"model": model})


def test_a_direct_decode_refuses_a_model_that_cannot_serve_it():
  """Without the hub job's `adopt`: `decoder.decode` (and its jit) refuses
  an imported model that cannot serve the decoder's role, naming both,
  before anything is traced (the params are None: any model call would
  fail otherwise)."""
  from lm_decoding.decoding import base

  def imported(case):
    fields = CASES[case][0]
    return {"model": Model(make_logits_fn(checkpoints.config_from_hf(fields)),
                           None, checkpoints.conventions_from_hf(fields))}

  prompts, lengths = jnp.ones((1, 3), jnp.int32), jnp.full((1,), 3)
  ar = base.make_decoder("ar", output_length=4)
  for run in (ar.decode, base.jit_decode(ar)):
    with pytest.raises(ValueError, match=r"decoder 'ar' \(role 'model'\) "
                       r"needs 'causal' attention; the model's is "
                       r"'bidirectional'"):
      run(imported("Dream"), prompts, lengths, jax.random.key(0))
  sdar = imported("sdar")
  with pytest.raises(ValueError, match=r"decoder 'bd3lm' \(role 'model'\) "
                     "has block_length=8; the model is block-causal with "
                     "block_length=4"):
    base.make_decoder("bd3lm", output_length=8, block_length=8,
                      steps=2).decode(sdar, prompts, lengths,
                                      jax.random.key(0))
  with pytest.raises(ValueError, match="has block_length=8; the model is "
                     "block-causal"):  # None: one block of T = 8
    base.make_decoder("bd3lm", output_length=8, steps=2).decode(
        sdar, prompts, lengths, jax.random.key(0))
  with pytest.raises(ValueError, match="decoder 'llada' \\(role 'model'\\) "
                     "attends over the whole canvas"):
    base.make_decoder("llada", output_length=8, steps=2,
                      block_length=4).decode(sdar, prompts, lengths,
                                             jax.random.key(0))
  # The decoders built for a block-causal model pass the check.
  v2 = imported("Fast_dLLM_Qwen")
  for name, options in (("bd3lm", dict(block_length=8, steps=2)),
                        ("self_speculative", {})):
    base.check_models(base.make_decoder(name, output_length=8, **options), v2)


# --- LLaDA's own sampler on a stub (the golden of its generate) ---------------

SAMPLER = pathlib.Path(__file__).parent / "goldens" / "llada_sampler.npz"


class _BagOfTokens:
  """benchmarks/hub_import/llada_sampler_golden.py's stub denoiser in JAX:
  logits[i] = A[i] + E[x_i] C + mean_j E[x_j] B (bidirectional)."""

  vocab_size, max_len = 24, 68

  def __init__(self):
    rng = np.random.RandomState(0)
    self.w = dict(A=rng.standard_normal((68, 24)) * 4.0,
                  E=rng.standard_normal((24, 8)),
                  B=rng.standard_normal((8, 24)) * 2.0,
                  C=rng.standard_normal((8, 24)) * 2.0)

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    from lm_decoding.models.output import ModelOutput
    del params, cache, attention_mask
    w = {k: jnp.asarray(v, jnp.float32) for k, v in self.w.items()}
    e = w["E"][tokens]
    logits = (w["A"][positions] + e @ w["C"]
              + e.mean(1, keepdims=True) @ w["B"])
    return ModelOutput(logits, None, e)


def test_llada_decoder_draws_what_llada_generate_draws():
  """64 greedy tokens, low-confidence remasking, blocks of 16, 32 steps:
  our 'llada' decoder against the golden of LLaDA's own generate."""
  from lm_decoding.decoding import base
  golden = np.load(SAMPLER)
  ids = Conventions(mask_id=23, eos_ids=(22,), pad_id=0)
  model = Model(_BagOfTokens(), None, ids)
  from lm_decoding.decoding import conventions
  decoder = conventions.adopt(base.make_decoder(
      "llada", output_length=64, steps=32, block_length=16,
      remasking="low_confidence", eos_ids=()), {"model": model})
  assert decoder.mask_id == 23
  out = decoder.decode({"model": model}, jnp.asarray(golden["prompts"]),
                       jnp.full((2,), 4, jnp.int32), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out.tokens), golden["tokens"])


def test_a_causal_denoising_loop_needs_a_causal_model():
  """An iterative decoder with attention='causal' (its loop builds causal
  masks) serves an AR model with a MASK id, and refuses a bidirectional
  one; with attention='bidirectional' the reverse."""
  from lm_decoding.decoding import base, conventions
  ar = Model(make_logits_fn(checkpoints.config_from_hf(
      dict(_QWEN, model_type="qwen3"))), None,
      Conventions(mask_id=90, eos_ids=(96,)))
  dream = Model(make_logits_fn(checkpoints.config_from_hf(
      CASES["Dream"][0])), None, Conventions(mask_id=90, eos_ids=(96,)))
  causal = base.make_decoder("mdlm", output_length=8, steps=4,
                             attention="causal")
  assert conventions.adopt(causal, {"model": ar}).mask_id == 90
  with pytest.raises(ValueError, match="needs 'causal' attention"):
    conventions.adopt(causal, {"model": dream})
  with pytest.raises(ValueError, match="needs non-causal attention"):
    conventions.adopt(base.make_decoder("mdlm", output_length=8, steps=4),
                      {"model": ar})


def test_fast_dllm_v2_sub_blocks_come_from_the_model():
  from lm_decoding.decoding import base, conventions
  fields = CASES["Fast_dLLM_Qwen"][0]
  model = Model(make_logits_fn(checkpoints.config_from_hf(fields)), None,
                checkpoints.conventions_from_hf(fields))
  sampler = conventions.adopt(base.make_decoder(
      "bd3lm", output_length=16, block_length=8, steps=16,
      remasking="threshold"), {"model": model})
  assert (sampler.sub_block_length, sampler.ar_first_token,
          sampler.mask_id) == (8, True, 151665)
  ancestral = conventions.adopt(base.make_decoder(
      "bd3lm", output_length=16, block_length=8, steps=4), {"model": model})
  assert ancestral.sub_block_length is None
