"""Training objectives: next-token cross-entropy, the MDLM, BD3-LM and uniform-state NELBOs.

Each objective is a pure function of (params, tokens, key) once the model is
bound, so it can be jitted and differentiated:

    loss_fn = functools.partial(mdlm_loss, make_logits_fn(config))
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens, key)

The model enters as a `logits_fn`, the decoder boundary of
`lm_decoding.decoding.base`: (params, tokens, positions, cache=None,
attention_mask=None) -> `ModelOutput` (float32 logits, cache, hidden).
`make_logits_fn(config)` is hashable (usable as a static jit argument) and
tests pass stub logits instead. When `logits_fn` has a `config`, its attention kind is checked:
a causal model for `ar_*`, a non-causal one for `mdlm_*` and `bd3lm_*` (BD3-LM
passes its own block masks).

Self-conditioning (Chen et al. 2022, arXiv:2208.04202; DiffusionGemma),
read from the model (`TransformerConfig.self_conditioning`), in `mdlm_*` and
`uniform_*`: a first pass at x_t without a previous prediction gives
probabilities (gradient stopped) that a second pass takes as its input, in
a random half of the training rows (`self_conditioning_rows`; zeros in the
others) and in every row of the validation bounds. The first pass is a
function of x_t alone, so either way the second pass is a denoiser of x_t
and its loss the exact NELBO of the model given its input; the bounds are
those of the two-pass model the sampler runs (2K passes).

Every objective returns `(loss, metrics)`:
  metrics['nll']:    float32[] negative log-likelihood (for MDLM and BD3-LM,
                     its upper bound, the NELBO) summed over the batch, in
                     nats.
  metrics['tokens']: float32[] number of scored tokens.
  metrics['loss']:   nll / tokens, the returned loss (nats per token).
Validation sums 'nll' and 'tokens' over batches and reports
exp(sum nll / sum tokens) as perplexity (an upper bound of it for MDLM and
BD3-LM).

PAD (id 0) marks positions outside a sequence: never a target, never masked.

Adapting an AR parent (DiffuLLaMA, Gong et al. 2025; Fast-dLLM v2, Wu et al.
2025; SDAR, Cheng et al. 2025) uses three options of the diffusion
objectives, each keeping the loss the exact NELBO of the resulting model:
  token shift    read from the model (`TransformerConfig.token_shift`): the
                 logits at i predict token i + 1 (`diffusion.shift_logits`),
                 so the parent's head keeps its alignment; token 0 has no
                 predictor and is never masked nor counted (as AR's
                 `ar_eval` scores tokens 1..L-1). In BD3-LM the first token
                 of block n is predicted from the clean copy's last token of
                 block n - 1, the others from the noisy block: with blocks of
                 1 every prediction is the parent's causal one.
  complementary  each row is scored twice, once with its mask and once with
                 the complement (every maskable token masked in exactly one
                 of the pair, `complement`), the complement at the time t'
                 whose masking probability is 1 - that of t: both halves
                 estimate the same NELBO, and every token trains.
  visible_ahead  (MDLM) attention-mask annealing: a query sees the keys at
                 most this many positions ahead of it (0: causal, L - 1:
                 bidirectional); the train step anneals it linearly
                 (`visible_ahead`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm_decoding.models import diffusion, masks
from lm_decoding.models.config import check_attention, self_conditioned
from lm_decoding.models.config import token_shift as shifted
from lm_decoding.models.diffusion import (
    EPS, log_linear_alpha, log_linear_alpha_prime, shift_logits)
from lm_decoding.special_tokens import MASK_ID, PAD_ID


def _check_tokens(tokens_BxL, min_length: int) -> None:
  if tokens_BxL.ndim != 2 or not jnp.issubdtype(tokens_BxL.dtype, jnp.integer):
    raise ValueError(f"tokens must be int[B, L]; got {tokens_BxL.dtype}"
                     f"{list(tokens_BxL.shape)}")
  if tokens_BxL.shape[1] < min_length:
    raise ValueError(f"tokens length L={tokens_BxL.shape[1]} must be >= "
                     f"{min_length}")


def _positions(tokens_BxL):
  return jnp.broadcast_to(
      jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)


def _gather(log_probs_BxLxV, ids_BxL):
  return jnp.take_along_axis(log_probs_BxLxV, ids_BxL[..., None], axis=-1)[..., 0]


def target_log_probs(logits_BxLxV: jax.Array, targets_BxL: jax.Array,
                     excluded: int | None = None) -> jax.Array:
  """float32[B, L]: log softmax(logits)[b, l, targets[b, l]], as
  logits[target] - logsumexp(logits), the log-probabilities [B, L, V] never
  materialised.

  Equal to `_gather(jax.nn.log_softmax(logits), targets)` up to float32
  rounding; with `excluded` (SUBS's MASK id) that id gets probability 0 as
  in `diffusion.subs_log_probs`, whose value this is at a masked position.
  The target's logit is picked by comparing ids (a select, fused into the
  reductions), not gathered: a gather's gradient is a scatter into a zero
  [B, L, V] buffer, and excluding an id with `.at[].set` copies the logits
  (together 0.4 s of a 9 s base MDLM train step on a busy 2-core CPU;
  benchmarks/training_speed/loss/).

  Args:
    logits_BxLxV: float[B, L, V] logits (any float dtype).
    targets_BxL: int[B, L] ids in [0, V).
    excluded: an id given probability 0, or None.
  """
  logits = logits_BxLxV.astype(jnp.float32)
  ids_BxLxV = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
  if excluded is not None:
    logits = jnp.where(ids_BxLxV == excluded,
                       jnp.finfo(jnp.float32).min / 2, logits)
  target_BxL = jnp.sum(jnp.where(ids_BxLxV == targets_BxL[..., None], logits,
                                 0.0), axis=-1)
  return target_BxL - jax.nn.logsumexp(logits, axis=-1)


def _summarise(nll, tokens):
  nll = nll.astype(jnp.float32)
  tokens = tokens.astype(jnp.float32)
  loss = nll / jnp.maximum(tokens, 1.0)
  return loss, {"loss": loss, "nll": nll, "tokens": tokens}


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
  _check_tokens(tokens_BxL, min_length=2)
  check_attention(logits_fn, causal=True, user="ar_eval")
  return _next_token_nll(logits_fn, params, tokens_BxL[:, :-1],
                         tokens_BxL[:, 1:])


def _next_token_nll(logits_fn, params, inputs_BxT, targets_BxT):
  """One causal pass on inputs scored against targets (PAD: no loss)."""
  logits_BxTxV = logits_fn(params, inputs_BxT, _positions(inputs_BxT)).logits
  scored_BxT = targets_BxT != PAD_ID
  nll_BxT = jnp.where(scored_BxT,
                      -target_log_probs(logits_BxTxV, targets_BxT), 0.0)
  return _summarise(nll_BxT.sum(), scored_BxT.sum())


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
  _check_tokens(tokens_BxL, min_length=2)
  check_attention(logits_fn, causal=True, user="ar_scheduled_sampling")
  inputs_BxT = tokens_BxL[:, :-1]
  first_BxTxV = logits_fn(params, inputs_BxT, _positions(inputs_BxT)).logits
  mixed_BxT, replaced_BxT = scheduled_sampling_inputs(key, inputs_BxT,
                                                      first_BxTxV, probability)
  loss, metrics = _next_token_nll(logits_fn, params, mixed_BxT,
                                  tokens_BxL[:, 1:])
  replaced = replaced_BxT.sum() / jnp.maximum(
      _replaceable(inputs_BxT).sum(), 1)
  return loss, dict(metrics, replaced=replaced.astype(jnp.float32))


def sample_times(key: jax.Array, batch_size: int,
                 t_min: float = EPS) -> jax.Array:
  """Antithetic diffusion times of MDLM (Sahoo et al. 2024), float32[B].

  t_i = t_min + (1 - t_min) * ((u + i / B) mod 1) for one u ~ U[0, 1): one
  time in each of B equal strata of [t_min, 1), which lowers the variance of
  the batch NELBO estimate. t_min > 0 keeps the 1/t loss weight bounded.
  """
  u = jax.random.uniform(key, (), jnp.float32)
  return t_min + (1.0 - t_min) * jnp.mod(
      u + jnp.arange(batch_size, dtype=jnp.float32) / batch_size, 1.0)


def mask_at_time(key: jax.Array, x0_BxL: jax.Array, t_B: jax.Array,
                mask_id: int = MASK_ID, eps: float = EPS) -> jax.Array:
  """Samples the absorbing forward process q(x_t | x_0) of masked diffusion.

  Each non-PAD token independently becomes `mask_id` with probability
  1 - alpha_t (log-linear schedule, `diffusion.log_linear_alpha(t, eps)`);
  PAD is never masked.

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] clean tokens.
    t_B: float32[B] diffusion times in [0, 1].
    mask_id: the MASK token id.
    eps: schedule parameter, alpha_1 = eps.
  Returns:
    int32[B, L] x_t.
  """
  return diffusion.mask_tokens(key, x0_BxL, log_linear_alpha(t_B, eps),
                               mask_id)


def maskable(x0_BxL: jax.Array, token_shift: bool) -> jax.Array:
  """bool[B, L]: the tokens the forward process may mask and the NELBO
  scores: every non-PAD token, less token 0 under a token shift."""
  keep_BxL = x0_BxL != PAD_ID
  if token_shift:
    keep_BxL &= (jnp.arange(x0_BxL.shape[1]) >= 1)[None, :]
  return keep_BxL


def complement(x0_BxL: jax.Array, x_t_BxL: jax.Array, t: jax.Array,
               maskable_BxL: jax.Array, *, mask_id: int = MASK_ID,
               eps: float = EPS):
  """Complementary masks (Fast-dLLM v2, Wu et al. 2025): rows [x_t ; x_t'].

  x_t' masks exactly the maskable tokens x_t leaves visible, so each
  maskable token is masked in exactly one row of the pair. Under the
  log-linear schedule a token is masked at time t with probability
  (1 - eps) t; x_t' is the masking at t' = 1 / (1 - eps) - t, whose
  probability is 1 - (1 - eps) t, so both rows are draws of the forward
  process and weigh their terms by 1 / t and 1 / t'.

  Args:
    x0_BxL: int32[B, L] clean tokens.
    x_t_BxL: int32[B, L] their masking at t.
    t: float32[B] or float32[B, L] times.
    maskable_BxL: bool[B, L] (`maskable`).
  Returns:
    (x0 int32[2B, L], x_t int32[2B, L], t float32[2B] or [2B, L]).
  """
  flipped_BxL = jnp.where(maskable_BxL & (x_t_BxL != mask_id), mask_id,
                          x0_BxL)
  t_prime = 1.0 / (1.0 - eps) - t
  return (jnp.concatenate([x0_BxL, x0_BxL]),
          jnp.concatenate([x_t_BxL, flipped_BxL]),
          jnp.concatenate([t, t_prime]))


def visible_ahead(step, anneal_steps: int, length: int) -> jax.Array:
  """int32[]: how far ahead a query sees at `step` of mask annealing.

  DiffuLLaMA's attention-mask annealing (Gong et al. 2025) as a band that
  widens linearly: floor((L - 1) * min(1, step / anneal_steps)): 0 (the
  causal mask) at step 0, L - 1 (bidirectional) from step `anneal_steps`
  on (at once when anneal_steps is 0).
  """
  if not anneal_steps:
    return jnp.int32(length - 1)
  fraction = jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / anneal_steps)
  return jnp.floor((length - 1) * fraction).astype(jnp.int32)


def parse_block_schedule(text: str, seq_len: int,
                         block_length: int) -> tuple[tuple[int, int], ...]:
  """The block-size schedule "s0:W0,s1:W1,..." as ((s0, W0), (s1, W1), ...).

  From step s_i on (until s_{i+1}) BD3-LM trains with blocks of W_i: LLaDA
  2.0's warm-up / stable / decay of the block size when adapting an AR model
  (small blocks, growing to long ones, then back to the block length the
  model is decoded with). Example: "0:1,50:16,100:256,200:4" for L = 256.

  Args:
    text: comma-separated step:block_length pairs.
    seq_len: L; every W_i must divide it.
    block_length: the model's block length (`train.block_length`, the one
      its bound is evaluated and it is decoded with): the last W_i.
  Raises:
    ValueError: naming train.block_schedule, unless s0 = 0, the steps rise
      strictly, every W_i is an integer in [1, L] dividing L, and the last
      W_i is block_length.
  """
  allowed = (f"train.block_schedule={text!r} must be 'step:block_length' "
             "pairs joined by commas, steps rising from 0, each block length "
             f"dividing data.seq_len={seq_len}, the last equal to "
             f"train.block_length={block_length}")
  try:
    pairs = tuple(tuple(int(x) for x in item.split(":"))
                  for item in str(text).split(","))
  except ValueError:
    raise ValueError(allowed) from None
  steps = [pair[0] for pair in pairs]
  if (any(len(pair) != 2 for pair in pairs) or steps[0] != 0
      or any(b <= a for a, b in zip(steps, steps[1:]))
      or any(not 1 <= w <= seq_len or seq_len % w for _, w in pairs)
      or pairs[-1][1] != block_length):
    raise ValueError(allowed)
  return pairs


def block_length_at(schedule: tuple[tuple[int, int], ...], step: int) -> int:
  """W at training `step` (an int) under a `parse_block_schedule` schedule."""
  return [w for start, w in schedule if start <= step][-1]


def mdlm_nelbo_terms(logits_BxLxV: jax.Array, x0_BxL: jax.Array,
                     x_t_BxL: jax.Array, t_B: jax.Array,
                     mask_id: int = MASK_ID, eps: float = EPS) -> jax.Array:
  """Per-position integrand of MDLM's continuous-time NELBO at time t.

  term[b, l] = -alpha'_t / (1 - alpha_t) * -log p_theta(x0[b, l] | x_t[b])
  where x_t[b, l] is MASK (and x0[b, l] is not PAD), 0 elsewhere; p_theta is
  the SUBS parameterisation (`diffusion.subs_log_probs`: MASK never predicted,
  unmasked positions carried over). With the log-linear schedule the weight
  is 1 / t. Sahoo et al. 2024, "Simple and Effective Masked Diffusion
  Language Models", eq. 10: NELBO = E_{t ~ U(0,1], x_t} sum_l term[l].

  Args:
    logits_BxLxV: float[B, L, V] denoiser logits (any float dtype).
    x0_BxL: int32[B, L] clean tokens.
    x_t_BxL: int32[B, L] masked tokens.
    t_B: float32[B] times in (0, 1] (t = 0 gives an infinite weight), or
      float32[B, L], one time per position (BD3-LM: one per block).
    mask_id: the MASK token id.
    eps: schedule parameter, alpha_1 = eps.
  Returns:
    float32[B, L] terms, in nats.
  """
  t_BxL = jnp.asarray(t_B, jnp.float32)
  if t_BxL.ndim == 1:
    t_BxL = t_BxL[:, None]
  weight_BxL = -log_linear_alpha_prime(t_BxL, eps) / (
      1.0 - log_linear_alpha(t_BxL, eps))
  scored_BxL = (x_t_BxL == mask_id) & (x0_BxL != PAD_ID)
  log_probs_BxL = target_log_probs(logits_BxLxV, x0_BxL, excluded=mask_id)
  return jnp.where(scored_BxL, weight_BxL * -log_probs_BxL, 0.0)


SELF_CONDITIONING_RATE = 0.5  # the training rows self-conditioned
_SELF_CONDITIONING_KEY = 2**31 - 2  # fold_in of the loss key for the rows


def self_conditioning_rows(key: jax.Array, batch: int,
                           rate: float = SELF_CONDITIONING_RATE) -> jax.Array:
  """bool[B]: the training rows given the first pass's prediction (each
  with probability `rate`, as Chen et al. 2022 and DiffusionGemma's
  training); the others get zeros."""
  return jax.random.uniform(key, (batch,)) < rate


def denoiser_logits(logits_fn, params, x_t_BxL: jax.Array,
                    attention_mask: jax.Array, rows_B: jax.Array | None
                    ) -> jax.Array:
  """float32[B, L, V] logits of the denoiser at x_t (positions 0..L-1).

  A model without self-conditioning (`self_conditioned`) runs once, as
  always. One with it runs twice: first without a previous prediction,
  then with that pass's probabilities (softmax of its logits, gradient
  stopped) as its input in the rows of `rows_B` (all rows when None) and
  zeros elsewhere.
  """
  positions = _positions(x_t_BxL)
  logits = logits_fn(params, x_t_BxL, positions,
                     attention_mask=attention_mask).logits
  if not self_conditioned(logits_fn):
    return logits
  probs = jax.lax.stop_gradient(jax.nn.softmax(logits.astype(jnp.float32)))
  if rows_B is not None:
    probs = jnp.where(rows_B[:, None, None], probs, 0.0)
  return logits_fn(params, x_t_BxL, positions, attention_mask=attention_mask,
                   self_conditioning=probs).logits


def _self_conditioning_rows(logits_fn, key, batch):
  """The training rows of `self_conditioning_rows` from the loss key (a
  fold_in, so the other draws of a loss are those of a model without
  self-conditioning); None for such a model."""
  if not self_conditioned(logits_fn):
    return None
  return self_conditioning_rows(
      jax.random.fold_in(key, _SELF_CONDITIONING_KEY), batch)


def _mdlm_nelbo(logits_fn, params, x0_BxL, x_t_BxL, t_B, mask_id, eps,
                ahead=None, rows_B=None):
  """Summed NELBO terms of one (t, x_t) draw per row; `ahead`: the
  annealing band (`visible_ahead`), None for bidirectional; `rows_B`: the
  self-conditioned rows (`denoiser_logits`)."""
  # PAD keys are hidden, as a diffusion decoder hides padding past a length.
  length = x_t_BxL.shape[1]
  mask = masks.key_padding_mask(x0_BxL != PAD_ID, length)
  if ahead is not None:
    offset_LxL = jnp.arange(length)[None, :] - jnp.arange(length)[:, None]
    mask &= (offset_LxL <= ahead)[None]
  logits = denoiser_logits(logits_fn, params, x_t_BxL, mask, rows_B)
  if shifted(logits_fn):
    logits = shift_logits(logits)
  return mdlm_nelbo_terms(logits, x0_BxL, x_t_BxL, t_B, mask_id, eps).sum()


def _noise(key, x0_BxL, t, keep_BxL, mask_id, eps):
  """x_t int32[B, L]: `mask_at_time` at t, the tokens outside keep unmasked."""
  return jnp.where(keep_BxL, mask_at_time(key, x0_BxL, t, mask_id, eps),
                   x0_BxL)


def mdlm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
              mask_id: int = MASK_ID, eps: float = EPS,
              complementary: bool = False, ahead=None):
  """MDLM training loss (Sahoo et al. 2024): one-sample NELBO per real token.

  Per row: an antithetic time t (`sample_times(.., t_min=eps)`), x_t from
  `mask_at_time` (log-linear schedule with alpha_1 = eps), one bidirectional
  forward pass, and the `mdlm_nelbo_terms` summed over masked positions. The
  loss is the batch NELBO divided by the number of maskable tokens: an
  unbiased estimate of the NELBO per token, except that as in MDLM t < eps is
  never drawn and a fraction eps of tokens stays unmasked at t = 1, each
  lowering the value by O(eps) relative (see `mdlm_bound` for the exact
  bound). A token-shifted model (module docstring) is scored on tokens
  1..L-1 of each row. A self-conditioned model gets its first pass's
  prediction in a random half of the rows (module docstring).

  Args:
    logits_fn: the denoiser (see the module docstring); non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and masks).
    mask_id: the MASK token id (static).
    eps: smallest time drawn and alpha_1, in (0, 1) (static); t = 0 would
      weigh a term by 1/0.
    complementary: also score every row's complementary mask (`complement`;
      twice the forward rows).
    ahead: int32[] attention band of mask annealing (`visible_ahead`; may
      be traced), None for bidirectional attention.
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], eps outside (0, 1), or a causal model.
  """
  _check_tokens(tokens_BxL, min_length=1)
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  check_attention(logits_fn, causal=False, user="mdlm_loss")
  key_t, key_mask = jax.random.split(key)
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  t_B = sample_times(key_t, tokens_BxL.shape[0], t_min=eps)
  x0_BxL = tokens_BxL
  x_t_BxL = _noise(key_mask, tokens_BxL, t_B, keep_BxL, mask_id, eps)
  copies = 1
  if complementary:
    x0_BxL, x_t_BxL, t_B = complement(x0_BxL, x_t_BxL, t_B, keep_BxL,
                                      mask_id=mask_id, eps=eps)
    copies = 2
  nll = _mdlm_nelbo(logits_fn, params, x0_BxL, x_t_BxL, t_B, mask_id, eps,
                    ahead, _self_conditioning_rows(logits_fn, key,
                                                   x_t_BxL.shape[0]))
  return _summarise(nll, copies * keep_BxL.sum())


def mdlm_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
               num_timesteps: int, *, mask_id: int = MASK_ID):
  """Deterministic MDLM NELBO per token: the validation perplexity bound.

  The continuous-time NELBO (Sahoo et al. 2024) with alpha_t = 1 - t (the
  log-linear schedule with eps = 0, so x_1 is fully masked and the NELBO
  bounds -log p(x0) with no prior term), integrated over t in (0, 1] by the
  midpoint rule on `num_timesteps` equal bins, t_k = (k + 1/2) / K, with one
  mask draw per row and timestep from `fold_in(key, k)`. The same key gives
  the same value; exp(loss) is the MDLM perplexity bound. Costs K forward
  passes (run sequentially with `lax.map`). A token-shifted model is scored
  on tokens 1..L-1 (module docstring). A self-conditioned model is scored
  with its first pass's prediction in every row (2K passes; module
  docstring).

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key of the masks; keep it fixed across evaluations.
    num_timesteps: K >= 1 (static).
    mask_id: the MASK token id (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], or a causal model.
  """
  def nelbo_at(t_B, keep_BxL, key):
    x_t_BxL = _noise(key, tokens_BxL, t_B, keep_BxL, mask_id, eps=0.0)
    return _mdlm_nelbo(logits_fn, params, tokens_BxL, x_t_BxL, t_B, mask_id,
                       eps=0.0)

  return _binned_bound(nelbo_at, logits_fn, tokens_BxL, key, num_timesteps,
                       "mdlm_bound")


def _binned_bound(nelbo_at, logits_fn, tokens_BxL: jax.Array, key: jax.Array,
                  num_timesteps: int, user: str):
  """The midpoint rule over K = num_timesteps time bins shared by the bounds:
  bin k at t = (k + 1/2) / K, its noise from fold_in(key, k); `nelbo_at(t_B,
  keep_BxL, key)` gives the bin's summed NELBO. Returns (loss, metrics).

  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], or a causal model.
  """
  if not isinstance(num_timesteps, int) or num_timesteps < 1:
    raise ValueError(f"num_timesteps={num_timesteps!r} must be an int >= 1")
  _check_tokens(tokens_BxL, min_length=1)
  check_attention(logits_fn, causal=False, user=user)
  batch = tokens_BxL.shape[0]
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))

  def bin_at(step):
    t_B = jnp.full((batch,), (step + 0.5) / num_timesteps, jnp.float32)
    return nelbo_at(t_B, keep_BxL, jax.random.fold_in(key, step))

  nll_K = jax.lax.map(bin_at, jnp.arange(num_timesteps, dtype=jnp.int32))
  return _summarise(nll_K.mean(), keep_BxL.sum())


def _check_block_length(block_length, length: int) -> None:
  if (isinstance(block_length, bool) or not isinstance(block_length, int)
      or not 1 <= block_length <= length or length % block_length):
    raise ValueError(f"block_length={block_length!r} must be an integer in "
                     f"[1, {length}] dividing the sequence length L={length}")


def bd3lm_noise(key: jax.Array, x0_BxL: jax.Array, block_length: int, *,
                mask_id: int = MASK_ID, eps: float = EPS):
  """BD3-LM's forward process (Arriola et al. 2025): one time per block.

  The B * N blocks (N = L / block_length) get antithetic times
  `sample_times(.., B * N, t_min=eps)` in row-major order (row b, block n is
  stratum b N + n), as the reference samples t "along blocks and batches";
  each non-PAD token is then masked with probability 1 - alpha_t of its
  block's t (log-linear schedule, alpha_1 = eps). With block_length = L
  this draws exactly `mdlm_loss`'s t and x_t from the same key.

  Args:
    key: PRNG key (times and masks).
    x0_BxL: int32[B, L] clean tokens.
    block_length: W, dividing L.
    mask_id: the MASK token id.
    eps: smallest time drawn and alpha_1.
  Returns:
    (t float32[B, L], each position's block time; x_t int32[B, L]).
  """
  batch, length = x0_BxL.shape
  num_blocks = length // block_length
  key_t, key_mask = jax.random.split(key)
  t_BxN = sample_times(key_t, batch * num_blocks, t_min=eps).reshape(
      batch, num_blocks)
  t_BxL = jnp.repeat(t_BxN, block_length, axis=1)
  return t_BxL, diffusion.mask_tokens(key_mask, x0_BxL,
                                      log_linear_alpha(t_BxL, eps), mask_id)


def _bd3lm_logits(logits_fn, params, x0_BxL, x_t_BxL, block_length):
  """float32[B, L, V] denoising logits of x_t, index i predicting token i.

  One pass over [x_t ; x_0]: both halves sit at positions 0..L-1 (the
  reference rotates both with the same positions);
  `masks.bd3lm_training_mask` lets noisy block i see itself and clean blocks
  < i, clean block i see clean blocks <= i; PAD keys are hidden in both
  halves. A token-shifted model predicts the first token of each block from
  the clean half's position before it, the others from the noisy half's
  (module docstring). With one block (block_length = L) the clean half is
  seen by no scored prediction, and the pass is over x_t alone.
  """
  batch, length = x0_BxL.shape
  positions_BxL = _positions(x0_BxL)
  if block_length == length:
    logits = logits_fn(params, x_t_BxL, positions_BxL,
                       attention_mask=masks.key_padding_mask(
                           x0_BxL != PAD_ID, length)).logits
    return shift_logits(logits) if shifted(logits_fn) else logits
  valid_Bx2L = jnp.tile(x0_BxL != PAD_ID, (1, 2))
  mask = (masks.bd3lm_training_mask(batch, length, block_length)
          & masks.key_padding_mask(valid_Bx2L, 2 * length))
  logits = logits_fn(params, jnp.concatenate([x_t_BxL, x0_BxL], axis=1),
                     jnp.concatenate([positions_BxL, positions_BxL], axis=1),
                     attention_mask=mask).logits
  if not shifted(logits_fn):
    return logits[:, :length]
  block_start_L = jnp.arange(length) % block_length == 0
  return jnp.where(block_start_L[None, :, None],
                   shift_logits(logits[:, length:]),
                   shift_logits(logits[:, :length]))


def bd3lm_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array, *,
               block_length: int, mask_id: int = MASK_ID, eps: float = EPS,
               complementary: bool = False):
  """BD3-LM training loss (Arriola et al. 2025): block diffusion NELBO/token.

  The sequence is cut into N = L / block_length blocks; block n is denoised
  conditioned on the clean blocks before it, so the NELBO is the sum over
  blocks of an MDLM NELBO. Per block: a time t (`bd3lm_noise`: antithetic
  over the B * N blocks), x_t of the block masked at alpha_t; one forward
  pass over [x_t ; x_0] (2L inputs, `_bd3lm_logits`) gives every block's
  denoising logits; `mdlm_nelbo_terms` scores the masked positions with SUBS
  and the weight -alpha'_t / (1 - alpha_t) = 1 / t of their block's t. As
  in the reference (kuleshov-group/bd3lms, `algo=bd3lm`): no time input to
  the model, t in [eps, 1); its learned clipped schedule ("var_min", which
  narrows t's range to lower the gradient variance) is not implemented.

  Limits: block_length = L is exactly `mdlm_loss` (the same key draws the
  same t and masks; the noisy half sees no clean token). block_length 1:
  noisy token l sees only itself (MASK when masked) and x_0[:l], so the
  model is a causal LM that reads [x_0[:l], MASK] and predicts x_l at the
  MASK's position, MASK excluded from the softmax; a one-token block's
  NELBO is exact, int P(masked at t) w(t) dt = alpha_0 - alpha_1 = 1 - eps,
  so E[loss] = (1 - eps) x that AR model's NLL per token (and
  `bd3lm_bound` equals its NLL exactly). With a token shift and blocks of 1
  each token is predicted by the clean causal pass at the position before
  it: the model is its AR parent, and `bd3lm_bound` equals `ar_eval`.

  Args:
    logits_fn: the denoiser (see the module docstring); non-causal attention
      (the masks are passed explicitly).
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and masks).
    block_length: W, dividing L (static).
    mask_id: the MASK token id (static).
    eps: smallest time drawn and alpha_1, in (0, 1) (static).
    complementary: also score every row's complementary mask (`complement`;
      twice the forward rows).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], block_length not dividing L, eps
      outside (0, 1), or a causal model.
  """
  _check_tokens(tokens_BxL, min_length=1)
  _check_block_length(block_length, tokens_BxL.shape[1])
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  check_attention(logits_fn, causal=False, user="bd3lm_loss")
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  t_BxL, x_t_BxL = bd3lm_noise(key, tokens_BxL, block_length, mask_id=mask_id,
                               eps=eps)
  x0_BxL, x_t_BxL = tokens_BxL, jnp.where(keep_BxL, x_t_BxL, tokens_BxL)
  copies = 1
  if complementary:
    x0_BxL, x_t_BxL, t_BxL = complement(x0_BxL, x_t_BxL, t_BxL, keep_BxL,
                                        mask_id=mask_id, eps=eps)
    copies = 2
  logits = _bd3lm_logits(logits_fn, params, x0_BxL, x_t_BxL, block_length)
  nll = mdlm_nelbo_terms(logits, x0_BxL, x_t_BxL, t_BxL, mask_id, eps).sum()
  return _summarise(nll, copies * keep_BxL.sum())


def bd3lm_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                num_timesteps: int, *, block_length: int,
                mask_id: int = MASK_ID):
  """Deterministic BD3-LM NELBO per token: the validation perplexity bound.

  Each block's NELBO is taken in its number-of-masks form: with alpha_t =
  1 - t (x_1 fully masked, no prior term), P(a given set S of m of the
  block's w real tokens is masked) integrates against the weight 1/t to
  int t^(m-1) (1-t)^(w-m) dt = 1 / (m C(w, m)), so

    NELBO(block) = sum_{m=1..w} (1/m) E_{|S|=m} sum_{l in S}
                   -log p(x_l | x_block\\S, x_<block),

  S uniform over the subsets of size m. K' = min(num_timesteps, W) forward
  passes estimate it: pass k covers the counts m in the stratum
  (floor(k w / K'), floor((k+1) w / K')] of each row and block, draws one m
  in it and one S of that size (keys from `fold_in(key, k)`), and weighs each
  masked token by |stratum| / m: unbiased, and the same key gives the same
  value. With block_length 1 it is one pass with every token masked and
  weight 1: exactly the NLL of the AR model described in `bd3lm_loss` (with
  a token shift, `ar_eval` of the same parameters). With block_length L it
  estimates the same NELBO as `mdlm_bound` (with other draws, so not the same
  number). A token-shifted model is scored on tokens 1..L-1.

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key of the draws; keep it fixed across evaluations.
    num_timesteps: K >= 1 (static), the number of strata (passes), at most
      block_length of them used.
    block_length: W, dividing L (static).
    mask_id: the MASK token id (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], block_length not
      dividing L, or a causal model.
  """
  if not isinstance(num_timesteps, int) or num_timesteps < 1:
    raise ValueError(f"num_timesteps={num_timesteps!r} must be an int >= 1")
  _check_tokens(tokens_BxL, min_length=1)
  _check_block_length(block_length, tokens_BxL.shape[1])
  check_attention(logits_fn, causal=False, user="bd3lm_bound")
  batch, length = tokens_BxL.shape
  num_blocks = length // block_length
  strata = min(num_timesteps, block_length)
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  valid_BxNxW = keep_BxL.reshape(batch, num_blocks, block_length)
  real_BxN = valid_BxNxW.sum(-1, dtype=jnp.int32)

  def nelbo_of_stratum(k):
    key_count, key_subset = jax.random.split(jax.random.fold_in(key, k))
    low_BxN = k * real_BxN // strata
    size_BxN = (k + 1) * real_BxN // strata - low_BxN
    offset_BxN = jnp.floor(jax.random.uniform(key_count, real_BxN.shape)
                           * size_BxN).astype(jnp.int32)
    count_BxN = low_BxN + 1 + jnp.minimum(offset_BxN,
                                          jnp.maximum(size_BxN - 1, 0))
    order_BxNxW = jnp.where(valid_BxNxW, jax.random.uniform(
        key_subset, valid_BxNxW.shape), 2.0)  # PAD ranks last
    rank_BxNxW = jnp.argsort(jnp.argsort(order_BxNxW, axis=-1), axis=-1)
    masked_BxL = (valid_BxNxW & (rank_BxNxW < count_BxN[..., None])
                  & (size_BxN > 0)[..., None]).reshape(batch, length)
    x_t_BxL = jnp.where(masked_BxL, mask_id, tokens_BxL)
    logits = _bd3lm_logits(logits_fn, params, tokens_BxL, x_t_BxL,
                           block_length)
    nll_BxL = -target_log_probs(logits, tokens_BxL, excluded=mask_id)
    weight_BxL = jnp.repeat(size_BxN / count_BxN, block_length, axis=1)
    return jnp.sum(jnp.where(masked_BxL, weight_BxL * nll_BxL, 0.0))

  nll_per_stratum = jax.lax.map(nelbo_of_stratum,
                                jnp.arange(strata, dtype=jnp.int32))
  return _summarise(nll_per_stratum.sum(), keep_BxL.sum())


# ----------------------------------------------------------------------------
# Uniform-state diffusion (UDLM, Schiff et al. 2024, arXiv:2412.10193; Duo,
# Sahoo et al. 2025, arXiv:2506.10892).


def uniform_noise(key: jax.Array, x0_BxL: jax.Array, alpha_B: jax.Array,
                  keep_BxL: jax.Array, vocab: int) -> jax.Array:
  """Samples uniform-state diffusion's forward process q(z_t | x_0).

  Each kept token is replaced, with probability 1 - alpha_t, by a token
  drawn uniformly from the whole vocabulary [0, V) (possibly itself, as
  DiffusionGemma's canvas is drawn), so q(z_t = y | x) = alpha_t [y = x] +
  (1 - alpha_t) / V; the other tokens stay clean.

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] clean tokens.
    alpha_B: float32[B] signal levels in [0, 1].
    keep_BxL: bool[B, L] the tokens the process may replace.
    vocab: V.
  Returns:
    int32[B, L] z_t.
  """
  key_flip, key_token = jax.random.split(key)
  u_BxL = jax.random.uniform(key_flip, x0_BxL.shape, jnp.float32)
  noise_BxL = jax.random.randint(key_token, x0_BxL.shape, 0, vocab,
                                 x0_BxL.dtype)
  replaced_BxL = keep_BxL & (u_BxL < 1.0 - jnp.asarray(alpha_B)[:, None])
  return jnp.where(replaced_BxL, noise_BxL, x0_BxL)


def uniform_nelbo_terms(logits_BxLxV: jax.Array, x0_BxL: jax.Array,
                        z_t_BxL: jax.Array, alpha_B: jax.Array,
                        alpha_prime_B: jax.Array,
                        scored_BxL: jax.Array) -> jax.Array:
  """Per-position integrand of the uniform-state continuous-time NELBO.

  With N = V, x-bar = N alpha_t onehot(x) + (1 - alpha_t) and x-bar_theta
  = N alpha_t softmax(logits) + (1 - alpha_t) (the marginals q(z_t | x) and
  q(z_t | x_theta), times N), the term of a position with noisy token z is

    -alpha'_t / (N alpha_t) * sum_{y != z} [ s_y - r_y log s_y
                                             + r_y log r_y - r_y ],
    r_y = x-bar_y / x-bar_z,  s_y = x-bar_theta_y / x-bar_theta_z,

  the denoising score entropy (Lou et al. 2023) of the uniform rate
  -alpha'_t / (N alpha_t) with the score of the denoiser's marginal; summed
  over y it equals UDLM's closed form N / x-bar_theta_z - N / x-bar_z +
  sum_{y != z} r_y log(r_y / s_y). Computed term-wise as
  r_y (expm1(u) - u), u = log(s_y / r_y), each >= 0 (no cancellation of
  the two large 1/x-bar terms at small t).

  Args:
    logits_BxLxV: float[B, L, V] denoiser logits at z_t (any float dtype).
    x0_BxL: int32[B, L] clean tokens; z_t_BxL: int32[B, L] noisy tokens.
    alpha_B, alpha_prime_B: float32[B] alpha_t in (0, 1] and d alpha/dt.
    scored_BxL: bool[B, L] positions scored.
  Returns:
    float32[B, L] terms (nats per unit time); 0 where not scored.
  """
  logits = logits_BxLxV.astype(jnp.float32)
  vocab = logits.shape[-1]
  a = jnp.asarray(alpha_B, jnp.float32)[:, None, None]
  ids_BxLxV = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
  log_x_theta = jnp.logaddexp(jnp.log(vocab * a) + jax.nn.log_softmax(logits),
                              jnp.log1p(-a))
  log_x_bar = jnp.where(ids_BxLxV == x0_BxL[..., None],
                        jnp.log(vocab * a + 1.0 - a), jnp.log1p(-a))
  at_z = ids_BxLxV == z_t_BxL[..., None]
  pick = lambda v: jnp.sum(jnp.where(at_z, v, 0.0), -1, keepdims=True)
  log_r = log_x_bar - pick(log_x_bar)
  u = log_x_theta - pick(log_x_theta) - log_r
  entropy_BxL = jnp.sum(jnp.exp(log_r) * (jnp.expm1(u) - u), -1)
  weight_B = -jnp.asarray(alpha_prime_B, jnp.float32) / (
      vocab * jnp.asarray(alpha_B, jnp.float32))
  return jnp.where(scored_BxL, weight_B[:, None] * entropy_BxL, 0.0)


def _uniform_nelbo(logits_fn, params, x0_BxL, t_B, keep_BxL, key, schedule,
                   eps, rows_B=None):
  """Summed NELBO terms of one (t, z_t) draw per row (bidirectional, PAD
  keys hidden; a token-shifted model's logits realigned; `rows_B`: the
  self-conditioned rows, `denoiser_logits`)."""
  a_B = diffusion.alpha(schedule, t_B, eps)
  length = x0_BxL.shape[1]
  vocab = jax.eval_shape(lambda t: logits_fn(params, t, _positions(t)).logits,
                         x0_BxL[:1, :1]).shape[-1]
  z_t_BxL = uniform_noise(key, x0_BxL, a_B, keep_BxL, vocab)
  logits = denoiser_logits(
      logits_fn, params, z_t_BxL,
      masks.key_padding_mask(x0_BxL != PAD_ID, length), rows_B)
  if shifted(logits_fn):
    logits = shift_logits(logits)
  return uniform_nelbo_terms(logits, x0_BxL, z_t_BxL, a_B,
                             diffusion.alpha_prime(schedule, t_B, eps),
                             keep_BxL).sum()


def uniform_loss(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                 *, schedule: str = "log_linear", eps: float = EPS):
  """Uniform-state diffusion training loss: one-sample NELBO per token.

  UDLM (Schiff et al. 2024) / Duo (Sahoo et al. 2025): the forward process
  replaces tokens by uniformly random ones (`uniform_noise`), the denoiser
  predicts x_0 from the whole noisy sequence with no time input, and the
  loss is the continuous-time NELBO (`uniform_nelbo_terms`) at one
  antithetic time t in [eps, 1) per row (`sample_times`), summed over the
  scored tokens and divided by their count. As in `mdlm_loss`, t < eps is
  never drawn and the prior term at t = 1 (alpha_1 = eps > 0 for the
  log-linear and cosine schedules) is left out, each O(eps); `uniform_bound`
  is the exact bound. Every token, noised or not, is scored (unlike MDLM's
  masked positions only). A self-conditioned model gets its first pass's
  prediction in a random half of the rows, zeros in the others (module
  docstring); the times and noise are those of a model without it.

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key (times and noise).
    schedule: one of `diffusion.SCHEDULES` (static).
    eps: smallest time drawn, in (0, 1) (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: tokens not int[B, L], eps outside (0, 1), an unknown
      schedule, or a causal model.
  """
  _check_tokens(tokens_BxL, min_length=1)
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1)")
  if schedule not in diffusion.SCHEDULES:
    raise ValueError(f"schedule={schedule!r}; allowed: {diffusion.SCHEDULES}")
  check_attention(logits_fn, causal=False, user="uniform_loss")
  key_t, key_noise = jax.random.split(key)
  keep_BxL = maskable(tokens_BxL, shifted(logits_fn))
  t_B = sample_times(key_t, tokens_BxL.shape[0], t_min=eps)
  nll = _uniform_nelbo(logits_fn, params, tokens_BxL, t_B, keep_BxL,
                       key_noise, schedule, eps,
                       _self_conditioning_rows(logits_fn, key,
                                               tokens_BxL.shape[0]))
  return _summarise(nll, keep_BxL.sum())


def uniform_bound(logits_fn, params, tokens_BxL: jax.Array, key: jax.Array,
                  num_timesteps: int):
  """Deterministic uniform-state NELBO per token: the perplexity bound.

  The continuous-time NELBO with alpha_t = 1 - t (z_1 exactly uniform, the
  prior, so no prior term), integrated over (0, 1) by the midpoint rule on
  `num_timesteps` bins with one noise draw per row and bin from
  `fold_in(key, k)`, as `mdlm_bound`. K forward passes; 2K for a
  self-conditioned model, scored with its first pass's prediction in every
  row (the two-pass denoiser `uniform_eb` runs from its second step on;
  module docstring).

  Args:
    logits_fn: the denoiser; non-causal attention.
    params: model parameters.
    tokens_BxL: int32[B, L] clean sequences, right-padded with PAD.
    key: PRNG key of the noise; keep it fixed across evaluations.
    num_timesteps: K >= 1 (static).
  Returns:
    (loss float32[] nats per token, metrics) as in the module docstring.
  Raises:
    ValueError: num_timesteps < 1, tokens not int[B, L], or a causal model.
  """
  def nelbo_at(t_B, keep_BxL, key):
    return _uniform_nelbo(logits_fn, params, tokens_BxL, t_B, keep_BxL, key,
                          "linear", 0.0)

  return _binned_bound(nelbo_at, logits_fn, tokens_BxL, key, num_timesteps,
                       "uniform_bound")
