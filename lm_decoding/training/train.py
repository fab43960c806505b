"""Training loop shared by the AR and masked-diffusion objectives.

One jit-compiled step (optax AdamW, warmup + cosine decay, global-norm
clipping), deterministic validation, orbax checkpoints that resume
automatically, a progress bar with loss and tokens/s, and metrics appended to
`{workdir}/metrics.jsonl`.
"""

from __future__ import annotations

import json
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

from lm_decoding.data import pipeline
from lm_decoding.models import TransformerConfig, count_params, init_params
from lm_decoding.models import make_logits_fn
from lm_decoding.training import objectives
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

_ATTENTION = {"ar": "causal", "mdlm": "bidirectional"}
_LOSSES = {"ar": objectives.ar_loss, "mdlm": objectives.mdlm_loss}
OBJECTIVES = tuple(_LOSSES)


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
  objective = config.train.objective
  if objective not in OBJECTIVES:
    raise ValueError(
        f"train.objective={objective!r}; allowed: {OBJECTIVES}")
  if config.data.seq_len > config.model.max_len:
    raise ValueError(
        f"data.seq_len={config.data.seq_len} must be <= "
        f"model.max_len={config.model.max_len}")
  return TransformerConfig(vocab_size=config.data.vocab_size,
                           attention=_ATTENTION[objective],
                           **config.model.to_dict())


def make_optimizer(train: ml_collections.ConfigDict):
  """AdamW with linear warmup then cosine decay, after global-norm clipping."""
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate,
      warmup_steps=train.warmup_steps,
      decay_steps=max(train.num_steps, train.warmup_steps + 1),
      end_value=train.learning_rate * 0.1)
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=train.weight_decay))


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


def make_train_step(model_cfg: TransformerConfig, objective: str, optimizer):
  """(state, tokens int32[B, L], key) -> (state, metrics), jitted, donating state."""
  loss_fn = _LOSSES[objective]
  logits_fn = make_logits_fn(model_cfg)

  def step(state: TrainState, tokens, key):
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: loss_fn(logits_fn, p, tokens, key), has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
    return TrainState(state.step + 1, params, opt_state), metrics

  return jax.jit(step, donate_argnums=0)


def make_eval_fn(model_cfg: TransformerConfig, objective: str,
                 num_timesteps: int):
  """(params, tokens int32[B, L]) -> (summed NLL, token count), jitted.

  Deterministic: AR teacher-forced NLL; MDLM the NELBO on a fixed grid of
  `num_timesteps` times with fixed masks (`objectives.mdlm_bound`).
  """
  logits_fn = make_logits_fn(model_cfg)

  def eval_fn(params, tokens):
    if objective == "ar":
      _, metrics = objectives.ar_eval(logits_fn, params, tokens)
    else:
      _, metrics = objectives.mdlm_bound(logits_fn, params, tokens,
                                         jax.random.key(0), num_timesteps)
    return metrics["nll"], metrics["tokens"]

  return jax.jit(eval_fn)


def evaluate(eval_fn, params, batches: np.ndarray) -> float:
  """Per-token validation loss (nats) over fixed batches [N, B, L]."""
  total, count = 0.0, 0.0
  for tokens in batches:
    nll, n = eval_fn(params, tokens)
    total += float(nll)
    count += float(n)
  return total / max(count, 1.0)


def _fingerprint(config: ml_collections.ConfigDict) -> dict:
  """What a checkpoint must share with a config to be resumed or reused."""
  return {"data": config.data.to_dict(), "model": config.model.to_dict(),
          "objective": config.train.objective}


