"""GPT-2-small shape (~125M parameters) for GPU/TPU runs; never trained in tests.

Usage:
  python experiments/train.py --config=configs/gpt2_small.py --workdir=gs://... \
      --config.data.path=/path/to/corpus
"""

import importlib.util
import pathlib

import ml_collections

_spec = importlib.util.spec_from_file_location(
    "tiny", pathlib.Path(__file__).with_name("tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


def get_config() -> ml_collections.ConfigDict:
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
  return config
