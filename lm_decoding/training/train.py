"""The training loop every model trains through: LM, translation and task.

`train(config, workdir)` trains (or resumes) the model `config` describes.
The LM objectives train on the packed text corpus, the translation
objectives on the verse pairs, the exact-answer task models (data.source
'task', `task_training`) on a task's rows given in memory: each reads its
rows through a data source (`data_sources`) and asks its objective's entry
(`registry.of_config`) for its loss and validation measure.

One jit-compiled step (`train_step`: AdamW, warmup + cosine decay,
global-norm clipping), deterministic validation, orbax checkpoints that
resume automatically, a progress bar with the latest loss, tokens/s and
model FLOP utilisation (MFU), and one JSON record per step appended to
`{workdir}/metrics.jsonl` (`run_log`; step 0 is the untrained model's
validation loss; evaluation steps add valid_loss and valid_ppl); the data
cache lives under `data_dir` (default `workdir`), shared by models trained
on the same data.

On a `config.mesh` other than one device the state is sharded by
`train_step.state_shardings`, batches by 'batch', and a checkpoint restored
straight onto the mesh, whatever mesh saved it; in a multi-process job every
process runs `train`, reads only its rows and shards, and process 0 alone
writes metrics.jsonl and shows progress.

`init_params` (`config`'s shapes, e.g. an AR parent's from
`loading.parent_params`) replaces the random initialisation of a fresh run
(the optimizer starts fresh); a resumed run ignores it. `stop_at` ends
the run after that step (validated and checkpointed there) although the
learning-rate schedule is train.num_steps': a budget cut short, reported as
such (the summary's `steps`); a run already past it is reported at its
latest step. The optional train.budget_s (seconds of training steps, over
every call of the run: a single-process budget such as the task models')
ends the run at the first step that reaches it, validated and checkpointed.

Every step's record holds its tokens/s, `train_s` (the seconds of the run's
training steps so far) and, for an LM objective, its MFU
(`cost.flop_utilisation` of `cost_model.objective_flops` against
`config.peak_flops`, or a peak measured at the start when that is 0 or
absent). The train step is compiled ahead of time, before the first timed
step, so no step's seconds (nor its tokens/s, its MFU, or `train_s`) hold
the compile: the first record of each call (a resume is another) holds that
call's `compile_s` and the `peak_flops` it measured against.

With `progress`, shows a bar (loss, tokens/s, MFU; 'eval' or 'save' while
validating or checkpointing), says so when it resumes, and prints the final
validation perplexity (MDLM: its upper bound) as one line.

`train` returns a summary: parameter count, steps, final validation loss
and perplexity (AR: perplexity; MDLM: perplexity bound); `train_s`, the
seconds of the run's training steps (from metrics.jsonl, so over every call
that trained them, resumes included; validation and checkpointing
excluded), and `train_tokens_per_s`, train tokens over the median step's
seconds; `wall_s`, this call's wall seconds (a resume of a finished run:
its own). For an LM objective also `flops_per_token` (model FLOPs of a step
per train token), `peak_flops` (FLOP/s of all the mesh's devices) and
`mfu`, the median step's model FLOP utilisation (a fraction); the exported
manifest's metrics are this summary.

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
import dataclasses
import math
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import tqdm

from lm_decoding.checks import is_count, is_number
from lm_decoding.models import TransformerConfig
from lm_decoding.parallel import sharding
from lm_decoding.training import data_sources
from lm_decoding.training import objectives
from lm_decoding.training import run_log
from lm_decoding.training import train_step as step_lib
from lm_decoding.training.objectives import registry
from lm_decoding.training.checkpoints import Checkpoints

OBJECTIVES = tuple(registry.OBJECTIVES)  # the names train.objective takes
TRANSLATION_OBJECTIVES = tuple(  # those that train on the verse pairs
    name for name, o in registry.OBJECTIVES.items() if o.data == "pairs")


def model_config(config: ml_collections.ConfigDict) -> TransformerConfig:
  """The backbone config of an experiment config (vocab from data, attention
  from the objective).

  Raises:
    ValueError: unknown objective, or data.seq_len above model.max_len.
  """
  entry = registry.of_config(config)
  length = entry.sequence_length(config)
  if length > config.model.max_len:
    what = (f"data.seq_len={length}" if entry.data != "pairs"
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
           ("data", "seq_len", 2))
_NUMBERS = (("train", "learning_rate", 0.0, False),
            ("train", "weight_decay", 0.0, True),
            ("train", "grad_clip_norm", 0.0, False))
# Optional: (section, key, what it must be), absent by default.
_OPTIONAL = (("train", "eval_batch_size", "an integer >= 1"),
             ("train", "budget_s", "a number in (0, inf]"))


def check_config(config: ml_collections.ConfigDict) -> TransformerConfig:
  """Checks every option `train` reads; returns the backbone config.

  Pure and fast: `train` calls it before touching the workdir, the data or
  the compiler.

  Raises:
    ValueError: naming the config key and its allowed range: seed not an
      integer >= 0; a count of `_COUNTS` not an integer >= its minimum; a
      rate of `_NUMBERS` not a finite number above 0 (weight decay: >= 0);
      an option of `_OPTIONAL` outside its range; peak_flops not a number
      >= 0; any error of `data_sources.check` (the data options of the
      config's source), of `registry.check_options` (the objective's own
      and optional keys) or of `model_config`.
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
  for section, key, what in _OPTIONAL:
    value = config[section].get(key)
    valid = (is_count(value) if key == "eval_batch_size"
             else is_number(value) and value > 0)
    if value is not None and not valid:
      raise ValueError(f"{section}.{key}={value!r} must be {what}")
  peak = config.get("peak_flops", 0.0)
  if not is_number(peak) or not 0 <= peak < math.inf:
    raise ValueError(f"peak_flops={peak!r} must be a number in [0, inf) "
                     "(0: measured at the start)")
  data_sources.check(config)
  registry.check_options(config)
  return model_config(config)


