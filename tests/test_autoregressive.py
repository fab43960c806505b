"""Tests of lm_decoding.decoding.autoregressive (cases C4, C5, C8), and its
bad options and inputs (`BAD_INPUTS`)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import autoregressive as ar
from lm_decoding.decoding import base
from lm_decoding.decoding.base import bind
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, PAD_ID

GREEDY = SamplingConfig(temperature=0.0)
CACHED = ("ar", "ar_early_exit")
ALL = ("ar", "ar_early_exit", "ar_uncached")
KEY = jax.random.key(0)


@pytest.fixture(scope="module")
def transformer():
  config = TransformerConfig(vocab_size=64, d_model=32, num_layers=2,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=32, tie_embeddings=False)
  params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(1))
  return make_logits_fn(config), params


def _decode(name, logits_fn, params, prompts, lengths, key=KEY, **options):
  if name != "ar_beam":
    options.setdefault("sampling", GREEDY)
  return base.make_decoder(name, **options).decode(
      bind(logits_fn, params), jnp.asarray(prompts, jnp.int32),
      jnp.asarray(lengths, jnp.int32), key)


# C4: ragged prompts, positions and batching. One batch and one set of options
# throughout, so the compiled decoders are shared between tests.
RAGGED = ([[5, 6, 7], [8, 9, PAD_ID]], [3, 2])
NEW = 5


def _greedy(name, transformer, prompts, lengths):
  return _decode(name, *transformer, prompts, lengths, output_length=NEW,
                 eos_ids=())


def test_greedy_cached_equals_uncached_on_transformer(transformer):
  results = {name: _greedy(name, transformer, *RAGGED) for name in ALL}
  for name in CACHED:
    np.testing.assert_array_equal(results[name].tokens,
                                  results["ar_uncached"].tokens)
  assert len(np.unique(results["ar"].tokens)) > 4  # not a degenerate model


def test_batch_equals_rows_alone_on_transformer(transformer):
  batch = _greedy("ar", transformer, *RAGGED)
  for row, (prompt, length) in enumerate(zip(*RAGGED)):
    alone = _greedy("ar", transformer, [prompt[:length]], [length])
    np.testing.assert_array_equal(batch.tokens[row], alone.tokens[0])


_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(.*\{$")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%\S+ = \w+\[([\d,]*)\]\S* ([\w\-]+)\(")
_CALLEE = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)")


def _while_body_ops(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
  """(opcode, dims) of every instruction the one while loop of a compiled
  module's text runs per iteration, fused computations included."""
  ops, callees, name = {}, {}, None
  for line in hlo.splitlines():
    if match := _HEADER.match(line):
      name = match.group(1)
      ops[name], callees[name] = [], set()
    elif name and (match := _INSTRUCTION.match(line)):
      dims = tuple(int(d) for d in match.group(1).split(",") if d)
      ops[name].append((match.group(2), dims))
      callees[name].update(_CALLEE.findall(line))
  pending = re.findall(r" while\(.*?body=%([\w.\-]+)", hlo)
  assert len(pending) == 1, "expected one decode loop"
  seen = set()
  while pending:
    name = pending.pop()
    if name not in seen:
      seen.add(name)
      pending.extend(callees[name])
  return [op for name in seen for op in ops[name]]


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_step_reads_the_kv_cache_in_place(transformer, batch):
  """The cache is stored heads-major [B, Hkv, S, Dh], the layout of the
  attention dots: the compiled decode loop neither transposes nor copies a
  cache-sized array (with a [B, S, Hkv, Dh] cache it did both, for keys and
  values in every layer; at batch 1, where XLA drops the size-1 batch axis,
  it copied every layer's cache until the write was ordered after the read
  by a data dependency: experiments/results/benchmark_ar/NOTES.md)."""
  logits_fn, params = transformer
  config = logits_fn.config
  prompt, new = 4, 6
  decoder = base.make_decoder("ar", output_length=new, eos_ids=(),
                              sampling=GREEDY)
  hlo = jax.jit(lambda p, x, n: decoder.decode(
      bind(logits_fn, p), x, n, KEY).tokens).lower(
          params, jnp.zeros((batch, prompt), jnp.int32),
          jnp.full((batch,), prompt, jnp.int32)).compile().as_text()
  size = lambda dims: sorted(d for d in dims if d != 1)  # also as bitcast
  cache_dims = size((batch, config.num_kv_heads, prompt + new,
                     config.head_dim))
  cache_ops = [op for op, dims in _while_body_ops(hlo)
               if size(dims) == cache_dims]
  assert cache_ops, "no cache-sized array found: the parser missed the loop"
  assert not {"transpose", "copy"} & set(cache_ops), cache_ops


