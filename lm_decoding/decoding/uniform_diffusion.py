"""Uniform-noise diffusion decoding: DiffusionGemma's entropy-bounded sampler
(`uniform_eb`) and UDLM/Duo's ancestral sampler (`uniform_ancestral`).

A canvas of W positions starts from tokens drawn uniformly from the whole
vocabulary (no MASK) and is denoised for at most K_b steps. Step k of a
block (counted down, as the reference does: c = K_b - k, from K_b to 1):

  1. logits of the canvas (the prefix of committed tokens as context);
  2. the linear temperature schedule: processed = logits / tau_c,
     tau_c = t_min + (t_max - t_min) c / K_b (so tau = t_max at the first
     step and t_min + (t_max - t_min) / K_b at the last);
  3. every canvas position draws a token from softmax(processed) through
     `sampling` (the AR processors; temperature 1 by default);
  4. entropy-bounded acceptance (the EB-sampler, Ben-Hamu et al. 2025,
     arXiv:2505.24857): sort the positions by the entropy of
     softmax(processed), ascending, and accept the longest prefix whose
     summed entropy minus its largest stays <= `entropy_bound` (the lowest
     one is always accepted); accepted positions take their draw;
  5. renoising: every position not accepted gets a fresh uniform token;
  6. the stable-and-confident stop: a row stops when the argmax canvas of
     processed equals each of its last `stability_threshold` argmax canvases
     and the mean entropy over the canvas is < `confidence_threshold`; a
     stopped row's canvas is frozen and costs no more steps of its own;
  7. self-conditioning, for a model with that input
     (`TransformerConfig.self_conditioning`): softmax(processed) of the
     canvas is the model's `self_conditioning` input at the next step
     (zeros at a block's first step and at every prefix position), as the
     reference feeds its processed logits back and its decoder takes their
     softmax.
The block's output is the last argmax canvas. Accepted tokens are not final:
a position accepted at one step is re-predicted at the next and may be
renoised or accepted with another token (self-correction); `stats` counts
how often (`revised` of `accepted`).

As in DiffusionGemma (transformers' `DiffusionGemmaGenerationMixin`), the
output is cut into N = T / W blocks decoded left to right, each on a canvas
that sees the prompt and the committed blocks and nothing after itself.
Attention: a query in the committed prefix sees only the prefix, a query in
the canvas sees the prefix and the canvas, so the prefix's keys do not
depend on the canvas and caching them is exact: with kv_cache="prefix" one
full pass at each block start fills the KV cache (its canvas logits serve
the first step, as Fast-dLLM) and every other step runs the W canvas
positions only; kv_cache="none" runs the full [B, L] pass every step.

Deliberate differences from the reference (transformers 5.24):
  - the self-conditioning input is the probabilities, softmax(processed)
    with MASK at 0, where the reference passes the processed logits and
    its decoder takes their softmax: the same input (tested step for step);
  - the canvas starts from per-row, per-position keys (`base.row_keys`),
    so a row decodes the same alone or in a batch; the reference draws
    one torch tensor per call;
  - ties in entropy are ordered by position (a stable sort); torch.sort's
    order among equal entropies is unspecified;
  - MASK (`mask_id`) is never drawn nor output (its logit is -inf before
    the temperature, so it has no share of the entropies either), as in
    every decoder of this package; the reference's vocabulary has no MASK
    to exclude;
  - t_max == t_min (a constant temperature) is allowed; the reference
    requires t_max > t_min;
  - `nfe` counts the calls made for the batch (a call whenever any row is
    still denoising); per-row step counts are in `stats["steps"]`, the
    reference's per-row `decoder_forward_passes`.
Randomness: row b's draws at global step s and absolute position p come
from fold_in(fold_in(row_key[b], s), p), the canvas at block n's start from
fold_in(fold_in(row_key[b], 2^31 - 1), n) (as `iterative.step_rows`).

`uniform_ancestral` (`UniformAncestralDecoder`) runs the same canvas loop
(blocks, prefix cache, self-conditioning input, keys) with another step: no
acceptance, renoising or stop; every position draws z_s from the reverse
step q(z_s | z_t, x_theta) of the forward process (`ancestral_posterior`),
from t = 1 down to s = 0 in K_b equal steps, and the last draws are the
output (UDLM, Schiff et al. 2024; Duo, Sahoo et al. 2025).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding import debug
from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding import base
from lm_decoding.decoding.base import DecodeResult, register
from lm_decoding.decoding.iterative import (
    ScheduledDecoder, prompt_layout, windows)
from lm_decoding.decoding.rows import finish_at_eos
from lm_decoding.models import Model
from lm_decoding.decoding.sampling import SamplingConfig, sample
from lm_decoding.models.config import self_conditioned, token_shift


_CANVAS = 2**31 - 1  # the key of the starting canvases (never a step number)


def entropy(logits_WxV: jax.Array) -> jax.Array:
  """float32[W]: entropy (nats) of softmax(logits) over the last axis."""
  log_p = jax.nn.log_softmax(logits_WxV.astype(jnp.float32), -1)
  p = jnp.exp(log_p)
  return -jnp.sum(jnp.where(p > 0, p * log_p, 0.0), -1)


def entropy_bounded(entropy_W: jax.Array, allowed_W: jax.Array,
                    bound: float) -> jax.Array:
  """bool[W]: the EB-sampler's accepted set (Ben-Hamu et al. 2025).

  Among the allowed positions sorted by entropy (ascending, ties by
  position), the longest prefix whose sum minus its largest entry is
  <= bound: the lowest-entropy allowed position always, every allowed one
  when the bound is huge. None when nothing is allowed.

  Args:
    entropy_W: float32[W] entropies (nats).
    allowed_W: bool[W] positions that may be accepted.
    bound: the entropy bound (nats), > 0.
  """
  score = jnp.where(allowed_W, entropy_W, jnp.inf)
  order = jnp.argsort(score, stable=True)
  sorted_W = score[order]
  before_W = jnp.cumsum(sorted_W) - sorted_W  # sum of the lower ones
  accept_sorted = (before_W <= bound) & jnp.isfinite(sorted_W)
  return jnp.zeros_like(allowed_W).at[order].set(accept_sorted)


def temperature(t_min: float, t_max: float, k: jax.Array,
                steps: int) -> jax.Array:
  """float32[] tau at step k (0-based) of `steps`: t_min + (t_max - t_min)
  (steps - k) / steps (transformers' LinearTemperatureScheduleLogitsProcessor
  at its count-down step steps - k)."""
  remaining = steps - jnp.asarray(k, jnp.float32)
  return t_min + (t_max - t_min) * (remaining / steps)  # the reference's order


@flax.struct.dataclass
class Canvas:
  """The carry of one block (leading axis B)."""

  window: jax.Array  # int32[B, W] current (noisy) canvas
  argmax: jax.Array  # int32[B, W] argmax canvas of the last step
  history: jax.Array  # int32[B, n, W] last n argmax canvases (-1 at start;
  #                    n = stability_threshold, 0: always stable)
  done: jax.Array  # bool[B] stopped rows
  last_accepted: jax.Array  # int32[B, W] token of the last acceptance, -1
  accepted: jax.Array  # int32[B] acceptances so far
  revised: jax.Array  # int32[B] acceptances that changed the last one
  steps: jax.Array  # int32[B] steps run by each row
  trace: dict | None  # per-step records when traced
  previous: jax.Array | None = None  # float32[B, W, V] softmax(processed)
  #   of the last step (zeros at the start; None: no self-conditioning)


def _attention(valid_BxL, start_B, end_B, num_queries, first_query_B):
  """bool[B, L, S]: prefix queries see the prefix, canvas queries the prefix
  and the canvas; nothing sees PAD or positions past the canvas."""
  length = valid_BxL.shape[1]
  key_S = jnp.arange(length)
  query_BxL = first_query_B[:, None] + jnp.arange(num_queries)[None, :]
  seen = jnp.where((query_BxL >= start_B[:, None])[..., None],
                   key_S[None, None, :] < end_B[:, None, None],
                   key_S[None, None, :] < start_B[:, None, None])
  return seen & valid_BxL[:, None, :]


def _processed(decoder, logits_BxWxV, k, steps) -> jax.Array:
  """float32[B, W, V]: the logits at step k's temperature (module docstring,
  item 2), MASK at -inf."""
  tau = temperature(decoder.t_min, decoder.t_max, k, steps)
  return logits_BxWxV.astype(jnp.float32).at[
      ..., decoder.mask_id].set(-jnp.inf) / tau


def _canvas_step(decoder, k, global_step, logits_BxWxV, canvas, start_B,
                 keys_B, vocab, steps):
  """One step of every row (module docstring, items 2-6)."""
  processed_BxWxV = _processed(decoder, logits_BxWxV, k, steps)
  width = canvas.window.shape[1]

  def row(processed_WxV, start, key):
    step_key = jax.random.fold_in(key, global_step)
    keys_Wx2 = jax.vmap(lambda p: jax.random.split(
        jax.random.fold_in(step_key, p)))(start + jnp.arange(width))
    drawn = jax.vmap(lambda key, x: sample(key, x[None], decoder.sampling)[0])(
        keys_Wx2[:, 0], processed_WxV)
    noise = jax.vmap(lambda key: jax.random.randint(key, (), 0, vocab))(
        keys_Wx2[:, 1])
    entropy_W = entropy(processed_WxV)
    accept = entropy_bounded(entropy_W, jnp.ones((width,), bool),
                             decoder.entropy_bound)
    return drawn, noise.astype(jnp.int32), entropy_W, accept

  drawn, noise, entropy_BxW, accept = jax.vmap(row)(processed_BxWxV, start_B,
                                                    keys_B)
  live_B = ~canvas.done
  window = jnp.where(accept, drawn, noise)
  argmax = jnp.argmax(processed_BxWxV, -1).astype(jnp.int32)
  stable = jnp.all(canvas.history == argmax[:, None], axis=(1, 2))
  confident = entropy_BxW.mean(-1) < decoder.confidence_threshold
  stop = stable & confident & decoder.early_stop
  history = jnp.concatenate([canvas.history, argmax[:, None]], 1)[:, 1:]
  revised = accept & (canvas.last_accepted >= 0) & (
      canvas.last_accepted != drawn)
  live = live_B[:, None]
  new = Canvas(
      window=jnp.where(live, window, canvas.window),
      argmax=jnp.where(live, argmax, canvas.argmax),
      history=jnp.where(live_B[:, None, None], history, canvas.history),
      done=canvas.done | stop,
      last_accepted=jnp.where(live & accept, drawn, canvas.last_accepted),
      accepted=canvas.accepted + jnp.where(live_B, accept.sum(-1), 0),
      revised=canvas.revised + jnp.where(live_B, revised.sum(-1), 0),
      steps=canvas.steps + live_B,
      trace=None,
      previous=None if canvas.previous is None else jnp.where(
          live_B[:, None, None], jax.nn.softmax(processed_BxWxV, -1),
          canvas.previous))
  if canvas.trace is not None:
    record = dict(canvas_in=canvas.window, drawn=drawn, noise=noise,
                  accepted=accept, canvas_out=new.window, argmax=argmax,
                  live=live_B, stop=stop)
    new = new.replace(trace={name: canvas.trace[name].at[global_step].set(
        value) for name, value in record.items()})
  return new


def ancestral_posterior(log_p_WxV: jax.Array, z_W: jax.Array,
                        alpha_t: jax.Array, alpha_s: jax.Array) -> jax.Array:
  """float32[W, V] log q(z_s | z_t, x_theta): uniform-state diffusion's
  reverse step (UDLM, Schiff et al. 2024; Duo, Sahoo et al. 2025).

  Bayes' rule on the forward process q(z_t = z | z_s = y) = alpha_ts [y = z]
  + (1 - alpha_ts) / V (alpha_ts = alpha_t / alpha_s) and q(z_s = y | x) =
  alpha_s x_y + (1 - alpha_s) / V with the denoiser's x_theta in place of
  the clean one-hot x:
    q(z_s = y | z_t, x_theta) oc (alpha_ts [y = z] + (1 - alpha_ts) / V)
                                 (alpha_s x_theta_y + (1 - alpha_s) / V).

  Args:
    log_p_WxV: float32[W, V] log x_theta.
    z_W: int32[W] z_t.
    alpha_t, alpha_s: float32[] signal levels, 0 <= alpha_t < alpha_s <= 1.
  """
  vocab = log_p_WxV.shape[-1]
  ratio = alpha_t / alpha_s
  ids_WxV = jax.lax.broadcasted_iota(jnp.int32, log_p_WxV.shape, 1)
  log_likelihood = jnp.where(ids_WxV == z_W[:, None],
                             jnp.log(ratio + (1.0 - ratio) / vocab),
                             jnp.log((1.0 - ratio) / vocab))
  log_prior = jnp.logaddexp(jnp.log(alpha_s) + log_p_WxV,
                            jnp.log((1.0 - alpha_s) / vocab))
  return jax.nn.log_softmax(log_likelihood + log_prior, -1)


def _ancestral_step(decoder, k, global_step, logits_BxWxV, canvas, start_B,
                    keys_B, vocab, steps):
  """One reverse step of every row from t = 1 - k / K_b to s = t - 1 / K_b
  (alpha_t = 1 - t, the linear schedule of the bound): each position draws
  z_s from `ancestral_posterior` of softmax(processed), MASK excluded."""
  processed_BxWxV = _processed(decoder, logits_BxWxV, k, steps)
  # t and s from the count of steps left, so that s is exactly 0 at the
  # last step (k / K rounds above 1 when XLA multiplies by 1 / K)
  left = steps - jnp.asarray(k, jnp.float32)
  alpha_t = jnp.maximum(1.0 - left / steps, 0.0)
  alpha_s = 1.0 - (left - 1.0) / steps
  width = canvas.window.shape[1]

  def row(processed_WxV, z_W, start, key):
    step_key = jax.random.fold_in(key, global_step)
    keys_W = jax.vmap(lambda p: jax.random.fold_in(step_key, p))(
        start + jnp.arange(width))
    posterior_WxV = ancestral_posterior(
        jax.nn.log_softmax(processed_WxV, -1), z_W, alpha_t, alpha_s
    ).at[:, decoder.mask_id].set(-jnp.inf)
    return jax.vmap(lambda key, x: sample(key, x[None], decoder.sampling)[0])(
        keys_W, posterior_WxV).astype(jnp.int32)

  drawn = jax.vmap(row)(processed_BxWxV, canvas.window, start_B, keys_B)
  new = canvas.replace(
      window=drawn, argmax=drawn, steps=canvas.steps + 1,
      previous=None if canvas.previous is None
      else jax.nn.softmax(processed_BxWxV, -1))
  if canvas.trace is not None:
    record = dict(canvas_in=canvas.window, drawn=drawn,
                  noise=jnp.full_like(drawn, -1),
                  accepted=jnp.ones(drawn.shape, bool), canvas_out=drawn,
                  argmax=drawn, live=jnp.ones(drawn.shape[:1], bool),
                  stop=jnp.zeros(drawn.shape[:1], bool))
    new = new.replace(trace={name: canvas.trace[name].at[global_step].set(
        value) for name, value in record.items()})
  return new


@debug.jit(static_argnames=("decoder", "trace", "measure_error"))
def _generate(decoder, models, prompts, prompt_lengths, keys_B, trace,
              measure_error=False):
  model = models["model"]
  t = decoder.output_length
  tokens_BxL, _, valid_BxL = prompt_layout(prompts, prompt_lengths, t,
                                           decoder.mask_id, decoder.pad_id)
  batch, length = tokens_BxL.shape
  width = decoder.block_size()
  steps = decoder.max_block_steps(width)
  num_blocks = t // width
  total = num_blocks * steps
  vocab = base.vocab_size(model)
  conditioned = self_conditioned(model.logits_fn)
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                   (batch, length))

  def block(n, carry):
    tokens_BxL, cost, stats, records, error = carry
    start_B = prompt_lengths + n * width
    end_B = start_B + width
    canvas_BxW = jax.vmap(lambda key: jax.random.randint(
        jax.random.fold_in(jax.random.fold_in(key, _CANVAS), n), (width,), 0,
        vocab))(keys_B)
    canvas = Canvas(
        window=canvas_BxW.astype(jnp.int32),
        argmax=canvas_BxW.astype(jnp.int32),
        history=jnp.full((batch, decoder.stability_threshold, width), -1,
                         jnp.int32),
        done=jnp.zeros((batch,), bool),
        last_accepted=jnp.full((batch, width), -1, jnp.int32),
        accepted=stats["accepted"], revised=stats["revised"],
        steps=jnp.zeros((batch,), jnp.int32), trace=records,
        previous=jnp.zeros((batch, width, vocab), jnp.float32)
        if conditioned else None)
    put = lambda x_BxL, window, start_B: jax.vmap(
        lambda x, w, s: jax.lax.dynamic_update_slice(
            x, w, (s,) + (0,) * (w.ndim - 1)))(x_BxL, window, start_B)

    def full(cost, canvas, cache=None):
      mask = _attention(valid_BxL, start_B, end_B, length,
                        jnp.zeros((batch,), jnp.int32))
      previous = None  # the canvas's, zeros over the prefix
      if canvas.previous is not None:
        previous = put(jnp.zeros((batch, length, vocab), jnp.float32),
                       canvas.previous, start_B)
      out, cost = base.forward(models, "model", cost,
                               put(tokens_BxL, canvas.window, start_B),
                               positions_BxL, cache=cache,
                               attention_mask=mask,
                               self_conditioning=previous)
      return windows(out.logits, start_B, width), out.cache, cost

    def cached(cost, canvas, cache):
      mask = _attention(valid_BxL, start_B, end_B, width, start_B)
      out, cost = base.forward(
          models, "model", cost, canvas.window,
          start_B[:, None] + jnp.arange(width, dtype=jnp.int32),
          cache=cache.at(start_B), attention_mask=mask,
          self_conditioning=canvas.previous)
      return out.logits, out.cache, cost

    if decoder.kv_cache == "prefix":
      first, cache, cost = full(cost, canvas,
                                model.logits_fn.init_cache(batch, length).at(0))
    else:
      first, cache = jnp.zeros((batch, width, vocab), jnp.float32), None

    def cond(c):
      k, canvas, _, _, _ = c
      return (k < steps) & ~jnp.all(canvas.done)

    def body(c):
      k, canvas, cache, cost, error = c
      if decoder.kv_cache == "prefix":
        logits, cache, cost = jax.lax.cond(
            k == 0, lambda: (first, cache, cost),
            lambda: cached(cost, canvas, cache))
        if measure_error:  # the same canvas through an uncounted full pass
          exact, _, _ = full(cost, canvas)
          live_B = (k > 0) & ~canvas.done  # step 0's logits are a full pass
          error = jnp.maximum(error, jnp.where(
              live_B[:, None, None], jnp.abs(logits - exact), 0.0).max())
      else:
        logits, _, cost = full(cost, canvas)
      canvas = decoder.canvas_step(k, n * steps + k, logits, canvas,
                                   start_B, keys_B, vocab, steps)
      return k + 1, canvas, cache, cost, error

    _, canvas, _, cost, error = jax.lax.while_loop(
        cond, body, (jnp.int32(0), canvas, cache, cost, error))
    stats = dict(accepted=canvas.accepted, revised=canvas.revised,
                 steps=stats["steps"] + canvas.steps)
    return (put(tokens_BxL, canvas.argmax, start_B), cost, stats,
            canvas.trace, error)

  zeros = jnp.zeros((batch,), jnp.int32)
  records = None
  if trace:
    shape = (total, batch, width)
    records = {name: jnp.zeros(shape, jnp.int32)
               for name in ("canvas_in", "drawn", "noise", "canvas_out",
                            "argmax")}
    records.update({name: jnp.zeros(shape, bool) for name in ("accepted",)})
    records.update({name: jnp.zeros((total, batch), bool)
                    for name in ("live", "stop")})
  carry = (tokens_BxL, base.Cost.zero(models),
           dict(accepted=zeros, revised=zeros, steps=zeros), records,
           jnp.float32(0))
  tokens_BxL, cost, stats, records, error = jax.lax.fori_loop(
      0, num_blocks, block, carry)
  if measure_error:
    stats["max_logit_error"] = error
  index_BxT = prompt_lengths[:, None] + jnp.arange(t)[None, :]
  return (jnp.take_along_axis(tokens_BxL, index_BxT, 1), cost, stats,
          records)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformCanvasDecoder(ScheduledDecoder):
  """A sampler on a uniform-noise canvas (module docstring): the canvas loop
  of `uniform_eb` and `uniform_ancestral`, which differ in their step
  (`canvas_step`).

  `steps` is the step budget over the whole output, K_b = steps / N per
  block (the reference's max_denoising_steps with one block).

  Attributes (besides `IterativeDecoder`'s):
    t_min, t_max: the temperature schedule, 0 <= t_min <= t_max, t_max > 0
      and finite.
    kv_cache: "none" or "prefix" (module docstring); reuse_logits and
      cache_refresh do not apply (the canvas changes at every step).
  Raises:
    ValueError: an option outside its range, attention other than
      bidirectional, kv_cache "dual", cache_refresh "step".
  """

  steps: int = 48
  t_min: float = 0.4
  t_max: float = 0.8
  sampling: SamplingConfig = SamplingConfig(temperature=1.0)
  stability_threshold = 0  # argmax canvases kept (`Canvas.history`)

  def __post_init__(self):
    super().__post_init__()
    if not (is_number(self.t_min) and is_number(self.t_max)
            and 0 <= self.t_min <= self.t_max and 0 < self.t_max < math.inf):
      raise ValueError(f"t_min={self.t_min!r} and t_max={self.t_max!r} must "
                       "satisfy 0 <= t_min <= t_max, t_max > 0 and finite")
    if self.kv_cache not in ("none", "prefix"):
      raise ValueError(f"kv_cache={self.kv_cache!r}; allowed: ('none', "
                       "'prefix') (the canvas cannot see a cached suffix)")
    if self.cache_refresh != "block" or self.attention != "bidirectional":
      raise ValueError(f"cache_refresh={self.cache_refresh!r} and attention="
                       f"{self.attention!r} must be 'block' and "
                       "'bidirectional'")

  def canvas_step(self, k, global_step, logits_BxWxV, canvas, start_B, keys_B,
                  vocab, steps) -> Canvas:
    """The canvas after step k of a block (global step `global_step`)."""
    raise NotImplementedError

  def select(self, step):
    raise ValueError(f"{self.registry_name} has no masked positions to "
                     "select; it runs its own canvas loop (decode)")

  def run(self, models: Mapping[str, Model], prompts: jax.Array,
          prompt_lengths: jax.Array, key: jax.Array, trace: bool = False,
          measure_error: bool = False):
    """(tokens int32[B, T], cost, stats, trace records or None): the raw
    canvases; arguments and errors as `IterativeDecoder.denoise`, and a
    token-shifted model is refused (ValueError). With `measure_error`,
    stats['max_logit_error'] float32[] is the largest |logit| difference
    between the prefix cache's canvas logits and an uncached full pass on
    the same canvas (extra, uncounted passes; 0 for kv_cache "none")."""
    prompts, prompt_lengths = self._check(models, prompts, prompt_lengths)
    if token_shift(models["model"].logits_fn):
      raise ValueError(f"{self.registry_name} decodes models without a "
                       "token shift")
    return _generate(self, models, prompts, prompt_lengths,
                     base.row_keys(key, prompts.shape[0]), trace,
                     measure_error)

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Generates output_length tokens per row (module docstring).

    Returns:
      `DecodeResult`; committed int32[K, B] is W at each block's first
      step slot (its canvas is committed whole); stats: steps int32[B]
      (steps each row ran) and the subclass's (`_stats`).
    Raises:
      ValueError: as `IterativeDecoder.denoise`.
    """
    tokens, cost, stats, _ = self.run(models, prompts, prompt_lengths, key)
    tokens, lengths = finish_at_eos(tokens, self.eos_ids, self.pad_id)
    width = self.block_size()
    steps = self.max_block_steps(width)
    committed = jnp.zeros((self.num_blocks() * steps, tokens.shape[0]),
                          jnp.int32).at[::steps].set(width)
    return base.result(tokens, lengths, committed, cost, **self._stats(stats))

  def _stats(self, stats: dict) -> dict:
    return {"steps": stats["steps"]}

  def denoise(self, *args, **kwargs):
    raise ValueError(f"{self.registry_name} has no masked loop; use decode "
                     "or run")

  def infill(self, *args, **kwargs):
    raise ValueError(f"{self.registry_name} does not infill; use decode or "
                     "run")


@register("uniform_eb")
@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformEntropyBoundDecoder(UniformCanvasDecoder):
  """DiffusionGemma's sampler on a uniform-noise canvas (module docstring).

  Attributes (besides `UniformCanvasDecoder`'s):
    entropy_bound: > 0 nats, the EB-sampler's bound (reference default 0.1).
    t_min, t_max: reference defaults 0.4, 0.8.
    stability_threshold: >= 0 steps the argmax canvas must have held.
    confidence_threshold: > 0 nats, the mean entropy below which a stable
      row stops (reference default 0.005).
    early_stop: the stable-and-confident stop (False: every block runs its
      K_b steps).
  Raises:
    ValueError: as `UniformCanvasDecoder`, or an option above outside its
      range.
  """

  entropy_bound: float = 0.1
  stability_threshold: int = 1
  confidence_threshold: float = 0.005

  def __post_init__(self):
    super().__post_init__()
    for name in ("entropy_bound", "confidence_threshold"):
      value = getattr(self, name)
      if not is_number(value) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a number > 0")
    if not is_count(self.stability_threshold, 0):
      raise ValueError(f"stability_threshold={self.stability_threshold!r} "
                       "must be an integer >= 0")

  def canvas_step(self, *args) -> Canvas:
    return _canvas_step(self, *args)

  def _stats(self, stats: dict) -> dict:
    """accepted and revised int32[B] (acceptances, and those that replaced
    an earlier accepted token at the same position: the self-correction
    count), steps int32[B], self_correction float32[B] = revised /
    accepted."""
    rate = stats["revised"] / jnp.maximum(stats["accepted"], 1)
    return dict(self_correction=rate.astype(jnp.float32), **stats)


@register("uniform_ancestral")
@dataclasses.dataclass(frozen=True, kw_only=True)
class UniformAncestralDecoder(UniformCanvasDecoder):
  """Ancestral sampling of uniform-state diffusion (UDLM, Schiff et al.
  2024, arXiv:2412.10193; Duo, Sahoo et al. 2025, arXiv:2506.10892): the
  sampler of their few-step claim. From a uniform canvas at t = 1, each of
  the K_b steps of a block draws every position from the reverse step
  q(z_s | z_t, x_theta) (`ancestral_posterior`) with s = t - 1 / K_b, on
  the linear schedule alpha_t = 1 - t of the bound; the last step lands at
  s = 0 and its draws are the output. Nothing is accepted or frozen: every
  position may change at every step. No early stop; the prefix cache,
  blocks and self-conditioning as `uniform_eb`.

  Differences from the references: MASK is never drawn (its share of the
  posterior is dropped; its x_theta is 0, so the share is (1 - alpha_s) /
  V or less, except where the canvas itself holds MASK, which only the
  first step's uniform draw can), and the temperature divides the
  denoiser's logits (t_min = t_max = 1, the default, is the exact
  posterior) before the posterior is formed; temperatures below about
  1e-8 overflow the float32 posterior. `early_stop` does not apply.
  """

  t_min: float = 1.0
  t_max: float = 1.0

  def canvas_step(self, *args) -> Canvas:
    return _ancestral_step(self, *args)


def cache_error(decoder: UniformCanvasDecoder,
                models: Mapping[str, Model], prompts: jax.Array,
                prompt_lengths: jax.Array, key: jax.Array) -> jax.Array:
  """float32[]: the largest |logit| difference between kv_cache="prefix"'s
  canvas logits and an uncached full pass, over the canvases the decode fed.

  The comparison's `max_logit_error` of a cached row (the masked decoders'
  `denoise(measure_error=True)`): the decode with kv_cache="prefix" and
  `run(measure_error=True)`. Each step after a block's first runs its
  canvas (and self-conditioning input) cached and through an uncounted full
  pass; rows already stopped are left out. The prefix cache is exact, so
  this is floating-point rounding only. Arguments and errors as
  `UniformCanvasDecoder.run`.
  """
  decoder = dataclasses.replace(decoder, kv_cache="prefix")
  return decoder.run(models, prompts, prompt_lengths, key,
                     measure_error=True)[2]["max_logit_error"]
