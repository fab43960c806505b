"""Hugging Face checkpoint import/export against `transformers` itself.

Randomly initialised tiny GPT-2 and LLaMA (GQA) models, every parameter
perturbed so biases and norm weights are not their zero/one init (no hub
download). Logits are compared on right-padded ragged batches (HF gets the
attention_mask; only the valid positions are compared); greedy generation on
ragged batches: our 'ar' decoder on right-padded prompts, HF `generate` on
the same prompts left-padded (its position ids follow the mask, so every
row's prompt sits at positions 0..len-1 in both).

Needs the [peer] extra (torch, transformers, safetensors).
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from lm_decoding.checkpoints import hf_gpt2, hf_llama
from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import make_logits_fn
from lm_decoding.special_tokens import MASK_ID

# The [peer] extra (pip install -e ".[test,peer]"): without it these tests
# fail at import, never skip.
import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 97
NEW_TOKENS = 64
LENGTHS = np.array([9, 4, 1, 6])  # ragged prompt lengths, width 9


def _perturbed(model):
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn(p.shape, generator=generator))
  return model.eval()


@pytest.fixture(scope="module")
def hf_models():
  torch.manual_seed(0)
  torch.set_num_threads(1)
  # n_positions 128 (not 64): a 9-token prompt plus 64 new tokens must fit.
  gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=128))
  llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500.0))
  return {"gpt2": (hf_gpt2, _perturbed(gpt2)),
          "llama": (hf_llama, _perturbed(llama))}


FAMILIES = ("gpt2", "llama")


def _imported(hf_models, family, **overrides):
  module, model = hf_models[family]
  config = module.config_from_hf(model.config, **overrides)
  params = module.params_from_hf(model.state_dict(), config)
  return module, model, config, jax.tree.map(jnp.asarray, params)


def _prompts(width=int(LENGTHS.max())):
  tokens = np.random.RandomState(0).randint(5, VOCAB, (len(LENGTHS), width))
  valid = np.arange(width)[None] < LENGTHS[:, None]
  return np.where(valid, tokens, 0), valid


def test_config_from_hf(hf_models):
  gpt2 = hf_gpt2.config_from_hf(hf_models["gpt2"][1].config)
  assert (gpt2.norm, gpt2.positional, gpt2.mlp_activation, gpt2.norm_eps,
          gpt2.use_bias, gpt2.tie_embeddings, gpt2.scale_embeddings,
          gpt2.mlp_dim, gpt2.max_len) == ("layernorm", "learned", "gelu",
                                          1e-5, True, True, False, 256, 128)
  llama = hf_llama.config_from_hf(hf_models["llama"][1].config)
  assert (llama.num_heads, llama.num_kv_heads, llama.head_dim,
          llama.rope_base, llama.norm_eps, llama.tie_embeddings,
          llama.use_bias) == (4, 2, 16, 500.0, 1e-5, False, False)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(hf_models, family):
  _, model, config, params = _imported(hf_models, family)
  tokens, valid = _prompts()
  with torch.no_grad():
    want = model(torch.tensor(tokens),
                 attention_mask=torch.tensor(valid.astype(np.int64))).logits
  positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
  got = make_logits_fn(config)(params, jnp.asarray(tokens),
                               jnp.asarray(positions)).logits
  assert np.abs(np.asarray(got) - want.numpy())[valid].max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_transformers(hf_models, family):
  _, model, config, params = _imported(hf_models, family)
  tokens, valid = _prompts()
  decoder = base.make_decoder("ar", output_length=NEW_TOKENS, eos_ids=(),
                              sampling=SamplingConfig(temperature=0.0))
  ours = decoder.decode(base.bind(make_logits_fn(config), params),
                        jnp.asarray(tokens), jnp.asarray(LENGTHS), None)
  width = tokens.shape[1]
  left = np.zeros_like(tokens)
  for b, n in enumerate(LENGTHS):  # left-pad for HF
    left[b, width - n:] = tokens[b, :n]
  with torch.no_grad():
    out = model.generate(
        torch.tensor(left),
        attention_mask=torch.tensor((left != 0) | (np.arange(width) >=
                                                   width - LENGTHS[:, None])
                                    ).long(),
        do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        pad_token_id=0, eos_token_id=None, use_cache=True)
  np.testing.assert_array_equal(np.asarray(ours.tokens),
                                out[:, width:].numpy())


@pytest.mark.parametrize("family", FAMILIES)
def test_export_round_trip(hf_models, family):
  module, model, config, params = _imported(hf_models, family)
  exported = module.params_to_hf(params, config)
  original = model.state_dict()
  assert sorted(exported) == sorted(original)
  for name, tensor in original.items():
    np.testing.assert_array_equal(exported[name], tensor.numpy(), name)
  # The exported dict loads into a fresh HF model (strict: no key left over).
  fresh = type(model)(model.config)
  fresh.load_state_dict({k: torch.tensor(v) for k, v in exported.items()})


def test_safetensors_file_loads(hf_models, tmp_path):
  from safetensors.numpy import save_file
  _, model, config, params = _imported(hf_models, "gpt2")
  # The hub's gpt2 layout: no 'transformer.' prefix, no tied lm_head, and
  # the causal-mask buffers of older files.
  state = {k.removeprefix("transformer."): v.numpy()
           for k, v in model.state_dict().items() if k != "lm_head.weight"}
  state["h.0.attn.bias"] = np.ones((1, 1, 128, 128), np.float32)
  save_file(state, str(tmp_path / "model.safetensors"))
  loaded = hf_gpt2.params_from_hf(tmp_path / "model.safetensors", config)
  jax.tree.map(np.testing.assert_array_equal, loaded,
               jax.tree.map(np.asarray, params))


@pytest.mark.parametrize("family,name,shape", [
    ("gpt2", "transformer.h.1.attn.c_attn.weight", (64, 192)),
    ("llama", "model.layers.0.self_attn.k_proj.weight", (32, 64)),
])
def test_bad_tensors_are_named(hf_models, family, name, shape):
  module, model, config, _ = _imported(hf_models, family)
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  wrong = dict(state, **{name: np.zeros((shape[0] + 1, shape[1]))})
  with pytest.raises(ValueError, match=rf"'{name}' has shape "
                     rf"\({shape[0] + 1}, {shape[1]}\); expected "
                     rf"\({shape[0]}, {shape[1]}\)"):
    module.params_from_hf(wrong, config)
  missing = {k: v for k, v in state.items() if k != name}
  with pytest.raises(ValueError, match=rf"lacks tensor '{name}' \(expected "
                     rf"shape \({shape[0]}, {shape[1]}\)\)"):
    module.params_from_hf(missing, config)
  extra = dict(state, **{"model.extra.weight": np.zeros(3)})
  with pytest.raises(ValueError, match=r"unexpected tensors "
                     r"\['model.extra.weight'\]"):
    module.params_from_hf(extra, config)


def test_tied_head_must_equal_embedding(hf_models):
  _, model, config, _ = _imported(hf_models, "gpt2")
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  state["lm_head.weight"] = state["lm_head.weight"] + 1.0
  with pytest.raises(ValueError, match="'lm_head.weight' differs from "
                     "'transformer.wte.weight'"):
    hf_gpt2.params_from_hf(state, config)


def test_unsupported_hf_options_are_refused(hf_models):
  config = hf_models["gpt2"][1].config.to_dict()
  with pytest.raises(ValueError, match="activation_function='relu'"):
    hf_gpt2.config_from_hf(dict(config, activation_function="relu"))
  config = hf_models["llama"][1].config.to_dict()
  with pytest.raises(ValueError, match="rope_type='llama3'"):
    hf_llama.config_from_hf(dict(config, rope_parameters={
        "rope_type": "llama3", "rope_theta": 1e4}))


def test_bidirectional_llama_denoises(hf_models):
  """The LLaDA/Dream backbone: the LLaMA import with bidirectional attention.

  One denoising forward (each row's prompt, then MASK up to the width)
  equals HF's with an all-True 4-D mask (no causal mask) at every position.
  """
  _, model, config, params = _imported(hf_models, "llama",
                                       attention="bidirectional")
  tokens, valid = _prompts(width=16)
  noisy = np.where(valid, tokens, MASK_ID)
  full = torch.ones((noisy.shape[0], 1, 16, 16), dtype=torch.bool)
  with torch.no_grad():
    want = model(torch.tensor(noisy), attention_mask=full).logits.numpy()
  positions = np.broadcast_to(np.arange(16), noisy.shape)
  got = make_logits_fn(config)(params, jnp.asarray(noisy),
                               jnp.asarray(positions)).logits
  assert np.abs(np.asarray(got) - want).max() < 1e-4
  causal = make_logits_fn(hf_llama.config_from_hf(model.config))(
      params, jnp.asarray(noisy), jnp.asarray(positions)).logits
  assert np.abs(np.asarray(causal) - want).max() > 1e-2  # the mask matters


def test_library_does_not_import_torch():
  import subprocess
  import sys
  code = ("import sys, lm_decoding.checkpoints; "
          "assert 'torch' not in sys.modules and "
          "'transformers' not in sys.modules, 'peer imported'")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
