"""AdamW's weight decay spares norm scales and biases, whatever their rank
(R5 of reliability_cases.md)."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lm_decoding.models import TransformerConfig, init_params
from lm_decoding.training import train_step


def train_section(weight_decay=0.1):
  """Learning rate 1 from the second update on (warmup of one step)."""
  return ml_collections.ConfigDict(dict(
      learning_rate=1.0, warmup_steps=1, num_steps=10,
      weight_decay=weight_decay, grad_clip_norm=1.0))


def two_updates_with_zero_gradients(params, weight_decay=0.1):
  """Parameters after two updates whose only effect is the weight decay (the
  first update has learning rate 0, the second 1)."""
  optimizer = train_step.make_optimizer(train_section(weight_decay))
  opt_state = optimizer.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  for _ in range(2):
    updates, opt_state = optimizer.update(zeros, opt_state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params


def test_decay_spares_norm_scales_and_biases():
  params = {"norm": {"scale": jnp.ones(2)},
            "dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  out = two_updates_with_zero_gradients(params)
  np.testing.assert_allclose(out["norm"]["scale"], [1.0, 1.0])
  np.testing.assert_allclose(out["dense"]["bias"], [1.0, 1.0])
  np.testing.assert_allclose(out["dense"]["kernel"], np.full((2, 2), 0.9),
                             rtol=1e-6)


@pytest.mark.parametrize("name, decayed", [
    ("kernel", True), ("embedding", True), ("pos_embedding", True),
    ("bias", False), ("scale", False)])
@pytest.mark.parametrize("shape", [(), (7,), (7, 3), (2, 3, 4)])
def test_decay_rule_by_name_at_every_rank(name, decayed, shape):
  out = two_updates_with_zero_gradients({"m": {name: jnp.full(shape, 2.0)}})
  np.testing.assert_allclose(out["m"][name],
                             np.full(shape, 1.8 if decayed else 2.0),
                             rtol=1e-6)


def test_zero_weight_decay_changes_nothing():
  params = {"kernel": jnp.ones((3, 3)), "bias": jnp.ones(3)}
  out = two_updates_with_zero_gradients(params, weight_decay=0.0)
  chex.assert_trees_all_equal(out, params)


@pytest.mark.parametrize("tie_embeddings, norm, use_bias", [
    (True, "rmsnorm", False), (False, "layernorm", True)])
def test_model_parameters_decay_exactly_when_they_are_weights(
    tie_embeddings, norm, use_bias):
  """Every leaf of a real backbone: kernels and embedding tables decay; norm
  scales and biases keep their value, the [H, Dh] query/key/value biases of
  a biased GQA model included."""
  cfg = TransformerConfig(vocab_size=64, d_model=16, num_layers=2, num_heads=2,
                          num_kv_heads=1, head_dim=8, mlp_dim=32, max_len=8,
                          tie_embeddings=tie_embeddings, norm=norm,
                          positional="learned", use_bias=use_bias)
  params = init_params(cfg, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 1.0, params)  # no zero-valued leaves
  out = two_updates_with_zero_gradients(params)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  kinds = set()
  for (path, before), after in zip(flat, jax.tree.leaves(out)):
    name = jax.tree_util.keystr(path)
    weight = path[-1].key not in ("bias", "scale")
    np.testing.assert_allclose(after, before * 0.9 if weight else before,
                               rtol=1e-5, err_msg=name)
    kinds.add((weight, before.ndim >= 2))
  expected = {(True, True), (False, False)}
  if use_bias:
    expected.add((False, True))  # the attention projections' [H, Dh] biases
  assert kinds == expected


def test_decay_rule_reads_the_name_through_partitioning_boxes():
  """Abstract train states are built from trees of flax partitioning boxes,
  whose key paths end in the box's `.value`; the rule still sees the leaf's
  name."""
  boxed = {"dense": {name: nn.LogicallyPartitioned(jnp.ones((2, 3)),
                                                   ("embed", "mlp"))
                     for name in ("kernel", "bias", "scale")}}
  flat, _ = jax.tree_util.tree_flatten_with_path(boxed)
  rule = {path[1].key: train_step.decays(path) for path, _ in flat}
  assert rule == {"kernel": True, "bias": False, "scale": False}
