"""The main job on one GPU (experiments/gpu_record.py): a larger model, bf16.

The full grid's config (configs/full.py: configs/tiny.py with every
decoder) with a 36M-parameter backbone (d512, 8 layers, 8 heads, MLP
2048: 143 MB of float32 parameters, above a CPU's 32 MiB L3 cache and an
H200's 60 MB L2, so a cached AR step reads them from HBM), bfloat16
compute, a training budget that `--retrain` affords on an H200 in a few
minutes for the five members the grid binds (ar, mdlm, bd3lm, draft_small,
evaluator), and the rows of the decoder grid that bear on the
cost question, at B = 1, 8, 32 and T = 128, 256.

Usage:
  python experiments/compare_decoding.py --config=configs/gpu_record.py \
      --workdir=/tmp/gpu_compare --retrain --profile=h200
  # smoke: tiny models, T 8, B 1, 2 training steps, AR and MDLM rows only;
  # checks the pipeline on a CPU
  python experiments/compare_decoding.py --config=configs/gpu_record.py:smoke \
      --workdir=/tmp/gpu_smoke --retrain
"""

import importlib.util
import pathlib

import ml_collections

_spec = importlib.util.spec_from_file_location(
    "full", pathlib.Path(__file__).with_name("full.py"))
full = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(full)

# The rows of the full grid (configs/full.py) kept here, each picked by a piece of its entry
# text: AR cached; MDLM K = 8, 32, T; LLaDA with blocks of 32 at K = 32;
# threshold decoding with the dual KV cache; BD3-LM; speculative decoding
# with the small draft.
COST_ROWS = ("| ar |", "| mdlm |",
             "| llada | model=mdlm | steps=32 block_length=32",
             "kv_cache=dual", "| bd3lm |", "| speculative |")


def cost_rows(decoders: tuple[str, ...],
              rows: tuple[str, ...] = COST_ROWS) -> tuple[str, ...]:
  """The entries of `decoders` holding one of `rows`, in order."""
  return tuple(d for d in decoders if any(row in d for row in rows))


def get_config(preset: str = "") -> ml_collections.ConfigDict:
  """The GPU record's config; preset 'smoke' shrinks it to CPU size.

  Raises:
    ValueError: an unknown preset.
  """
  if preset not in ("", "smoke"):
    raise ValueError(f"preset={preset!r}; allowed: '' or 'smoke'")
  config = full.get_config()
  config.model.update(dict(
      d_model=512, num_layers=8, num_heads=8, num_kv_heads=8, head_dim=64,
      mlp_dim=2048, dtype="bfloat16"))
  config.train.update(dict(
      batch_size=32, num_steps=600, learning_rate=1e-3, warmup_steps=100,
      eval_every=300, checkpoint_every=600, keep_checkpoints=1))
  # Larger than the decoded models (79M parameters), other seed.
  config.evaluator.model = ml_collections.ConfigDict(dict(
      d_model=768, num_layers=8, num_heads=12, num_kv_heads=12, head_dim=64,
      mlp_dim=3072))
  config.evaluator.train = ml_collections.ConfigDict(dict(num_steps=600))
  config.drafts.draft_small = ml_collections.ConfigDict(dict(
      d_model=128, num_layers=2, num_heads=2, num_kv_heads=2, mlp_dim=512))
  config.compare.output_lengths = (128, 256)
  config.compare.batch_sizes = (1, 8, 32)
  config.compare.timed_runs = 3
  config.compare.decoders = cost_rows(config.compare.decoders)
  if preset == "smoke":
    small = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                 head_dim=16, mlp_dim=64)
    config.data.seq_len = 32
    config.model.update(dict(small, max_len=32))
    config.train.update(dict(
        batch_size=4, num_steps=2, warmup_steps=1, eval_every=2,
        eval_batches=1, mdlm_eval_timesteps=2, checkpoint_every=2))
    config.evaluator.model = ml_collections.ConfigDict(small)
    config.evaluator.train = ml_collections.ConfigDict(dict(num_steps=2))
    config.drafts.draft_small = ml_collections.ConfigDict(dict(
        d_model=16, num_heads=1, num_kv_heads=1, mlp_dim=32))
    config.compare.update(dict(output_lengths=(8,), batch_sizes=(1,),
                               prompt_len=4, reference_len=8, timed_runs=1))
    # AR cached and MDLM only: three members to train, two rows to compile.
    config.compare.decoders = tuple(
        d for d in cost_rows(config.compare.decoders, COST_ROWS[:2])
        if "temperature=0" not in d)
    config.compare.greedy_baseline = ""
  return config
