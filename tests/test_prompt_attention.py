"""SequenceConfig.prompt_attention: a prefix LM decoded as it was trained."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding import autoregressive, base, beam_search, sampling
from lm_decoding.models import (
    TransformerConfig, init_params, make_logits_fn, masks)
from lm_decoding.models import Model

CFG = TransformerConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2,
                        num_kv_heads=2, head_dim=8, mlp_dim=32, max_len=24)
PROMPTS = np.array([[7, 8, 9, 10, 11], [12, 13, 0, 0, 0]], np.int32)
LENGTHS = np.array([5, 2], np.int32)
T = 6
GREEDY = sampling.SamplingConfig(temperature=0.0)


def _model():
  return Model(make_logits_fn(CFG), init_params(CFG, jax.random.key(3)))


def _teacher_forced_argmax(model, tokens_BxT, prompt_attention):
  """Greedy tokens re-predicted by one uncached pass over [prompt, tokens]."""
  rows = []
  for b, length in enumerate(LENGTHS):
    rows.append(np.concatenate([PROMPTS[b, :length], tokens_BxT[b]]))
  width = max(len(r) for r in rows)
  seq = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    seq[b, :len(row)] = row
  mask = (masks.prefix_lm_mask(jnp.asarray(LENGTHS), width)
          if prompt_attention == "bidirectional"
          else masks.causal_mask(len(rows), width))
  positions = jnp.broadcast_to(jnp.arange(width), seq.shape)
  logits = model.logits_fn(model.params, jnp.asarray(seq), positions,
                           attention_mask=mask).logits
  index = LENGTHS[:, None] - 1 + np.arange(T)[None]
  return np.asarray(jnp.take_along_axis(logits, index[..., None], 1)
                    .argmax(-1))


@pytest.mark.parametrize("name", ["ar", "ar_uncached"])
@pytest.mark.parametrize("prompt_attention", ["causal", "bidirectional"])
def test_cached_decode_equals_teacher_forced_pass(name, prompt_attention):
  model = _model()
  decoder = base.make_decoder(name, output_length=T, eos_ids=(),
                              sampling=GREEDY,
                              prompt_attention=prompt_attention)
  tokens = np.asarray(decoder.decode({"model": model}, PROMPTS, LENGTHS,
                                     None).tokens)
  np.testing.assert_array_equal(
      tokens, _teacher_forced_argmax(model, tokens, prompt_attention))


def test_bidirectional_prompt_changes_the_decode():
  """The option is not a no-op on this model (so the test above can fail)."""
  model = _model()
  outs = [np.asarray(autoregressive.AutoregressiveDecoder(
      output_length=T, eos_ids=(), sampling=GREEDY,
      prompt_attention=a).decode(
          {"model": model}, PROMPTS, LENGTHS, None).tokens)
          for a in autoregressive.PROMPT_ATTENTION]
  assert (outs[0] != outs[1]).any()


def test_beam_of_one_is_greedy_under_a_bidirectional_prompt():
  model = _model()
  greedy = autoregressive.AutoregressiveDecoder(
      output_length=T, eos_ids=(), sampling=GREEDY,
      prompt_attention="bidirectional")
  beam = beam_search.BeamSearchDecoder(
      output_length=T, eos_ids=(), num_beams=1,
      prompt_attention="bidirectional")
  args = ({"model": model}, PROMPTS, LENGTHS, None)
  np.testing.assert_array_equal(greedy.decode(*args).tokens,
                                beam.decode(*args).tokens)


def test_bad_prompt_attention():
  with pytest.raises(ValueError, match="prompt_attention='prefix'"):
    autoregressive.AutoregressiveDecoder(prompt_attention="prefix")
