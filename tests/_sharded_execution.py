"""Sharded == single device, on 8 fake CPU devices (run by
tests/test_sharded_execution.py in a subprocess: the device count is fixed
when JAX starts).

Prints one line per check, `CHECK <name> OK <seconds>` or
`CHECK <name> FAIL <message>`, and never stops at a failed check; the pytest
side reports each check. `CHECKS` (importable without JAX devices) lists
the names in order.

Checks, for a tiny GQA Transformer (d 32, 2 layers, 8 query heads, 2 KV
heads, vocab 64, max_len 32):
- params/<mesh>: the `.sharding` of every placed parameter is the spec the
  rules give, written out by hand here (KV kernels replicated over tensor=4
  and 8, which do not divide the 2 KV heads);
- cache/<mesh>: the cache a sharded prefill returns is sharded by
  KVCache.LOGICAL_AXES (batch over data x fsdp, KV heads over tensor when
  it divides them), and its keys/values, the prefill's logits and a full
  uncached pass's logits equal one device's (tolerance below);
- train/<mesh>: sharded gradients, and one sharded train step (loss,
  gradient norm, AdamW moments, updated parameters), equal the single-device
  ones (tolerances below, with why), and the new state keeps its shardings;
- checkpoint/8x1x1-2x2x2: a trained state saved with orbax
  (`training.checkpoints`) from mesh (8, 1, 1) restores onto (2, 2, 2),
  given the new mesh's shardings as the restore target, and back; the values
  are bitwise the saved ones and every array has the target's sharding;
- decode/<name>/<mesh>: a registered decoder's tokens (greedy, or with a
  fixed key) equal the single-device ones token for token: every decoder on
  the GQA mesh (1, 2, 4), AR and beam search on all four meshes.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

MESHES = ((8, 1, 1), (2, 2, 2), (1, 1, 8), (1, 2, 4))
RESHARD = ((8, 1, 1), (2, 2, 2))  # checkpoint saved on one, restored on the other
GQA_MESH = (1, 2, 4)  # tensor 4 > 2 KV heads
ALL_MESH_DECODERS = ("ar", "ar_beam")

# Tolerances against one device: sharding splits the contractions over
# embed (fsdp), heads/mlp/vocab (tensor) and batch (data), and GSPMD adds the
# partial sums with all-reduces, so float32 sums are added in another order;
# even pure data parallelism reorders them, since each device runs the
# matmuls at another shape, which XLA:CPU blocks and vectorises differently.
# A reordered sum moves by a few ulp of the magnitudes summed (float32 ulp
# ~6e-8 relative). rtol 1e-5 is ~100 ulp: far above reordering noise, far
# below a real error (a wrong shard or a missing all-reduce changes values
# by O(1) relative). Near-zero entries, whose relative error is unbounded,
# get an absolute tolerance on the scale of the terms summed: 1e-6 for
# gradients (terms ~1e-2); 1e-5 for logits, keys and values, sums of O(1)
# terms (measured: up to 1.7e-6 on keys of magnitude 1e-2).
# The AdamW moments are 0.1 g and 0.05 g^2 after one step: rtol 1e-4 (a
# square doubles g's relative error) with atol 1e-8 (measured: up to 2.5e-9
# on moments ~1e-5). Parameters after the step are compared to atol 1e-5 =
# lr / 100: Adam's first update is lr * g / (|g| + eps), which amplifies g's
# rounding where |g| ~ eps = 1e-8 (measured: one weight of 2048 moved
# 2.6e-6 on the (2, 2, 2) mesh).
RTOL, ATOL = 1e-5, 1e-6
ACTIVATION_ATOL = 1e-5
MOMENT_RTOL, MOMENT_ATOL = 1e-4, 1e-8
PARAM_ATOL = 1e-5  # lr / 100


def _mesh_name(shape) -> str:
  return "x".join(map(str, shape))


def decoder_names() -> tuple[str, ...]:
  from lm_decoding.decoding import registered
  return registered()


def checks() -> list[str]:
  """The check names, in the order `main` prints them."""
  names = []
  for shape in MESHES:
    m = _mesh_name(shape)
    names += [f"params/{m}", f"cache/{m}", f"train/{m}"]
    names += [f"decode/{d}/{m}" for d in ALL_MESH_DECODERS]
  names.append(f"checkpoint/{'-'.join(map(_mesh_name, RESHARD))}")
  names += [f"decode/{d}/{_mesh_name(GQA_MESH)}" for d in decoder_names()
            if d not in ALL_MESH_DECODERS]
  return names


def main(only: tuple[str, ...] = ("",)):
  """Runs the checks whose names start with one of `only` (default all)."""
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8")
  import dataclasses
  import functools

  import chex
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import PartitionSpec as P

  from lm_decoding.decoding import base, make_decoder, sampling, sharded
  from lm_decoding.decoding.denoising import ScheduledDecoder
  from lm_decoding.models import Model, TransformerConfig, init_params
  from lm_decoding.models import make_logits_fn
  from lm_decoding.parallel import sharding
  from lm_decoding.training import train_step
  import ml_collections

  assert jax.device_count() == 8, (
      f"need 8 fake CPU devices, got {jax.devices()}")

  cfg = TransformerConfig(vocab_size=64, d_model=32, num_layers=2,
                          num_heads=8, num_kv_heads=2, head_dim=4,
                          mlp_dim=64, max_len=32, tie_embeddings=False)
  bidirectional = cfg.replace(attention="bidirectional")
  # Jitted: one program per config instead of one per operation eagerly
  # (about 90 at startup, in both subprocesses); any parameters serve, as
  # each check compares the sharded run with one device's on the same ones.
  init = jax.jit(init_params, static_argnums=0)
  params = init(cfg, jax.random.key(0))
  bi_params = init(bidirectional, jax.random.key(1))
  causal_model = Model(make_logits_fn(cfg), params)
  bi_model = Model(make_logits_fn(bidirectional), bi_params)
  # self-speculation drafts with a block-diffusion model with a token shift
  shifted_model = Model(make_logits_fn(bidirectional.replace(
      token_shift=True)), bi_params)
  batch, prompt_width, output_length = 8, 4, 6
  prompts = jax.random.randint(jax.random.key(2), (batch, prompt_width), 5,
                               64)
  prompt_lengths = jnp.asarray([4, 3, 2, 4, 1, 4, 3, 2], jnp.int32)
  key = jax.random.key(3)

  def run(name, fn):
    if not name.startswith(only):
      return
    start = time.perf_counter()
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      message = " ".join(f"{type(e).__name__}: {e}".split())[:600]
      print(f"CHECK {name} FAIL {message}", flush=True)
      traceback.print_exc(file=sys.stderr)
      return
    print(f"CHECK {name} OK {time.perf_counter() - start:.1f}", flush=True)

  def expected_specs(shape):
    """The specs DEFAULT_RULES give, by hand: fsdp on embed, tensor on
    heads/mlp/vocab, KV heads on tensor only where it divides 2."""
    kv = "tensor" if 2 % shape[2] == 0 else None
    block = {
        "attention": {"query": {"kernel": P("fsdp", "tensor", None)},
                      "key": {"kernel": P("fsdp", kv, None)},
                      "value": {"kernel": P("fsdp", kv, None)},
                      "out": {"kernel": P("tensor", None, "fsdp")}},
        "attention_norm": {"scale": P("fsdp")},
        "mlp": {"wi": {"kernel": P("fsdp", "tensor")},
                "wi_gate": {"kernel": P("fsdp", "tensor")},
                "wo": {"kernel": P("tensor", "fsdp")}},
        "mlp_norm": {"scale": P("fsdp")}}
    return {"embedding": P("tensor", "fsdp"), "block_0": block,
            "block_1": block, "final_norm": {"scale": P("fsdp")},
            "lm_head": {"kernel": P("fsdp", "tensor")}}

  def greedy(name: str):
    cls = base.decoder_class(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    options = {"output_length": output_length}
    if issubclass(cls, ScheduledDecoder):
      options["steps"] = output_length
    if "sampling" in fields:
      options["sampling"] = sampling.SamplingConfig(temperature=0.0)
    decoder = make_decoder(name, **options)
    denoises = "mask_id" in fields
    denoiser = (shifted_model if name == "self_speculative" else bi_model)
    models = {role: denoiser if denoises and role != "target"
              else causal_model for role in decoder.roles}
    return decoder, models

  references = {}

  def reference(name):
    if name not in references:
      decoder, models = greedy(name)
      references[name] = np.asarray(jax.jit(decoder.decode)(
          models, prompts, prompt_lengths, key).tokens)
    return references[name]

  def check_decode(name, mesh):
    decoder, models = greedy(name)
    out = sharded.decode(decoder, models, prompts, prompt_lengths, key, mesh)
    want = sharding.batch_sharding(mesh, out.tokens.shape)
    assert out.tokens.sharding.is_equivalent_to(want, 2), out.tokens.sharding
    np.testing.assert_array_equal(np.asarray(out.tokens), reference(name))

  def check_params(shape, mesh):
    placed, _, _ = sharded.place({"model": causal_model}, prompts,
                                 prompt_lengths, mesh)
    got = jax.tree.map(lambda a: a.sharding.spec, placed["model"].params)
    want = expected_specs(shape)
    pad = lambda spec, n: tuple(spec) + (None,) * (n - len(spec))
    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    flat_want = dict(jax.tree_util.tree_flatten_with_path(want)[0])
    assert len(flat_got) == len(flat_want), (len(flat_got), len(flat_want))
    for path, spec in flat_got:
      n = len(flat_want[path])
      assert pad(spec, n) == pad(flat_want[path], n), (
          jax.tree_util.keystr(path), spec, flat_want[path])

  def check_cache(shape, mesh):
    models, sharded_prompts, _ = sharded.place(
        {"model": causal_model}, prompts, prompt_lengths, mesh)
    model = models["model"]
    logits_fn = model.logits_fn
    positions = jnp.broadcast_to(jnp.arange(prompt_width),
                                 sharded_prompts.shape)

    @jax.jit
    def prefill(params, tokens):
      cache = logits_fn.init_cache(batch, cfg.max_len)
      return logits_fn(params, tokens, positions, cache)

    logits, cache, _ = prefill(model.params, sharded_prompts)
    full = jax.jit(logits_fn)(model.params, sharded_prompts, positions).logits
    kv = "tensor" if 2 % shape[2] == 0 else None
    want_kv = jax.sharding.NamedSharding(
        mesh, P(("data", "fsdp"), kv, None, None))
    want_index = jax.sharding.NamedSharding(mesh, P(("data", "fsdp")))
    for array in cache.k + cache.v:
      assert array.sharding.is_equivalent_to(want_kv, 4), array.sharding
    assert cache.index.sharding.is_equivalent_to(want_index, 1), (
        cache.index.sharding)
    single = jax.jit(make_logits_fn(cfg))
    ref = single(params, prompts, positions,
                 make_logits_fn(cfg).init_cache(batch, cfg.max_len))
    for got, want in ((logits, ref.logits), (cache.k[1], ref.cache.k[1]),
                      (cache.v[0], ref.cache.v[0]),
                      (full, single(params, prompts, positions).logits)):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                                 rtol=RTOL, atol=ACTIVATION_ATOL)

  train_cfg = ml_collections.ConfigDict(dict(
      learning_rate=1e-3, warmup_steps=0, num_steps=10, weight_decay=0.1,
      grad_clip_norm=1.0))
  optimizer = train_step.make_optimizer(train_cfg)
  tokens = jax.random.randint(jax.random.key(4), (batch, 16), 5, 64)
  train_key = jax.random.key(5)
  fresh = lambda: train_step.init_state(cfg, optimizer, jax.random.key(0))

  loss = lambda p: train_step.objective_loss("ar")(make_logits_fn(cfg), p,
                                                   tokens, train_key)[0]

  @functools.cache
  def reference_step():
    """One device's (state, metrics) after one train step and its gradients
    at `params`: computed once, by the first train or checkpoint check (none
    for the decode checks)."""
    single_step = train_step.make_train_step(cfg, "ar", optimizer)
    state, metrics = single_step(fresh(), tokens, train_key)
    return state, metrics, jax.jit(jax.grad(loss))(params)

  def check_train(mesh):
    ref_state, ref_metrics, ref_grads = reference_step()
    shardings = train_step.state_shardings(cfg, optimizer, mesh)
    step = train_step.make_train_step(cfg, "ar", optimizer, mesh=mesh,
                                 batch_shape=tokens.shape)
    state = jax.device_put(fresh(), shardings)
    new_state, metrics = step(
        state, sharding.shard_batch(tokens, mesh), train_key)
    # The gradients themselves (the step's metrics hold only their norm).
    param_shardings = shardings.params
    grads = jax.jit(jax.grad(loss), in_shardings=(param_shardings,),
                    out_shardings=param_shardings)(
                        jax.device_put(params, param_shardings))
    chex.assert_trees_all_close(grads, ref_grads, rtol=RTOL, atol=ATOL)
    for name in ("loss", "grad_norm"):
      np.testing.assert_allclose(float(metrics[name]),
                                 float(ref_metrics[name]), rtol=RTOL,
                                 err_msg=name)
    chex.assert_trees_all_close(new_state.opt_state, ref_state.opt_state,
                                rtol=MOMENT_RTOL, atol=MOMENT_ATOL)
    chex.assert_trees_all_close(new_state.params, ref_state.params, rtol=0,
                                atol=PARAM_ATOL)
    assert int(new_state.step) == int(ref_state.step) == 1
    jax.tree.map(lambda a, s: _assert(
        a.sharding.is_equivalent_to(s, a.ndim), (a.sharding, s)),
                 new_state, shardings)

  def check_checkpoint_reshard():
    import tempfile
    ref_state, _, _ = reference_step()
    from lm_decoding.training.checkpoints import Checkpoints
    first, second = (train_step.state_shardings(cfg, optimizer,
                                           sharding.make_mesh(*shape))
                     for shape in RESHARD)
    state = jax.device_put(ref_state, first)
    with tempfile.TemporaryDirectory() as directory:
      with Checkpoints(directory) as checkpoints:
        for step, (saved, target) in enumerate(((first, second),
                                                (second, first)), 1):
          state = jax.device_put(state, saved)
          checkpoints.save(step, state, {"step": step})
          abstract = jax.tree.map(
              lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
              state, target)
          restored, _ = checkpoints.restore(abstract, step)
          jax.tree.map(lambda a, s: _assert(
              a.sharding.is_equivalent_to(s, a.ndim), (a.sharding, s)),
                       restored, target)
          chex.assert_trees_all_equal(restored, ref_state)
          state = restored

  for shape in MESHES:
    mesh = sharding.make_mesh(*shape)
    m = _mesh_name(shape)
    run(f"params/{m}", lambda: check_params(shape, mesh))
    run(f"cache/{m}", lambda: check_cache(shape, mesh))
    run(f"train/{m}", lambda: check_train(mesh))
    for name in ALL_MESH_DECODERS:
      run(f"decode/{name}/{m}", lambda: check_decode(name, mesh))
  run(f"checkpoint/{'-'.join(map(_mesh_name, RESHARD))}",
      check_checkpoint_reshard)
  mesh = sharding.make_mesh(*GQA_MESH)
  for name in decoder_names():
    if name not in ALL_MESH_DECODERS:
      run(f"decode/{name}/{_mesh_name(GQA_MESH)}",
          lambda: check_decode(name, mesh))
  print("DONE", flush=True)


def _assert(condition, message):
  if not condition:
    raise AssertionError(message)


if __name__ == "__main__":
  main(tuple(sys.argv[1:]) or ("",))  # e.g. `train cache`: those checks only
