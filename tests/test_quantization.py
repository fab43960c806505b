"""Tests of int8 weights and the int8 KV cache (models/int8.py,
models/quantization.py, the int8 paths of models/transformer.py and
models/kv_cache.py)."""

from __future__ import annotations

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding import make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import (KVCache, TransformerConfig, abstract_params,
                                init_params, make_logits_fn, masks)
from lm_decoding.models import int8
from lm_decoding.models import Model
from lm_decoding.models.kv_cache import Int8KV
from lm_decoding.models.quantization import (dequantize_params,
                                              quantize_params)
from lm_decoding.models.layers import Attention
from lm_decoding.parallel import sharding

# GQA (4 query heads on 2 KV heads), RoPE, tied embeddings.
BASE = TransformerConfig(vocab_size=48, d_model=32, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=8, mlp_dim=64, max_len=24)
INT8 = BASE.replace(quantization="int8_weights", kv_cache_dtype="int8")


@functools.lru_cache(maxsize=None)
def _float_params():
  return init_params(BASE, jax.random.key(0))


@functools.lru_cache(maxsize=None)
def _int8_params():
  return quantize_params(_float_params(), BASE)


def _positions(batch, length, start=0):
  return jnp.broadcast_to(jnp.arange(start, start + length, dtype=jnp.int32),
                          (batch, length))


def _tokens(key, batch, length):
  return jax.random.randint(jax.random.key(key), (batch, length), 3,
                            BASE.vocab_size)


@functools.lru_cache(maxsize=None)
def _apply(config):
  return jax.jit(make_logits_fn(config))


# ---- quantise / dequantise ------------------------------------------------


def test_quantize_gives_the_hand_computed_int8_values():
  x = np.array([[2.54, -1.0, 0.02],   # scale 2.54 / 127 = 0.02
                [0.0, 0.0, 0.0],      # all zero: scale 0, values 0
                [-0.5, 0.2, 0.1]],    # scale 0.5 / 127: 0.2 -> 50.8, 0.1 -> 25.4
               np.float32)
  q, scale = int8.quantize(jnp.asarray(x), axes=-1)
  assert q.dtype == jnp.int8 and scale.dtype == jnp.float32
  np.testing.assert_array_equal(q, [[127, -50, 1], [0, 0, 0], [-127, 51, 25]])
  np.testing.assert_allclose(scale, [0.02, 0.0, 0.5 / 127], rtol=1e-6)
  # Per column instead (axis 0): one scale per output channel.
  q0, scale0 = int8.quantize(jnp.asarray(x), axes=0)
  np.testing.assert_allclose(scale0, [2.54 / 127, 1.0 / 127, 0.1 / 127],
                             rtol=1e-6)
  np.testing.assert_array_equal(q0[:, 1], [-127, 0, 25])  # 0.2/(1/127)=25.4


@pytest.mark.parametrize("axes", [0, (0, 1), -1])
def test_round_trip_error_is_at_most_half_a_step_per_channel(axes):
  w = jax.random.normal(jax.random.key(1), (16, 4, 8)) * jnp.arange(1, 9)
  q, scale = int8.quantize(w, axes)
  error = np.abs(np.asarray(w - int8.dequantize(q, scale, axes)))
  bound = np.expand_dims(np.asarray(scale), axes) / 2
  assert np.all(error <= bound * (1 + 1e-5) + 1e-7)
  assert np.abs(np.asarray(q)).max() == 127  # the absmax maps to +-127
  assert error.max() > 0.25 * bound.max()  # rounding does lose something


