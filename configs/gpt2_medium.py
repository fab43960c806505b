"""GPT-2-medium shape (~355M parameters) for GPU/TPU runs; never trained in tests.

Usage (the optional `:preset` picks a mesh from MESH_PRESETS):
  python experiments/train.py --config=configs/gpt2_medium.py:gpu8 \
      --workdir=gs://... --config.data.path=/path/to/corpus
"""

import importlib.util
import pathlib

import ml_collections

from lm_decoding.parallel import sharding

_spec = importlib.util.spec_from_file_location(
    "gpt2_small", pathlib.Path(__file__).with_name("gpt2_small.py"))
gpt2_small = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt2_small)

# (data, fsdp, tensor): one 8-GPU host, a TPU v5e-8 (8 chips), a TPU v4-32
# slice (16 chips). FSDP shards every weight's embedding dimension (1024) and
# the AdamW moments, 8 ways within a host; the v4 slice adds 2-way data
# parallelism on top.
MESH_PRESETS = {"gpu8": (1, 8, 1), "v5e8": (1, 8, 1), "v4_32": (2, 8, 1)}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
  config = gpt2_small.get_config()
  config.model.update(dict(
      d_model=1024, num_layers=24, num_heads=16, num_kv_heads=16, head_dim=64,
      mlp_dim=4096))
  config.train.update(dict(learning_rate=3e-4))
  sharding.select_preset(config.mesh, MESH_PRESETS, preset)
  return config
