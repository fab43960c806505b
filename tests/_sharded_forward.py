"""Run in a subprocess with 8 fake CPU devices by tests/test_sharding.py."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from lm_decoding.models import KVCache, TransformerConfig, init_params  # noqa: E402
from lm_decoding.models import make_logits_fn  # noqa: E402
from lm_decoding.parallel import sharding  # noqa: E402


def main():
  assert jax.device_count() == 8, jax.devices()
  # Tensor parallelism shards kv heads: the tensor axis must divide them.
  cfg = TransformerConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=8,
                          num_kv_heads=4, head_dim=8, mlp_dim=64, max_len=16)
  params = init_params(cfg, jax.random.key(0))
  logits_fn = jax.jit(make_logits_fn(cfg))
  tokens = jax.random.randint(jax.random.key(1), (8, 12), 0, 64)
  positions = jnp.broadcast_to(jnp.arange(12), (8, 12))
  ref = logits_fn(params, tokens, positions).logits
  ref_step, ref_cache, _ = logits_fn(params, tokens[:, :5], positions[:, :5],
                                  KVCache.init(cfg, 8, 16))
  for shape in ((8, 1, 1), (2, 2, 2), (1, 2, 4), (2, 4, 1)):
    mesh = sharding.make_mesh(*shape)
    p = sharding.shard_params(params, cfg, mesh)
    t = sharding.shard_batch(tokens, mesh)
    pos = sharding.shard_batch(positions, mesh)
    out = logits_fn(p, t, pos).logits
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)
    cache = sharding.shard_cache(KVCache.init(cfg, 8, 16), mesh)
    out, new_cache, _ = logits_fn(p, t[:, :5], pos[:, :5], cache)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_step), atol=1e-5)
    np.testing.assert_allclose(np.asarray(new_cache.k[1]),
                               np.asarray(ref_cache.k[1]), atol=1e-5)
  print("SHARDED_OK")


if __name__ == "__main__":
  main()