@dataclasses.dataclass(frozen=True)
class _Run:
  """What one call of `train` runs, read from its config once (`_plan`)."""

  desc: str  # the progress bar's
  objective: str  # train.objective
  bound_name: str  # what exp(validation loss) is
  seed: int
  batch_size: int
  num_steps: int
  last: int  # the last step this call may train (stop_at)
  eval_every: int
  checkpoint_every: int
  budget_s: float  # seconds of training steps; inf when unbounded
  fingerprint: dict
  log_path: str
  primary: bool  # process 0: writes the log
  progress: bool
  mesh: Any
  rules: Any
  schedule: tuple  # ((from step, block length), ...)
  train_steps: dict  # block length -> the (compiled) train step
  eval_fn: Any
  train_rows: np.ndarray  # int32[R, parts x L] (`Objective.row_parts`)
  row_parts: int  # the model's sequences in a row
  valid_batches: np.ndarray  # int32[n, B', L]
  step_flops: int | None
  peak_flops: float | None

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.train_rows.shape[1] // self.row_parts

  def ends_at(self, done: int, train_s: float) -> bool:
    """Whether the call stops after step `done`."""
    return done >= self.last or train_s >= self.budget_s


def _check_teacher(teacher, train_cfg) -> None:
  """Raises ValueError unless `teacher` is given exactly when train.teacher
  names one, and is a function of the tokens."""
  if (teacher is None) != (not train_cfg.get("teacher")):
    raise ValueError(f"train.teacher={train_cfg.get('teacher')!r} needs its "
                     "loaded next-token log-probabilities (teacher=, "
                     "`loading.teacher_log_probs`), and they need it")
  if teacher is not None and not callable(teacher):
    raise ValueError(f"teacher= must be a function of the tokens "
                     f"(`loading.teacher_log_probs`); got a "
                     f"{type(teacher).__name__}")


def _train_steps(config, model_cfg, optimizer, schedule, batch_shape, mesh,
                 rules, options: dict, teacher) -> dict:
  """{block length: the jitted train step} for each block length of the
  schedule, with the objective's `options` and the teacher, if any."""
  distillation = {} if teacher is None else {"teacher": teacher}
  return {width: step_lib.make_train_step(
              model_cfg, registry.of_config(config), optimizer, width,
              registry.scheduled_sampling(config), mesh=mesh, rules=rules,
              batch_shape=batch_shape,
              anneal_steps=config.train.get("anneal_steps", 0), **options,
              **distillation)
          for width in dict(schedule).values()}