def test_step_logits_of_padded_rows_match_rows_alone(transformer):
  """C4 within 1e-5: prefill of prompt + generated[:k], batch vs alone."""
  logits_fn, params = transformer
  generated = np.asarray(_greedy("ar", transformer, *RAGGED).tokens)
  width = 3 + NEW
  pad = lambda row: row + [PAD_ID] * (width - len(row))
  for k in range(NEW):
    rows = [list(p[:n]) + list(g[:k]) for p, n, g in zip(*RAGGED, generated)]
    batch_logits, cache = ar.prefill(logits_fn, params,
                                     jnp.asarray([pad(r) for r in rows]),
                                     jnp.asarray([len(r) for r in rows]))
    np.testing.assert_array_equal(cache.index, [len(r) for r in rows])
    for b, row in enumerate(rows):
      alone_logits, _ = ar.prefill(logits_fn, params, jnp.asarray([pad(row)]),
                                   jnp.asarray([len(row)]))
      np.testing.assert_allclose(batch_logits[b], alone_logits[0], atol=1e-5)
      assert np.argmax(batch_logits[b]) == generated[b, k]


@pytest.mark.parametrize("name", ALL + ("ar_beam",))
def test_every_row_starts_at_position_zero_and_fills_the_cache(name):
  # The model predicts 10 + position: outputs reveal the positions fed. Its
  # max_len 8 = P + output_length: the cache (or buffer) is exactly full.
  logits_fn = stubs.TableLogitsFn.by_position(lambda p: 10 + p, 32, 8)
  prompts, lengths = [[5, 6, 7], [8, 9, PAD_ID], [8, PAD_ID, PAD_ID]], [3, 2, 1]
  result = _decode(name, logits_fn, None, prompts, lengths, output_length=5)
  np.testing.assert_array_equal(
      result.tokens, [[10 + n - 1 + i for i in range(5)] for n in lengths])


def test_prefill_fills_cache_and_reads_last_real_position():
  logits_fn = stubs.TableLogitsFn.by_position(lambda p: 10 + p, 32, 16)
  logits, cache = ar.prefill(logits_fn, None, jnp.asarray([[5, 6, 7], [8, 9, 4]]),
                             jnp.asarray([3, 2]), cache_length=6)
  np.testing.assert_array_equal(np.argmax(logits, -1), [12, 11])
  np.testing.assert_array_equal(cache.index, [3, 2])
  np.testing.assert_array_equal(cache.tokens, [[5, 6, 7, 0, 0, 0],
                                               [8, 9, 4, 0, 0, 0]])


# C5: per-row EOS.
def _c5_stub():
  """Prompts of length 2: token i comes from position 1 + i. Row 0 emits EOS
  at step 2, row 1 at step 5; afterwards both still propose non-PAD tokens."""
  return stubs.TableLogitsFn.scripted(
      [[9, 5, EOS_ID, 9, 9, 9, 9, 9], [9, 5, 6, 6, 6, EOS_ID, 7, 9]], 10)


C5_PROMPTS = ([[5, 6], [7, 8]], [2, 2])


