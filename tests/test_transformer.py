"""Correctness tests of the Transformer backbone and its KV cache."""

from __future__ import annotations

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding import bind, make_decoder
from lm_decoding.models import (KVCache, TransformerConfig, abstract_params,
                                count_params, init_params, make_logits_fn)
from lm_decoding.models import masks
from lm_decoding.models.kv_cache import write_rows
from lm_decoding.models.layers import Attention
from lm_decoding.special_tokens import EOS_ID, PAD_ID

BASE = TransformerConfig(vocab_size=32, d_model=32, num_layers=2, num_heads=4,
                         num_kv_heads=4, head_dim=8, mlp_dim=64, max_len=32)

# Every value of every option appears in at least one variant: MHA/GQA/MQA,
# rope/learned, rmsnorm/layernorm, swiglu/gelu, tied/untied.
VARIANTS = {
    "mha-rope-rmsnorm-swiglu-tied": BASE,
    "gqa-learned-layernorm-gelu-untied": BASE.replace(
        num_kv_heads=2, positional="learned", norm="layernorm",
        mlp_activation="gelu", tie_embeddings=False),
    "mqa-rope-layernorm-swiglu-untied": BASE.replace(
        num_kv_heads=1, norm="layernorm", tie_embeddings=False),
}

# GPT-2-small-shaped (Radford et al. 2019): ~124M parameters.
GPT2_SMALL_SHAPED = TransformerConfig(
    vocab_size=50304, d_model=768, num_layers=12, num_heads=12,
    num_kv_heads=12, head_dim=64, mlp_dim=3072, max_len=1024,
    norm="layernorm", positional="learned", mlp_activation="gelu",
    tie_embeddings=True)


@functools.lru_cache(maxsize=None)
def _params(config):
  """Random parameters of `config`'s shapes, drawn in numpy.

  The properties tested hold for any parameters; drawing them from the
  `abstract_params` shapes avoids compiling an init per config. Scales
  roughly follow `init_params`; norm scales and biases are perturbed so a
  norm applied wrongly shows.
  """
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    name = path[-1].key
    center = 1.0 if name == "scale" else 0.0
    std = {"scale": 0.1, "bias": 0.1, "embedding": 1.0}.get(
        name, config.d_model ** -0.5)
    return jnp.asarray(rng.normal(center, std, leaf.shape), leaf.dtype)

  return jax.tree_util.tree_map_with_path(
      draw, nn.meta.unbox(abstract_params(config)))


@functools.lru_cache(maxsize=None)
def _apply(config):
  """The jitted logits_fn of `config` (one compile per input shape)."""
  return jax.jit(make_logits_fn(config))


def _positions(batch, length, start=0):
  return jnp.broadcast_to(jnp.arange(start, start + length, dtype=jnp.int32),
                          (batch, length))


def _tokens(key, batch, length, vocab):
  return jax.random.randint(jax.random.key(key), (batch, length), 5, vocab)


def _full(config, params, tokens, **kwargs):
  out = _apply(config)(params, tokens, _positions(*tokens.shape), **kwargs)
  return np.asarray(out.logits)


# ----------------------------------------------------------------------------
# KV cache equivalence.

@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_cached_decoding_matches_full_forward_for_every_prompt_length(name):
  """Row b has a prompt of b + 1 tokens (right-padded, index = lengths after
  prefill) and decodes the rest one token per step at position
  prompt_len + step; every logit equals the full causal forward pass."""
  config = VARIANTS[name]
  params, logits_fn = _params(config), _apply(config)
  length = 6
  seqs = _tokens(1, length - 1, length, config.vocab_size)
  full = _full(config, params, seqs)
  lengths = jnp.arange(1, length, dtype=jnp.int32)
  batch, prompt_len = len(lengths), length - 1
  slot = jnp.arange(prompt_len)[None, :]
  prompts = jnp.where(slot < lengths[:, None], seqs[:, :prompt_len], PAD_ID)
  cache = make_logits_fn(config).init_cache(batch, 2 * length)
  logits, cache, _ = logits_fn(params, prompts, _positions(batch, prompt_len),
                            cache)
  np.testing.assert_array_equal(cache.index, prompt_len)
  for b in range(batch):
    np.testing.assert_allclose(logits[b, :lengths[b]], full[b, :lengths[b]],
                               atol=1e-4, rtol=0)
  cache = cache.replace(index=lengths)
  for step in range(length - 1):
    position_B = lengths + step
    token_B = jnp.take_along_axis(
        seqs, jnp.minimum(position_B, length - 1)[:, None], axis=1)
    logits, cache, _ = logits_fn(params, token_B, position_B[:, None], cache)
    np.testing.assert_array_equal(cache.index, position_B + 1)
    for b in range(batch):
      if position_B[b] < length:
        np.testing.assert_allclose(logits[b, 0], full[b, position_B[b]],
                                   atol=1e-4, rtol=0, err_msg=f"row {b}")


