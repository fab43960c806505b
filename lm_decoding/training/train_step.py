"""The train state, AdamW and the jitted train step and validation pass.

What `train.train` runs once per step, usable alone (benchmarks, sharded
checks, throughput): `init_state` / `abstract_state` / `state_shardings`
build a `TrainState`; `make_optimizer` is AdamW with warmup and cosine decay
after global-norm clipping; `make_train_step` is one jitted update on the
loss of an objective (`objective_loss`), sharded when given a mesh;
`make_eval_fn` and `evaluate` are the deterministic validation measure.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm_decoding.evaluation import cost
from lm_decoding.models import TransformerConfig, abstract_params
from lm_decoding.models import init_params, make_logits_fn
from lm_decoding.parallel import sharding
from lm_decoding.training import objectives
from lm_decoding.training.objectives import registry


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


NO_DECAY = ("bias", "scale")  # leaf names weight decay never reaches


def decays(path: tuple) -> bool:
  """Whether weight decay applies to the parameter at `path` (a key path of
  `jax.tree_util.tree_flatten_with_path`): every leaf but those named in
  NO_DECAY.

  The usual AdamW practice (GPT-2, nanoGPT, MaxText): decay the weight
  matrices (attention and MLP kernels, the embedding tables, the tied LM
  head), never the norm scales and biases, whose decay would pull a norm's
  gain towards 0 and not regularise. Decided by name, not by rank: the query,
  key and value biases of a biased model are [H, Dh] matrices. The name is
  the path's last dict key, also in a tree of flax partitioning boxes (whose
  paths end in the box's `.value`).
  """
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return not names or names[-1] not in NO_DECAY


def make_optimizer(train: ml_collections.ConfigDict):
  """AdamW with linear warmup then cosine decay, after global-norm clipping.

  Decoupled weight decay (Loshchilov & Hutter 2019) of `train.weight_decay`
  times the learning rate, on the parameters `decays` selects.

  Args:
    train: the `train` section: learning_rate, warmup_steps, num_steps,
      weight_decay, grad_clip_norm.
  """
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate,
      warmup_steps=train.warmup_steps,
      decay_steps=max(train.num_steps, train.warmup_steps + 1),
      end_value=train.learning_rate * 0.1)
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=train.weight_decay,
                  mask=lambda params: jax.tree_util.tree_map_with_path(
                      lambda path, _: decays(path), params)))


def init_state(model_cfg: TransformerConfig, optimizer, key) -> TrainState:
  """A fresh TrainState (built in one compiled program)."""
  def build(key):
    params = init_params(model_cfg, key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))
  return jax.jit(build)(key)


def unbox(tree):
  """Strips flax's logical-axis metadata boxes from a parameter tree."""
  return nn.meta.unbox(tree)


def abstract_state(model_cfg: TransformerConfig, optimizer) -> TrainState:
  """Shapes and dtypes of a fresh TrainState, nothing allocated."""
  return jax.eval_shape(
      lambda: init_state(model_cfg, optimizer, jax.random.key(0)))


def state_shardings(model_cfg: TransformerConfig, optimizer, mesh,
                    rules=sharding.DEFAULT_RULES) -> TrainState:
  """NamedShardings of a TrainState on `mesh`.

  The optimizer state is built abstractly from the boxed parameters, so
  AdamW's moments keep each parameter's logical axes (flax's
  `get_partition_spec` reads them); scalars (step, counts) are replicated.
  KV heads the mesh cannot split are replicated (`rules_for_model`).

  Raises:
    ValueError: as `sharding.param_shardings` (a dimension the mesh cannot
      split, a logical axis without a rule).
  """
  rules = sharding.rules_for_model(model_cfg, mesh, rules)
  sharding.param_shardings(model_cfg, mesh, rules)  # names, divisibility
  abstract = jax.eval_shape(
      lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p,
                           opt_state=optimizer.init(p)),
      abstract_params(model_cfg))
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh,
                                     rules)


def entry_of(objective) -> registry.Objective:
  """The registry entry of `objective`: a name of `registry.OBJECTIVES` or
  an entry itself (e.g. a task's prompt-conditioned one, `registry.of_config`).

  Raises:
    ValueError: an unknown name (`registry.get`).
  """
  if isinstance(objective, registry.Objective):
    return objective
  return registry.get(objective)


def objective_loss(objective, block_length: int | None = None,
                   **options):
  """The objective's loss, (logits_fn, params, tokens int32[B, L], key) ->
  (loss, metrics) (see `objectives`), with BD3-LM's `block_length` or a
  translation objective's `options` (`registry.Objective.options`) bound.
  `objective` is a name of `registry.OBJECTIVES` or an entry (`entry_of`).
  """
  entry = entry_of(objective)
  if entry.blocks:
    options = dict(options, block_length=block_length)
  return functools.partial(entry.loss, **options)


