"""Logical-axis rules and meshes on this process's devices. Sharded ==
unsharded on 8 fake CPU devices: tests/test_sharded_execution.py."""

import jax
import pytest

from lm_decoding.models import TransformerConfig
from lm_decoding.parallel import sharding


def test_every_parameter_has_a_logical_sharding():
  cfg = TransformerConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4,
                          num_kv_heads=2, head_dim=8, mlp_dim=64, max_len=16,
                          tie_embeddings=False, positional="learned",
                          norm="layernorm")
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  shardings = sharding.param_shardings(cfg, mesh)
  leaves = jax.tree.leaves(shardings)
  assert leaves and all(isinstance(s, jax.sharding.NamedSharding)
                        for s in leaves)
  specs = {tuple(s.spec) for s in leaves}
  assert ("fsdp", "tensor") in specs  # e.g. wi: ('embed', 'mlp')


def test_mesh_size_must_match_devices():
  with pytest.raises(ValueError, match="number of devices"):
    sharding.make_mesh(data=3, devices=jax.devices()[:1])


# R4 (reliability_cases.md): a logical axis name without a rule was silently
# replicated.
@pytest.mark.parametrize("axes, unknown", [
    (("batch", "embedd"), "embedd"),
    (("Batch", None), "Batch"),
    (("cache_len",), "cache_len"),
    (("kv_head", "kv"), "kv_head"),
    (("", "embed"), ""),
])
def test_unknown_logical_axis_is_an_error(axes, unknown):
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  with pytest.raises(ValueError, match=f"unknown logical axis '{unknown}'") as e:
    sharding.logical_sharding(mesh, axes)
  assert "known logical axes" in str(e.value) and "'embed'" in str(e.value)


@pytest.mark.parametrize("name, like", [
    ("cache_batch", "batch"), ("cache_length", None),
    ("cache_kv_heads", "heads"), ("cache_head_dim", None),
    ("kv_heads", "heads"),
])
def test_cache_and_kv_head_axes_shard_like_their_counterparts(name, like):
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  got = sharding.logical_sharding(mesh, (name,)).spec
  want = sharding.logical_sharding(mesh, (like,)).spec
  assert got == want


def test_every_rule_name_and_cache_axis_is_known():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  names = tuple(name for name, _ in sharding.DEFAULT_RULES)
  for name in names + sharding.KV_CACHE_AXES:
    sharding.logical_sharding(mesh, (name, None))


def test_parameter_axis_missing_from_the_rules_is_an_error():
  cfg = TransformerConfig(vocab_size=64, d_model=32, num_layers=1, num_heads=4,
                          num_kv_heads=2, head_dim=8, mlp_dim=64, max_len=16)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  rules = tuple(r for r in sharding.DEFAULT_RULES if r[0] != "mlp")
  with pytest.raises(ValueError, match="unknown logical axis 'mlp' in "
                     "parameter .*known logical axes"):
    sharding.param_shardings(cfg, mesh, rules)
