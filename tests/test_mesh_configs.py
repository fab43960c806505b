"""Large configs and their mesh presets, shape-checked abstractly.

GPT-2 small/medium and the ~1B LLaMA-style config are never materialised:
parameters come from `jax.eval_shape` (`abstract_params`) and shardings are
laid out on a `jax.sharding.AbstractMesh` of each preset's shape (no devices
needed). Also the mesh and rules read from a config on this process's
devices, and the rules' handling of KV heads the tensor axis cannot split.
"""

import importlib.util
import math
import pathlib

import jax
import ml_collections
import pytest
from jax.sharding import AbstractMesh

from lm_decoding.models import TransformerConfig, abstract_params, count_params
from lm_decoding.parallel import sharding
from lm_decoding.training import train
from lm_decoding.training import train_step

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


def load(name: str):
  spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# Published sizes; the tolerance covers what the model here leaves out or
# pads: no attention/MLP biases (GPT-2 small has ~0.1M, medium ~0.3M), the
# vocabulary padded from 50257 to 50304 (+36K small, +48K medium).
# GPT-2 small 124M, medium 355M (Radford et al. 2019, as counted by HF);
# TinyLlama 1.1B (Zhang et al. 2024).
EXPECTED = {"gpt2_small": 124.4e6, "gpt2_medium": 354.8e6,
            "llama_1b": 1.100e9}
TOLERANCE = 0.01

CASES = [(name, preset) for name in EXPECTED
         for preset in ("gpu8", "v5e8", "v4_32")]
DEVICES = {"gpu8": 8, "v5e8": 8, "v4_32": 16}


@pytest.mark.parametrize("name, preset", CASES)
def test_preset_shards_every_parameter_evenly(name, preset):
  config = load(name).get_config(preset)
  assert config.mesh.preset == preset
  model_cfg = train.model_config(config)
  mesh = AbstractMesh(tuple(config.mesh.shape), sharding.MESH_AXES)
  assert mesh.size == DEVICES[preset]
  rules = sharding.rules_for_model(model_cfg, mesh,
                                   sharding.rules_from_config(config.mesh))
  shardings = sharding.param_shardings(model_cfg, mesh, rules)
  shapes = jax.tree.leaves(train_step.unbox(abstract_params(model_cfg)))
  sharded_dims = 0
  for shape, named in zip(shapes, jax.tree.leaves(shardings)):
    for size, axes in zip(shape.shape, named.spec):
      names = () if axes is None else (
          (axes,) if isinstance(axes, str) else axes)
      split = math.prod(mesh.shape[a] for a in names)
      assert size % split == 0, (name, preset, shape.shape, named.spec)
      sharded_dims += split > 1
  # Only a pure data-parallel mesh leaves every parameter whole.
  assert (sharded_dims > 0) == (mesh.shape["fsdp"] * mesh.shape["tensor"] > 1)
  # The training batch splits evenly over the batch axes.
  batch_split = mesh.shape["data"] * mesh.shape["fsdp"]
  assert config.train.batch_size % batch_split == 0


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_count(name):
  model_cfg = train.model_config(load(name).get_config())
  count = count_params(abstract_params(model_cfg))
  assert abs(count / EXPECTED[name] - 1) < TOLERANCE, f"{count:,}"


def test_llama_config_is_llama_style():
  cfg = train.model_config(load("llama_1b").get_config())
  assert (cfg.norm, cfg.positional, cfg.mlp_activation) == (
      "rmsnorm", "rope", "swiglu")
  assert cfg.num_kv_heads < cfg.num_heads and not cfg.tie_embeddings


def test_unknown_preset_is_an_error():
  with pytest.raises(ValueError, match="mesh preset 'v5e-8' unknown; presets"):
    load("llama_1b").get_config("v5e-8")


def test_default_mesh_is_one_device_and_rules_are_the_defaults():
  config = load("tiny").get_config()
  mesh = sharding.mesh_from_config(config.mesh)
  assert mesh.devices.size == 1
  assert sharding.rules_from_config(config.mesh) == sharding.DEFAULT_RULES


def mesh_section(**fields):
  section = ml_collections.ConfigDict(dict(
      shape=(1, 1, 1), num_slices=1, dcn_shape=(1, 1, 1)))
  section.update(fields)
  return section


def test_derived_axis_takes_the_remaining_devices():
  devices = jax.devices()[:1]
  for shape in ((-1, 1, 1), (1, 0, 1), (1, 1, -1)):
    mesh = sharding.mesh_from_config(mesh_section(shape=shape), devices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("fields, message", [
    (dict(shape=(-1, -1, 1)), "at most one of them -1 or 0"),
    (dict(shape=(1, 1)), "must be three sizes"),
    (dict(shape=(2, 1, 1)), "needs 2 devices; there are 1"),
    (dict(shape=(-1, 2, 1)), "the fixed axes .2 devices. must divide"),
    (dict(num_slices=0), "mesh.num_slices=0 must be >= 1"),
    (dict(num_slices=2, dcn_shape=(1, 1, 1)),
     "product is mesh.num_slices=2"),
])
def test_bad_mesh_config_is_an_error(fields, message):
  with pytest.raises(ValueError, match=message):
    sharding.mesh_from_config(mesh_section(**fields), jax.devices()[:1])


@pytest.mark.parametrize("tensor, kv_heads, want", [
    (4, 2, None), (4, 1, None), (2, 2, "tensor"), (4, 4, "tensor"),
    (4, 8, "tensor"), (3, 6, "tensor"), (4, 6, None)])
def test_kv_heads_replicated_when_tensor_does_not_divide_them(
    tensor, kv_heads, want):
  cfg = TransformerConfig(vocab_size=96, d_model=32, num_heads=24,
                          num_kv_heads=kv_heads, head_dim=4, mlp_dim=48)
  mesh = AbstractMesh((1, 1, tensor), sharding.MESH_AXES)
  rules = dict(sharding.rules_for_model(cfg, mesh))
  assert rules["kv_heads"] == rules["cache_kv_heads"] == want
  assert rules["heads"] == "tensor"
  sharding.param_shardings(cfg, mesh, tuple(rules.items()))


def test_query_heads_the_tensor_axis_cannot_split_are_an_error():
  cfg = TransformerConfig(vocab_size=64, d_model=32, num_heads=6,
                          num_kv_heads=2, head_dim=4, mlp_dim=64)
  mesh = AbstractMesh((1, 1, 4), sharding.MESH_AXES)
  with pytest.raises(ValueError, match=(
      r"parameter \[.*'attention'.*\] of shape .*: dimension \d \(6\) does "
      r"not divide over mesh axes \{'tensor': 4\}")):
    sharding.param_shardings(cfg, mesh, sharding.rules_for_model(cfg, mesh))


def test_batch_the_mesh_cannot_split_is_an_error():
  mesh = AbstractMesh((8, 1, 1), sharding.MESH_AXES)
  with pytest.raises(ValueError, match=r"batch.*dimension 0 \(1\) does not "
                     r"divide over mesh axes \{'data': 8, 'fsdp': 1\}"):
    sharding.batch_sharding(mesh, (1, 16))