def _plan(config: ml_collections.ConfigDict, workdir: str, data, data_dir,
          stop_at: int | None, progress: bool,
          teacher: Any = None) -> tuple[_Run, Any]:
  """(the `_Run` of `config`, (its backbone config, its optimizer)): every
  option checked (before the workdir is created), then the workdir, the
  data (`data`, else `data_sources.training_data`), the train and eval
  steps (not yet compiled) and the MFU's FLOPs and peak.

  Raises:
    ValueError: as `train` says, before anything is compiled.
  """
  model_cfg, entry = check_config(config), registry.of_config(config)
  train_cfg, optimizer = config.train, step_lib.make_optimizer(config.train)
  mesh = sharding.mesh_or_none(config.get("mesh"))
  rules = sharding.rules_from_config(config.get("mesh"))
  if mesh is not None:  # a batch or a parameter it cannot split fails here
    sharding.batch_sharding(mesh, (train_cfg.batch_size,), rules)
    step_lib.state_shardings(model_cfg, optimizer, mesh, rules)
  if stop_at is not None and not is_count(stop_at, 1):
    raise ValueError(f"stop_at={stop_at!r} must be an integer >= 1")
  _check_teacher(teacher, train_cfg)
  budget_s = train_cfg.get("budget_s") or math.inf
  if budget_s < math.inf and jax.process_count() > 1:
    raise ValueError("train.budget_s is a single-process budget; unset it "
                     "in a multi-process job")
  primary = jax.process_index() == 0  # writes the log, shows progress
  run_log.check_workdir(workdir)
  train_rows, valid_batches = data_sources.validation_batches(
      data_sources.training_data(config, data_dir) if data is None
      else data_sources.given_rows(data, config.data.seq_len,
                                   entry.row_parts),
      train_cfg.batch_size, train_cfg.get("eval_batch_size"),
      train_cfg.eval_batches, progress and primary)
  shape, options = train_rows.shape, entry.options(config)
  schedule = registry.block_schedule(config)
  train_steps = _train_steps(config, model_cfg, optimizer, schedule,
                             (train_cfg.batch_size, shape[1]), mesh, rules,
                             options, teacher)
  eval_fn = step_lib.make_eval_fn(model_cfg, entry,
                                  train_cfg.mdlm_eval_timesteps,
                                  train_cfg.get("block_length"), **options)
  step_flops, peak_flops = run_log.step_flops_and_peak(
      model_cfg, train_cfg.objective, train_cfg.batch_size, shape[1],
      1 if mesh is None else mesh.devices.size, config.get("peak_flops", 0.0))
  return _Run(
      desc=f"train {train_cfg.objective}", objective=train_cfg.objective,
      bound_name=entry.bound_name, seed=config.seed,
      batch_size=train_cfg.batch_size, num_steps=train_cfg.num_steps,
      last=min(stop_at or train_cfg.num_steps, train_cfg.num_steps),
      eval_every=train_cfg.eval_every,
      checkpoint_every=train_cfg.checkpoint_every, budget_s=budget_s,
      fingerprint=registry.fingerprint(config),
      log_path=os.path.join(workdir, "metrics.jsonl"), primary=primary,
      progress=progress and primary, mesh=mesh, rules=rules,
      schedule=schedule, train_steps=train_steps, eval_fn=eval_fn,
      train_rows=train_rows, row_parts=entry.row_parts,
      valid_batches=valid_batches, step_flops=step_flops,
      peak_flops=peak_flops), (model_cfg, optimizer)


def train(config: ml_collections.ConfigDict, workdir: str,
          progress: bool = True, data_dir: str | None = None,
          stop_at: int | None = None, init_params: Any = None,
          data: tuple | None = None, teacher: Any = None) -> dict:
  """Trains (or resumes) the model described by `config` under `workdir`
  (module docstring: what it writes, resumes and returns).

  `data` is the (data, train rows, valid rows) of a data source the caller
  read (`data_sources.task_rows`); None reads `config`'s
  (`data_sources.training_data`, cached in `data_dir`, default `workdir`).
  `teacher` is train.teacher's next-token log-probabilities
  (`loading.teacher_log_probs`), given exactly when that key is set.

  Raises:
    ValueError: any error of `check_config` or of the mesh (a bad
      `config.mesh`, a batch size or parameter it cannot split; raised
      before the workdir is created), a `teacher` without train.teacher or
      the reverse, or not callable, bad data (`data_sources.given_rows`),
      a workdir that is a file or not writable (all before compiling).
    CheckpointError: an existing checkpoint that does not fit `config`.
    CheckpointWriteError: a checkpoint could not be written (full disk,
      read-only file system); the earlier checkpoints are intact.
    OSError: `metrics.jsonl` could not be written (the message names it).
  """
  start_time = time.time()
  run, (model_cfg, optimizer) = _plan(config, workdir, data,
                                      data_dir or workdir, stop_at, progress,
                                      teacher)
  with contextlib.ExitStack() as stack:
    checkpoints = stack.enter_context(Checkpoints(
        os.path.join(workdir, "checkpoints"), config.train.keep_checkpoints))
    resume = run_log.check_resume(checkpoints, run.fingerprint)  # no compile
    state = step_lib.init_state(model_cfg, optimizer,
                                jax.random.split(jax.random.key(run.seed))[0])
    if run.mesh is not None:  # also the target shardings of a restore
      state = jax.device_put(state, step_lib.state_shardings(
          model_cfg, optimizer, run.mesh, run.rules))
    state, train_s = run_log.start_state(checkpoints, state, resume,
                                         init_params, run.log_path,
                                         run.primary)
    if resume and run.progress:
      print(f"{run.desc}: resuming from step {int(state.step)} of "
            f"{checkpoints.directory}")
    bar = stack.enter_context(tqdm.tqdm(  # closed before any error prints
        initial=int(state.step), total=run.num_steps,
        disable=not run.progress, desc=run.desc, unit="step"))
    state, valid_loss = _loop(run, state, train_s, checkpoints, bar)
  if run.progress:
    print(f"{run.desc}: final validation {run.bound_name} "
          f"{float(np.exp(valid_loss)):.2f} at step {int(state.step)} "
          f"({workdir})")
  step_seconds = (run_log.logged_step_seconds(run.log_path,
                                              run.tokens_per_step)
                  if run.primary else [])  # every call's steps
  return run_log.summary(run.objective, state, valid_loss, step_seconds,
                         run.tokens_per_step, run.step_flops, run.peak_flops,
                         start_time)