def test_quantize_params_quantises_each_kernel_per_output_channel():
  floats, quantized = _float_params(), _int8_params()
  chex.assert_trees_all_equal_shapes_and_dtypes(
      quantized, nn.meta.unbox(abstract_params(INT8)))
  kernel = floats["block_0"]["attention"]["out"]["kernel"]  # [H, Dh, D]
  q = quantized["block_0"]["attention"]["out"]["kernel"]
  scale = quantized["block_0"]["attention"]["out"]["kernel_scale"]
  assert q.dtype == jnp.int8 and scale.shape == (BASE.d_model,)
  np.testing.assert_allclose(scale, np.abs(kernel).max((0, 1)) / 127,
                             rtol=1e-6)
  assert np.all(np.abs(kernel - q * scale) <= scale / 2 * (1 + 1e-5))
  embedding, rows = quantized["embedding"], quantized["embedding_scale"]
  np.testing.assert_allclose(rows, np.abs(floats["embedding"]).max(1) / 127,
                             rtol=1e-6)
  np.testing.assert_array_equal(  # norms are kept as they are
      quantized["final_norm"]["scale"], floats["final_norm"]["scale"])
  assert embedding.dtype == jnp.int8


@pytest.mark.parametrize("overrides", [
    {}, {"tie_embeddings": False, "use_bias": True},
    {"param_dtype": "bfloat16", "use_bias": True, "length_classes": 5}])
def test_dequantize_params_inverts_quantize_params_per_channel(overrides):
  """Back to the float tree of the config (names, shapes, its param_dtype):
  each int8 weight within half its own channel's scale (plus bfloat16's
  rounding), every other parameter unchanged. Covers the query/key/value
  kernels [D, H, Dh], the output kernel [H, Dh, D], the MLP's, an untied LM
  head, the embedding (a scale per row), biases and the length head."""
  config = BASE.replace(**overrides)
  floats = init_params(config, jax.random.key(0))
  quantized = quantize_params(floats, config)
  back = dequantize_params(quantized, config.param_dtype)
  chex.assert_trees_all_equal_shapes_and_dtypes(
      back, nn.meta.unbox(abstract_params(config)))
  flat = lambda tree: {jax.tree_util.keystr(p): x
                       for p, x in jax.tree_util.tree_leaves_with_path(tree)}
  flat_q, flat_back = flat(quantized), flat(back)
  checked = 0
  for name, want in flat(floats).items():
    got = np.asarray(flat_back[name], np.float32)
    want = np.asarray(want, np.float32)
    if flat_q[name].dtype != jnp.int8:
      np.testing.assert_array_equal(got, want)
      continue
    scale = np.asarray(flat_q[name[:-2] + "_scale']"])
    # A kernel's scale covers its trailing (output) axes, the embedding's its
    # leading (row) axis.
    scale = (scale.reshape((1,) * (want.ndim - scale.ndim) + scale.shape)
             if name.endswith("['kernel']") else scale[:, None])
    rounding = np.abs(want) * (2.0 ** -8 if config.param_dtype == "bfloat16"
                               else 0.0)
    assert np.all(np.abs(got - want) <= scale / 2 * (1 + 1e-5) + rounding
                  + 1e-7), name
    checked += 1
  assert checked >= 7 + (not config.tie_embeddings)


def test_quantize_params_names_the_parameter_that_does_not_fit():
  other = init_params(BASE.replace(mlp_dim=32), jax.random.key(0))
  with pytest.raises(ValueError, match=r"params\['block_0'\]\['mlp'\]\['wi'\]"
                     r"\['kernel'\] is float32\[32, 32\]; the float parameters"
                     r" of this config have float32\[32, 64\]"):
    quantize_params(other, BASE)
  with pytest.raises(ValueError, match=r"\['key'\]\['kernel'\] is int8\[32, 2, 8\]"):
    quantize_params(_int8_params(), BASE)  # already quantised


@pytest.mark.parametrize("field, value, allowed", [
    ("quantization", "int4", "('none', 'int8_weights')"),
    ("kv_cache_dtype", "bfloat16", "('compute', 'int8')"),
])
def test_bad_option_names_the_field_and_the_allowed_values(field, value,
                                                           allowed):
  with pytest.raises(ValueError, match=f"^{field}='{value}'; allowed: "
                     + allowed.replace("(", r"\(").replace(")", r"\)")):
    BASE.replace(**{field: value})


# ---- the int8 model against float32 ----------------------------------------


