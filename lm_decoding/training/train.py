"""Training loop shared by the AR, masked-diffusion and translation objectives.

The LM objectives ('ar', 'mdlm', 'bd3lm', 'uniform') train on the packed text corpus
(`pipeline`); the translation objectives ('translation_ar', 'cmlm', 'ctc',
`objectives.translation`) on the verse pairs (`parallel_text`, rows
[source, BOS, target, EOS, PAD]); the loop, evaluation and checkpoints are
the same.

One jit-compiled step (optax AdamW, warmup + cosine decay, global-norm
clipping), deterministic validation, orbax checkpoints that resume
automatically, a progress bar with the latest loss, tokens/s and model FLOP
utilisation (MFU), and one JSON record per step appended to
`{workdir}/metrics.jsonl`.

Crash safety (`kill -9`, a full disk, a read-only workdir): a step's record is
written before its checkpoint, checkpoints are atomic (see `checkpoints`), and
a run that resumes from step s first rewinds `metrics.jsonl` to the records
of steps <= s (dropping a torn last line), so a killed run loses at most the
steps since its last complete checkpoint and the log never holds a step twice
or misses one. A write that fails raises one error naming the file; the
checkpoints written before it stay intact.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from lm_decoding.checks import is_count, is_number
from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import parallel_text
from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import MIN_VOCAB_SIZE
from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model
from lm_decoding.models import TransformerConfig, abstract_params
from lm_decoding.models import count_params, init_params, make_logits_fn
from lm_decoding.parallel import multihost
from lm_decoding.parallel import sharding
from lm_decoding.training import data_sources
from lm_decoding.training import objectives
from lm_decoding.training.objectives import registry
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

OBJECTIVES = tuple(registry.OBJECTIVES)  # the names train.objective takes
TRANSLATION_OBJECTIVES = tuple(  # those that train on the verse pairs
    name for name, o in registry.OBJECTIVES.items() if o.data == "pairs")


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def model_config(config: ml_collections.ConfigDict) -> TransformerConfig:
  """The backbone config of an experiment config (vocab from data, attention
  from the objective).

  Raises:
    ValueError: unknown objective, or data.seq_len above model.max_len.
  """
  entry = registry.get(config.train.objective)
  length = entry.sequence_length(config)
  if length > config.model.max_len:
    what = (f"data.seq_len={length}" if entry.data == "text"
            else f"the {entry.name} training sequence length {length} (from "
                 "data.max_source_tokens, data.max_target_tokens)")
    raise ValueError(
        f"{what} must be <= model.max_len={config.model.max_len}")
  model = dict(config.model.to_dict(), **entry.model_options(config))
  try:
    return TransformerConfig(vocab_size=config.data.vocab_size,
                             attention=entry.attention, **model)
  except ValueError as e:  # name the config section
    raise ValueError(f"model.{e}") from e


_COUNTS = (("train", "num_steps", 1), ("train", "batch_size", 1),
           ("train", "warmup_steps", 0), ("train", "eval_every", 1),
           ("train", "eval_batches", 1), ("train", "mdlm_eval_timesteps", 1),
           ("train", "checkpoint_every", 1), ("train", "keep_checkpoints", 1),
           ("data", "seq_len", 2), ("data", "vocab_size", MIN_VOCAB_SIZE))
_NUMBERS = (("train", "learning_rate", 0.0, False),
            ("train", "weight_decay", 0.0, True),
            ("train", "grad_clip_norm", 0.0, False))


def check_config(config: ml_collections.ConfigDict) -> TransformerConfig:
  """Checks every option `train` reads; returns the backbone config.

  Pure and fast: `train` calls it before touching the workdir, the data or
  the compiler.

  Raises:
    ValueError: naming the config key and its allowed range: seed not an
      integer >= 0; a count of `_COUNTS` not an integer >= its minimum; a
      rate of `_NUMBERS` not a finite number above 0 (weight decay: >= 0);
      data.format unknown; data.targets not in parallel_text.TARGETS;
      data.path missing; peak_flops not a number >= 0; any error of
      `registry.check_options` (the objective's own and optional keys) or
      of `model_config`.
  """
  if not is_count(config.seed, minimum=0):
    raise ValueError(f"seed={config.seed!r} must be an integer >= 0")
  for section, key, minimum in _COUNTS:
    value = config[section][key]
    if not is_count(value, minimum):
      raise ValueError(f"{section}.{key}={value!r} must be an integer >= "
                       f"{minimum}")
  for section, key, low, closed in _NUMBERS:
    value = config[section][key]
    if (not is_number(value) or not math.isfinite(value)
        or not (value >= low if closed else value > low)):
      bound = f"[{low}, inf)" if closed else f"({low}, inf)"
      raise ValueError(f"{section}.{key}={value!r} must be a number in "
                       f"{bound}")
  data_format = config.data.get("format", "auto")
  if data_format not in corpus_lib.FORMATS:
    raise ValueError(f"data.format={data_format!r} must be one of "
                     f"{corpus_lib.FORMATS}")
  corpus_lib.resolve_path(config.data.path)
  targets = config.data.get("targets", "reference")
  if targets not in parallel_text.TARGETS:
    raise ValueError(f"data.targets={targets!r}; allowed: "
                     f"{parallel_text.TARGETS}")
  peak = config.get("peak_flops", 0.0)
  if not is_number(peak) or not 0 <= peak < math.inf:
    raise ValueError(f"peak_flops={peak!r} must be a number in [0, inf) "
                     "(0: measured at the start)")
  registry.check_options(config)
  return model_config(config)


PEAK_MATMUL_SIZES = (256, 512, 1024)  # the matmuls `train` takes its peak of
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


def objective_loss(objective, block_length: int | None = None,
                   **options):
  """The objective's loss, (logits_fn, params, tokens int32[B, L], key) ->
  (loss, metrics) (see `objectives`), with BD3-LM's `block_length` or a
  translation objective's `options` (`registry.Objective.options`) bound.
  `objective` is a name of OBJECTIVES or such a loss function itself (a
  task objective, `objectives.tasks`, with its `options`)."""
  if callable(objective):
    return functools.partial(objective, **options)
  entry = registry.get(objective)
  if entry.blocks:
    options = dict(options, block_length=block_length)
  return functools.partial(entry.loss, **options)


def make_train_step(model_cfg: TransformerConfig, objective: str, optimizer,
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


def make_eval_fn(model_cfg: TransformerConfig, objective: str,
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
  each objective evaluates is its registry entry's `bound`.
  """
  logits_fn = make_logits_fn(model_cfg)
  entry = registry.get(objective)
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


def _append_record(path: str, record: dict) -> None:
  """Appends one JSON line to `path`.

  Raises:
    OSError: the write failed; the message names `path`.
  """
  try:
    with open(path, "a") as f:
      f.write(json.dumps(record) + "\n")
  except OSError as e:
    raise OSError(e.errno, f"could not write metrics ({e.strerror})",
                  path) from e


def _rewind_metrics(path: str, last_step: int) -> None:
  """Keeps only the complete records of steps <= `last_step` in `path`.

  A run killed after logging steps beyond its last checkpoint would otherwise
  log them twice on resume; a torn last line (killed mid-write) is dropped.
  The file is replaced atomically.
  """
  if not os.path.exists(path):
    return
  kept = []
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if line.endswith("\n") and record.get("step", last_step + 1) <= last_step:
        kept.append(line)
  staging = path + ".tmp"
  with open(staging, "w") as f:
    f.writelines(kept)
  os.replace(staging, path)


def _logged_step_seconds(path: str, tokens_per_step: int) -> list[float]:
  """Seconds of every training step recorded in `path` (each record's
  tokens_per_s), over every process that trained this run; [] if none."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = [json.loads(line) for line in f if line.endswith("\n")]
  return [tokens_per_step / r["tokens_per_s"] for r in records
          if r.get("tokens_per_s")]


def _check_workdir(workdir: str) -> None:
  """Creates `workdir` if needed.

  Raises:
    ValueError: `workdir` is a file, or cannot be created or written.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"workdir={workdir!r} is a file, not a directory")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f"workdir={workdir!r} cannot be created: {e}") from e
  if not os.access(workdir, os.W_OK):
    raise ValueError(f"workdir={workdir!r} is not writable")


