"""Registered decoders, run on a mesh.

One entry point for decoding, `decode(decoder, models, prompts,
prompt_lengths, key, mesh, rules)` (or `place` + `jit_decode` to compile
once and time many calls): parameters are placed by their logical axes
(`sharding.shard_params`), prompts and prompt lengths by 'batch', the key
replicated, and the decoder runs under `jax.jit` with explicit
`in_shardings` and `out_shardings`. Decoders are not changed: each model's
logits_fn is wrapped in a `ShardedLogitsFn`, whose `init_cache` and every
call constrain the KV cache to `KVCache.LOGICAL_AXES` with
`jax.lax.with_sharding_constraint` (as MaxText constrains its cache inside
the step), so a cache is created sharded and stays so through prefill, the
AR loop, denoising steps, beam reorders and speculative rollbacks. The
caches are created inside the compiled decode and threaded through its loop
carry, which XLA updates in place; no cache crosses the jit boundary, so
there is no cache argument to donate.

The meshes and logical-axis rules come from `lm_decoding.parallel.sharding`,
a layer below the decoders; the train step uses the same rules
(`lm_decoding.training.train_step.make_train_step(..., mesh=mesh)`).

GSPMD adds the collectives; results equal one device's up to the order of
floating-point reductions (exactly, token for token, for greedy and
fixed-key decoding in tests/test_sharded_execution.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from lm_decoding.decoding import base
from lm_decoding.models import KVCache, Model, TransformerConfig
from lm_decoding.models.transformer import ConfigDims
from lm_decoding.models.output import ModelOutput
from lm_decoding.parallel import sharding


@dataclasses.dataclass(frozen=True)
class ShardedLogitsFn(ConfigDims):
  """A Transformer logits_fn whose KV caches are sharded on `mesh`.

  Hashable (the mesh and rules are), so decoders can keep taking it as a
  static jit argument.

  Attributes:
    logits_fn: the wrapped `ModelLogitsFn` (it has `.config`).
    mesh: the device mesh.
    rules: logical-axis rules fitted to the model (`rules_for_model`).
  """

  logits_fn: Any
  mesh: Mesh
  rules: tuple

  @property
  def config(self) -> TransformerConfig:
    """The wrapped model's config (its max_len and vocab_size are the
    wrapper's, `ConfigDims`)."""
    return self.logits_fn.config

  def constrain_cache(self, cache: KVCache) -> KVCache:
    """`cache` constrained to its logical axes (`sharding.place_cache`)."""
    return sharding.place_cache(cache, self.mesh,
                                jax.lax.with_sharding_constraint, self.rules)

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None) -> ModelOutput:
    out = self.logits_fn(params, tokens, positions, cache=cache,
                         attention_mask=attention_mask)
    if out.cache is None:
      return out
    return out._replace(cache=self.constrain_cache(out.cache))

  def init_cache(self, batch_size: int, length: int) -> KVCache:
    return self.constrain_cache(self.logits_fn.init_cache(batch_size, length))

  def length_logits(self, params, hidden_BxLxD, source_BxL) -> jax.Array:
    return self.logits_fn.length_logits(params, hidden_BxLxD, source_BxL)


def _unwrapped(model: Model):
  """The model's Transformer logits_fn (unwrapped if already sharded)."""
  logits_fn = model.logits_fn
  if isinstance(logits_fn, ShardedLogitsFn):
    return logits_fn.logits_fn
  return logits_fn


def _config(model: Model) -> TransformerConfig:
  logits_fn = _unwrapped(model)
  config = getattr(logits_fn, "config", None)
  if not isinstance(config, TransformerConfig):
    raise ValueError(
        f"sharded decoding needs Transformer models (make_logits_fn); got a "
        f"logits_fn of type {type(logits_fn).__name__}")
  return config


def model_shardings(models: Mapping[str, Model], mesh: Mesh,
                    rules=sharding.DEFAULT_RULES) -> dict[str, Model]:
  """{role: Model(sharded logits_fn, parameter NamedShardings)}.

  Each model gets `rules_for_model` of its own config (a draft may have
  fewer KV heads than its target).

  Raises:
    ValueError: a model that is not a Transformer, or a parameter dimension
      the mesh cannot split (see `sharding.param_shardings`).
  """
  out = {}
  for role, model in models.items():
    config = _config(model)
    fitted = sharding.rules_for_model(config, mesh, rules)
    out[role] = Model(ShardedLogitsFn(_unwrapped(model), mesh, fitted),
                      sharding.param_shardings(config, mesh, fitted),
                      model.ids)
  return out