@pytest.mark.parametrize("untied", [False, True])
def test_int8_weights_logits_are_close_to_float32(untied):
  """Each weight moves by at most scale / 2 = absmax / 254 of its channel
  (0.4% of its range); through a block and the tied head this measured
  0.7% of the logit range on these random weights, so 5% is the tolerance.
  A scale on the wrong axis, or none, is off by O(100%). Untied: an int8
  'lm_head', learned positions (kept float), LayerNorm and GELU."""
  config, params = BASE, _float_params()
  if untied:
    config = BASE.replace(tie_embeddings=False, positional="learned",
                          norm="layernorm", mlp_activation="gelu")
    params = init_params(config, jax.random.key(0))
  tokens = _tokens(2, 3, 12)
  reference = np.asarray(_apply(config)(params, tokens,
                                        _positions(3, 12)).logits)
  int8_config = config.replace(quantization="int8_weights")
  logits = np.asarray(_apply(int8_config)(quantize_params(params, config),
                                          tokens, _positions(3, 12)).logits)
  error = np.abs(logits - reference).max()
  assert 0 < error < 0.05 * np.abs(reference).max()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("untied", [False, True])
def test_int8_weights_in_half_precision_stay_finite_at_large_activations(
    dtype, untied):
  """Case I3: norm gains of 8 on a d128 model make activations large; the
  float-weight model in half precision stays finite, so must the int8 one
  (the unscaled x @ q product overflowed float16: every logit non-finite),
  and its error against int8 in float32 be of the float-weight model's
  (half against float32) order."""
  config = TransformerConfig(vocab_size=300, d_model=128, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=32,
                             mlp_dim=512, max_len=24, kv_cache_dtype="int8")
  if untied:
    config = config.replace(tie_embeddings=False, use_bias=True)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 8.0 if path[-1].key == "scale" else x,
      init_params(config, jax.random.key(0)))
  quantised = quantize_params(params, config)
  tokens = jax.random.randint(jax.random.key(2), (3, 8), 3, 300)
  positions = _positions(3, 8)
  logits = {}
  for compute in ("float32", dtype):
    for weights in ("none", "int8_weights"):
      logits[compute, weights] = np.asarray(_apply(config.replace(
          dtype=compute, quantization=weights))(
              quantised if weights != "none" else params, tokens,
              positions).logits)
  assert np.isfinite(logits[dtype, "none"]).all()
  assert np.isfinite(logits[dtype, "int8_weights"]).all()
  float_error = np.abs(logits[dtype, "none"] - logits["float32", "none"])
  int8_error = np.abs(logits[dtype, "int8_weights"]
                      - logits["float32", "int8_weights"])
  assert int8_error.max() < 4 * float_error.max()
  # Cached decoding (int8 weights and int8 KV cache) too.
  logits_fn = make_logits_fn(config.replace(dtype=dtype,
                                            quantization="int8_weights"))
  cached = logits_fn(quantised, tokens, positions,
                     cache=logits_fn.init_cache(3, 8)).logits
  assert np.isfinite(np.asarray(cached)).all()


def test_int8_cache_logits_are_close_to_the_float_cache():
  """Keys/values move by at most absmax / 254 of their head vector: the
  measured logit change is 0.14% of the range; tolerance 2%."""
  tokens = _tokens(3, 2, 10)
  logits = {}
  for dtype in ("compute", "int8"):
    config = BASE.replace(kv_cache_dtype=dtype)
    cache = KVCache.init(config, 2, 16)
    logits[dtype] = np.asarray(_apply(config)(
        _float_params(), tokens, _positions(2, 10), cache).logits)
  error = np.abs(logits["int8"] - logits["compute"]).max()
  assert 0 < error < 0.02 * np.abs(logits["compute"]).max()


# ---- the int8 KV cache ------------------------------------------------------


def _fake_quant(x_BxLxHxD):
  """numpy per-(row, position, head) absmax int8 round trip."""
  scale = np.abs(x_BxLxHxD).max(-1, keepdims=True) / 127
  return np.round(x_BxLxHxD / np.where(scale > 0, scale, 1)) * scale