def make_train_step(model_cfg: TransformerConfig, objective, optimizer,
                    block_length: int | None = None,
                    scheduled: tuple[float, int] | None = None, mesh=None,
                    rules=sharding.DEFAULT_RULES, batch_shape=None,
                    anneal_steps: int = 0, **options):
  """(state, tokens int32[B, L], key) -> (state, metrics), jitted, donating state.

  `block_length` is BD3-LM's (`train.block_length`); other objectives ignore it.
  `scheduled` is (p_max, ramp_steps) of scheduled sampling for 'ar'
  (`scheduled_sampling`): the loss is then
  `objectives.ar_scheduled_sampling_loss` at the probability of
  `state.step`. `anneal_steps` > 0 ('mdlm'): attention-mask annealing, the
  loss's band `objectives.visible_ahead(state.step, anneal_steps, L)`.
  `options` are the objective's (`registry.Objective.options`).
  With a `mesh` (`lm_decoding.parallel.sharding`), the step is jitted with
  explicit shardings: the state by `state_shardings` (place it there with
  `jax.device_put(state, state_shardings(...))`), the tokens int32
  `batch_shape` ([B, L]; B must divide over the batch mesh axes) by 'batch',
  key and metrics replicated. Without one (the default) nothing changes.

  Raises:
    ValueError: a mesh without batch_shape, or as `state_shardings` and
      `sharding.batch_sharding`.
  """
  loss_fn = objective_loss(objective, block_length, **options)
  logits_fn = make_logits_fn(model_cfg)

  def step_loss(state: TrainState, length: int):
    if anneal_steps:
      return functools.partial(loss_fn, ahead=objectives.visible_ahead(
          state.step, anneal_steps, length))
    if scheduled is None:
      return loss_fn
    return functools.partial(
        objectives.ar_scheduled_sampling_loss,
        probability=objectives.scheduled_sampling_probability(
            state.step, *scheduled))

  def step(state: TrainState, tokens, key):
    loss_of = step_loss(state, tokens.shape[1])
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: loss_of(logits_fn, p, tokens, key),
        has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
    return TrainState(state.step + 1, params, opt_state), metrics

  if mesh is None:
    return jax.jit(step, donate_argnums=0)
  if batch_shape is None:
    raise ValueError("make_train_step: a mesh needs batch_shape=(B, L), the "
                     "shape of the token batches")
  state = state_shardings(model_cfg, optimizer, mesh, rules)
  replicated = sharding.replicated(mesh)
  return jax.jit(step, donate_argnums=0,
                 in_shardings=(state, sharding.batch_sharding(
                     mesh, batch_shape, rules), replicated),
                 out_shardings=(state, replicated))


def make_eval_fn(model_cfg: TransformerConfig, objective,
                 num_timesteps: int, block_length: int | None = None,
                 **options):
  """(params, tokens int32[B, L]) -> (summed NLL, token count), jitted.

  Deterministic: AR teacher-forced NLL; MDLM the NELBO on a fixed grid of
  `num_timesteps` times with fixed masks (`objectives.mdlm_bound`); BD3-LM
  its NELBO with blocks of `block_length` from `num_timesteps` fixed draws
  (`objectives.bd3lm_bound`); uniform-state diffusion its NELBO on the same
  grid (`objectives.uniform_bound`); a translation objective its training
  loss's target NLL (`options`: `registry.Objective.options`) with a fixed
  key (CMLM: the masked tokens' NLL under one fixed draw of masks). What
  each objective evaluates is its registry entry's `bound`; `objective` is
  a name or an entry (`entry_of`).
  """
  logits_fn = make_logits_fn(model_cfg)
  entry = entry_of(objective)
  if entry.blocks:
    options = dict(options, block_length=block_length)

  def eval_fn(params, tokens):
    metrics = entry.bound(logits_fn, params, tokens, num_timesteps, **options)
    return metrics["nll"], metrics["tokens"]

  return jax.jit(eval_fn)


def evaluate(eval_fn, params, batches: np.ndarray) -> float:
  """Per-token validation loss (nats) over fixed batches [n, B, L]."""
  total, count = 0.0, 0.0
  for tokens in batches:
    nll, n = eval_fn(params, tokens)
    total += float(nll)
    count += float(n)
  return total / max(count, 1.0)


def compiled_steps(train_steps: dict, state: TrainState,
                   batch_shape: tuple[int, int], mesh=None,
                   rules=sharding.DEFAULT_RULES) -> tuple[dict, float]:
  """({key: the train step compiled ahead of time for `state` and token
  batches int32[B, L] of `batch_shape` (placed by 'batch' on `mesh`)}, the
  seconds compiling them took), for `train_steps` {key: jitted step}
  (`make_train_step`); nothing runs."""
  batch = jax.ShapeDtypeStruct(
      batch_shape, jnp.int32, sharding=None if mesh is None else
      sharding.batch_sharding(mesh, batch_shape, rules))
  key = jax.random.key(0)
  compiled, seconds = {}, 0.0
  for width, step in train_steps.items():
    compiled[width], took = cost.compile_timed(step, (state, batch, key))
    seconds += took
  return compiled, seconds