def _validate(run: _Run, params, bar) -> float:
  """The validation loss of `params` (nats per token), the bar saying so."""
  bar.set_description(f"{run.desc}: eval")
  loss = step_lib.evaluate(run.eval_fn, params, run.valid_batches)
  bar.set_description(run.desc)
  return loss


def _loop(run: _Run, state, train_s: float, checkpoints: Checkpoints,
          bar) -> tuple[Any, float]:
  """Trains `state` (after `train_s` seconds of training steps) from its
  step to the call's end (`_Run.ends_at`), logging each step before its
  checkpoint; returns (state, the last validation loss)."""
  first = int(state.step)
  if first >= run.last or train_s >= run.budget_s:  # nothing left to train
    return state, step_lib.evaluate(run.eval_fn, state.params,
                                    run.valid_batches)
  valid_loss = math.nan
  if first == 0:  # the untrained baseline, so every log shows the drop
    valid_loss = _validate(run, state.params, bar)
    if run.primary:
      run_log.append_record(run.log_path, {
          "step": 0, "valid_loss": valid_loss,
          "valid_ppl": float(np.exp(valid_loss))})
  batches = data_sources.train_batches(run.train_rows, run.batch_size,
                                       run.seed, first, run.mesh, run.rules)
  # Compiled before the first timed step, so that no step's seconds (nor
  # train_s, nor the MFU) hold the compile; its seconds are recorded apart.
  train_steps, compile_s = step_lib.compiled_steps(
      run.train_steps, state, (run.batch_size, run.train_rows.shape[1]),
      run.mesh, run.rules)
  step_key = jax.random.split(jax.random.key(run.seed))[1]
  for step in range(first, run.last):
    train_step = train_steps[objectives.block_length_at(run.schedule, step)]
    tick = time.time()
    state, metrics = train_step(state, next(batches),
                                jax.random.fold_in(step_key, step))
    loss = float(metrics["loss"])  # waits for the step, so the time is real
    seconds = time.time() - tick
    train_s, done = train_s + seconds, step + 1
    record, postfix = run_log.step_record(
        done, loss, metrics, seconds, train_s, run.tokens_per_step,
        run.step_flops, run.peak_flops)
    if step == first:  # this call's compile, and the peak it measured
      record.update(compile_s=compile_s, peak_flops=run.peak_flops)
    bar.set_postfix(**postfix, refresh=False)
    bar.update(1)
    valid_loss = _end_step(run, state, done, train_s, record, valid_loss,
                           checkpoints, bar)
    if run.ends_at(done, train_s):
      break
  return state, valid_loss


def _end_step(run: _Run, state, done: int, train_s: float, record: dict,
              valid_loss: float, checkpoints: Checkpoints, bar) -> float:
  """Validates (every eval_every steps and at the call's end), appends
  step `done`'s `record`, then checkpoints (every checkpoint_every steps and
  at the end); returns the latest validation loss."""
  end = run.ends_at(done, train_s)
  if done % run.eval_every == 0 or end:
    valid_loss = _validate(run, state.params, bar)
    record.update(valid_loss=valid_loss, valid_ppl=float(np.exp(valid_loss)))
  if run.primary:  # before the checkpoint of this step
    run_log.append_record(run.log_path, record)
  if done % run.checkpoint_every == 0 or end:
    bar.set_description(f"{run.desc}: save")
    checkpoints.save(done, state, {"fingerprint": run.fingerprint,
                                   "valid_loss": valid_loss,
                                   "train_s": train_s})
    bar.set_description(run.desc)
  return valid_loss