def train(config: ml_collections.ConfigDict, workdir: str,
          progress: bool = True, data_dir: str | None = None,
          stop_at: int | None = None, init_params: Any = None) -> dict:
  """Trains (or resumes) the model described by `config` under `workdir`.

  Writes `{workdir}/checkpoints/` (orbax, resumed automatically from the
  latest complete step), `{workdir}/metrics.jsonl` (one JSON object per step:
  step 0 is the untrained model's validation loss; evaluation steps add
  valid_loss and valid_ppl) and the data cache (tokenizer, encoded splits)
  under `data_dir` (default `workdir`), where models trained on the same data
  share it. See the module docstring for what a crash loses.

  With a `config.mesh` other than the one-device default, the state is
  sharded by `state_shardings` and every step runs sharded
  (`make_train_step(mesh=...)`); batches are split by 'batch'. A checkpoint
  is restored straight onto the mesh, whatever mesh saved it. In a
  multi-process job (`multihost.initialize`) every process runs `train`:
  each reads only its rows of every batch (`multihost.global_batches`),
  orbax writes and reads each process's shards, and process 0 alone
  writes metrics.jsonl and shows progress.

  `init_params` (a parameter tree of `config`'s shapes, e.g. an AR parent's
  from `pretrained.parent_params`) replaces the random initialisation of a
  fresh run (the optimizer starts fresh); a resumed run ignores it.

  `stop_at` ends the run after that step (validated and checkpointed there)
  although the learning-rate schedule is train.num_steps': a budget cut
  short, reported as such (the summary's `steps`); a run already past it
  is reported at its latest step.

  Every step's record holds its tokens/s and, for an LM objective, its
  model FLOP utilisation `mfu` (`cost.flop_utilisation` of
  `cost_model.objective_flops` against `config.peak_flops`, or against a
  peak measured at the start when that is 0 or absent). The train step is
  compiled ahead of time, before the first timed step, so no step's seconds
  (nor its tokens/s, its MFU, or `train_s`) hold the compile: the first
  record of each call (a resume is another) holds that call's `compile_s`
  and the `peak_flops` it measured against.

  With `progress`, shows a bar with the latest loss, tokens/s and MFU (its
  description says 'eval' or 'save' while validating or checkpointing), says
  so when it resumes, and prints the final validation perplexity (MDLM: its
  upper bound) as one line.

  Returns:
    A summary: parameter count, steps, final validation loss and perplexity
    (AR: perplexity; MDLM: perplexity bound); `train_s`, the seconds of
    the run's training steps (from metrics.jsonl, so over every call that
    trained them, resumes included; validation and checkpointing excluded),
    and `train_tokens_per_s`, train tokens over the median step's seconds;
    `wall_s`, this call's wall seconds (a resume of a finished run: its own).
    For an LM objective also `flops_per_token` (model FLOPs of a step per
    train token, `cost_model.objective_flops`), `peak_flops` (FLOP/s of all
    the mesh's devices) and `mfu`, the median step's model FLOP utilisation
    (a fraction); the exported manifest's metrics are this summary.
  Raises:
    ValueError: any error of `check_config` or of the mesh (a bad
      `config.mesh`, a batch size or parameter it cannot split; raised
      before the workdir is created), bad data, a workdir that is a file or not writable (all
      before anything is compiled).
    CheckpointError: an existing checkpoint that does not fit `config`.
    CheckpointWriteError: a checkpoint could not be written (full disk,
      read-only file system); the earlier checkpoints are intact.
    OSError: `metrics.jsonl` could not be written (the message names it).
  """
  start_time = time.time()
  model_cfg = check_config(config)
  train_cfg = config.train
  optimizer = make_optimizer(train_cfg)
  mesh = sharding.mesh_or_none(config.get("mesh"))
  rules = sharding.rules_from_config(config.get("mesh"))
  if mesh is not None:  # a batch or a parameter it cannot split fails here
    sharding.batch_sharding(mesh, (train_cfg.batch_size,), rules)
    shardings = state_shardings(model_cfg, optimizer, mesh, rules)
  objective, num_steps = train_cfg.objective, train_cfg.num_steps
  if stop_at is not None and not is_count(stop_at, 1):
    raise ValueError(f"stop_at={stop_at!r} must be an integer >= 1")
  last = num_steps if stop_at is None else min(stop_at, num_steps)
  primary = jax.process_index() == 0  # writes the log, shows progress
  progress = progress and primary
  _check_workdir(workdir)
  train_packed, valid_batches = _checked_data(
      data_sources.training_data(config, data_dir or workdir), model_cfg,
      train_cfg.batch_size, train_cfg.eval_batches, progress)
  seq_len = train_packed.shape[1]
  init_key, step_key = jax.random.split(jax.random.key(config.seed))
  fingerprint = registry.fingerprint(config)
  log_path = os.path.join(workdir, "metrics.jsonl")
  tokens_per_step = train_cfg.batch_size * seq_len
  block_length = train_cfg.get("block_length")  # bd3lm only
  entry = registry.get(objective)
  options = entry.options(config)
  schedule = registry.block_schedule(config)
  train_steps = {  # one compiled step per block length of the schedule
      width: make_train_step(model_cfg, objective, optimizer, width,
                             registry.scheduled_sampling(config), mesh=mesh,
                             rules=rules,
                             batch_shape=(train_cfg.batch_size, seq_len),
                             anneal_steps=train_cfg.get("anneal_steps", 0),
                             **options)
      for width in dict(schedule).values()}
  eval_fn = make_eval_fn(model_cfg, objective, train_cfg.mdlm_eval_timesteps,
                         block_length, **options)
  step_flops, peak_flops = _step_flops_and_peak(
      model_cfg, objective, train_cfg.batch_size, seq_len,
      1 if mesh is None else mesh.devices.size, config.get("peak_flops", 0.0))
  desc = f"train {objective}"
  valid_loss = float("nan")
  step_seconds = []  # this call's
  with contextlib.ExitStack() as stack:
    checkpoints = stack.enter_context(Checkpoints(
        os.path.join(workdir, "checkpoints"), train_cfg.keep_checkpoints))
    resume = _check_resume(checkpoints, fingerprint)  # before any compile
    state = init_state(model_cfg, optimizer, init_key)
    if mesh is not None:  # also the target shardings of a restore
      state = jax.device_put(state, shardings)
    state = _start_state(checkpoints, state, resume, init_params, log_path,
                         primary, progress, desc)
    first = int(state.step)
    batches = _train_batches(train_packed, train_cfg.batch_size, config.seed,
                             first, mesh, rules)
    # Compiled before the first timed step, so that no step's seconds (nor
    # train_s, nor the MFU) hold the compile; its seconds are recorded apart.
    train_steps, compile_s = _compiled_steps(
        train_steps, state, (train_cfg.batch_size, seq_len), mesh, rules)
    bar = stack.enter_context(tqdm.tqdm(  # closed before any error prints
        initial=first, total=num_steps, disable=not progress, desc=desc,
        unit="step"))

    def validate(params) -> float:
      bar.set_description(f"{desc}: eval")
      loss = evaluate(eval_fn, params, valid_batches)
      bar.set_description(desc)
      return loss

    if first == 0:  # the untrained baseline, so every log shows the drop
      valid_loss = validate(state.params)
      if primary:
        _append_record(log_path, {"step": 0, "valid_loss": valid_loss,
                                  "valid_ppl": float(np.exp(valid_loss))})
    for step in range(first, last):
      train_step = train_steps[objectives.block_length_at(schedule, step)]
      key = jax.random.fold_in(step_key, step)
      tick = time.time()
      state, metrics = train_step(state, next(batches), key)
      loss = float(metrics["loss"])  # waits for the step, so the time is real
      seconds = time.time() - tick
      step_seconds.append(seconds)
      done = step + 1
      record, postfix = _step_record(done, loss, metrics, seconds,
                                     tokens_per_step, step_flops, peak_flops)
      if step == first:  # this call's compile, and the peak it measured
        record.update(compile_s=compile_s, peak_flops=peak_flops)
      bar.set_postfix(**postfix, refresh=False)
      bar.update(1)
      if done % train_cfg.eval_every == 0 or done == last:
        valid_loss = validate(state.params)
        record.update(valid_loss=valid_loss,
                      valid_ppl=float(np.exp(valid_loss)))
      if primary:  # before the checkpoint of this step
        _append_record(log_path, record)
      if done % train_cfg.checkpoint_every == 0 or done == last:
        bar.set_description(f"{desc}: save")
        checkpoints.save(done, state, {"fingerprint": fingerprint,
                                       "valid_loss": valid_loss})
        bar.set_description(desc)
  if first >= last:  # nothing left to train: report as is
    valid_loss = evaluate(eval_fn, state.params, valid_batches)
  if progress:
    measure = registry.get(objective).bound_name
    print(f"{desc}: final validation {measure} {float(np.exp(valid_loss)):.2f}"
          f" at step {int(state.step)} ({workdir})")
  if primary:  # the whole run's steps, whichever calls trained them
    step_seconds = _logged_step_seconds(log_path, tokens_per_step)
  return _summary(objective, state, valid_loss, step_seconds, tokens_per_step,
                  step_flops, peak_flops, start_time)


