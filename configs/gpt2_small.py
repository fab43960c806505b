"""GPT-2-small shape (~124M parameters) for GPU/TPU runs; never trained in tests.

Usage (the optional `:preset` picks a mesh from MESH_PRESETS):
  python experiments/train.py --config=configs/gpt2_small.py:v5e8 \
      --workdir=gs://... --config.data.path=/path/to/corpus
"""

import importlib.util
import pathlib

import ml_collections

from lm_decoding.parallel import sharding

_spec = importlib.util.spec_from_file_location(
    "tiny", pathlib.Path(__file__).with_name("tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

# (data, fsdp, tensor) per target: one 8-GPU host, a TPU v5e-8 (8 chips) and
# a TPU v4-32 slice (16 chips: JAX sees one device per v4 chip). 124M
# parameters fit every device, so mostly data parallel; FSDP over a host's 4
# chips halves the optimizer memory on v5e (16 GiB HBM per chip).
MESH_PRESETS = {"gpu8": (8, 1, 1), "v5e8": (2, 4, 1), "v4_32": (4, 4, 1)}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
  config = tiny.get_config()
  config.data.vocab_size = 50304  # GPT-2 vocabulary, padded to a multiple of 64
  config.data.seq_len = 1024
  config.model.update(dict(
      d_model=768, num_layers=12, num_heads=12, num_kv_heads=12, head_dim=64,
      mlp_dim=3072, max_len=1024, mlp_activation="gelu", norm="layernorm",
      positional="learned",
      dtype="bfloat16"))
  config.train.update(dict(
      batch_size=256, num_steps=100_000, learning_rate=6e-4, warmup_steps=2000,
      weight_decay=0.1, eval_every=2000, eval_batches=50,
      checkpoint_every=2000, keep_checkpoints=3))
  # Evaluator: GPT-2-medium shape (~350M), other seed.
  config.evaluator.model = ml_collections.ConfigDict(dict(
      d_model=1024, num_layers=24, num_heads=16, num_kv_heads=16, head_dim=64,
      mlp_dim=4096))
  config.evaluator.train = ml_collections.ConfigDict(dict(num_steps=100_000))
  sharding.select_preset(config.mesh, MESH_PRESETS, preset)
  return config
