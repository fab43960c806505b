"""Hugging Face checkpoint import/export against `transformers` itself.

One tiny random-weight model per row of the importer table (GPT-2; LLaMA
with each RoPE scaling, in both spellings of the block, with biases, tied;
Mistral with a sliding window; Qwen2 with its q/k/v biases, with and
without a window; Qwen3 with its per-head q/k norm), every parameter
perturbed so biases and norm weights are not their zero/one init (no hub
download). Logits are compared on
right-padded ragged batches (HF gets the attention_mask; only the valid
positions are compared); greedy generation of 64 tokens on a ragged batch
(our 'ar' decoder on right-padded prompts, KV-cached) against HF `generate`
on each row alone (a padded HF batch would count pad slots in the sliding
window). Bidirectional and block-causal variants against HF given the same
attention pattern as an explicit 4-D float mask built here.

Needs the [peer] extra (torch, transformers, safetensors).
"""

import functools

import numpy as np
import pytest

import chex
import jax
import jax.numpy as jnp

from lm_decoding import checkpoints
from lm_decoding.checkpoints import hf_gpt2, hf_llama, options
from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model, init_params, make_logits_fn
from lm_decoding.special_tokens import MASK_ID

# The [peer] extra (pip install -e ".[test,peer]"): without it these tests
# fail at import, never skip.
import _hub_folders
import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 97
NEW_TOKENS = 64
LENGTHS = np.array([9, 4, 1, 6])  # ragged prompt lengths, width 9

_LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
              num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5, rope_theta=500.0)
# config.json dicts, one per row of the importer table (family x option).
CASES = {
    "gpt2": dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4,
                 vocab_size=VOCAB, n_positions=128),
    "gpt2-untied": dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4,
                        vocab_size=VOCAB, n_positions=128,
                        tie_word_embeddings=False),
    "llama": dict(_LLAMA, model_type="llama"),
    "llama-tied-bias": dict(_LLAMA, model_type="llama",
                            tie_word_embeddings=True, attention_bias=True,
                            mlp_bias=True),
    "llama-linear": dict(_LLAMA, model_type="llama", rope_parameters=dict(
        rope_type="linear", factor=4.0, rope_theta=500.0)),
    # Case I1: the older spelling (transformers < 4.45 wrote `type`).
    "llama-linear-type": dict(_LLAMA, model_type="llama",
                              rope_scaling=dict(type="linear", factor=4.0)),
    "llama-llama3": dict(_LLAMA, model_type="llama", rope_parameters=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=32,
        rope_theta=500.0)),
    # Within max_position_embeddings (every call here) the default RoPE.
    "llama-dynamic": dict(_LLAMA, model_type="llama", rope_scaling=dict(
        type="dynamic", factor=2.0)),
    "llama-yarn": dict(_LLAMA, model_type="llama", rope_scaling=dict(
        type="yarn", factor=4.0, original_max_position_embeddings=32,
        beta_fast=16.0, beta_slow=2.0)),
    "llama-yarn-mscale": dict(_LLAMA, model_type="llama", rope_parameters=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=32,
        mscale=0.8, mscale_all_dim=0.4, truncate=False, rope_theta=500.0)),
    # Case I2: a window shorter than the sequences.
    "mistral-window": dict(_LLAMA, model_type="mistral", sliding_window=4),
    "mistral-no-window": dict(_LLAMA, model_type="mistral",
                              sliding_window=None),
    "qwen2": dict(_LLAMA, model_type="qwen2"),
    "qwen2-window": dict(_LLAMA, model_type="qwen2", use_sliding_window=True,
                         sliding_window=5, max_window_layers=0),
    # Per-head q/k RMSNorm; a head_dim other than hidden_size / heads.
    "qwen3": dict(_LLAMA, model_type="qwen3", head_dim=24),
}


@functools.lru_cache(maxsize=None)
def hf_model(case):
  torch.manual_seed(0)
  torch.set_num_threads(1)
  fields = dict(CASES[case])
  config = transformers.AutoConfig.for_model(fields.pop("model_type"),
                                             **fields)
  return _hub_folders.perturbed(
      transformers.AutoModelForCausalLM.from_config(config))


def _module(case):
  """The family module by hand (`checkpoints.family` is tested below)."""
  return hf_gpt2 if CASES[case]["model_type"] == "gpt2" else hf_llama


def _imported(case, **overrides):
  module = _module(case)
  config = module.config_from_hf(CASES[case], **overrides)
  params = module.params_from_hf(hf_model(case).state_dict(), config)
  return config, jax.tree.map(jnp.asarray, params)