def _compiled_steps(train_steps: dict, state: TrainState,
                    batch_shape: tuple[int, int], mesh, rules
                    ) -> tuple[dict, float]:
  """({block length: the train step compiled ahead of time for `state` and
  token batches int32[B, L] of `batch_shape`}, the seconds compiling them
  took); nothing runs."""
  batch = jax.ShapeDtypeStruct(
      batch_shape, jnp.int32, sharding=None if mesh is None else
      sharding.batch_sharding(mesh, batch_shape, rules))
  key = jax.random.key(0)
  compiled, seconds = {}, 0.0
  for width, step in train_steps.items():
    compiled[width], took = cost.compile_timed(step, (state, batch, key))
    seconds += took
  return compiled, seconds


def _checked_data(data: tuple, model_cfg: TransformerConfig,
                  batch_size: int, eval_batches: int,
                  progress: bool) -> tuple[np.ndarray, np.ndarray]:
  """(train sequences int32[R, L], validation batches int32[n, B, L]): the
  `data_sources.training_data` triple `data` checked against the model and
  the batch size B (n = min(eval_batches, what the split holds)).

  Raises:
    ValueError: a tokenizer of another vocabulary size than the model's, a
      validation split with fewer than one batch.
  """
  corpus, train_packed, valid_packed = data
  if progress:
    print(corpus.describe())
  if corpus.tokenizer.vocab_size != model_cfg.vocab_size:
    raise ValueError(
        f"tokenizer vocab_size={corpus.tokenizer.vocab_size} does not match "
        f"data.vocab_size={model_cfg.vocab_size}")
  seq_len = train_packed.shape[1]
  num_valid = min(eval_batches, len(valid_packed) // batch_size)
  if num_valid < 1:
    raise ValueError(
        f"validation split has {len(valid_packed)} sequences of "
        f"seq_len={seq_len}: fewer than train.batch_size={batch_size}")
  return train_packed, valid_packed[:num_valid * batch_size].reshape(
      num_valid, batch_size, seq_len)


def _check_resume(checkpoints: Checkpoints, fingerprint: dict) -> bool:
  """True if the run resumes from a checkpoint.

  Raises:
    CheckpointError: a checkpoint trained with another fingerprint.
  """
  if checkpoints.latest_step() is None:
    return False
  meta = checkpoints.read_meta()
  if meta.get("fingerprint") != fingerprint:
    raise CheckpointError(
        f"checkpoint in {checkpoints.directory} was trained with "
        f"{meta.get('fingerprint')}, not {fingerprint}; use another "
        "workdir")
  return True


def _start_state(checkpoints: Checkpoints, fresh: TrainState, resume: bool,
                 init_params: Any, log_path: str, primary: bool,
                 progress: bool, desc: str) -> TrainState:
  """The state a run starts from: the latest checkpoint restored onto
  `fresh`'s shardings when `resume`, else `fresh` (with `init_params` when
  given); the metrics log is cut back to that step.

  Raises:
    CheckpointError: a checkpoint of other shapes or dtypes than `fresh`.
  """
  if not resume:
    state = fresh
    if init_params is not None:
      # A copy: the train step donates its state, and the caller's arrays
      # must outlive this run.
      state = state.replace(params=jax.device_put(
          jax.tree.map(jnp.copy, init_params),
          jax.tree.map(lambda a: a.sharding, state.params)))
    if primary:  # a log left by a run killed before step 1
      _rewind_metrics(log_path, -1)
    return state
  state, _ = checkpoints.restore(fresh)
  if primary:
    _rewind_metrics(log_path, int(state.step))
  if progress:
    print(f"{desc}: resuming from step {int(state.step)} of "
          f"{checkpoints.directory}")
  return state


def _train_batches(train_packed: np.ndarray, batch_size: int, seed: int,
                   first: int, mesh, rules):
  """The batches of steps first, first + 1, ... (B = `batch_size`, drawn by
  `seed`): the same sequence on one device as on a mesh, where each process
  reads its rows only."""
  if mesh is None:
    return pipeline.batches(train_packed, batch_size, seed, start_step=first)
  return multihost.global_batches(
      train_packed, batch_size, seed,
      sharding.batch_sharding(mesh, (batch_size, train_packed.shape[1]),
                              rules), start_step=first)


def _step_record(done: int, loss: float, metrics: dict, seconds: float,
                 tokens_per_step: int, step_flops: int | None,
                 peak_flops: float | None) -> tuple[dict, dict]:
  """(metrics.jsonl record of step `done`, the progress bar's postfix):
  loss, tokens/s, gradient norm, and the MFU and scheduled sampling's
  replaced fraction where they apply."""
  record = {"step": done, "loss": loss,
            "tokens_per_s": tokens_per_step / seconds,
            "grad_norm": float(metrics["grad_norm"])}
  postfix = dict(loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
  if step_flops is not None:
    record["mfu"] = cost.flop_utilisation(step_flops, seconds, peak_flops)
    postfix["mfu"] = f"{record['mfu']:.0%}"
  if "replaced" in metrics:  # scheduled sampling's replaced fraction
    record["replaced"] = float(metrics["replaced"])
  return record, postfix


def _summary(objective: str, state: TrainState, valid_loss: float,
             step_seconds: list[float], tokens_per_step: int,
             step_flops: int | None, peak_flops: float | None,
             start_time: float) -> dict:
  """`train`'s return value (see its docstring)."""
  summary = {"objective": objective,
             "num_params": count_params(state.params),
             "steps": int(state.step), "valid_loss": valid_loss,
             "valid_ppl": float(np.exp(valid_loss)),
             "train_s": float(np.sum(step_seconds)),
             "train_tokens_per_s": (tokens_per_step / np.median(step_seconds)
                                    if step_seconds else 0.0),
             "wall_s": time.time() - start_time}
  if step_flops is not None:
    summary.update(
        flops_per_token=step_flops / tokens_per_step, peak_flops=peak_flops,
        mfu=(cost.flop_utilisation(step_flops, float(np.median(step_seconds)),
                                   peak_flops) if step_seconds else 0.0))
  return summary


def _step_flops_and_peak(model_cfg: TransformerConfig, objective: str,
                         batch_size: int, seq_len: int, devices: int,
                         peak_flops: float) -> tuple[int | None, float | None]:
  """(model FLOPs of one train step of B = `batch_size` rows of `seq_len`,
  peak FLOP/s of the `devices` that run it) for the MFU, or (None, None)
  for an objective `cost_model.objective_flops` does not count (the
  translation ones). The peak is `devices` x `peak_flops` (one device's,
  config.peak_flops) or, when that is 0 (the default), x
  `cost.measure_peak_flops` of the default device measured now, beside the
  run (the best of 5 back-to-back matmuls at each of PEAK_MATMUL_SIZES,
  about 0.5 s on a 2-core CPU), and recorded in the call's first step
  record and in the summary. Scheduled sampling's extra forward pass
  (`objectives.ar_scheduled_sampling_loss`) is not counted."""
  if objective not in cost_model.TRAINED_OBJECTIVES:
    return None, None
  flops = cost_model.objective_flops(model_cfg, objective, batch_size,
                                     seq_len)
  peak = peak_flops or cost.measure_peak_flops(PEAK_MATMUL_SIZES, runs=5)
  return flops, devices * float(peak)