def test_int8_cached_attention_equals_uncached_attention_on_quantised_kv():
  """Prefill 3 tokens then decode 2 one at a time through an int8 cache; the
  reference is causal attention in numpy over keys and values rounded to
  int8 per (position, head) exactly as the cache stores them."""
  heads, kv_heads, head_dim, length = 4, 2, 8, 5
  d_model = heads * head_dim
  config = TransformerConfig(
      vocab_size=8, d_model=d_model, num_layers=1, num_heads=heads,
      num_kv_heads=kv_heads, head_dim=head_dim, mlp_dim=8, max_len=8,
      positional="learned", kv_cache_dtype="int8")  # no rotary: plain numpy
  rng = np.random.default_rng(0)
  params = {name: {"kernel": rng.normal(size=shape).astype(np.float32)}
            for name, shape in (("query", (d_model, heads, head_dim)),
                                ("key", (d_model, kv_heads, head_dim)),
                                ("value", (d_model, kv_heads, head_dim)))}
  params["out"] = {"kernel": np.eye(d_model, dtype=np.float32).reshape(
      heads, head_dim, d_model)}
  x = rng.normal(size=(1, length, d_model)).astype(np.float32)

  q = np.einsum("bld,dhk->blhk", x, params["query"]["kernel"])
  k = _fake_quant(np.einsum("bld,dhk->blhk", x, params["key"]["kernel"]))
  v = _fake_quant(np.einsum("bld,dhk->blhk", x, params["value"]["kernel"]))
  causal = np.tril(np.ones((length, length), bool))
  expected = np.zeros((1, length, heads, head_dim), np.float32)
  for h in range(heads):
    g = h // (heads // kv_heads)
    scores = np.where(causal, q[0, :, h] @ k[0, :, g].T / np.sqrt(head_dim),
                      -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected[0, :, h] = (probs / probs.sum(-1, keepdims=True)) @ v[0, :, g]

  attend = jax.jit(functools.partial(Attention(config).apply,
                                     {"params": params}))
  cache = KVCache.init(config, 1, 8)
  outputs = []
  for start, stop in ((0, 3), (3, 4), (4, 5)):
    mask = masks.default_mask("causal", 1, stop - start, cache.index,
                              cache.length)
    y, kc, vc = attend(jnp.asarray(x[:, start:stop]),
                       _positions(1, stop - start, start), mask,
                       cache.k[0], cache.v[0], cache.index)
    assert isinstance(kc, Int8KV) and kc.values.dtype == jnp.int8
    cache = cache.replace(k=(kc,), v=(vc,), index=cache.index + stop - start)
    outputs.append(np.asarray(y))
  got = np.concatenate(outputs, 1).reshape(expected.shape)
  np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)
  # The keys (and so their scales, max |k| / 127 per head) come from
  # projections XLA and numpy sum in different orders, so they may differ
  # in the last bits: a few float32 ulps, relative (2 ulps of 7.5 in
  # one run, over an absolute 1e-6).
  np.testing.assert_allclose(cache.k[0].dequantize()[:, :, :length],
                             k.transpose(0, 2, 1, 3), rtol=1e-6, atol=1e-6)