def test_family_follows_model_type():
  """Also: the config.json dict and the transformers object built from it
  (whose to_dict() spells options its own way) import alike."""
  for case in CASES:
    assert checkpoints.family(CASES[case]) is _module(case)
    assert checkpoints.config_from_hf(hf_model(case).config) == _module(
        case).config_from_hf(CASES[case])
  with pytest.raises(ValueError, match="model_type='t5' is not importable"):
    checkpoints.family({"model_type": "t5"})


def _prompts(width=int(LENGTHS.max())):
  tokens = np.random.RandomState(0).randint(5, VOCAB, (len(LENGTHS), width))
  valid = np.arange(width)[None] < LENGTHS[:, None]
  return np.where(valid, tokens, 0), valid


def _positions(tokens):
  return jnp.asarray(np.broadcast_to(np.arange(tokens.shape[1]),
                                     tokens.shape))


def test_config_from_hf():
  gpt2 = checkpoints.config_from_hf(hf_model("gpt2").config)
  assert (gpt2.norm, gpt2.positional, gpt2.mlp_activation, gpt2.norm_eps,
          gpt2.use_bias, gpt2.tie_embeddings, gpt2.scale_embeddings,
          gpt2.mlp_dim, gpt2.max_len) == ("layernorm", "learned", "gelu",
                                          1e-5, True, True, False, 256, 128)
  llama = checkpoints.config_from_hf(hf_model("llama").config)
  assert (llama.num_heads, llama.num_kv_heads, llama.head_dim,
          llama.rope_base, llama.norm_eps, llama.tie_embeddings,
          llama.use_bias, llama.qkv_bias, llama.rope_scaling,
          llama.sliding_window) == (4, 2, 16, 500.0, 1e-5, False, False,
                                    False, None, 0)
  assert checkpoints.config_from_hf(CASES["qwen2"]).qkv_bias
  assert checkpoints.config_from_hf(CASES["mistral-window"]).sliding_window == 4
  assert checkpoints.config_from_hf(CASES["qwen2-window"]).sliding_window == 5


def test_both_spellings_of_the_rope_block_read_the_same():
  """Case I1: `rope_scaling={'type': ...}` (older files), `rope_type`, and
  `rope_parameters` give one config; the transformers object too."""
  spellings = [dict(type="linear", factor=4.0),
               dict(rope_type="linear", factor=4.0)]
  read = hf_llama.config_from_hf
  configs = {read(dict(CASES["llama"], rope_scaling=block))
             for block in spellings}
  configs.add(read(dict(CASES["llama"], rope_parameters=dict(
      rope_type="linear", factor=4.0, rope_theta=500.0))))
  configs.add(read(hf_model("llama-linear-type").config))
  assert len(configs) == 1
  (config,) = configs
  assert (config.rope_scaling.kind, config.rope_scaling.factor) == ("linear",
                                                                    4.0)


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case):
  config, params = _imported(case)
  tokens, valid = _prompts(width=24)
  valid[1, :20] = True  # one row longer than the windows and contexts
  with torch.no_grad():
    want = hf_model(case)(
        torch.tensor(tokens),
        attention_mask=torch.tensor(valid.astype(np.int64))).logits.numpy()
  got = make_logits_fn(config)(params, jnp.asarray(tokens),
                               _positions(tokens)).logits
  error = np.abs(np.asarray(got) - want)[valid].max()
  print(f"{case}: max |logit difference| {error:.2e}")
  assert error < 1e-4
  if config.rope_scaling or config.sliding_window:  # the option matters
    plain = config.replace(rope_scaling=None, sliding_window=0)
    ignored = make_logits_fn(plain)(params, jnp.asarray(tokens),
                                    _positions(tokens)).logits
    assert np.abs(np.asarray(ignored) - want)[valid].max() > 1e-2


def _greedy(case, name="ar", **options):
  """Our greedy decode of the ragged prompts with decoder `name`."""
  config, params = _imported(case)
  tokens, _ = _prompts()
  decoder = base.make_decoder(name, output_length=NEW_TOKENS, eos_ids=(),
                              sampling=SamplingConfig(temperature=0.0),
                              **options)
  models = {role: Model(make_logits_fn(config), params)
            for role in base.decoder_class(name).roles}
  return decoder.decode(models, jnp.asarray(tokens), jnp.asarray(LENGTHS),
                        None), tokens


@pytest.mark.parametrize("case", CASES)
def test_greedy_generation_matches_transformers(case):
  ours, tokens = _greedy(case)
  _assert_hf_generates(case, tokens, ours.tokens)