def test_f3_rotary_positions_during_cached_decoding():
  config = BASE
  params, logits_fn = _params(config), _apply(config)
  tokens = jnp.array([[3, 1, 4, 1, 5]], jnp.int32)
  full = _full(config, params, tokens)
  cache = make_logits_fn(config).init_cache(1, 8)
  _, cache, _ = logits_fn(params, tokens[:, :4], _positions(1, 4), cache)

  def last_logits(position):
    logits = logits_fn(params, tokens[:, 4:], jnp.array([[position]]),
                       cache).logits
    return np.asarray(logits[0, 0])

  np.testing.assert_allclose(last_logits(4), full[0, 4], atol=1e-5, rtol=0)
  # The test can fail: a wrong decode position changes the logits.
  for wrong in (0, 3, 5):
    assert np.abs(last_logits(wrong) - full[0, 4]).max() > 1e-3


# ----------------------------------------------------------------------------
# Causality.

def test_causal_logits_ignore_later_tokens_and_bidirectional_do_not():
  tokens = _tokens(2, 5, 6, BASE.vocab_size)
  changed = tokens.at[:, 3:].set(_tokens(3, 5, 3, BASE.vocab_size))
  for attention in ("causal", "bidirectional"):
    config = BASE.replace(attention=attention)
    params = _params(config)
    a, b = _full(config, params, tokens), _full(config, params, changed)
    early_change = np.abs(a[:, :3] - b[:, :3]).max()
    if attention == "causal":
      assert early_change == 0
    else:
      assert early_change > 1e-3
    assert np.abs(a[:, 3:] - b[:, 3:]).max() > 1e-3


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_gradient_causality(attention):
  """d logits[i] / d pos_embedding[j] is nonzero iff j <= i (causal)."""
  config = BASE.replace(attention=attention, positional="learned",
                        num_layers=1)
  params = _params(config)
  tokens = _tokens(4, 5, 6, config.vocab_size)

  def logits_of(pos_embedding):
    p = {**params, "pos_embedding": pos_embedding}
    logits = _apply(config)(p, tokens, _positions(5, 6)).logits
    return logits.sum(-1)[0]

  jac_LxSxD = jax.jacrev(logits_of)(params["pos_embedding"])
  depends_LxS = np.abs(np.asarray(jac_LxSxD)).max(-1) > 0
  expected = np.zeros((6, config.max_len), bool)
  expected[:, :6] = (np.tril(np.ones((6, 6), bool)) if attention == "causal"
                     else True)
  np.testing.assert_array_equal(depends_LxS, expected)


# ----------------------------------------------------------------------------
# F2: grouped-query attention maps query head h to kv head h // (H / Hkv).

