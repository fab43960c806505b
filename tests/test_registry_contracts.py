"""Contracts of every registered decoder, on stub models.

Parametrised by `registered()`, so a new decoder is checked by them without
a line here: inputs as lists and numpy arrays decode like jax arrays; bad
prompts and options raise a ValueError naming them before any trace; the
invariants of `DecodeResult` (shapes, dtypes, EOS and PAD, committed counts,
the cost the stub ran) hold. And `make_decoder`'s own refusals (an unknown
name, options outside their range).

Bad options and inputs of one decoder are tabled in its module's test file
(`BAD_INPUTS`); the rows here hold for every decoder.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import autoregressive as ar
from lm_decoding.decoding import (base, make_decoder, registered, sampling,
                                  speculative)
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID

V = 8
KEY = jax.random.key(0)
ALL = registered()
SEQUENTIAL = tuple(n for n in ALL
                   if issubclass(base.decoder_class(n), ar.SequenceConfig))
PARALLEL = tuple(n for n in ALL if n not in SEQUENTIAL)
DRAFT_VERIFY = tuple(n for n in ALL if issubclass(
    base.decoder_class(n), speculative.DraftVerifyDecoder))


def build(name: str, length: int, **options):
  """Decoder `name` generating `length` tokens per row (K = T steps; draft
  and verify with gamma 1, so the caches fit in P + T slots)."""
  if name in DRAFT_VERIFY:
    options.setdefault("gamma", 1)
  if name in SEQUENTIAL:
    return make_decoder(name, output_length=length, **options)
  if issubclass(base.decoder_class(name), ScheduledDecoder):
    options.setdefault("steps", length)
  return make_decoder(name, output_length=length, **options)


def eos_first_stub() -> stubs.TableLogitsFn:
  """Random trigram logits (PAD never drawn) with max_len 8, except that the
  row with prompt [5, 6, 7] is all but certain to start with EOS.

  AR decoders draw that token from the logits after (6, 7) at position 2; a
  masked denoiser predicts it from MASK at position 3 after 7, a
  uniform-noise one (uniform_eb) from any token there.
  """
  stub = stubs.TableLogitsFn.random(3, V, 8, masked_ids=(PAD_ID,))
  for position, previous, token in ((2, 6, 7), *((3, 7, t) for t in range(V))):
    stub.table[0, position, previous, token] = -20.0
    stub.table[0, position, previous, token, EOS_ID] = 20.0
    stub.table[0, position, previous, token, PAD_ID] = -np.inf
  return stub


# Shared by several tests so that each decoder compiles once for them. Row 0
# starts with EOS, row 2's prompt holds an EOS; P + T = 3 + 5 = max_len: the
# prompt fills the cache exactly.
STUB = eos_first_stub()
PROMPTS = jnp.asarray([[5, 6, 7], [7, 0, 0], [EOS_ID, 5, 0]])
PROMPT_LENGTHS = jnp.asarray([3, 1, 2])
TWO_EOS = (EOS_ID, 6)


# --- Input types: lists and numpy arrays decode like jax int32 arrays. ------

@pytest.mark.parametrize("name", ALL)
def test_python_lists_and_numpy_int64_decode_like_jax_arrays(name):
  """Bug: the AR family raised TypeError for prompt_lengths given as a list.

  Fix: in the prompt check (`autoregressive.check_prompts` then, now
  `rows.check_prompts`) convert first (`prompts = jnp.asarray(prompts);
  prompt_lengths = jnp.asarray(prompt_lengths)`) and return them; `checked_cache_length`, `prefill` and
  the three `decode` methods pass the converted arrays on to the jitted loop.
  """
  decoder = build(name, 5, eos_ids=TWO_EOS)
  reference = decoder.decode(stubs.bind_roles(decoder, STUB), PROMPTS,
                             PROMPT_LENGTHS, KEY)
  rows = np.asarray(PROMPTS).tolist()
  for prompts, lengths in ((np.asarray(rows, np.int64), np.asarray([3, 1, 2])),
                           (rows, [3, 1, 2]),
                           (np.asarray(rows), (3, 1, 2))):
    out = decoder.decode(stubs.bind_roles(decoder, STUB), prompts, lengths,
                         KEY)
    np.testing.assert_array_equal(out.tokens, reference.tokens)
    np.testing.assert_array_equal(out.lengths, reference.lengths)


# --- Options: every bad value raises ValueError naming it, at construction.

@pytest.mark.parametrize("name", SEQUENTIAL + PARALLEL)
def test_eos_ids_given_as_one_int(name):
  """Bug: eos_ids=3 raises TypeError ('int' object is not iterable).

  Fix (either): accept one id (`eos_ids = (eos_ids,) if isinstance(eos_ids,
  (int, np.integer)) else eos_ids` before the tuple conversion in
  `SequenceConfig` and `_MaskedDiffusionDecoder`), or raise ValueError naming
  eos_ids.
  """
  try:
    decoder = build(name, 2, eos_ids=EOS_ID)
  except ValueError as e:
    assert "eos_ids" in str(e)
  else:
    assert decoder.eos_ids == (3,)


def test_bad_decoder_names_and_options_name_the_allowed_range():
  with pytest.raises(ValueError, match=r"registered: \('ar', 'ar_beam'"):
    make_decoder("greedy")
  with pytest.raises(ValueError, match="allowed:"):
    make_decoder("mdlm", output_length=4, steps=4, top_p=0.9)
  for top_p in (0.0, 1.5, float("nan")):
    with pytest.raises(ValueError, match=r"top_p=.* must be in \(0, 1\]"):
      make_decoder("ar", sampling=sampling.SamplingConfig(top_p=top_p))
  with pytest.raises(ValueError, match="temperature=-0.5 must be"):
    sampling.SamplingConfig(temperature=-0.5)
  for name, options in (("mdlm", dict(steps=0, output_length=4)),
                        ("llada", dict(steps=0, output_length=4)),
                        ("ar_beam", dict(num_beams=0))):
    field = next(iter(options))  # K < 1
    with pytest.raises(ValueError, match=f"{field}=0 .*>= 1"):
      make_decoder(name, **options)
  with pytest.raises(ValueError, match=r"block_length=3 must be in \[1, 8\]"):
    make_decoder("llada", output_length=8, steps=8, block_length=3)
  with pytest.raises(ValueError, match="steps=3 must be a multiple"):
    make_decoder("llada", output_length=8, steps=3, block_length=4)


# --- Bad input raises ValueError naming it before the model is touched. ----

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("prompts, lengths, match", [
    (np.ones((1, 14), np.int32), [14], "max_len"),  # P + 4 > max_len 16
    (np.ones((2, 3), np.int32), [3, 4], "prompt_lengths"),
    (np.ones((2, 3), np.int32), [3], "prompt_lengths"),
    (np.ones((3,), np.int32), [3], "prompts"),
    (np.ones((1, 3), np.float32), [3], "prompts"),
])
def test_bad_prompts_raise_before_the_model_runs(name, prompts, lengths,
                                                 match):
  with pytest.raises(ValueError, match=match):
    decoder = build(name, 4)
    raising = stubs.RaisingLogitsFn(max_len=16)
    decoder.decode(stubs.bind_roles(decoder, raising), jnp.asarray(prompts),
                   jnp.asarray(lengths), KEY)


def has_field(name, field):
  return field in {f.name for f in dataclasses.fields(base.decoder_class(name))}


# Every row a (call, exception class, regex): the message names the argument
# and its allowed range; a decoder decodes on `stubs.RaisingLogitsFn` (V = 16,
# max_len 16; T = 4), so a check that comes after any trace or compile fails
# the row.
BAD_INPUTS = [
    *[pytest.param(lambda n=n: stubs.decode_raising(n, prompts=((5, 16),)),
                   ValueError, r"prompts must be token ids in \[0, V=16\)",
                   id=f"{n}-prompt-id-outside-vocab") for n in ALL],
    *[pytest.param(lambda n=n: stubs.decode_raising(
        n, prompts=np.ones((1, 14), np.int32), lengths=(14,)), ValueError,
                   r"(?=.*P=14)(?=.*output_length=4).*max_len=16",
                   id=f"{n}-prompt-longer-than-the-cache") for n in ALL],
    *[pytest.param(lambda n=n: stubs.decoder(n, output_length=0), ValueError,
                   r"output_length=0 must be an integer >= 1",
                   id=f"{n}-output-length-0") for n in ALL],
    *[pytest.param(lambda n=n: stubs.decode_raising(n, key=None), ValueError,
                   r"key=None.*jax.random.key\(seed\)",
                   id=f"{n}-key-none") for n in ALL
      if has_field(n, "sampling")],
    pytest.param(lambda: make_decoder("greedy"), ValueError,
                 r"unknown decoder name='greedy'; registered: \(",
                 id="unknown-decoder-name"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()


# The test files whose BAD_INPUTS tables list bad options and inputs.
BAD_INPUT_TABLES = ("test_registry_contracts", "test_autoregressive",
                    "test_beam_search", "test_masked_diffusion",
                    "test_iterative", "test_sampling", "test_speculative",
                    "test_comparison", "test_training")


def test_the_table_is_large():
  assert sum(len(importlib.import_module(name).BAD_INPUTS)
             for name in BAD_INPUT_TABLES) >= 40


# --- DecodeResult invariants, for every registered decoder. ----------------

def check_result(name, out, batch, length, steps, eos_ids, executed):
  """`executed`: B * L of every call the stub actually ran for `out`."""
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  committed, nfe = np.asarray(out.committed), int(out.nfe)
  assert tokens.shape == (batch, length) and tokens.dtype == np.int32
  assert lengths.shape == (batch,) and lengths.dtype == np.int32
  assert committed.shape == (steps, batch) and committed.dtype == np.int32
  assert out.nfe.shape == () and out.nfe.dtype == np.int32
  assert ((tokens >= 0) & (tokens < V)).all()
  for row, n in zip(tokens, lengths):
    is_eos = np.isin(row, eos_ids)
    expected = int(np.argmax(is_eos)) + 1 if is_eos.any() else length
    assert n == expected
    assert (row[n:] == PAD_ID).all() and (row[:n] != PAD_ID).all()
  if name in DRAFT_VERIFY:  # 1 to gamma + 1 tokens per round
    np.testing.assert_array_equal(committed.sum(0), lengths)
    gamma = out.stats["accept_counts"].shape[1] - 1
    assert ((committed >= 0) & (committed <= gamma + 1)).all()
  elif name in SEQUENTIAL:
    prefix = np.arange(length)[:, None] < lengths[None, :]
    np.testing.assert_array_equal(committed, prefix.astype(np.int32))
    assert nfe == (lengths.max() if name == "ar_early_exit" else length)
  else:
    assert not (tokens == MASK_ID).any()
    np.testing.assert_array_equal(committed.sum(0), [length] * batch)
    assert nfe >= 1
  # The cost the decoder reports is the cost the stub counted.
  assert nfe == len(executed) == sum(map(int, out.calls.values()))
  assert int(sum(map(int, out.forward_tokens.values()))) == sum(executed)


def run_counted(decoder, prompts, prompt_lengths):
  """decoder.decode on STUB; returns (result, the calls STUB executed)."""
  first = len(STUB.executed)
  out = decoder.decode(stubs.bind_roles(decoder, STUB), prompts,
                       prompt_lengths, KEY)
  jax.effects_barrier()
  return out, STUB.executed[first:]


@pytest.mark.parametrize("name", ALL)
def test_decode_result_is_consistent(name):
  """A ragged batch with two EOS ids, EOS at the first step, an EOS inside a
  prompt (a decoder that read it as an end would emit PAD first) and a
  prompt filling the cache; then T = 1, B = 1 and no EOS id."""
  for length, batch, eos_ids in ((5, 3, TWO_EOS), (1, 1, ())):
    decoder = build(name, length, eos_ids=eos_ids)
    out, executed = run_counted(decoder, PROMPTS[:batch],
                                PROMPT_LENGTHS[:batch])
    check_result(name, out, batch, length, length, eos_ids, executed)
    np.testing.assert_array_equal(out.tokens[0], [EOS_ID] + [PAD_ID] * (length - 1))
  with pytest.raises(ValueError, match="max_len"):
    decoder = build(name, 6)
    decoder.decode(stubs.bind_roles(decoder, STUB), PROMPTS, PROMPT_LENGTHS,
                   KEY)


# --- Suppressed ids (SamplingConfig.suppress_ids) are never decoded. --------

SAMPLED = tuple(n for n in ALL if "sampling" in {
    f.name for f in dataclasses.fields(base.decoder_class(n))})
SUPPRESSED = 6


def _favouring(token: int) -> stubs.TableLogitsFn:
  """Random trigram logits (PAD never drawn) under which `token` is all but
  certain at every position, whatever came before."""
  stub = stubs.TableLogitsFn.random(3, V, 8, masked_ids=(PAD_ID,))
  stub.table[..., token] = 30.0
  return stub


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", SAMPLED)
def test_every_sampling_decoder_never_decodes_a_suppressed_id(name,
                                                              temperature):
  """Under logits that all but force token 6, a decoder given
  suppress_ids=(6,) never writes it (every decoder that samples draws
  through `sampling.sample` or `sampling.probabilities`), and otherwise
  does."""
  stub = _favouring(SUPPRESSED)
  prompts, lengths = PROMPTS[1:2], PROMPT_LENGTHS[1:2]  # [7]: no 6 given
  outs = {}
  for ids in ((), (SUPPRESSED,)):
    decoder = build(name, 5, eos_ids=(), sampling=sampling.SamplingConfig(
        temperature=temperature, suppress_ids=ids))
    outs[ids] = np.asarray(decoder.decode(stubs.bind_roles(decoder, stub),
                                          prompts, lengths, KEY).tokens)
  assert (outs[()] == SUPPRESSED).any()
  assert not (outs[(SUPPRESSED,)] == SUPPRESSED).any(), outs


@pytest.mark.parametrize("name", SAMPLED)
def test_suppressing_every_id_a_decoder_may_draw_is_refused(name):
  """Every id but MASK suppressed: an AR decoder may still draw MASK, a
  denoiser (which never draws MASK) has nothing left and must refuse
  rather than write a suppressed id (the argmax of all -inf logits is 0)."""
  ids = tuple(i for i in range(V) if i != MASK_ID)
  decoder = build(name, 4, eos_ids=(), sampling=sampling.SamplingConfig(
      temperature=1.0, suppress_ids=ids))
  try:
    out = decoder.decode(stubs.bind_roles(decoder, _favouring(0)),
                         PROMPTS[1:2], PROMPT_LENGTHS[1:2], KEY)
  except ValueError as e:
    assert "suppress_ids" in str(e) and "MASK" in str(e), e
  else:
    assert (np.asarray(out.tokens) == MASK_ID).all(), out.tokens


def test_suppress_ids_are_checked():
  for bad in ((4, 4), (-1,), [4], (1.5,)):
    with pytest.raises(ValueError, match="suppress_ids=.*distinct integers"):
      sampling.SamplingConfig(suppress_ids=bad)
  logits = jnp.zeros((2, V))
  for ids in ((V,), tuple(range(V))):
    with pytest.raises(ValueError, match=f"in \\[0, {V}\\)"):
      sampling.sample(KEY, logits, sampling.SamplingConfig(suppress_ids=ids))
  probs = sampling.probabilities(
      logits, sampling.SamplingConfig(suppress_ids=(0, 4)))
  np.testing.assert_allclose(np.asarray(probs)[:, [0, 4]], 0.0)
  np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-6)


# The same invariants where MDLM and LLaDA take more steps than tokens.
@pytest.mark.parametrize("name, options", [
    ("mdlm", dict(output_length=4, steps=9)),
    ("llada", dict(output_length=4, steps=8, block_length=1)),
    ("llada", dict(output_length=4, steps=4, block_length=4)),  # == output_length
])
def test_parallel_decoders_with_more_steps_than_tokens(name, options):
  out, executed = run_counted(make_decoder(name, **options), PROMPTS[1:],
                              PROMPT_LENGTHS[1:])
  check_result(name, out, 2, 4, options["steps"], (EOS_ID,), executed)
  if options.get("block_length") == 1:  # one position per block, 2 steps each
    np.testing.assert_array_equal(out.committed,
                                  np.asarray([[1, 1], [0, 0]] * 4, np.int32))


def test_cost_counts_forward_tokens_past_the_int32_range():
  """8,192 calls at B 64 x L 4,096 process 2^31 token positions, one past
  int32's largest value; `Cost` counts them (in a compiled loop, as decoders
  do) without wrapping round to a negative count."""
  calls, shape = 8192, (64, 4096)
  tokens = jax.ShapeDtypeStruct(shape, jnp.int32)  # only its shape counts
  cost = jax.jit(lambda: jax.lax.fori_loop(
      0, calls, lambda _, c: c.add("model", tokens),
      base.Cost.zero(("model",))))()
  assert int(cost.calls["model"]) == calls
  assert int(cost.tokens["model"]) == 2**31 == calls * 64 * 4096
  merged = cost.merge("model", jnp.int32(1), cost.tokens["model"])
  assert int(merged.tokens["model"]) == 2**32
