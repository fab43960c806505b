"""One process of tests/test_multihost.py (or its one-process reference).

  python tests/_multihost_worker.py OUT PROCESS_ID NUM_PROCESSES ADDRESS CKPT

NUM_PROCESSES 0 is the reference: one process, one device, no mesh (the
plain train step and decoder). Otherwise the process joins a
NUM_PROCESSES-process JAX job at ADDRESS (`multihost.initialize`, gloo CPU
collectives) and, on a data-parallel mesh over every process's devices:
trains NUM_STEPS AdamW steps of a tiny causal Transformer on batches each
process reads its own rows of (`multihost.global_batches`), saves the state
with orbax into the shared folder CKPT and restores it onto the mesh, and
decodes the prompts greedily (`sharded.decode`, AR). Process 0 writes the
losses, the final parameters, the restored parameters and the tokens to
OUT (.npz); the test compares them with the reference's.
"""

from __future__ import annotations

import sys

NUM_STEPS = 3
BATCH, SEQ_LEN = 4, 16


def main(out: str, process_id: int, num_processes: int, address: str,
         checkpoint_dir: str) -> None:
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  import ml_collections
  import numpy as np
  from jax.experimental import multihost_utils

  from lm_decoding.data import pipeline
  from lm_decoding.decoding import make_decoder, sharded
  from lm_decoding.models import Model, TransformerConfig, make_logits_fn
  from lm_decoding.parallel import multihost, sharding
  from lm_decoding.training import train_step
  from lm_decoding.training.checkpoints import Checkpoints

  reference = num_processes == 0
  if not reference:
    multihost.initialize(address, num_processes, process_id)
    assert jax.process_count() == num_processes, jax.process_count()

  cfg = TransformerConfig(vocab_size=64, d_model=32, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=8,
                          mlp_dim=64, max_len=32)
  optimizer = train_step.make_optimizer(ml_collections.ConfigDict(dict(
      learning_rate=1e-2, warmup_steps=0, num_steps=10, weight_decay=0.1,
      grad_clip_norm=1.0)))
  packed = np.random.default_rng(0).integers(5, 64, (24, SEQ_LEN),
                                             dtype=np.int32)
  seed, key = 7, jax.random.key(1)
  state = train_step.init_state(cfg, optimizer, jax.random.key(0))
  if reference:
    mesh = None
    step = train_step.make_train_step(cfg, "ar", optimizer)
    batches = pipeline.batches(packed, BATCH, seed)
  else:
    mesh = sharding.make_mesh(data=jax.device_count())
    shardings = train_step.state_shardings(cfg, optimizer, mesh)
    state = jax.device_put(state, shardings)
    step = train_step.make_train_step(cfg, "ar", optimizer, mesh=mesh,
                                 batch_shape=(BATCH, SEQ_LEN))
    batch_sharding = sharding.batch_sharding(mesh, (BATCH, SEQ_LEN))
    shard = multihost.process_shard(batch_sharding, (BATCH, SEQ_LEN))
    assert (shard.shard_index, shard.shard_count) == (
        process_id, num_processes), shard  # each reads its own rows only
    batches = multihost.global_batches(packed, BATCH, seed, batch_sharding)
  losses = []
  for k in range(NUM_STEPS):
    state, metrics = step(state, next(batches), jax.random.fold_in(key, k))
    losses.append(float(metrics["loss"]))

  restored = state.params
  if not reference:  # orbax: every process writes and reads its shards
    with Checkpoints(checkpoint_dir) as checkpoints:
      checkpoints.save(NUM_STEPS, state, {"step": NUM_STEPS})
      target = jax.device_put(
          train_step.init_state(cfg, optimizer, jax.random.key(9)), shardings)
      restored = checkpoints.restore(target)[0].params

  prompts = packed[:BATCH, :4]
  prompt_lengths = np.asarray([4, 2, 3, 1], np.int32)
  decoder = make_decoder("ar", output_length=6)
  models = {"model": Model(make_logits_fn(cfg), state.params)}
  if reference:
    tokens = jax.jit(decoder.decode)(models, prompts, prompt_lengths,
                                     key).tokens
  else:
    tokens = sharded.decode(decoder, models, prompts, prompt_lengths, key,
                            mesh).tokens
  gather = lambda tree: jax.tree.map(
      np.asarray, tree if reference else
      multihost_utils.process_allgather(tree, tiled=True))
  params, restored, tokens = gather((state.params, restored, tokens))
  if process_id == 0:
    flat = {"param/" + jax.tree_util.keystr(p): v for p, v in
            jax.tree_util.tree_flatten_with_path(params)[0]}
    flat.update({"restored/" + jax.tree_util.keystr(p): v for p, v in
                 jax.tree_util.tree_flatten_with_path(restored)[0]})
    np.savez(out, losses=np.asarray(losses), tokens=tokens, **flat)
  print(f"process {process_id}: devices {jax.device_count()} "
        f"(local {jax.local_device_count()}), losses {losses}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
       sys.argv[5])
