"""Sharded == unsharded, on 8 fake CPU devices (in a subprocess: the device
count is fixed when JAX starts)."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from lm_decoding.models import TransformerConfig
from lm_decoding.parallel import sharding


def test_sharded_forward_equals_unsharded_on_8_devices():
  script = pathlib.Path(__file__).with_name("_sharded_forward.py")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  proc = subprocess.run([sys.executable, str(script)], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "SHARDED_OK" in proc.stdout


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