def _gqa_reference(x, params, num_kv_heads):
  """Causal attention in numpy, query head h reading kv head h // (H / Hkv)."""
  q = np.einsum("bld,dhk->blhk", x, params["query"]["kernel"])
  k = np.einsum("bld,dhk->blhk", x, params["key"]["kernel"])
  v = np.einsum("bld,dhk->blhk", x, params["value"]["kernel"])
  heads, length, head_dim = q.shape[2], q.shape[1], q.shape[3]
  causal = np.tril(np.ones((length, length), bool))
  outs = []
  for h in range(heads):
    kv = h // (heads // num_kv_heads)
    scores = np.einsum("bld,bsd->bls", q[:, :, h], k[:, :, kv]) / np.sqrt(head_dim)
    scores = np.where(causal, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    outs.append(np.einsum("bls,bsd->bld", probs, v[:, :, kv]))
  return np.stack(outs, axis=2)  # [B, L, H, Dh]


@pytest.mark.parametrize("constant_values", [True, False])
def test_f2_gqa_query_head_reads_kv_head_h_div_group(constant_values):
  """H=4, Hkv=2. With values 0.0 in kv head 0 and 1.0 in kv head 1 the query
  heads output [0, 0, 1, 1] (repeat, not tile); with random weights each
  query head h matches attention over kv head h // 2 alone. The output
  projection is the identity, so y is the concatenated head outputs.
  Cached (prefill 3, then one token at a time) and uncached paths agree."""
  heads, kv_heads, head_dim, length = 4, 2, 2, 5
  d_model = heads * head_dim
  config = TransformerConfig(vocab_size=8, d_model=d_model, num_layers=1,
                             num_heads=heads, num_kv_heads=kv_heads,
                             head_dim=head_dim, mlp_dim=8, max_len=8,
                             positional="learned")  # no rotary: plain reference
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, length, d_model)).astype(np.float32)
  x[..., 0] = 1.0  # a constant feature, so values can be constant
  if constant_values:
    value = np.zeros((d_model, kv_heads, head_dim), np.float32)
    value[0, 1, :] = 1.0  # kv head 0 -> 0.0, kv head 1 -> 1.0
  else:
    value = rng.normal(size=(d_model, kv_heads, head_dim)).astype(np.float32)
  params = {
      "query": {"kernel": rng.normal(size=(d_model, heads, head_dim))},
      "key": {"kernel": rng.normal(size=(d_model, kv_heads, head_dim))},
      "value": {"kernel": value},
      "out": {"kernel": np.eye(d_model).reshape(heads, head_dim, d_model)},
  }
  params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
  attend = jax.jit(functools.partial(Attention(config).apply,
                                     {"params": params}))
  positions = _positions(1, length)
  y, _, _ = attend(jnp.asarray(x), positions,
                   masks.default_mask(config.attention, 1, length),
                   None, None, None)
  y_BxLxHxD = np.asarray(y).reshape(1, length, heads, head_dim)
  if constant_values:
    expected = np.broadcast_to(np.array([0.0, 0.0, 1.0, 1.0])[:, None],
                               y_BxLxHxD.shape)
  else:
    expected = _gqa_reference(x, params, kv_heads)
  np.testing.assert_allclose(y_BxLxHxD, expected, atol=1e-5)

  zeros = jnp.zeros((1, kv_heads, 8, head_dim))  # [B, Hkv, S, Dh]
  cache = KVCache(k=(zeros,), v=(zeros,), index=jnp.zeros((1,), jnp.int32))
  cached = []
  for start, stop in ((0, 3), (3, 4), (4, 5)):  # prefill 3, then decode
    mask = masks.default_mask(config.attention, 1, stop - start, cache.index,
                              cache.length)
    y_step, k, v = attend(jnp.asarray(x[:, start:stop]),
                          positions[:, start:stop], mask,
                          cache.k[0], cache.v[0], cache.index)
    cache = cache.replace(k=(k,), v=(v,), index=cache.index + stop - start)
    cached.append(y_step)
  np.testing.assert_allclose(jnp.concatenate(cached, 1), y, atol=1e-5)


# ----------------------------------------------------------------------------
# attention masks, jit, dtypes.

def test_key_padding_mask_hides_padded_keys_in_bidirectional_mode():
  config = BASE.replace(attention="bidirectional")
  params = _params(config)
  tokens = _tokens(5, 5, 6, config.vocab_size).at[0, 4:].set(PAD_ID)
  mask = masks.key_padding_mask(tokens != PAD_ID, 6)
  refilled = tokens.at[0, 4:].set(jnp.array([7, 8]))
  a = _full(config, params, tokens, attention_mask=mask)
  b = _full(config, params, refilled, attention_mask=mask)
  np.testing.assert_allclose(a[0, :4], b[0, :4], atol=1e-5, rtol=0)
  np.testing.assert_array_equal(a[1:], b[1:])
  alone = _full(config, params, tokens[:1, :4])
  np.testing.assert_allclose(a[0, :4], alone[0], atol=1e-5, rtol=0)
  # Without the mask the padding is attended to, so the test can fail.
  unmasked = _full(config, params, refilled)
  assert np.abs(unmasked[0, :4] - a[0, :4]).max() > 1e-3


