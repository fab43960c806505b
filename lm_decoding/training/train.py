"""Training loop shared by the AR, masked-diffusion and translation objectives.

The LM objectives ('ar', 'mdlm', 'bd3lm', 'uniform') train on the packed text corpus
(`pipeline`); the translation objectives ('translation_ar', 'cmlm', 'ctc',
`translation_objectives`) on the verse pairs (`parallel_text`, rows
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
from lm_decoding.training import certainty_forcing
from lm_decoding.training import objectives
from lm_decoding.training import translation_objectives
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

_ATTENTION = {"ar": "causal", "mdlm": "bidirectional",
              "bd3lm": "bidirectional",  # bd3lm passes its block masks
              "uniform": "bidirectional",
              "certainty_forcing": "bidirectional",  # as bd3lm
              "translation_ar": "causal",  # the objectives pass their masks
              "cmlm": "bidirectional", "ctc": "bidirectional"}
_LOSSES = {"ar": objectives.ar_loss, "mdlm": objectives.mdlm_loss,
           "bd3lm": objectives.bd3lm_loss, "uniform": objectives.uniform_loss,
           "certainty_forcing": certainty_forcing.certainty_forcing_loss,
           "translation_ar": translation_objectives.translation_ar_loss,
           "cmlm": translation_objectives.cmlm_loss,
           "ctc": translation_objectives.ctc_loss}
OBJECTIVES = tuple(_LOSSES)
TRANSLATION_OBJECTIVES = ("translation_ar", "cmlm", "ctc")


def objective_options(config: ml_collections.ConfigDict) -> dict:
  """The objective's static keyword arguments from `config`.

  cmlm: length_weight (train.length_weight); ctc: source_width
  (data.max_source_tokens) and upsample (train.ctc_upsample); mdlm and
  bd3lm with train.complementary_masks: complementary; certainty_forcing:
  prompt_length (train.prompt_length, default 0), complementary, weight and
  temperature (train.certainty_weight and train.certainty_temperature,
  default dParallel's 2.0 and 0.5); {} otherwise.
  """
  objective = config.train.objective
  if objective == "certainty_forcing":
    return {"prompt_length": config.train.get("prompt_length", 0),
            "complementary": bool(config.train.get("complementary_masks")),
            "weight": config.train.get("certainty_weight",
                                       certainty_forcing.CERTAINTY_WEIGHT),
            "temperature": config.train.get(
                "certainty_temperature",
                certainty_forcing.CERTAINTY_TEMPERATURE)}
  if objective == "cmlm":
    return {"length_weight": config.train.length_weight}
  if objective == "ctc":
    return {"source_width": config.data.max_source_tokens,
            "upsample": config.train.ctc_upsample}
  if config.train.get("complementary_masks"):
    return {"complementary": True}
  return {}


def sequence_length(config: ml_collections.ConfigDict) -> int:
  """Positions the model sees in training: data.seq_len for an LM; for
  translation S + T + 2 ([source, BOS, target, EOS]), and for ctc the
  source and its frames, S + 1 + upsample * S (S, T: data.max_source_tokens,
  data.max_target_tokens)."""
  objective = config.train.objective
  if objective not in TRANSLATION_OBJECTIVES:
    return config.data.seq_len
  source, target = config.data.max_source_tokens, config.data.max_target_tokens
  if objective == "ctc":
    return source + 1 + config.train.ctc_upsample * source
  return source + target + 2


def training_data(config: ml_collections.ConfigDict, data_dir: str):
  """(data, train int32[R, L], valid int32[R', L]) of the objective.

  `data` has `.tokenizer` and `.describe()`: the packed corpus
  (`pipeline.prepare`, cached in `data_dir`) for an LM objective, the
  book-split verse pairs (`parallel_text.prepare`, tokenizer cached in
  `data_dir`) laid out by `parallel_text.layout` for a translation one;
  with data.targets 'distilled' the pairs are `data_dir`'s distilled file
  (`parallel_text.pairs_path`), which must share that cached tokenizer.
  With data.distillation_set (a folder of
  `certainty_forcing.write_distillation_set`) the training rows are that
  set's, cut to their first data.seq_len tokens; validation stays the
  corpus's.
  """
  if config.train.objective in TRANSLATION_OBJECTIVES:
    path = parallel_text.pairs_path(
        config.data.path, config.data.get("targets", "reference"), data_dir)
    data = parallel_text.prepare(
        config.data.vocab_size, config.data.max_source_tokens,
        config.data.max_target_tokens, path, cache_dir=data_dir)
    return (data, parallel_text.layout(data.splits["train"]),
            parallel_text.layout(data.splits["valid"]))
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            data_dir, config.data.get("format", "auto"))
  seq_len = config.data.seq_len
  valid = pipeline.pack(corpus.tokens["valid"], seq_len)
  if config.data.get("distillation_set"):
    rows, _ = certainty_forcing.read_distillation_set(
        config.data.distillation_set)
    if rows.shape[1] < seq_len:
      raise ValueError(f"data.distillation_set rows hold {rows.shape[1]} "
                       f"tokens; data.seq_len={seq_len} must be at most that")
    return corpus, rows[:, :seq_len], valid
  return (corpus, pipeline.pack(corpus.tokens["train"], seq_len), valid)


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
  length = sequence_length(config)
  if length > config.model.max_len:
    what = (f"data.seq_len={length}" if objective not in TRANSLATION_OBJECTIVES
            else f"the {objective} training sequence length {length} (from "
                 "data.max_source_tokens, data.max_target_tokens)")
    raise ValueError(
        f"{what} must be <= model.max_len={config.model.max_len}")
  model = config.model.to_dict()
  if objective == "cmlm":  # the length head: one class per target length
    model["length_classes"] = config.data.max_target_tokens
  try:
    return TransformerConfig(vocab_size=config.data.vocab_size,
                             attention=_ATTENTION[objective],
                             **model)
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
      data.path missing; peak_flops not a number >= 0; train.block_length
      (bd3lm) not dividing data.seq_len; train.scheduled_sampling malformed (see
      `scheduled_sampling`); or any error of `model_config`.
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
  scheduled_sampling(config)
  peak = config.get("peak_flops", 0.0)
  if not is_number(peak) or not 0 <= peak < math.inf:
    raise ValueError(f"peak_flops={peak!r} must be a number in [0, inf) "
                     "(0: measured at the start)")
  if config.train.objective in ("bd3lm", "certainty_forcing"):
    block, seq_len = config.train.get("block_length"), config.data.seq_len
    if not is_count(block) or seq_len % block:
      raise ValueError(f"train.block_length={block!r} must be an integer in "
                       f"[1, {seq_len}] dividing data.seq_len={seq_len}")
  _check_adaptation(config)
  return model_config(config)


# Optional keys (the adaptation recipes', and model.self_conditioning):
# absent, a recipe (and the shipped members' manifests) is unchanged.
# key -> the objectives it applies to.
_ADAPTATION_KEYS = {("model", "token_shift"): ("mdlm", "bd3lm",
                                                "certainty_forcing"),
                    ("model", "self_conditioning"): ("mdlm", "uniform"),
                    ("train", "complementary_masks"): ("mdlm", "bd3lm",
                                                       "certainty_forcing"),
                    ("train", "anneal_steps"): ("mdlm",),
                    ("train", "block_schedule"): ("bd3lm",)}


def _check_adaptation(config: ml_collections.ConfigDict) -> None:
  """Checks the optional adaptation keys (see `objectives`' docstring).

  model.token_shift and train.complementary_masks: booleans, for mdlm or
  bd3lm; model.self_conditioning (not an adaptation key, optional the same
  way): a boolean, for mdlm or uniform; train.anneal_steps: an integer >= 0, for mdlm; train.init_from: a
  string (what it names is resolved by `pretrained.parent_params`).

  Raises:
    ValueError: naming the key, its allowed values and objectives.
  """
  objective = config.train.objective
  for (section, key), objectives_allowed in _ADAPTATION_KEYS.items():
    value = config[section].get(key)
    if value is None:
      continue
    if key == "block_schedule":
      block_schedule(config)
      valid = True
    else:
      valid = (is_count(value, minimum=0) if key == "anneal_steps"
               else isinstance(value, bool))
    if not valid:
      kind = "an integer >= 0" if key == "anneal_steps" else "True or False"
      raise ValueError(f"{section}.{key}={value!r} must be {kind}")
    if value and objective not in objectives_allowed:
      raise ValueError(f"{section}.{key}={value!r} applies to "
                       f"train.objective in {objectives_allowed}; got "
                       f"{objective!r}")
  init_from = config.train.get("init_from")
  if init_from is not None and not isinstance(init_from, str):
    raise ValueError(f"train.init_from={init_from!r} must be a string: a "
                     "member of the pretrained set or a training workdir")


def block_schedule(config: ml_collections.ConfigDict
                   ) -> tuple[tuple[int, int], ...]:
  """BD3-LM's block-size schedule (`objectives.parse_block_schedule`) from
  train.block_schedule, or one block length, train.block_length, from step
  0 when the key is absent (or for other objectives).

  Raises:
    ValueError: as `objectives.parse_block_schedule`.
  """
  text = config.train.get("block_schedule")
  if text is None or config.train.objective != "bd3lm":
    return ((0, config.train.get("block_length")),)
  return objectives.parse_block_schedule(text, config.data.seq_len,
                                         config.train.block_length)


def scheduled_sampling(config: ml_collections.ConfigDict
                       ) -> tuple[float, int] | None:
  """(p_max, ramp_steps) of `train.scheduled_sampling`, None when absent.

  The optional section `train.scheduled_sampling` (keys p_max: the final
  probability of feeding the model its own prediction, in [0, 1];
  ramp_steps: steps of the linear ramp from 0, an integer >= 0) switches
  the 'ar' objective to `objectives.ar_scheduled_sampling_loss` with
  probability `objectives.scheduled_sampling_probability(step, p_max,
  ramp_steps)` (Bengio et al. 2015; two-pass form of Mihaylova & Martins
  2019). Absent, training is plain teacher forcing (and the recipe of a
  shipped model is unchanged).

  Raises:
    ValueError: naming the key: the section is not a mapping of exactly
      p_max and ramp_steps, p_max not a number in [0, 1], ramp_steps not an
      integer >= 0, or the objective is not 'ar'.
  """
  section = config.train.get("scheduled_sampling")
  if section is None:
    return None
  if (not isinstance(section, (dict, ml_collections.ConfigDict))
      or set(section.keys()) != {"p_max", "ramp_steps"}):
    raise ValueError(f"train.scheduled_sampling={section!r} must hold "
                     "exactly the keys p_max and ramp_steps")
  p_max, ramp_steps = section["p_max"], section["ramp_steps"]
  if not is_number(p_max) or not 0.0 <= p_max <= 1.0:
    raise ValueError(f"train.scheduled_sampling.p_max={p_max!r} must be a "
                     "number in [0, 1]")
  if not is_count(ramp_steps, minimum=0):
    raise ValueError(f"train.scheduled_sampling.ramp_steps={ramp_steps!r} "
                     "must be an integer >= 0")
  if config.train.objective != "ar":
    raise ValueError("train.scheduled_sampling applies to train.objective="
                     f"'ar' only; got {config.train.objective!r}")
  return float(p_max), int(ramp_steps)


PEAK_MATMUL_SIZE = 1024  # the matmul `train` measures the peak with
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
  translation objective's `options` (`objective_options`) bound.
  `objective` is a name of OBJECTIVES or such a loss function itself (a
  task objective, `task_objectives`, with its `options`)."""
  loss_fn = functools.partial(
      objective if callable(objective) else _LOSSES[objective], **options)
  if objective in ("bd3lm", "certainty_forcing"):
    loss_fn = functools.partial(loss_fn, block_length=block_length)
  return loss_fn


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
  `options` are the objective's (`objective_options`).
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
  grid (`objectives.uniform_bound`); a translation objective its training loss's
  target NLL (`options`: `objective_options`) with a fixed key (CMLM: the
  masked tokens' NLL under one fixed draw of masks).
  """
  logits_fn = make_logits_fn(model_cfg)

  def eval_fn(params, tokens):
    if objective in TRANSLATION_OBJECTIVES:
      _, metrics = _LOSSES[objective](logits_fn, params, tokens,
                                      jax.random.key(0), **options)
    elif objective == "ar":
      _, metrics = objectives.ar_eval(logits_fn, params, tokens)
    elif objective in ("bd3lm", "certainty_forcing"):  # the student's bound
      _, metrics = objectives.bd3lm_bound(logits_fn, params, tokens,
                                          jax.random.key(0), num_timesteps,
                                          block_length=block_length)
    elif objective == "uniform":
      _, metrics = objectives.uniform_bound(logits_fn, params, tokens,
                                            jax.random.key(0), num_timesteps)
    else:
      _, metrics = objectives.mdlm_bound(logits_fn, params, tokens,
                                         jax.random.key(0), num_timesteps)
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


def _fingerprint(config: ml_collections.ConfigDict) -> dict:
  """What a checkpoint must share with a config to be resumed or reused."""
  fingerprint = {"data": config.data.to_dict(),
                 "model": config.model.to_dict(),
                 "objective": config.train.objective}
  scheduled = scheduled_sampling(config)
  if scheduled is not None:  # absent: old checkpoints fit
    fingerprint["scheduled_sampling"] = list(scheduled)
  for key in ("init_from", "complementary_masks", "anneal_steps",
              "block_schedule", "prompt_length"):
    if config.train.get(key) is not None:  # absent: old checkpoints fit
      fingerprint[key] = config.train[key]
  return fingerprint


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
  peak measured at the start when that is 0 or absent).

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
  mesh, rules, shardings = _mesh_for(config, model_cfg)
  objective, num_steps = train_cfg.objective, train_cfg.num_steps
  if stop_at is not None and not is_count(stop_at, 1):
    raise ValueError(f"stop_at={stop_at!r} must be an integer >= 1")
  last = num_steps if stop_at is None else min(stop_at, num_steps)
  primary = jax.process_index() == 0  # writes the log, shows progress
  progress = progress and primary
  _check_workdir(workdir)
  train_packed, valid_batches = _checked_data(config, model_cfg,
                                              data_dir or workdir, progress)
  seq_len = train_packed.shape[1]
  optimizer = make_optimizer(train_cfg)
  init_key, step_key = jax.random.split(jax.random.key(config.seed))
  fingerprint = _fingerprint(config)
  log_path = os.path.join(workdir, "metrics.jsonl")
  tokens_per_step = train_cfg.batch_size * seq_len
  block_length = train_cfg.get("block_length")  # bd3lm only
  options = objective_options(config)
  schedule = block_schedule(config)
  train_steps = {  # one compiled step per block length of the schedule
      width: make_train_step(model_cfg, objective, optimizer, width,
                             scheduled_sampling(config), mesh=mesh,
                             rules=rules,
                             batch_shape=(train_cfg.batch_size, seq_len),
                             anneal_steps=train_cfg.get("anneal_steps", 0),
                             **options)
      for width in dict(schedule).values()}
  eval_fn = make_eval_fn(model_cfg, objective, train_cfg.mdlm_eval_timesteps,
                         block_length, **options)
  step_flops, peak_flops = _step_flops_and_peak(
      config, model_cfg, seq_len, 1 if mesh is None else mesh.devices.size)
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
    batches = _train_batches(config, train_packed, first, mesh, rules)
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
      tick = time.time()
      train_step = train_steps[objectives.block_length_at(schedule, step)]
      state, metrics = train_step(state, next(batches),
                                  jax.random.fold_in(step_key, step))
      loss = float(metrics["loss"])  # waits for the step, so the time is real
      seconds = time.time() - tick
      step_seconds.append(seconds)
      done = step + 1
      record, postfix = _step_record(done, loss, metrics, seconds,
                                     tokens_per_step, step_flops, peak_flops)
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
    measure = ("perplexity" if objective in ("ar", "translation_ar", "ctc")
               else "perplexity bound")
    print(f"{desc}: final validation {measure} {float(np.exp(valid_loss)):.2f}"
          f" at step {int(state.step)} ({workdir})")
  if primary:  # the whole run's steps, whichever calls trained them
    step_seconds = _logged_step_seconds(log_path, tokens_per_step)
  return _summary(objective, state, valid_loss, step_seconds, tokens_per_step,
                  step_flops, peak_flops, start_time)


def _mesh_for(config: ml_collections.ConfigDict, model_cfg: TransformerConfig
              ) -> tuple[Any, tuple, Any]:
  """(mesh or None, logical-axis rules, the train state's shardings or
  None) of `config.mesh`; raises ValueError for a batch size or parameter
  the mesh cannot split, before the workdir is touched."""
  mesh = sharding.mesh_or_none(config.get("mesh"))
  rules = sharding.rules_from_config(config.get("mesh"))
  if mesh is None:
    return None, rules, None
  sharding.batch_sharding(mesh, (config.train.batch_size,), rules)
  return mesh, rules, state_shardings(
      model_cfg, make_optimizer(config.train), mesh, rules)


def _checked_data(config: ml_collections.ConfigDict,
                  model_cfg: TransformerConfig, data_dir: str,
                  progress: bool) -> tuple[np.ndarray, np.ndarray]:
  """(train sequences int32[R, L], validation batches int32[n, B, L]):
  `training_data` checked against the model and the batch size (n =
  min(train.eval_batches, what the split holds)).

  Raises:
    ValueError: a tokenizer of another vocabulary size than the model's, a
      validation split with fewer than one batch.
  """
  train_cfg = config.train
  corpus, train_packed, valid_packed = training_data(config, data_dir)
  if progress:
    print(corpus.describe())
  if corpus.tokenizer.vocab_size != model_cfg.vocab_size:
    raise ValueError(
        f"tokenizer vocab_size={corpus.tokenizer.vocab_size} does not match "
        f"data.vocab_size={model_cfg.vocab_size}")
  seq_len = train_packed.shape[1]
  num_valid = min(train_cfg.eval_batches,
                  len(valid_packed) // train_cfg.batch_size)
  if num_valid < 1:
    raise ValueError(
        f"validation split has {len(valid_packed)} sequences of "
        f"seq_len={seq_len}: fewer than train.batch_size="
        f"{train_cfg.batch_size}")
  return train_packed, valid_packed[:num_valid * train_cfg.batch_size].reshape(
      num_valid, train_cfg.batch_size, seq_len)


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


def _train_batches(config: ml_collections.ConfigDict, train_packed: np.ndarray,
                   first: int, mesh, rules):
  """The batches of steps first, first + 1, ...: the same sequence on one
  device as on a mesh, where each process reads its rows only."""
  batch_size = config.train.batch_size
  if mesh is None:
    return pipeline.batches(train_packed, batch_size, config.seed,
                            start_step=first)
  return multihost.global_batches(
      train_packed, batch_size, config.seed,
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


def _step_flops_and_peak(config: ml_collections.ConfigDict,
                         model_cfg: TransformerConfig, seq_len: int,
                         devices: int) -> tuple[int | None, float | None]:
  """(model FLOPs of one train step, peak FLOP/s of the `devices` that run
  it) for the MFU, or (None, None) for an objective
  `cost_model.objective_flops` does not count (the translation ones). The
  peak is `devices` x `config.peak_flops` (one device's) or, when that is 0
  (the default), x `cost.measure_peak_flops` of the default device measured
  now, once a run (about 0.2 s). Scheduled sampling's extra forward pass
  (`objectives.ar_scheduled_sampling_loss`) is not counted."""
  objective = config.train.objective
  if objective not in cost_model.TRAINED_OBJECTIVES:
    return None, None
  flops = cost_model.objective_flops(model_cfg, objective,
                                     config.train.batch_size, seq_len)
  peak = config.get("peak_flops", 0.0) or cost.measure_peak_flops(
      PEAK_MATMUL_SIZE, runs=3)
  return flops, devices * float(peak)
