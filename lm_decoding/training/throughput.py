"""Training throughput: tokens/s, model FLOPs and MFU of an objective's step.

For one experiment config (`config.train.objective`, its batch and sequence
length) `measure` times two jitted programs on a batch of random tokens
(ids drawn uniformly from the non-reserved ones; the speed does not depend
on the values):

  train step  `train_step.make_train_step`: forward, backward and the AdamW
              update, the state donated and threaded through the calls as
              in training;
  forward     the objective's loss without a gradient: one forward pass
              over the same batch, what one denoising step costs.

Each is compiled ahead of time (compile time apart), warmed up, then timed
over `runs` calls (`cost.measure`; the median is reported). Model FLOPs are
`cost_model.objective_flops` (6 N + 12 n_layers S H Dh per position for a
step, a third of it forward only); `Throughput.mfu` is their rate over the
median time against a peak (e.g. `cost.measure_peak_flops`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm_decoding.evaluation import cost
from lm_decoding.evaluation import cost_model
from lm_decoding.models import make_logits_fn
from lm_decoding.special_tokens import RESERVED_IDS
from lm_decoding.training import train
from lm_decoding.training import train_step


@dataclasses.dataclass(frozen=True)
class Throughput:
  """One timed program.

  Attributes:
    objective: 'ar', 'mdlm' or 'bd3lm'.
    program: 'train step' or 'forward'.
    batch_size: B, rows.
    seq_len: L, data tokens per row.
    compile_s: XLA compile time, seconds.
    median_ms: median wall time of a call, ms.
    iqr_ms: interquartile range of the calls, ms.
    tokens_per_s: B L data tokens / median time.
    flops_per_token: model FLOPs per data token
      (`cost_model.objective_flops` / (B L)).
    gflops_per_s: model FLOPs / median time, 1e9 FLOP/s.
  """

  objective: str
  program: str
  batch_size: int
  seq_len: int
  compile_s: float
  median_ms: float
  iqr_ms: float
  tokens_per_s: float
  flops_per_token: float
  gflops_per_s: float

  def mfu(self, peak_flops: float) -> float:
    """Model FLOP utilisation against `peak_flops` (FLOP/s), a fraction.

    Raises:
      ValueError: peak_flops <= 0.
    """
    return cost.flop_utilisation(self.gflops_per_s * 1e9, 1.0, peak_flops)


def random_batch(config: ml_collections.ConfigDict) -> jax.Array:
  """int32[B, L] tokens of `config` (train.batch_size x data.seq_len),
  uniform over the non-reserved ids, seed 0."""
  shape = (config.train.batch_size, config.data.seq_len)
  return jnp.asarray(np.random.RandomState(0).randint(
      max(RESERVED_IDS) + 1, config.data.vocab_size, shape), jnp.int32)


def _record(config, program, timing: cost.Timing, flops: int
            ) -> Throughput:
  batch, length = config.train.batch_size, config.data.seq_len
  return Throughput(
      objective=config.train.objective, program=program, batch_size=batch,
      seq_len=length, compile_s=timing.compile_s,
      median_ms=timing.median_s * 1e3, iqr_ms=timing.iqr_s * 1e3,
      tokens_per_s=batch * length / timing.median_s,
      flops_per_token=flops / (batch * length),
      gflops_per_s=flops / timing.median_s / 1e9)


def measure(config: ml_collections.ConfigDict, warmup: int = 2,
            runs: int = 5) -> tuple[Throughput, Throughput]:
  """(train step, forward) throughput of `config`'s objective.

  Args:
    config: an experiment config (configs/tiny.py layout) whose
      train.objective is one of `cost_model.TRAINED_OBJECTIVES`.
    warmup: untimed calls after compiling, >= 0.
    runs: timed calls, >= 1.
  Raises:
    ValueError: before compiling: an objective `cost_model.objective_flops`
      does not count, any error of `train.check_config`, warmup < 0 or
      runs < 1.
  """
  objective = config.train.objective
  if objective not in cost_model.TRAINED_OBJECTIVES:
    raise ValueError(f"train.objective={objective!r}; allowed: "
                     f"{cost_model.TRAINED_OBJECTIVES}")
  if warmup < 0 or runs < 1:
    raise ValueError(f"warmup={warmup} must be >= 0 and runs={runs} >= 1")
  model_cfg = train.check_config(config)
  batch, length = config.train.batch_size, config.data.seq_len
  optimizer = train_step.make_optimizer(config.train)
  block_length = config.train.get("block_length")
  step = train_step.make_train_step(model_cfg, objective, optimizer,
                                    block_length)
  state = train_step.init_state(model_cfg, optimizer,
                                jax.random.key(config.seed))
  tokens, key = random_batch(config), jax.random.key(1)
  loss_fn = train_step.objective_loss(objective, block_length)
  logits_fn = make_logits_fn(model_cfg)
  forward = jax.jit(lambda p, t, k: loss_fn(logits_fn, p, t, k)[0])
  forward_timing = cost.measure(forward, (state.params, tokens, key),
                                warmup, runs)[0]
  step_timing = cost.measure(step, (state, tokens, key), warmup, runs,
                             carry=True)[0]
  flops = cost_model.objective_flops(model_cfg, objective, batch, length)
  return (_record(config, "train step", step_timing, flops),
          _record(config, "forward", forward_timing, flops // 3))