def test_init_params_and_jit_matches_eager():
  config = VARIANTS["gqa-learned-layernorm-gelu-untied"]
  params = init_params(config, jax.random.key(0))
  chex.assert_trees_all_equal_shapes_and_dtypes(
      params, nn.meta.unbox(abstract_params(config)))
  # The shapes init_params traces with, so eager mode reuses its kernels.
  tokens = _tokens(6, 1, 8, config.vocab_size)
  positions = _positions(1, 8)
  eager = make_logits_fn(config)(params, tokens, positions).logits
  jitted = _apply(config)(params, tokens, positions).logits
  np.testing.assert_allclose(jitted, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_runs_and_returns_float32_logits(dtype):
  config = BASE.replace(dtype=dtype, param_dtype=dtype)
  params = _params(config)  # BASE's draws, rounded to `dtype`
  tokens = _tokens(7, 5, 6, config.vocab_size)
  cache = make_logits_fn(config).init_cache(5, 12)
  logits, cache, _ = _apply(config)(params, tokens, _positions(5, 6), cache)
  assert logits.dtype == jnp.float32
  assert cache.k[0].dtype == jnp.dtype(dtype)
  assert np.all(np.isfinite(logits))
  reference = _full(BASE, jax.tree.map(lambda x: x.astype(jnp.float32), params),
                    tokens)  # measured error: 0.2% (bfloat16) of the range
  assert np.abs(logits - reference).max() < 0.02 * np.abs(reference).max()


# ----------------------------------------------------------------------------
# Configuration and input validation.

@pytest.mark.parametrize("changes,match", [
    (dict(num_heads=6, num_kv_heads=4), "num_heads"),
    (dict(attention="prefix"), "attention"),
    (dict(norm="batchnorm"), "norm"),
    (dict(positional="alibi"), "positional"),
    (dict(mlp_activation="relu"), "mlp_activation"),
    (dict(dtype="float64"), "dtype"),
    (dict(param_dtype="int8"), "param_dtype"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(num_layers=0), "num_layers"),
    (dict(head_dim=7), "head_dim"),
])
def test_config_validation(changes, match):
  with pytest.raises(ValueError, match=match):
    BASE.replace(**changes)


def test_cache_and_attention_mask_validation():
  logits_fn = make_logits_fn(BASE)
  with pytest.raises(ValueError, match="length"):
    logits_fn.init_cache(1, BASE.max_len + 1)
  with pytest.raises(ValueError, match="length"):
    logits_fn.init_cache(1, 0)
  tokens = jnp.ones((1, 3), jnp.int32)
  with pytest.raises(ValueError, match="attention_mask"):  # S = 4 with a cache
    logits_fn(_params(BASE), tokens, _positions(1, 3), logits_fn.init_cache(1, 4),
              attention_mask=jnp.ones((1, 3, 3), bool))
  with pytest.raises(ValueError, match="attention_mask"):
    logits_fn(_params(BASE), tokens, _positions(1, 3),
              attention_mask=jnp.ones((1, 3), bool))


# ----------------------------------------------------------------------------
# A GPT-2-small-shaped model, shapes only (never materialised).

def test_gpt2_small_shaped_config_abstract_shapes_and_size():
  config = GPT2_SMALL_SHAPED
  abstract = abstract_params(config)
  shapes = nn.meta.unbox(abstract)
  assert all(isinstance(leaf, jax.ShapeDtypeStruct)
             for leaf in jax.tree.leaves(shapes))
  assert shapes["embedding"].shape == (50304, 768)
  assert shapes["pos_embedding"].shape == (1024, 768)
  attention = shapes["block_11"]["attention"]
  assert attention["query"]["kernel"].shape == (768, 12, 64)
  assert attention["out"]["kernel"].shape == (12, 64, 768)
  assert shapes["block_11"]["mlp"]["wi"]["kernel"].shape == (768, 3072)
  d, f, v, layers = 768, 3072, 50304, 12
  per_layer = 4 * d * d + 2 * d * f + 2 * 2 * d  # attention, MLP, 2 layernorms
  expected = v * d + 1024 * d + layers * per_layer + 2 * d
  assert count_params(abstract) == expected
  assert 100e6 <= expected <= 170e6  # 124.4M
  tokens = jax.ShapeDtypeStruct((2, 1024), jnp.int32)
  logits, cache, hidden = jax.eval_shape(make_logits_fn(config), shapes,
                                         tokens, tokens)
  assert logits.shape == (2, 1024, 50304) and logits.dtype == jnp.float32
  assert cache is None and hidden.shape == (2, 1024, 768)


# ----------------------------------------------------------------------------
# Masks at the boundary, cache operations, hidden states, initial scale.

def test_mask_builders_worked_examples():
  np.testing.assert_array_equal(masks.causal_mask(1, 3)[0],
                                [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  np.testing.assert_array_equal(masks.block_causal_mask(1, 4, 2)[0],
                                [[1, 1, 0, 0]] * 2 + [[1, 1, 1, 1]] * 2)
  np.testing.assert_array_equal(masks.block_causal_mask(2, 5, 1),
                                masks.causal_mask(2, 5))
  np.testing.assert_array_equal(masks.block_causal_mask(1, 5, 5),
                                masks.full_mask(1, 5))
  np.testing.assert_array_equal(
      masks.prefix_lm_mask(jnp.array([2, 0]), 4),
      [[[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]],
       np.tril(np.ones((4, 4)))])
  np.testing.assert_array_equal(
      masks.key_padding_mask(jnp.array([[1, 1, 0]], bool), 2)[0],
      [[1, 1, 0], [1, 1, 0]])
  # Queries at slots 2, 3 of a 5-slot cache: written slots are < 4.
  np.testing.assert_array_equal(
      masks.cache_query_mask(jnp.array([2]), 2, 5, causal=True)[0],
      [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
  np.testing.assert_array_equal(
      masks.cache_query_mask(jnp.array([2]), 2, 5, causal=False)[0],
      [[1, 1, 1, 1, 0]] * 2)


@pytest.mark.parametrize("block", [1, 2, 3, 6])
def test_bd3lm_training_mask_layout(block):
  length = 6
  mask = np.asarray(masks.bd3lm_training_mask(1, length, block)[0])
  b = np.arange(length) // block
  for i in range(length):
    for j in range(length):
      assert mask[i, j] == (b[i] == b[j])  # noisy sees its own noisy block
      assert mask[i, length + j] == (b[j] < b[i])  # and earlier clean blocks
      assert not mask[length + i, j]  # clean never sees noisy
      assert mask[length + i, length + j] == (b[j] <= b[i])


def test_explicit_masks_equal_the_configured_attention():
  """The default mask is only a default: a causal mask passed to a
  bidirectional model gives the causal model's logits (same parameters)."""
  causal = BASE
  bidirectional = BASE.replace(attention="bidirectional")
  params = _params(BASE)
  tokens = _tokens(11, 3, 7, BASE.vocab_size)
  np.testing.assert_allclose(
      _full(bidirectional, params, tokens,
            attention_mask=masks.causal_mask(3, 7)),
      _full(causal, params, tokens), atol=1e-5)
  np.testing.assert_allclose(
      _full(causal, params, tokens, attention_mask=masks.full_mask(3, 7)),
      _full(bidirectional, params, tokens), atol=1e-5)
  # A block-causal mask differs from both (so the comparison can fail).
  block = _full(causal, params, tokens,
                attention_mask=masks.block_causal_mask(3, 7, 2))
  assert np.abs(block - _full(causal, params, tokens)).max() > 1e-3


def test_masked_cached_call_equals_masked_full_pass():
  """A bidirectional prefix in the cache, then a bidirectional block of 3
  queries written at slots 4..6 (a dual-cache step): equal to the full pass
  over the same 7 tokens with the same mask."""
  config = BASE.replace(attention="bidirectional")
  params = _params(config)
  logits_fn = _apply(config)
  tokens = _tokens(12, 2, 7, config.vocab_size)
  full = _full(config, params, tokens)
  cache = make_logits_fn(config).init_cache(2, 7)
  _, cache, _ = logits_fn(params, tokens, _positions(2, 7), cache)
  mask = jnp.ones((2, 3, 7), bool)
  step = logits_fn(params, tokens[:, 4:], _positions(2, 3, 4), cache.at(4),
                   attention_mask=mask)
  np.testing.assert_allclose(step.logits, full[:, 4:], atol=1e-5)
  assert np.all(np.asarray(step.cache.index) == 7)


def test_kv_cache_rollback_and_reorder():
  config = BASE
  params = _params(config)
  logits_fn = _apply(config)
  tokens = _tokens(13, 3, 6, config.vocab_size)
  cache = make_logits_fn(config).init_cache(3, 8)
  _, cache, _ = logits_fn(params, tokens, _positions(3, 6), cache)
  # Row-wise rollback to 4, 2, 6, then re-feeding the dropped tokens gives
  # the logits of an uninterrupted pass.
  kept = jnp.array([4, 2, 6])
  rolled = cache.rollback(kept)
  np.testing.assert_array_equal(rolled.index, kept)
  np.testing.assert_array_equal(cache.rollback(jnp.array([9, 9, 9])).index,
                                [6, 6, 6])
  full = _full(config, params, tokens)
  for row in range(3):
    n = int(kept[row])
    if n == 6:
      continue
    one = rolled.reorder(jnp.array([row]))
    out = logits_fn(params, tokens[row:row + 1, n:],
                    _positions(1, 6 - n, n), one)
    np.testing.assert_allclose(out.logits[0], full[row, n:], atol=1e-5)
  reordered = cache.reorder(jnp.array([2, 0, 0]))
  np.testing.assert_array_equal(reordered.k[1][1], cache.k[1][0])
  np.testing.assert_array_equal(reordered.k[0][0], cache.k[0][2])
  assert reordered.k[0].shape == cache.k[0].shape


@pytest.mark.parametrize("kv_cache_dtype", ["compute", "int8"])
def test_kv_cache_is_heads_major_and_writes_each_row_at_its_index(
    kv_cache_dtype):
  """Keys/values [B, Hkv, S, Dh] (int8: scales [B, Hkv, S]); `write_rows`
  puts new[b, h, j] at slot index[b] + j of row b, head h, and leaves every
  other slot as it was."""
  config = BASE.replace(num_kv_heads=2, kv_cache_dtype=kv_cache_dtype)
  cache = KVCache.init(config, 2, 7)
  assert cache.length == 7
  int8 = kv_cache_dtype == "int8"
  values = (lambda a: a.values) if int8 else (lambda a: a)
  assert values(cache.k[0]).shape == (2, 2, 7, 8)
  if int8:
    assert cache.k[0].scale.shape == (2, 2, 7)
  # Integer-valued head vectors with absmax 127: int8 stores them exactly.
  new = np.arange(2 * 2 * 3 * 8, dtype=np.float32).reshape(2, 2, 3, 8) % 255
  new = new - 127
  new[..., 0] = 127
  written = write_rows(cache.k[0], jnp.asarray(new), jnp.asarray([1, 4]))
  got = np.asarray(written.dequantize() if int8 else written)
  want = np.zeros((2, 2, 7, 8), np.float32)
  want[0, :, 1:4] = new[0]
  want[1, :, 4:7] = new[1]
  np.testing.assert_array_equal(got, want)
  if int8:
    scale = np.zeros((2, 2, 7), np.float32)
    scale[0, :, 1:4] = scale[1, :, 4:7] = 1.0
    np.testing.assert_array_equal(written.scale, scale)
  # Per slot: keys and values of 2 layers x 2 KV heads x 8 dims, and int8's
  # float32 scale per KV head.
  per_layer = 2 * (2 * 8 + 2 * 4) if int8 else 2 * 2 * 8 * 4
  assert cache.bytes_per_slot() == config.num_layers * per_layer
  # Internal invariants (chex): the new rows, heads and head dims must be
  # the buffer's, at most S slots, one index per row.
  for bad_new, bad_index in ((new[:1], [1, 4]), (new[:, :1], [1, 4]),
                             (new[..., :4], [1, 4]),
                             (np.zeros((2, 2, 8, 8), np.float32), [0, 0]),
                             (new, [1, 4, 0])):
    with pytest.raises(AssertionError):
      write_rows(cache.k[0], jnp.asarray(bad_new), jnp.asarray(bad_index))
  with pytest.raises(AssertionError):
    cache.reorder(jnp.array([[0, 1]]))


def test_hidden_states_are_the_final_norm_output():
  config = BASE.replace(tie_embeddings=False)
  params = _params(config)
  tokens = _tokens(14, 2, 5, config.vocab_size)
  out = _apply(config)(params, tokens, _positions(2, 5))
  assert out.hidden.shape == (2, 5, config.d_model)
  head = np.asarray(params["lm_head"]["kernel"])
  np.testing.assert_allclose(np.asarray(out.hidden) @ head, out.logits,
                             atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_initial_loss_is_near_uniform(name):
  """A fresh model's next-token loss is within 10% of log V (a uniform
  guess): initial logits on the scale of a uniform distribution."""
  config = VARIANTS[name].replace(vocab_size=4096)
  params = init_params(config, jax.random.key(3))
  tokens = _tokens(15, 4, 16, config.vocab_size)
  logits = _full(config, params, tokens)
  log_probs = jax.nn.log_softmax(logits[:, :-1], -1)
  loss = -float(np.take_along_axis(np.asarray(log_probs),
                                   np.asarray(tokens)[:, 1:, None], -1).mean())
  assert abs(loss - np.log(4096)) < 0.1 * np.log(4096), loss


@pytest.mark.parametrize("changes, chunks", [
    (dict(sliding_window=3), (5, 1, 1, 1, 1, 1)),  # prefill, then one a step
    (dict(sliding_window=3, attention="bidirectional"), (10,)),
    (dict(attention="block_causal", block_length=2), (4, 2, 2, 2)),
    (dict(attention="block_causal", block_length=2, sliding_window=2),
     (2, 2, 2, 2, 2)),
])
def test_window_and_block_causal_hold_with_the_kv_cache(changes, chunks):
  """The default mask of block-causal attention and the sliding window
  (`config.sliding_window`, ANDed in the model) are the same built from
  slots with a KV cache as from indices without one: the cached pass,
  prefill then chunks, equals the full one; and the full one equals an
  explicit mask built here."""
  config = BASE.replace(**changes)
  params = _params(config)
  tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, 32)
  logits_fn = make_logits_fn(config)
  full = logits_fn(params, tokens, _positions(2, 10)).logits
  i = np.arange(10)
  allowed = np.ones((10, 10), bool)
  if config.attention == "causal":
    allowed = i[None] <= i[:, None]
  if config.block_length:
    allowed = i[None] // config.block_length <= i[:, None] // config.block_length
  if config.sliding_window:
    allowed &= np.abs(i[:, None] - i[None]) < config.sliding_window
  plain = config.replace(sliding_window=0)
  explicit = make_logits_fn(plain)(
      params, tokens, _positions(2, 10),
      attention_mask=jnp.broadcast_to(jnp.asarray(allowed), (2, 10, 10))).logits
  np.testing.assert_allclose(full, explicit, atol=1e-5)
  cache, cached, start = logits_fn.init_cache(2, 10), [], 0
  for size in chunks:
    out = logits_fn(params, tokens[:, start:start + size],
                    _positions(2, size, start), cache=cache)
    cache, start = out.cache, start + size
    cached.append(out.logits)
  if config.attention == "bidirectional":  # one chunk: the whole sequence
    np.testing.assert_allclose(cached[0], full, atol=1e-5)
  else:
    np.testing.assert_allclose(jnp.concatenate(cached, 1), full, atol=1e-5)
  assert np.abs(np.asarray(full) - np.asarray(
      make_logits_fn(plain.replace(attention="causal", block_length=0))(
          params, tokens, _positions(2, 10)).logits)).max() > 1e-3


def test_bfloat16_model_with_a_bfloat16_kv_cache():
  """A bfloat16 GQA Transformer decodes through its bfloat16 KV cache."""
  cfg = TransformerConfig(vocab_size=32, d_model=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=16, mlp_dim=64, max_len=8,
                          dtype="bfloat16", param_dtype="bfloat16")
  logits_fn = make_logits_fn(cfg)
  assert logits_fn.init_cache(1, 1).k[0].dtype == jnp.bfloat16
  out = make_decoder("ar", output_length=4, eos_ids=(EOS_ID,)).decode(
      bind(logits_fn, init_params(cfg, jax.random.key(0))),
      jnp.asarray([[5, 6, 7], [8, 9, 0]]), jnp.asarray([3, 2]),
      jax.random.key(0))
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (2, 4) and ((tokens >= 0) & (tokens < 32)).all()
  assert int(out.nfe) == 4