def test_int8_cache_decoding_one_token_at_a_time_equals_one_prefill():
  """Each slot is quantised alone, so the int8 cache holds the same bytes
  whether the tokens arrive together or one by one (RoPE model)."""
  tokens = _tokens(4, 2, 7)
  apply = _apply(INT8)
  full = apply(_int8_params(), tokens, _positions(2, 7),
               KVCache.init(INT8, 2, 8))
  cache = KVCache.init(INT8, 2, 8)
  steps = []
  for i in range(7):
    out = apply(_int8_params(), tokens[:, i:i + 1], _positions(2, 1, i), cache)
    cache = out.cache
    steps.append(np.asarray(out.logits))
  np.testing.assert_allclose(np.concatenate(steps, 1), full.logits,
                             atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(cache, full.cache, rtol=1e-6)  # int8: exact


def test_rollback_and_reorder_move_scales_with_their_rows():
  cache = KVCache.init(INT8, 3, 8)
  out = _apply(INT8)(_int8_params(), _tokens(5, 3, 4), _positions(3, 4), cache)
  cache = out.cache
  reordered = cache.reorder(jnp.array([2, 2, 0]))
  for layer in range(INT8.num_layers):
    for got, want in ((reordered.k[layer], cache.k[layer]),
                      (reordered.v[layer], cache.v[layer])):
      np.testing.assert_array_equal(got.values[0], want.values[2])
      np.testing.assert_array_equal(got.scale[0], want.scale[2])
      np.testing.assert_array_equal(got.scale[2], want.scale[0])
      assert np.all(np.asarray(got.scale[:, :, :4]) > 0)  # 4 slots written
  rolled = cache.rollback(jnp.array([1, 4, 2]))
  np.testing.assert_array_equal(rolled.index, [1, 4, 2])
  chex.assert_trees_all_equal(rolled.k, cache.k)  # stale slots stay, unread
  # Per-slot bytes: int8 keys and values plus a float32 scale per KV head.
  assert cache.bytes_per_slot() == 2 * (2 * 8 + 2 * 4)  # one layer
  assert KVCache.init(BASE, 1, 1).bytes_per_slot() == 2 * 2 * 8 * 4


def test_int8_cache_scales_have_their_logical_sharding():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  cache = sharding.shard_cache(KVCache.init(INT8, 2, 8), mesh)
  scale_spec = sharding.logical_sharding(mesh, KVCache.SCALE_LOGICAL_AXES).spec
  assert cache.k[0].scale.sharding.spec == scale_spec
  assert cache.v[0].values.sharding.spec == sharding.logical_sharding(
      mesh, KVCache.LOGICAL_AXES).spec


# ---- every AR decoder with int8 -------------------------------------------

PROMPTS = jnp.array([[5, 6, 7, 8], [9, 10, 0, 0], [11, 12, 13, 0]], jnp.int32)
PROMPT_LENGTHS = jnp.array([4, 2, 3], jnp.int32)
T = 6


def _decode(name, config, params, prompts=PROMPTS, lengths=PROMPT_LENGTHS,
            **options):
  if name != "ar_beam":
    options["sampling"] = SamplingConfig(temperature=0.0)  # greedy
  decoder = make_decoder(name, output_length=T, eos_ids=(), **options)
  model = Model(make_logits_fn(config), params)
  models = {role: model for role in decoder.roles}
  return np.asarray(decoder.decode(models, prompts, lengths, None).tokens)


def test_greedy_int8_decoding_agrees_across_the_ar_decoders():
  """With int8 weights and an int8 cache, greedy tokens of the cached AR
  loop, beam search with one beam and lossless speculative decoding (the
  model as its own draft: int8 caches written in blocks of gamma + 1 and
  rolled back) are identical; the uncached decoder (no cache: keys/values
  stay float) equals the cached one when only the weights are int8."""
  params = _int8_params()
  ar = _decode("ar", INT8, params)
  assert ar.shape == (3, T)
  for name, options in (("ar_beam", {"num_beams": 1}),
                        ("speculative", {"gamma": 3})):
    np.testing.assert_array_equal(_decode(name, INT8, params, **options), ar,
                                  err_msg=name)
  weights_only = INT8.replace(kv_cache_dtype="compute")
  np.testing.assert_array_equal(_decode("ar_uncached", weights_only, params),
                                _decode("ar", weights_only, params))


def test_int8_batch_decodes_as_each_row_alone():
  batch = _decode("ar", INT8, _int8_params())
  for row in range(3):
    alone = _decode("ar", INT8, _int8_params(), PROMPTS[row:row + 1],
                    PROMPT_LENGTHS[row:row + 1])
    np.testing.assert_array_equal(alone[0], batch[row], err_msg=f"row {row}")