@pytest.mark.parametrize("name", ALL)
def test_rows_stop_independently_at_eos(name):
  result = _decode(name, _c5_stub(), None, *C5_PROMPTS, output_length=6)
  np.testing.assert_array_equal(result.tokens, [[5, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
                                                [5, 6, 6, 6, EOS_ID, PAD_ID]])
  np.testing.assert_array_equal(result.lengths, [2, 5])
  np.testing.assert_array_equal(result.committed.T, [[1, 1, 0, 0, 0, 0],
                                                     [1, 1, 1, 1, 1, 0]])
  assert result.committed.dtype == jnp.int32
  assert result.nfe == (5 if name == "ar_early_exit" else 6)


@pytest.mark.parametrize("name", ALL)
def test_any_id_of_the_eos_set_ends_a_row(name):
  # Token i comes from position 1 + i; 3 is an ordinary token here.
  stub = stubs.TableLogitsFn.scripted(
      [[9, 5, 7, 3, 3, 3, 3, 3], [9, 5, 3, 6, 6, 2, 7, 3]], 10)
  result = _decode(name, stub, None, *C5_PROMPTS, output_length=6,
                   eos_ids=(2, 7))
  np.testing.assert_array_equal(result.tokens, [[5, 7, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
                                                [5, 3, 6, 6, 2, PAD_ID]])
  np.testing.assert_array_equal(result.lengths, [2, 5])
  if name == "ar":
    no_eos = _decode(name, stub, None, *C5_PROMPTS, output_length=6,
                     eos_ids=())
    np.testing.assert_array_equal(no_eos.tokens, [[5, 7, 3, 3, 3, 3],
                                                  [5, 3, 6, 6, 2, 7]])
    np.testing.assert_array_equal(no_eos.lengths, [6, 6])


@pytest.mark.parametrize("steps", [1, 4])
def test_early_exit_after_first_token(steps):
  stub = stubs.TableLogitsFn.by_position(lambda p: EOS_ID, 10, 8)
  result = _decode("ar_early_exit", stub, None, *C5_PROMPTS,
                   output_length=steps)
  assert result.nfe == 1
  np.testing.assert_array_equal(result.lengths, [1, 1])
  np.testing.assert_array_equal(result.committed.sum(0), [1, 1])


def test_repetition_penalty_counts_prompt_and_generated_tokens():
  table = np.full((1, 12, 10, 10, 10), -1.0, np.float32)
  table[..., 5], table[..., 6] = 3.0, 2.0  # 5 unless penalised, then 6
  stub = stubs.TableLogitsFn(table)
  penalty = SamplingConfig(temperature=0.0, repetition_penalty=2.0)
  # Row 0 holds a 5 only in its padding, which must not count.
  result = _decode("ar", stub, None, [[7, 5], [7, 5]], [1, 2],
                   output_length=4, sampling=penalty)
  np.testing.assert_array_equal(result.tokens, [[5, 6, 5, 5], [6, 5, 5, 5]])


SAMPLED = SamplingConfig(temperature=0.8, top_k=6, top_p=0.95, min_p=0.01,
                         repetition_penalty=1.2)
# rbg keys: the decoders take any key; threefry would compile ~10x slower here.
RBG_KEYS = [jax.random.key(seed, impl="rbg") for seed in (3, 4)]
SAMPLED_STUB = stubs.TableLogitsFn.random(2, 12, 16, masked_ids=(PAD_ID,))


def test_sampled_decoders_agree_on_a_stub():
  """Same key, same logits -> the same draws in every AR decoder."""
  prompts, lengths = [[5, 6, 7], [8, 9, PAD_ID], [8, PAD_ID, PAD_ID]], [3, 2, 1]
  decode = lambda name, key: _decode(name, SAMPLED_STUB, None, prompts,
                                     lengths, key=key, output_length=8,
                                     sampling=SAMPLED).tokens
  reference = decode("ar", RBG_KEYS[0])
  assert not np.array_equal(reference, decode("ar", RBG_KEYS[1]))
  for name in ("ar_early_exit", "ar_uncached"):
    np.testing.assert_array_equal(decode(name, RBG_KEYS[0]), reference)


@pytest.mark.parametrize("name", ALL)
def test_jitted_equals_eager_and_nfe_counts_calls(name):
  stub = stubs.TableLogitsFn.random(5, 12, 16, masked_ids=(PAD_ID,))
  prompts, lengths = [[5, 6, 7], [8, 9, PAD_ID]], [3, 2]
  decode = lambda: _decode(name, stub, None, prompts, lengths, output_length=5,
                           eos_ids=(EOS_ID, 7))
  jitted = decode()
  stub.calls.clear()
  with jax.disable_jit():
    eager = decode()
  for field in ("tokens", "lengths", "nfe", "committed"):
    np.testing.assert_array_equal(getattr(jitted, field), getattr(eager, field))
  assert len(stub.calls) == int(eager.nfe)


# C8 and input errors: raised before anything is traced or compiled.
@pytest.mark.parametrize("name", ALL + ("ar_beam",))
@pytest.mark.parametrize("options, prompt_width, lengths, match", [
    (dict(output_length=13), 4, [4], "max_len"),
    (dict(output_length=5, cache_length=8), 4, [4], "cache_length"),
    (dict(output_length=2, cache_length=17), 4, [4], "max_len"),
    (dict(output_length=2), 4, [0], "prompt_lengths"),
    (dict(output_length=2), 4, [5], "prompt_lengths"),
    (dict(output_length=2), 4, [4, 4], "prompt_lengths"),
])
def test_bad_lengths_raise_before_compiling(name, options, prompt_width,
                                            lengths, match):
  decoder = base.make_decoder(name, **options)
  prompts = jnp.ones((1, prompt_width), jnp.int32)
  with pytest.raises(ValueError, match=match):
    decoder.decode(bind(stubs.RaisingLogitsFn(max_len=16), None), prompts,
                   jnp.asarray(lengths, jnp.int32), KEY)


@pytest.mark.parametrize("name", ALL + ("ar_beam",))
@pytest.mark.parametrize("options, match", [
    (dict(output_length=0), "output_length"),
    (dict(output_length=-1), "output_length"),
    (dict(cache_length=0), "cache_length"),
    (dict(pad_id=-1), "pad_id"),
    (dict(eos_ids=(EOS_ID, -2)), "eos_ids"),
    (dict(no_such_option=1), "no_such_option"),
])
def test_bad_options_raise(name, options, match):
  with pytest.raises(ValueError, match=match):
    base.make_decoder(name, **options)


def test_prefill_rejects_short_cache_and_bad_prompts():
  stub = stubs.RaisingLogitsFn(max_len=16)
  with pytest.raises(ValueError, match="cache_length"):
    ar.prefill(stub, None, jnp.ones((2, 4), jnp.int32), jnp.asarray([4, 2]),
               cache_length=3)
  with pytest.raises(ValueError, match="prompts"):
    ar.prefill(stub, None, jnp.ones((4,), jnp.int32), jnp.asarray([4]))
  with pytest.raises(ValueError, match="prompts"):
    ar.prefill(stub, None, jnp.ones((1, 4)), jnp.asarray([4]))


def test_decoders_are_registered_hashable_configs():
  assert set(ALL + ("ar_beam",)) <= set(base.registered())
  decoder = base.make_decoder("ar", output_length=4, eos_ids=[2, 7])
  assert decoder.eos_ids == (2, 7)
  assert hash(decoder) == hash(ar.AutoregressiveDecoder(output_length=4,
                                                        eos_ids=(2, 7)))
  assert decoder != ar.EarlyExitDecoder(output_length=4, eos_ids=(2, 7))


def test_prefill_accepts_python_lists():
  """Bug: as for `decode` (tests/test_registry_contracts.py), `prefill`
  raised TypeError for list inputs."""
  stub = stubs.TableLogitsFn.random(1, 8, 10)
  logits, cache = ar.prefill(stub, None, [[5, 6, 7], [5, 6, 0]], [3, 2])
  expected, _ = ar.prefill(stub, None, jnp.asarray([[5, 6, 7], [5, 6, 0]]),
                           jnp.asarray([3, 2]))
  np.testing.assert_array_equal(logits, expected)
  np.testing.assert_array_equal(cache.index, [3, 2])


@pytest.mark.parametrize("name, options, match", [
    ("ar", dict(output_length=2.5), "output_length"),
    ("ar_uncached", dict(output_length=float("nan")), "output_length"),
])
def test_integer_options_reject_non_integers(name, options, match):
  """Bug: `x < 1` checks accept 2.5 and NaN; decoding then fails late with a
  TypeError from inside the trace (after init_cache / the model ran).

  Fix: check integer options like `SamplingConfig.top_k` does:
  `isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1`
  for output_length, cache_length, num_beams, output_length, steps and
  block_length.
  """
  with pytest.raises(ValueError, match=match):
    base.make_decoder(name, **options)


# Rows (call, exception class, regex) as in tests/test_registry_contracts.py:
# the message names the argument and its range, before any trace (decoding
# on `stubs.RaisingLogitsFn`, V = 16, with T = 4).
BAD_INPUTS = [
    pytest.param(lambda: stubs.decoder("ar", cache_length=0), ValueError,
                 r"cache_length=0 must be >= 1", id="ar-cache-length-0"),
    pytest.param(lambda: stubs.decode_raising("ar", cache_length=5),
                 ValueError,
                 r"P=2 \+ output_length=4 must be <= cache_length=5",
                 id="ar-cache-shorter-than-prompt-plus-output"),
    pytest.param(lambda: stubs.decode_raising("ar", cache_length=17),
                 ValueError,
                 r"^17 positions \(cache_length=17\) must be <= the model's "
                 r"max_len=16$", id="ar-cache-longer-than-max-len"),
    pytest.param(lambda: stubs.decode_raising("ar", eos_ids=(16,)),
                 ValueError,
                 r"eos_ids and pad_id must be token ids in \[0, V=16\)",
                 id="ar-eos-id-outside-vocab"),
    pytest.param(lambda: stubs.decoder("ar", pad_id=-1), ValueError,
                 r"pad_id=-1 must be >= 0", id="ar-pad-id-negative"),
    pytest.param(lambda: stubs.decode_raising("ar", lengths=(3,)),
                 ValueError, r"prompt_lengths=\[3\] must be in \[1, P=2\]",
                 id="ar-prompt-length-above-width"),
    pytest.param(lambda: stubs.decode_raising("ar",
                                              key=jax.random.PRNGKey(0)),
                 ValueError, r"key must be a typed PRNG key",
                 id="ar-raw-prng-key"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()
