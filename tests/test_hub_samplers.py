"""Our decoders against the diffusion LMs' own samplers, on a stub.

Each golden holds the 64 tokens a family's own generate drew from a
deterministic bag-of-tokens denoiser (written by benchmarks/hub_import/
sampler_goldens.py, which names the reference file, commit and settings;
the references' code is not in this repository); here the same stub runs
in JAX under our decoder with the settings that reproduce the family's
sampler:

  Dream         `llada`, transfer='dream', one block, 32 steps, orderings
                entropy / low_confidence / margin (Dream's alg 'entropy',
                'maskgit_plus', 'topk_margin'), token shift;
  SDAR          `bd3lm`, ranked low_confidence (its 'low_confidence_static')
                at blocks of 4 and 8, and threshold 0.85 at blocks of 4 with
                one commit per step (its 'low_confidence_dynamic');
  Fast-dLLM v2  `bd3lm`, threshold 0.9, blocks of 32, sub-blocks of 8,
                `ar_first_token`, token shift.

Greedy throughout; the prompts' lengths are multiples of the block length
(the references anchor blocks at position 0, ours at the prompt's end).
"""

import pathlib
import types

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models.binding import Conventions, Model
from lm_decoding.models.output import ModelOutput

GOLDENS = pathlib.Path(__file__).parent / "goldens"
MASK_ID = 23
GREEDY = SamplingConfig(temperature=0.0)


class _VisibleBag:
  """sampler_goldens.py's stub in JAX, its weights read from the golden
  (`stub_A`, ...): logits[i] = A[p_i] + E[x_i] C + mean over the keys i
  may see (its attention_mask) of E[x_j] B; `token_shift` as the family's
  config says."""

  def __init__(self, golden, token_shift):
    self.w = {k: jnp.asarray(golden[f"stub_{k}"]) for k in "AEBC"}
    self.max_len, self.vocab_size = golden["stub_A"].shape
    self.config = types.SimpleNamespace(token_shift=token_shift)

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params, cache
    if attention_mask is None:
      attention_mask = jnp.ones(tokens.shape + tokens.shape[-1:], bool)
    visible_BxQxK = attention_mask.astype(jnp.float32)
    e_BxLxD = self.w["E"][tokens]
    context_BxQxD = (visible_BxQxK @ e_BxLxD) / visible_BxQxK.sum(
        -1, keepdims=True)
    logits = (self.w["A"][positions] + e_BxLxD @ self.w["C"]
              + context_BxQxD @ self.w["B"])
    return ModelOutput(logits, None, e_BxLxD)


def _decode(golden, token_shift, name, **options):
  model = Model(_VisibleBag(golden, token_shift), None,
                Conventions(mask_id=MASK_ID, eos_ids=(22,), pad_id=0))
  decoder = base.make_decoder(name, output_length=64, eos_ids=(),
                              mask_id=MASK_ID, pad_id=0, **options)
  prompts = jnp.asarray(golden["prompts"], jnp.int32)
  out = decoder.decode({"model": model}, prompts,
                       jnp.full((prompts.shape[0],), prompts.shape[1],
                                jnp.int32), jax.random.key(0))
  return np.asarray(out.tokens)


@pytest.mark.parametrize("alg,remasking", [
    ("entropy", "entropy"), ("maskgit_plus", "low_confidence"),
    ("topk_margin", "margin")])
def test_llada_with_dream_transfer_draws_what_dream_generate_draws(
    alg, remasking):
  golden = np.load(GOLDENS / "dream_sampler.npz")
  got = _decode(golden, True, "llada", steps=32, remasking=remasking,
                transfer="dream")
  np.testing.assert_array_equal(got, golden[alg])


@pytest.mark.parametrize("setting,options", [
    ("static_w4", dict(block_length=4, steps=64, remasking="low_confidence")),
    ("static_w8", dict(block_length=8, steps=32, remasking="low_confidence")),
    ("dynamic_w4", dict(block_length=4, steps=64, remasking="threshold",
                        threshold=0.85))])
def test_bd3lm_draws_what_sdar_generate_draws(setting, options):
  golden = np.load(GOLDENS / "sdar_sampler.npz")
  got = _decode(golden, False, "bd3lm", kv_cache="none", sampling=GREEDY,
                **options)
  np.testing.assert_array_equal(got, golden[setting])


def test_bd3lm_draws_what_fast_dllm_v2_generate_draws():
  """And without `ar_first_token` it does not (the option is read)."""
  golden = np.load(GOLDENS / "fast_dllm_v2_sampler.npz")
  options = dict(block_length=32, steps=64, remasking="threshold",
                 threshold=0.9, sub_block_length=8, kv_cache="none",
                 sampling=GREEDY)
  got = _decode(golden, True, "bd3lm", ar_first_token=True, **options)
  np.testing.assert_array_equal(got, golden["tokens"])
  assert not np.array_equal(_decode(golden, True, "bd3lm", **options),
                            golden["tokens"])


def test_the_new_options_are_checked():
  with pytest.raises(ValueError, match="transfer='cosine'; allowed"):
    base.make_decoder("llada", output_length=8, steps=4, transfer="cosine")
  with pytest.raises(ValueError, match="ar_first_token=True needs "
                     "remasking='threshold'"):
    base.make_decoder("bd3lm", output_length=8, steps=4,
                      ar_first_token=True)
