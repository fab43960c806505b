"""Numerics: bf16 decoding stays finite at the maximum length; the debug switch.

Every registered decoder decodes with a tiny random-init Transformer whose
parameters and activations are bfloat16, with P + T = max_len (the cache is
full at the end), under `debug.enable()`: a NaN or inf logit in any model call
of the compiled steps raises. The full-size check on the shipped models is
`experiments/bf16_check.py` (results in experiments/results/bf16_check.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import stubs
from lm_decoding import debug
from lm_decoding.decoding import base, make_decoder, registered, sampling
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.models import Model

MAX_LEN, PROMPT, V = 12, 4, 300
KEY = jax.random.key(0)


@pytest.fixture
def debugging():
  debug.enable()
  yield
  debug.enable(False)


def denoises(name: str) -> bool:
  return "mask_id" in {f.name for f in dataclasses.fields(
      base.decoder_class(name))}


def bf16_model(attention: str, token_shift: bool = False) -> Model:
  cfg = TransformerConfig(vocab_size=V, d_model=32, num_layers=2, num_heads=2,
                          num_kv_heads=1, head_dim=16, mlp_dim=64,
                          max_len=MAX_LEN, attention=attention,
                          token_shift=token_shift,
                          dtype="bfloat16", param_dtype="bfloat16")
  return Model(make_logits_fn(cfg), init_params(cfg, jax.random.key(1)))


@pytest.mark.parametrize("name", registered())
def test_bf16_decodes_finite_at_max_len(name, debugging):
  del debugging
  cls = base.decoder_class(name)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  # Draft-and-verify decoders verify gamma tokens past the output's end.
  length = MAX_LEN - PROMPT - (fields["gamma"].default - 1
                               if "gamma" in fields else 0)
  options = {"output_length": length}
  if issubclass(cls, ScheduledDecoder):
    options["steps"] = length
  if "sampling" in fields:
    options["sampling"] = sampling.SamplingConfig(temperature=1.0)
  decoder = make_decoder(name, **options)
  causal, bidirectional = bf16_model("causal"), bf16_model(
      "bidirectional", token_shift=name == "self_speculative")
  models = {role: bidirectional if denoises(name) and role != "target"
            else causal for role in decoder.roles}
  prompts = jax.random.randint(jax.random.key(2), (2, PROMPT), 5, V)
  out = decoder.decode(models, prompts, jnp.asarray([PROMPT, 2]), KEY)
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (2, length)
  assert ((tokens >= 0) & (tokens < V)).all()


def nan_stub(poison: bool) -> stubs.TableLogitsFn:
  """Random trigram logits; with `poison`, NaN after position 2."""
  stub = stubs.TableLogitsFn.random(0, 8, 8, masked_ids=(0,))
  if poison:
    stub.table[:, 2:] = np.nan
  return stub


@pytest.mark.parametrize("name", ["ar", "mdlm"])
def test_debug_switch_raises_on_nan_logits(name, debugging):
  del debugging
  decoder = make_decoder(name, output_length=4,
                         **({"steps": 4} if name == "mdlm" else {}))
  prompts, lengths = jnp.asarray([[5, 6]]), jnp.asarray([2])
  decoder.decode(base.bind(nan_stub(False), None), prompts, lengths, KEY)
  with pytest.raises(checkify.JaxRuntimeError, match="non-finite logits"):
    decoder.decode(base.bind(nan_stub(True), None), prompts, lengths, KEY)


@pytest.mark.parametrize("name", ["ar", "mdlm"])
def test_without_the_switch_nothing_is_checked(name):
  assert not debug.enabled()
  decoder = make_decoder(name, output_length=4,
                         **({"steps": 4} if name == "mdlm" else {}))
  decoder.decode(base.bind(nan_stub(True), None), jnp.asarray([[5, 6]]),
                 jnp.asarray([2]), KEY)  # garbage, but no check traced
  hlo = jax.jit(lambda p: decoder.decode(
      base.bind(nan_stub(False), None), p, jnp.asarray([2]), KEY).tokens
  ).lower(jnp.asarray([[5, 6]])).as_text()
  assert "isfinite" not in hlo.lower() and "is_finite" not in hlo.lower()
