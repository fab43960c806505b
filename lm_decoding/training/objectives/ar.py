"""Next-token cross-entropy, plain (teacher forcing) or with scheduled
sampling (Bengio et al. 2015, in the two-pass form of Mihaylova & Martins
2019)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models.config import check_attention
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training.objectives.common import (
    check_tokens, summarise, target_log_probs, token_positions)


def ar_eval(logits_fn, params, tokens_BxL: jax.Array):
  """Next-token cross-entropy with teacher forcing (a causal LM); deterministic.

  Predicts tokens[:, 1:] from tokens[:, :-1] in one causal forward pass;
  targets that are PAD carry no loss.

  Args:
    logits_fn: the model (see the module docstring); causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] sequences (L >= 2), right-padded with PAD.
  Returns:
    (loss float32[] nats per scored token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L] with L >= 2, or a non-causal model.
  """
  check_tokens(tokens_BxL, min_length=2)
  check_attention(logits_fn, causal=True, user="ar_eval")
  return next_token_nll(logits_fn, params, tokens_BxL[:, :-1],
                         tokens_BxL[:, 1:])


def next_token_nll(logits_fn, params, inputs_BxT, targets_BxT):
  """One causal pass on inputs scored against targets (PAD: no loss)."""
  logits_BxTxV = logits_fn(params, inputs_BxT,
                           token_positions(inputs_BxT)).logits
  scored_BxT = targets_BxT != PAD_ID
  nll_BxT = jnp.where(scored_BxT,
                      -target_log_probs(logits_BxTxV, targets_BxT), 0.0)
  return summarise(nll_BxT.sum(), scored_BxT.sum())


def ar_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array):
  """`ar_eval` with the training signature; `key` is unused (no noise)."""
  del key
  return ar_eval(logits_fn, params, tokens_BxL)


def scheduled_sampling_probability(step, p_max: float,
                                   ramp_steps: int) -> jax.Array:
  """Linear ramp of the replacement probability: p_max * min(1, step / ramp).

  The "linear decay" of the teacher-forcing probability in Bengio et al.
  2015 ("Scheduled Sampling for Sequence Prediction with Recurrent Neural
  Networks"), written as the probability of using the model's token: 0 at
  step 0, p_max from step `ramp_steps` on (p_max at once when ramp_steps is
  0).

  Args:
    step: int[] or int training step (traced inside the train step).
    p_max: final probability, in [0, 1].
    ramp_steps: steps of the ramp, >= 0.
  Returns:
    float32[] probability in [0, p_max].
  """
  if not ramp_steps:
    return jnp.float32(p_max)
  ramp = jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / ramp_steps)
  return jnp.float32(p_max) * ramp


def _replaceable(inputs_BxT):
  """bool[B, T]: inputs scheduled sampling may replace (not PAD, i >= 1)."""
  return (inputs_BxT != PAD_ID) & (
      jnp.arange(inputs_BxT.shape[1]) >= 1)[None, :]


def scheduled_sampling_inputs(key: jax.Array, inputs_BxT: jax.Array,
                              logits_BxTxV: jax.Array, probability):
  """Teacher-forced inputs with some tokens replaced by the model's own.

  The two-pass approximation of scheduled sampling for Transformers
  (Mihaylova & Martins 2019, "Scheduled Sampling for Transformers"): the
  first, teacher-forced pass gives logits at every position; its prediction
  at position i (a sample from softmax(logits[:, i]), as Bengio et al. 2015
  sample from the model) stands for input i + 1. Each input position i >= 1
  whose token is not PAD takes that prediction with probability
  `probability`, independently; position 0 (no prediction before it) and
  PAD inputs are kept. No gradient flows through the first pass.

  Args:
    key: PRNG key (the predictions and the coin flips).
    inputs_BxT: int32[B, T] teacher-forced inputs.
    logits_BxTxV: float[B, T, V] logits of the first pass on `inputs_BxT`.
    probability: float32[] replacement probability in [0, 1].
  Returns:
    (mixed int32[B, T] inputs, replaced bool[B, T]: where a token was
    replaced; the fraction of eligible positions replaced is `probability`
    in expectation).
  """
  key_sample, key_coin = jax.random.split(key)
  predicted_BxT = jax.random.categorical(
      key_sample, jax.lax.stop_gradient(logits_BxTxV).astype(jnp.float32))
  shifted_BxT = jnp.concatenate(
      [inputs_BxT[:, :1], predicted_BxT[:, :-1].astype(inputs_BxT.dtype)],
      axis=1)
  replaced_BxT = _replaceable(inputs_BxT) & (
      jax.random.uniform(key_coin, inputs_BxT.shape) < probability)
  return jnp.where(replaced_BxT, shifted_BxT, inputs_BxT), replaced_BxT


def ar_scheduled_sampling_loss(logits_fn, params, tokens_BxL: jax.Array,
                               key: jax.Array, *, probability):
  """Next-token cross-entropy on inputs mixed by scheduled sampling.

  Pass 1: the teacher-forced forward pass of `ar_eval` (no gradient); pass
  2: the same model on `scheduled_sampling_inputs` (each non-PAD input
  i >= 1 replaced by pass 1's sampled prediction with probability
  `probability`), scored against the true targets tokens[:, 1:] (PAD
  targets carry no loss). Mihaylova & Martins 2019's two-pass approximation
  of Bengio et al. 2015 for a Transformer, whose true scheduled sampling
  would need T sequential passes. With probability 0 it is exactly
  `ar_loss`; validation stays `ar_eval` (teacher forcing).

  Args:
    logits_fn: the model (see the module docstring); causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] sequences (L >= 2), right-padded with PAD.
    key: PRNG key (predictions and coin flips).
    probability: float32[] replacement probability in [0, 1] (may be traced:
      the schedule `scheduled_sampling_probability` of the step).
  Returns:
    (loss float32[] nats per scored token, metrics) as in the module
    docstring, plus metrics['replaced']: float32[] fraction of eligible
    inputs replaced.
  Raises:
    ValueError: tokens not int[B, L] with L >= 2, or a non-causal model.
  """
  check_tokens(tokens_BxL, min_length=2)
  check_attention(logits_fn, causal=True, user="ar_scheduled_sampling")
  inputs_BxT = tokens_BxL[:, :-1]
  first_BxTxV = logits_fn(params, inputs_BxT,
                          token_positions(inputs_BxT)).logits
  mixed_BxT, replaced_BxT = scheduled_sampling_inputs(key, inputs_BxT,
                                                      first_BxTxV, probability)
  loss, metrics = next_token_nll(logits_fn, params, mixed_BxT,
                                  tokens_BxL[:, 1:])
  replaced = replaced_BxT.sum() / jnp.maximum(
      _replaceable(inputs_BxT).sum(), 1)
  return loss, dict(metrics, replaced=replaced.astype(jnp.float32))