def train(config: ml_collections.ConfigDict, workdir: str,
          progress: bool = True, data_dir: str | None = None) -> dict:
  """Trains (or resumes) the model described by `config` under `workdir`.

  Writes `{workdir}/checkpoints/` (orbax, resumed automatically from the
  latest step), `{workdir}/metrics.jsonl` (one JSON object per log point) and
  the data cache (tokenizer, encoded splits) under `data_dir` (default
  `workdir`), where models trained on the same data share it.

  Returns:
    A summary: parameter count, steps, final validation loss and perplexity
    (AR: perplexity; MDLM: perplexity bound), train tokens/s, wall seconds.
  Raises:
    ValueError: bad objective, sequence length above max_len, bad data path
      or vocab size (before anything is compiled).
    CheckpointError: an existing checkpoint that does not fit `config`.
  """
  start_time = time.time()
  model_cfg = model_config(config)
  train_cfg = config.train
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            data_dir or workdir)
  if corpus.tokenizer.vocab_size != model_cfg.vocab_size:
    raise ValueError(
        f"tokenizer vocab_size={corpus.tokenizer.vocab_size} does not match "
        f"data.vocab_size={model_cfg.vocab_size}")
  seq_len = config.data.seq_len
  train_packed = pipeline.pack(corpus.tokens["train"], seq_len)
  valid_packed = pipeline.pack(corpus.tokens["valid"], seq_len)
  num_valid = min(train_cfg.eval_batches,
                  len(valid_packed) // train_cfg.batch_size)
  if num_valid < 1:
    raise ValueError(
        f"validation split has {len(valid_packed)} sequences of "
        f"seq_len={seq_len}: fewer than train.batch_size="
        f"{train_cfg.batch_size}")
  valid_batches = valid_packed[:num_valid * train_cfg.batch_size].reshape(
      num_valid, train_cfg.batch_size, seq_len)

  optimizer = make_optimizer(train_cfg)
  key = jax.random.key(config.seed)
  init_key, step_key = jax.random.split(key)
  state = init_state(model_cfg, optimizer, init_key)
  checkpoints = Checkpoints(os.path.join(workdir, "checkpoints"),
                            train_cfg.keep_checkpoints)
  fingerprint = _fingerprint(config)
  if checkpoints.latest_step() is not None:
    meta = checkpoints.read_meta()
    if meta.get("fingerprint") != fingerprint:
      raise CheckpointError(
          f"checkpoint in {checkpoints.directory} was trained with "
          f"{meta.get('fingerprint')}, not {fingerprint}; use another workdir")
    state, _ = checkpoints.restore(state)

  train_step = make_train_step(model_cfg, train_cfg.objective, optimizer)
  eval_fn = make_eval_fn(model_cfg, train_cfg.objective,
                         train_cfg.mdlm_eval_timesteps)
  first = int(state.step)
  batches = pipeline.batches(train_packed, train_cfg.batch_size, config.seed,
                             start_step=first)
  log_path = os.path.join(workdir, "metrics.jsonl")
  tokens_per_step = train_cfg.batch_size * seq_len
  valid_loss = float("nan")
  if first == 0:  # the untrained baseline, so every log shows the drop
    valid_loss = evaluate(eval_fn, state.params, valid_batches)
    with open(log_path, "a") as f:
      f.write(json.dumps({"step": 0, "valid_loss": valid_loss,
                          "valid_ppl": float(np.exp(valid_loss))}) + "\n")
  tick, tick_step, tokens_per_s = time.time(), first, 0.0
  bar = tqdm.tqdm(range(first, train_cfg.num_steps), initial=first,
                  total=train_cfg.num_steps, disable=not progress,
                  desc=f"train {train_cfg.objective}", unit="step")
  for step in bar:
    state, metrics = train_step(state, next(batches),
                                jax.random.fold_in(step_key, step))
    done = step + 1
    last = done == train_cfg.num_steps
    if done % 20 == 0 or last:
      loss = float(metrics["loss"])
      now = time.time()
      tokens_per_s = (done - tick_step) * tokens_per_step / (now - tick)
      tick, tick_step = now, done
      bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:.0f}")
      record = {"step": done, "loss": loss, "tokens_per_s": tokens_per_s,
                "grad_norm": float(metrics["grad_norm"])}
      if done % train_cfg.eval_every == 0 or last:
        valid_loss = evaluate(eval_fn, state.params, valid_batches)
        record.update(valid_loss=valid_loss, valid_ppl=float(np.exp(valid_loss)))
      with open(log_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if done % train_cfg.checkpoint_every == 0 or last:
      checkpoints.save(done, state, {"fingerprint": fingerprint,
                                     "valid_loss": valid_loss})
  bar.close()
  checkpoints.close()
  if first == train_cfg.num_steps:  # nothing left to train: report as is
    valid_loss = evaluate(eval_fn, state.params, valid_batches)
  return {"objective": train_cfg.objective,
          "num_params": count_params(state.params),
          "steps": int(state.step), "valid_loss": valid_loss,
          "valid_ppl": float(np.exp(valid_loss)),
          "train_tokens_per_s": tokens_per_s,
          "wall_s": time.time() - start_time}
