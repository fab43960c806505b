"""The denoising engine's parts: contexts name themselves and know their cost."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base, make_decoder
from lm_decoding.special_tokens import PAD_ID

PROMPTS = jnp.asarray([[5, 6, 7], [7, 0, 0]], jnp.int32)
PROMPT_LENGTHS = jnp.asarray([3, 1], jnp.int32)
STUB = stubs.TableLogitsFn.random(3, 12, 16, masked_ids=(PAD_ID,))

# (name, options, context record, exact): every context the decoders pick.
CONTEXTS = [
    ("llada", dict(steps=8, block_length=4), "full", True),
    ("llada", dict(steps=8, block_length=4, kv_cache="prefix"), "prefix",
     False),
    ("llada", dict(steps=8, block_length=4, kv_cache="prefix",
                   attention="causal"), "prefix", True),
    ("llada", dict(steps=8, block_length=4, kv_cache="dual"), "dual", False),
    ("llada", dict(steps=8, block_length=4, kv_cache="dual",
                   cache_refresh="step"), "dual", True),
    ("bd3lm", dict(steps=8, block_length=4), "blocks", True),
    ("bd3lm", dict(steps=8, block_length=4, kv_cache="none"), "full", True),
    ("bd3lm", dict(steps=8, block_length=4, kv_cache="dual",
                   remasking="threshold", sub_block_length=2), "sub_blocks",
     False),
    ("uniform_ancestral", dict(steps=8, block_length=4, kv_cache="prefix"),
     "canvas_prefix", True),
    ("uniform_ancestral", dict(steps=8, block_length=4), "full", True),
]


@pytest.mark.parametrize("name, options, record, exact", CONTEXTS)
def test_context_record_and_exactness(name, options, record, exact):
  context = make_decoder(name, output_length=8, **options).context()
  assert (context.record, context.exact) == (record, exact)


@pytest.mark.parametrize("name, options, record, exact",
                         [c for c in CONTEXTS if c[2] != "sub_blocks"])
def test_expected_work_is_what_a_scheduled_decode_runs(name, options, record,
                                                       exact):
  """Without skipped calls (reuse_logits=False) or early stops, the
  context's forward tokens and the drawn positions are exactly the decode's."""
  del record, exact
  reuse = {} if name.startswith("uniform") else dict(reuse_logits=False,
                                                     early_stop=False)
  decoder = make_decoder(name, output_length=8, eos_ids=(), **reuse,
                         **options)
  out = decoder.decode(base.bind(STUB, None), PROMPTS, PROMPT_LENGTHS,
                       jax.random.key(0))
  work = decoder.expected_work(2, PROMPTS.shape[1])
  assert work.forward_tokens == int(out.forward_tokens["model"])
  assert work.drawn == 8 * 2 * 4  # K steps x B x W


def test_bd3lm_traces_its_steps():
  """The one loop traces every decoder: BD3-LM's states end at its tokens."""
  decoder = make_decoder("bd3lm", output_length=8, steps=8, block_length=4)
  models = base.bind(STUB, None)
  out = decoder.denoise(models, PROMPTS, PROMPT_LENGTHS, jax.random.key(1),
                        trace=True)
  last = np.asarray(out.states[-1])
  for b, start in enumerate(np.asarray(PROMPT_LENGTHS)):
    np.testing.assert_array_equal(last[b, start:start + 8], out.tokens[b])
  np.testing.assert_array_equal(
      out.tokens, decoder.denoise(models, PROMPTS, PROMPT_LENGTHS,
                                  jax.random.key(1)).tokens)