def place_models(models: Mapping[str, Model], mesh: Mesh,
                 rules=sharding.DEFAULT_RULES) -> dict[str, Model]:
  """Models with `ShardedLogitsFn`s and parameters placed on `mesh`.

  Raises:
    ValueError: as `model_shardings`.
  """
  shardings = model_shardings(models, mesh, rules)
  return {role: Model(s.logits_fn,
                      jax.device_put(models[role].params, s.params), s.ids)
          for role, s in shardings.items()}


def place(models: Mapping[str, Model], prompts, prompt_lengths,
          mesh: Mesh, rules=sharding.DEFAULT_RULES):
  """(models, prompts, prompt_lengths) placed on `mesh`.

  Returns:
    `place_models(models)`; prompts int32[B, P] and prompt lengths int32[B]
    sharded by 'batch'.
  Raises:
    ValueError: B does not divide over the batch mesh axes, or as
      `model_shardings`.
  """
  return (place_models(models, mesh, rules),
          sharding.shard_batch(jnp.asarray(prompts, jnp.int32), mesh, rules),
          sharding.shard_batch(jnp.asarray(prompt_lengths, jnp.int32), mesh,
                               rules))


def jit_decode(decoder: base.Decoder, args: tuple, mesh: Mesh,
               rules=sharding.DEFAULT_RULES):
  """`decoder.decode` jitted with explicit input and output shardings
  (`base.jit_decode` with the shardings of the mesh).

  Args:
    decoder: a registered decoder config.
    args: (models, prompts int32[B, P], prompt_lengths int32[B], key) it
      will be called with, as `place` returns them; only their shapes and
      the models' configs are read here (the output tree, e.g. a decoder's
      stats, comes from an abstract call).
    mesh, rules: the mesh and the logical-axis rules.
  Returns:
    jitted (models, prompts, prompt_lengths, key) -> DecodeResult, with
    tokens and lengths sharded by 'batch' and the rest (counts, committed,
    stats) replicated.
  """
  models, prompts, prompt_lengths, _ = args
  replicated = sharding.replicated(mesh)
  abstract = jax.eval_shape(base.jit_decode(decoder), *args)
  out_shardings = jax.tree.map(lambda _: replicated, abstract).replace(
      tokens=sharding.batch_sharding(mesh, abstract.tokens.shape, rules),
      lengths=sharding.batch_sharding(mesh, abstract.lengths.shape, rules))
  in_shardings = (model_shardings(models, mesh, rules),
                  sharding.batch_sharding(mesh, prompts.shape, rules),
                  sharding.batch_sharding(mesh, prompt_lengths.shape, rules),
                  replicated)
  return base.jit_decode(decoder, in_shardings, out_shardings)


def decode(decoder: base.Decoder, models: Mapping[str, Model], prompts,
           prompt_lengths, key: jax.Array, mesh: Mesh,
           rules=sharding.DEFAULT_RULES) -> base.DecodeResult:
  """Runs a registered decoder on `mesh`: places, compiles and decodes.

  Args:
    decoder: a registered decoder config (`decoding.make_decoder`).
    models: {role: Model} with Transformer logits_fns (`base.bind`).
    prompts: int32[B, P] right-padded prompts; B must divide over the mesh
      axes 'batch' maps to.
    prompt_lengths: int32[B].
    key: a PRNG key (replicated on every device).
    mesh: from `sharding.make_mesh` or `sharding.mesh_from_config`.
    rules: logical-axis rules (default `sharding.DEFAULT_RULES`).
  Returns:
    The decoder's `DecodeResult`.
  Raises:
    ValueError: as `place`, and the decoder's own checks.
  """
  base.check_models(decoder, models)
  placed, prompts, prompt_lengths = place(models, prompts, prompt_lengths,
                                          mesh, rules)
  args = (placed, prompts, prompt_lengths, key)
  return jit_decode(decoder, args, mesh, rules)(*args)