@pytest.mark.parametrize("name, options", [
    ("prompt_lookup", dict(gamma=3)), ("jacobi", dict(gamma=3))])
def test_sliding_window_holds_in_draft_and_verify_decoders(name, options):
  """Case I2 in other decoders: drafts verified in chunks of gamma + 1 with
  cache rollback, on the windowed Mistral, still give HF's greedy output."""
  ours, tokens = _greedy("mistral-window", name, **options)
  _assert_hf_generates("mistral-window", tokens, ours.tokens)


def _assert_hf_generates(case, tokens, ours_BxT):
  """HF `generate` (greedy, cached) on each row alone equals ours_BxT."""
  for b, n in enumerate(LENGTHS):
    with torch.no_grad():
      out = hf_model(case).generate(
          torch.tensor(tokens[b:b + 1, :n]), do_sample=False,
          max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
          pad_token_id=0, eos_token_id=None, use_cache=True)
    np.testing.assert_array_equal(np.asarray(ours_BxT[b]),
                                  out[0, n:].numpy(), f"row {b}")


@pytest.mark.parametrize("case", CASES)
def test_export_round_trip(case):
  config, params = _imported(case)
  model = hf_model(case)
  exported = _module(case).params_to_hf(params, config)
  original = model.state_dict()
  assert sorted(exported) == sorted(original)
  for name, tensor in original.items():
    np.testing.assert_array_equal(exported[name], tensor.numpy(), name)
  # The exported dict loads into a fresh HF model (strict: no key left over).
  fresh = type(model)(model.config)
  fresh.load_state_dict({k: torch.tensor(v) for k, v in exported.items()})


def _hf_with_mask(case, tokens, allowed_BxLxS):
  """HF logits with an explicit additive 4-D float mask (0 where allowed)."""
  mask = np.where(allowed_BxLxS, 0.0, -1e9).astype(np.float32)[:, None]
  with torch.no_grad():
    return hf_model(case)(torch.tensor(tokens),
                          attention_mask=torch.tensor(mask)).logits.numpy()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("attention", ["bidirectional", "block_causal"])
def test_bidirectional_and_block_causal_variants_match_transformers(
    case, attention):
  """The LLaDA/Dream backbone: any imported family with attention
  'bidirectional' (or block-causal, blocks of 4) equals HF run with the same
  pattern as a 4-D float mask, built here from indices: |i - j| < W where
  the family has a window, j's block <= i's block for block-causal.
  """
  overrides = dict(attention=attention)
  if attention == "block_causal":
    overrides["block_length"] = 4
  config, params = _imported(case, **overrides)
  tokens, valid = _prompts(width=16)
  noisy = np.where(valid, tokens, MASK_ID)
  i = np.arange(16)
  allowed = np.ones((16, 16), bool)
  if attention == "block_causal":
    allowed = i[None] // 4 <= i[:, None] // 4
  if config.sliding_window:
    allowed &= np.abs(i[:, None] - i[None]) < config.sliding_window
  allowed = np.broadcast_to(allowed, (len(LENGTHS), 16, 16))
  want = _hf_with_mask(case, noisy, allowed)
  got = make_logits_fn(config)(params, jnp.asarray(noisy),
                               _positions(noisy)).logits
  assert np.abs(np.asarray(got) - want).max() < 1e-4
  causal = np.broadcast_to(i[None] <= i[:, None], allowed.shape)
  assert np.abs(_hf_with_mask(case, noisy, causal) - want).max() > 1e-2


@pytest.mark.parametrize("case", ["gpt2", "llama", "mistral-window", "qwen2"])
@pytest.mark.parametrize("override", [
    dict(attention="bidirectional"),
    dict(attention="block_causal", block_length=2),
    dict(dtype="bfloat16"), dict(dtype="float16"),
    dict(param_dtype="bfloat16"),
    dict(quantization="int8_weights"), dict(kv_cache_dtype="int8")])
def test_every_documented_override_works_for_every_family(case, override):
  """Each of options.OVERRIDES on each family: the import loads, the model
  runs (cached for the KV-cache dtype), the dtype/quantisation overrides
  stay near the float32 logits, the attention overrides change them (their
  parity with HF: the test above), and the parameters export."""
  assert set(override) <= set(options.OVERRIDES)
  config, params = _imported(case, **override)
  reference_config, reference = _imported(case)
  tokens, _ = _prompts(width=8)
  logits_fn = make_logits_fn(config)
  cache = (logits_fn.init_cache(len(LENGTHS), 8)
           if "kv_cache_dtype" in override else None)
  got = np.asarray(logits_fn(params, jnp.asarray(tokens), _positions(tokens),
                             cache=cache).logits)
  want = np.asarray(make_logits_fn(reference_config)(
      reference, jnp.asarray(tokens), _positions(tokens)).logits)
  assert np.isfinite(got).all()
  if "attention" in override:
    assert np.abs(got - want).max() > 1e-3
  else:
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
  exported = _module(case).params_to_hf(params, config)
  assert sorted(exported) == sorted(hf_model(case).state_dict())


