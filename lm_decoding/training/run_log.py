"""What a training run writes and reads back beside its checkpoints.

`metrics.jsonl` (one JSON record per step, appended before the step's
checkpoint, rewound to the checkpoint a run resumes from), the per-step
record (loss, tokens/s, MFU, the seconds of training steps so far), the
run's summary, the model FLOPs and peak the MFU is taken against, and the
checks of the workdir and of a checkpoint to resume (see `train`'s module
docstring for what a crash loses).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model
from lm_decoding.models import TransformerConfig, count_params
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

PEAK_MATMUL_SIZES = (256, 512, 1024)  # the matmuls `train` takes its peak of


def append_record(path: str, record: dict) -> None:
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


def rewind_metrics(path: str, last_step: int) -> None:
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


def logged_step_seconds(path: str, tokens_per_step: int) -> list[float]:
  """Seconds of every training step recorded in `path` (each record's
  tokens_per_s), over every process that trained this run; [] if none."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = [json.loads(line) for line in f if line.endswith("\n")]
  return [tokens_per_step / r["tokens_per_s"] for r in records
          if r.get("tokens_per_s")]


def check_workdir(workdir: str) -> None:
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


def check_resume(checkpoints: Checkpoints, fingerprint: dict) -> bool:
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


# The metrics beside the loss that a step record keeps when the objective
# returns them: scheduled sampling's replaced fraction; certainty forcing's
# cross-entropy, entropy and the fraction of masked tokens already right,
# with a teacher the cross-entropy against it at the block anchors or of the
# causal view, and the consistency term; Jacobi forcing's AR cross-entropy.
LOSS_TERMS = ("replaced", "ce", "entropy", "correct", "teacher_ce",
              "view_ce", "consistency", "ar_ce")


def step_record(done: int, loss: float, metrics: dict, seconds: float,
                train_s: float, tokens_per_step: int, step_flops: int | None,
                peak_flops: float | None) -> tuple[dict, dict]:
  """(metrics.jsonl record of step `done`, the progress bar's postfix):
  loss, tokens/s, gradient norm, `train_s` (the seconds of the run's
  training steps so far, resumes included), the MFU where it applies, and
  the `LOSS_TERMS` the objective's metrics hold."""
  record = {"step": done, "loss": loss,
            "tokens_per_s": tokens_per_step / seconds,
            "grad_norm": float(metrics["grad_norm"]), "train_s": train_s}
  postfix = dict(loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
  if step_flops is not None:
    record["mfu"] = cost.flop_utilisation(step_flops, seconds, peak_flops)
    postfix["mfu"] = f"{record['mfu']:.0%}"
  for term in LOSS_TERMS:
    if term in metrics:
      record[term] = float(metrics[term])
  return record, postfix


def summary(objective: str, state, valid_loss: float,
            step_seconds: list[float], tokens_per_step: int,
            step_flops: int | None, peak_flops: float | None,
            start_time: float) -> dict:
  """`train.train`'s return value (see the `train` module docstring) for
  the TrainState `state` it ends with."""
  out = {"objective": objective, "num_params": count_params(state.params),
         "steps": int(state.step), "valid_loss": valid_loss,
         "valid_ppl": float(np.exp(valid_loss)),
         "train_s": float(np.sum(step_seconds)),
         "train_tokens_per_s": (tokens_per_step / np.median(step_seconds)
                                if step_seconds else 0.0),
         "wall_s": time.time() - start_time}
  if step_flops is not None:
    out.update(
        flops_per_token=step_flops / tokens_per_step, peak_flops=peak_flops,
        mfu=(cost.flop_utilisation(step_flops, float(np.median(step_seconds)),
                                   peak_flops) if step_seconds else 0.0))
  return out


def step_flops_and_peak(model_cfg: TransformerConfig, objective: str,
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


def start_state(checkpoints: Checkpoints, fresh, resume: bool,
                init_params: Any, log_path: str, primary: bool
                ) -> tuple[Any, float]:
  """(the TrainState a run starts from, the seconds of training steps before
  it): the latest checkpoint restored onto `fresh`'s shardings when
  `resume` (its seconds from the checkpoint's metadata; 0 for one written
  before they were kept), else `fresh` (with a copy of `init_params` when given) and 0; the
  metrics log is cut back to that step.

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
      rewind_metrics(log_path, -1)
    return state, 0.0
  state, meta = checkpoints.restore(fresh)
  if primary:
    rewind_metrics(log_path, int(state.step))
  return state, float(meta.get("train_s", 0.0))
