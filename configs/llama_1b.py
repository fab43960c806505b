"""A ~1.1B LLaMA-style model (TinyLlama-1.1B shape): RMSNorm, RoPE, SwiGLU,
GQA (32 query heads, 4 KV heads), untied embeddings; never trained in tests.

Usage (the optional `:preset` picks a mesh from MESH_PRESETS):
  python experiments/train.py --config=configs/llama_1b.py:v4_32 \
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

# (data, fsdp, tensor): one 8-GPU host, a TPU v5e-8 (8 chips, 16 GiB each),
# a TPU v4-32 slice (16 chips). FSDP over 8 shards the 2048-wide embedding
# dimension; tensor 2 splits query heads (32), KV heads (4), MLP (5632) and
# vocabulary (32000) within a chip pair, halving activation memory on v5e.
MESH_PRESETS = {"gpu8": (1, 8, 1), "v5e8": (1, 4, 2), "v4_32": (1, 8, 2)}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
  config = tiny.get_config()
  config.data.vocab_size = 32000  # a LLaMA-2-size sentencepiece vocabulary
  config.data.seq_len = 2048
  config.model.update(dict(
      d_model=2048, num_layers=22, num_heads=32, num_kv_heads=4, head_dim=64,
      mlp_dim=5632, max_len=2048, norm="rmsnorm", positional="rope",
      mlp_activation="swiglu", tie_embeddings=False, dtype="bfloat16"))
  config.train.update(dict(
      batch_size=256, num_steps=100_000, learning_rate=4e-4,
      warmup_steps=2000, weight_decay=0.1, eval_every=2000, eval_batches=50,
      checkpoint_every=2000, keep_checkpoints=3))
  config.evaluator.model = ml_collections.ConfigDict(dict(
      d_model=2048, num_layers=22, num_heads=32, num_kv_heads=4, head_dim=64,
      mlp_dim=5632))
  config.evaluator.train = ml_collections.ConfigDict(dict(num_steps=100_000))
  sharding.select_preset(config.mesh, MESH_PRESETS, preset)
  return config