def test_refused_overrides_are_named():
  with pytest.raises(ValueError, match=r"overrides \['d_model'\] are not "
                     r"allowed"):
    hf_llama.config_from_hf(CASES["llama"], d_model=32)


# --- refused options, named, before any tensor is read -----------------------

@pytest.mark.parametrize("case, change, message", [
    ("gpt2", dict(activation_function="relu"), "activation_function='relu'"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True),
     "scale_attn_by_inverse_layer_idx=True"),
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention=True"),
    ("gpt2", dict(n_ctx=64), "n_ctx=64"),
    ("llama", dict(rope_scaling=dict(type="dynamic", factor=2.0, low=1)),
     r"rope_type='dynamic' does not use \['low'\]"),
    ("llama", dict(rope_scaling=dict(rope_type="longrope", short_factor=[1],
                                     long_factor=[1])), "rope_type='longrope'"),
    ("llama", dict(rope_scaling=dict(type="linear", factor=2.0, beta=3)),
     r"does not use \['beta'\]"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    ("llama", dict(rope_scaling=dict(rope_type="llama3", factor=8.0)),
     r"rope_type='llama3' needs \['low_freq_factor', 'high_freq_factor'\]"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("llama", dict(attention_bias=True), "attention_bias=True and mlp_bias"),
    ("llama", dict(sliding_window=4), "sliding_window=4 is not represented"),
    ("llama", dict(quantization_config=dict(quant_method="gptq")),
     "quantization_config="),
    ("llama", dict(model_type="gemma"), "model_type='gemma'"),
    ("mistral-window", dict(layer_types=["sliding_attention"] * 2),
     "layer_types="),
    ("qwen2", dict(use_sliding_window=True, sliding_window=4,
                   max_window_layers=1), "max_window_layers=1"),
    ("qwen2", dict(layer_types=["full_attention", "sliding_attention"],
                   use_sliding_window=True, sliding_window=4), "layer_types"),
    ("qwen2", dict(some_new_option=1), "some_new_option=1"),
])
def test_unsupported_options_are_refused_by_name(case, change, message,
                                                 monkeypatch):
  def no_reads(*args, **kwargs):
    raise AssertionError("a tensor was read before the refusal")
  monkeypatch.setattr(checkpoints.layout, "read_state_dict", no_reads)
  with pytest.raises(ValueError, match=message):
    _module(case).config_from_hf(dict(CASES[case], **change))


# --- tensors: layouts, buffers, tied copies ----------------------------------

def test_safetensors_file_loads(tmp_path):
  from safetensors.numpy import save_file
  config, params = _imported("gpt2")
  # The hub's gpt2 layout: no 'transformer.' prefix, no tied lm_head, and
  # the causal-mask buffers of older files.
  state = {k.removeprefix("transformer."): v.numpy()
           for k, v in hf_model("gpt2").state_dict().items()
           if k != "lm_head.weight"}
  state["h.0.attn.bias"] = np.ones((1, 1, 128, 128), np.float32)
  save_file(state, str(tmp_path / "model.safetensors"))
  loaded = hf_gpt2.params_from_hf(tmp_path / "model.safetensors", config)
  chex.assert_trees_all_equal(loaded, params)


@pytest.mark.parametrize("case,name,shape", [
    ("gpt2", "transformer.h.1.attn.c_attn.weight", (64, 192)),
    ("llama", "model.layers.0.self_attn.k_proj.weight", (32, 64)),
    ("qwen2", "model.layers.1.self_attn.v_proj.bias", (32,)),
])
def test_bad_tensors_are_named(case, name, shape):
  config, _ = _imported(case)
  module = _module(case)
  state = {k: v.numpy() for k, v in hf_model(case).state_dict().items()}
  wrong_shape = (shape[0] + 1,) + shape[1:]
  wrong = dict(state, **{name: np.zeros(wrong_shape)})
  with pytest.raises(ValueError, match=rf"'{name}' has shape "
                     rf"{wrong_shape}; expected {shape}".replace(
                         "(", r"\(").replace(")", r"\)")):
    module.params_from_hf(wrong, config)
  missing = {k: v for k, v in state.items() if k != name}
  with pytest.raises(ValueError, match=rf"lacks tensor '{name}'"):
    module.params_from_hf(missing, config)
  extra = dict(state, **{"model.extra.weight": np.zeros(3)})
  with pytest.raises(ValueError, match=r"unexpected tensors "
                     r"\['model.extra.weight'\]"):
    module.params_from_hf(extra, config)


@pytest.mark.parametrize("case", ["llama-linear", "llama-yarn"])
def test_rope_inv_freq_buffers_are_checked_and_skipped(case):
  """Case I4: `model.layers.N.self_attn.rotary_emb.inv_freq` (and the
  model-level `model.rotary_emb.inv_freq`) are skipped when they hold the
  config's frequencies, refused by name when not; unknown tensors still
  refused."""
  config, params = _imported(case)
  state = {k: v.numpy() for k, v in hf_model(case).state_dict().items()}
  inv_freq = hf_model(case).model.rotary_emb.inv_freq.numpy()
  with_buffers = dict(state, **{
      "model.rotary_emb.inv_freq": inv_freq,
      **{f"model.layers.{i}.self_attn.rotary_emb.inv_freq": inv_freq
         for i in range(2)}})
  loaded = hf_llama.params_from_hf(with_buffers, config)
  chex.assert_trees_all_equal(loaded, params)
  other = dict(with_buffers, **{
      "model.layers.1.self_attn.rotary_emb.inv_freq": inv_freq * 2})
  with pytest.raises(ValueError, match=r"'model.layers.1.self_attn."
                     r"rotary_emb.inv_freq' holds RoPE frequencies"):
    hf_llama.params_from_hf(other, config)
  with pytest.raises(ValueError, match=r"unexpected tensors "
                     r"\['model.layers.0.self_attn.rotary_emb.cos'\]"):
    hf_llama.params_from_hf(dict(state, **{
        "model.layers.0.self_attn.rotary_emb.cos": inv_freq}), config)


@pytest.mark.parametrize("case, embedding, head", [
    ("llama-tied-bias", "model.embed_tokens.weight", "lm_head.weight"),
    ("gpt2", "transformer.wte.weight", "lm_head.weight")])
def test_tied_checkpoints_load_from_any_layout(case, embedding, head):
  """Case I6: a tied file may store the embedding only, the head only (as
  some writers do), or both (then equal)."""
  config, params = _imported(case)
  module = _module(case)
  state = {k: v.numpy() for k, v in hf_model(case).state_dict().items()}
  for drop in (head, embedding):
    loaded = module.params_from_hf(
        {k: v for k, v in state.items() if k != drop}, config)
    chex.assert_trees_all_equal(loaded, params)
  state[head] = state[head] + 1.0
  with pytest.raises(ValueError, match=f"'{head}' differs from "
                     f"'{embedding}'"):
    module.params_from_hf(state, config)
  both_missing = {k: v for k, v in state.items() if k not in (head,
                                                              embedding)}
  with pytest.raises(ValueError, match=f"lacks tensor '{embedding}'"):
    module.params_from_hf(both_missing, config)


def test_library_does_not_import_torch():
  import subprocess
  import sys
  code = ("import sys, lm_decoding.checkpoints; "
          "assert 'torch' not in sys.modules and "
          "'transformers' not in sys.modules, 'peer imported'")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("case, field, length", [
    ("gpt2", "n_positions", 20),  # transformers raises; it returned NaN
    ("llama-dynamic", "max_position_embeddings", 24)])  # HF rescales RoPE
def test_forward_refuses_more_tokens_than_the_checkpoint_positions(
    case, field, length):
  """Issue 37: past its position count an imported GPT-2 returned NaN and a
  dynamic-NTK LLaMA ran on unscaled RoPE (1.0 off transformers' logits);
  both now refuse a known position past it, and run at the limit."""
  fields = dict(CASES[case], **{field: 16})
  config = checkpoints.config_from_hf(fields)
  assert config.max_len == 16
  logits_fn = make_logits_fn(config)
  params = init_params(config, jax.random.key(0))
  tokens = jnp.ones((1, length), jnp.int32)
  with pytest.raises(ValueError, match=rf"positions reach {length - 1}; the "
                     r"model's max_len=16 allows 0\.\.15"):
    logits_fn(params, tokens, _positions(tokens))
  at_limit = logits_fn(params, tokens[:, :16], _positions(tokens[:, :16]))
  assert np.isfinite(np.asarray(at_limit.logits)).all()
