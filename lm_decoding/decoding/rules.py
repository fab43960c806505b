"""Commit rules of the denoising decoders: which draws a step keeps.

Every rule here is a pure function of ONE row's window at one step (W
positions), traced inside the loop (`engine.generate`) and `jax.vmap`-ed over
the batch by its caller; the decoders pick one by name and never import each
other for it (as gemma's diffusion sampler plugs small strategy objects into
one loop). Masked rules see a `Step` and return which masked positions take
their draw:

- orderings (`confidence`): how positions are ranked, 'low_confidence'
  p(drawn) (LLaDA, Nie et al. 2025), 'random', 'margin' top-1 minus top-2
  (Kim et al. 2025), 'entropy' minus the entropy (Ben-Hamu et al. 2025);
- `ranked`: the n positions ranked highest (LLaDA's transfer schedule,
  MaskGIT's cosine one);
- `unmask_ancestral`: MDLM's reverse step (Sahoo et al. 2024);
- `commit_above`: threshold decoding (Fast-dLLM, Wu et al. 2025);
- `commit_in_order`: threshold decoding left to right (a run of commits
  from the first masked position: the states a left-to-right student is
  trained on);
- `commit_factor`: Fast-dLLM's factor rule;
- `entropy_bounded`: the EB-sampler's accepted set (Ben-Hamu et al. 2025),
  for masked positions and for the uniform canvas alike;
- `active_sub_block`: Fast-dLLM v2's sub-blocks (commits go to the first
  sub-block still holding a MASK).

The uniform-noise canvas (no MASK: every position holds a token) has two
steps of its own, `eb_canvas_step` (DiffusionGemma's entropy-bounded
acceptance with renoising) and `ancestral_canvas_step` (UDLM/Duo's reverse
step), over a `Canvas` carry; `docs/uniform_diffusion.md` walks through them.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding.decoding.sampling import sample, suppress
from lm_decoding.models import diffusion
from lm_decoding.models.selection import top_n

ORDERINGS = ("low_confidence", "random", "margin", "entropy")


@flax.struct.dataclass
class Step:
  """What a masked rule sees of ONE row at one step (W = window).

  Attributes:
    k: int32[] step within the block (0-based).
    masked: bool[W] window positions still MASK.
    fill: bool[W] window positions the decoder may write (the generated
      region); a rule must never commit or re-mask outside it.
    num_masked: int32[] masked window positions when the block started.
    drawn: int32[W] proposed tokens (never MASK).
    probs: float32[W, V] softmax of the raw logits (MASK included).
    committed_confidence: float32[W] probability each committed generated
      token had when it was committed (0 elsewhere).
    uniform: float32[W] U[0, 1) noise for the rule's own randomness,
      drawn per absolute position (like the proposals), so a row's result
      does not depend on where its window starts.
  """

  k: jax.Array
  masked: jax.Array
  fill: jax.Array
  num_masked: jax.Array
  drawn: jax.Array
  probs: jax.Array
  committed_confidence: jax.Array
  uniform: jax.Array

  def confidence(self, ordering: str) -> jax.Array:
    """float32[W] score of each position under `ordering` (higher first).

    Raises:
      ValueError: an ordering not in `ORDERINGS`.
    """
    if ordering == "low_confidence":
      return jnp.take_along_axis(self.probs, self.drawn[:, None], -1)[:, 0]
    if ordering == "random":
      return self.uniform
    if ordering == "margin":
      # Two max passes, not `lax.top_k(probs, 2)` (XLA's CPU top-k sorts
      # each row: 12-14x the rest of a step at T = 32) nor an argmax (slow
      # on CPU too): the top-2 value is the largest below the top, or the
      # top itself when it is reached twice (top_k's tie: margin 0).
      top = jnp.max(self.probs, -1, keepdims=True)
      at_top = self.probs == top
      below = jnp.max(jnp.where(at_top, -jnp.inf, self.probs), -1)
      second = jnp.where(at_top.sum(-1) > 1, top[:, 0], below)
      return top[:, 0] - second
    if ordering == "entropy":
      p = self.probs
      return jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.maximum(p, 1e-30)), 0.0),
                     -1)
    raise ValueError(f"ordering={ordering!r}; allowed: {ORDERINGS}")


def ranked(step: Step, ordering: str, count: jax.Array) -> jax.Array:
  """bool[W]: the `count` masked positions ranked highest by `ordering`
  (ties to the leftmost)."""
  return top_n(step.confidence(ordering), step.masked, count)


def unmask_ancestral(step: Step, schedule: str, steps: int) -> jax.Array:
  """bool[W]: MDLM's reverse step k of `steps` (t = 1 - k / steps to s =
  1 - (k + 1) / steps): each masked position is unmasked with probability
  (alpha_s - alpha_t) / (1 - alpha_t) of `schedule`, every one at the last
  step (Sahoo et al. 2024)."""
  t = 1.0 - step.k / steps
  s = 1.0 - (step.k + 1) / steps
  p_unmask = jnp.where(step.k == steps - 1, 1.0,
                       diffusion.unmask_probability(schedule, t, s))
  return step.masked & (step.uniform < p_unmask)


def commit_above(step: Step, threshold: float) -> jax.Array:
  """bool[W]: the masked positions with confidence p(drawn) > `threshold`,
  and at least the most confident one (Fast-dLLM's threshold decoding; the
  strict > keeps threshold 1 meaning one token per step even when a float32
  softmax rounds a probability to exactly 1)."""
  confidence = step.confidence("low_confidence")
  return ((step.masked & (confidence > threshold))
          | top_n(confidence, step.masked, 1))


def commit_in_order(step: Step, threshold: float) -> jax.Array:
  """bool[W]: the first masked position, then each later masked position
  while every masked position after the first, up to and including it, has
  confidence p(drawn) > `threshold`.

  Threshold decoding that commits left to right only, so masked positions
  that start as a suffix of the window stay one: the states a student
  trained on left-to-right trajectories sees
  (`certainty_forcing.semi_ar_masks` with order 'left_to_right'; d3LLM's
  pseudo-trajectories). `commit_above` may commit a confident later
  position before an unsure earlier one, a state such a student never saw.
  threshold >= 1 commits one position a step, left to right.
  """
  confidence = step.confidence("low_confidence")
  first = step.masked & (jnp.cumsum(step.masked) == 1)
  stop = step.masked & ~first & ~(confidence > threshold)
  return step.masked & (jnp.cumsum(stop) == 0)


def commit_factor(step: Step, factor: float) -> jax.Array:
  """bool[W]: with the masked confidences sorted, c_1 >= c_2 >= ..., the n
  most confident for the largest n with (n + 1)(1 - c_n) < `factor`, and at
  least the most confident one (Fast-dLLM's factor rule)."""
  confidence = step.confidence("low_confidence")
  sorted_W = -jnp.sort(-jnp.where(step.masked, confidence, -jnp.inf))
  n_W = jnp.arange(1, sorted_W.shape[0] + 1)
  count = jnp.sum((n_W + 1) * (1.0 - sorted_W) < factor)
  return (top_n(jnp.where(step.masked, confidence, -jnp.inf), step.masked,
                count)
          | top_n(confidence, step.masked, 1))


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


def active_sub_block(masked_W: jax.Array, sub_block_length: int) -> jax.Array:
  """bool[W]: the masked positions of the first sub-block of n =
  `sub_block_length` positions that still holds one (all False if none)."""
  index_W = jnp.arange(masked_W.shape[0]) // sub_block_length
  first = jnp.min(jnp.where(masked_W, index_W, masked_W.shape[0]))
  return masked_W & (index_W == first)


# ----------------------------------------------------------------------------
# The uniform-noise canvas (docs/uniform_diffusion.md).

@flax.struct.dataclass
class Canvas:
  """The canvas rule's state (leading axis B), carried across blocks.

  Attributes:
    window: int32[B, W] current (noisy) canvas.
    argmax: int32[B, W] argmax canvas of the last step (the block's output).
    history: int32[B, n, W] last n argmax canvases (-1 at a block's start;
      n = stability_threshold, 0: always stable).
    done: bool[B] rows stopped in this block.
    last_accepted: int32[B, W] token of the last acceptance, -1 if none.
    accepted: int32[B] acceptances so far (all blocks).
    revised: int32[B] acceptances that changed the last one (all blocks).
    steps: int32[B] steps run by each row (all blocks).
    trace: per-step records when traced, else None.
    previous: float32[B, W, V] softmax(processed) of the last step, the
      self-conditioning input (zeros at a block's start); None: the model
      takes none.
  """

  window: jax.Array
  argmax: jax.Array
  history: jax.Array
  done: jax.Array
  last_accepted: jax.Array
  accepted: jax.Array
  revised: jax.Array
  steps: jax.Array
  trace: dict | None
  previous: jax.Array | None = None


def temperature(t_min: float, t_max: float, k: jax.Array,
                steps: int) -> jax.Array:
  """float32[] tau at step k (0-based) of `steps`: t_min + (t_max - t_min)
  (steps - k) / steps (transformers' LinearTemperatureScheduleLogitsProcessor
  at its count-down step steps - k)."""
  remaining = steps - jnp.asarray(k, jnp.float32)
  return t_min + (t_max - t_min) * (remaining / steps)  # the reference's order


def _processed(decoder, logits_BxWxV, k, steps) -> jax.Array:
  """float32[B, W, V]: the logits at step k's temperature, MASK and the
  sampling's suppressed ids at -inf (so the argmax canvas and the entropies
  leave them out too)."""
  tau = temperature(decoder.t_min, decoder.t_max, k, steps)
  return suppress(logits_BxWxV.astype(jnp.float32),
                  decoder.sampling.suppress_ids,
                  also=(decoder.mask_id,)) / tau


def _position_keys(key, global_step, start, width):
  """[W] keys fold_in(fold_in(key, global_step), p), p = start + w."""
  step_key = jax.random.fold_in(key, global_step)
  return jax.vmap(lambda p: jax.random.fold_in(step_key, p))(
      start + jnp.arange(width))


def _traced(canvas: Canvas, new: Canvas, global_step, **record) -> Canvas:
  """`new` with this step's records written (when traced)."""
  if canvas.trace is None:
    return new
  return new.replace(trace={name: canvas.trace[name].at[global_step].set(
      value) for name, value in record.items()})


def eb_canvas_step(decoder, k, global_step, logits_BxWxV, canvas: Canvas,
                   start_B, keys_B, vocab: int, steps: int) -> Canvas:
  """DiffusionGemma's step of every row on the canvas: draw every position
  at step k's temperature, accept the EB-sampler's set (`entropy_bounded`
  with `decoder.entropy_bound`), renoise the rest uniformly, and stop a row
  whose argmax canvas held for `decoder.stability_threshold` steps with mean
  entropy < `decoder.confidence_threshold` (docs/uniform_diffusion.md)."""
  processed_BxWxV = _processed(decoder, logits_BxWxV, k, steps)
  width = canvas.window.shape[1]

  def row(processed_WxV, start, key):
    keys_Wx2 = jax.vmap(jax.random.split)(
        _position_keys(key, global_step, start, width))
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
      trace=canvas.trace,
      previous=None if canvas.previous is None else jnp.where(
          live_B[:, None, None], jax.nn.softmax(processed_BxWxV, -1),
          canvas.previous))
  return _traced(canvas, new, global_step, canvas_in=canvas.window,
                 drawn=drawn, noise=noise, accepted=accept,
                 canvas_out=new.window, argmax=argmax, live=live_B, stop=stop)


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


def ancestral_canvas_step(decoder, k, global_step, logits_BxWxV,
                          canvas: Canvas, start_B, keys_B, vocab: int,
                          steps: int) -> Canvas:
  """One reverse step of every row from t = 1 - k / K_b to s = t - 1 / K_b
  (alpha_t = 1 - t, the linear schedule of the bound): each position draws
  z_s from `ancestral_posterior` of softmax(processed), MASK excluded."""
  del vocab
  processed_BxWxV = _processed(decoder, logits_BxWxV, k, steps)
  # t and s from the count of steps left, so that s is exactly 0 at the
  # last step (k / K rounds above 1 when XLA multiplies by 1 / K)
  left = steps - jnp.asarray(k, jnp.float32)
  alpha_t = jnp.maximum(1.0 - left / steps, 0.0)
  alpha_s = 1.0 - (left - 1.0) / steps
  width = canvas.window.shape[1]

  def row(processed_WxV, z_W, start, key):
    posterior_WxV = ancestral_posterior(
        jax.nn.log_softmax(processed_WxV, -1), z_W, alpha_t, alpha_s
    ).at[:, decoder.mask_id].set(-jnp.inf)
    return jax.vmap(lambda key, x: sample(key, x[None], decoder.sampling)[0])(
        _position_keys(key, global_step, start, width), posterior_WxV
    ).astype(jnp.int32)

  drawn = jax.vmap(row)(processed_BxWxV, canvas.window, start_B, keys_B)
  new = canvas.replace(
      window=drawn, argmax=drawn, steps=canvas.steps + 1,
      previous=None if canvas.previous is None
      else jax.nn.softmax(processed_BxWxV, -1))
  return _traced(canvas, new, global_step, canvas_in=canvas.window,
                 drawn=drawn, noise=jnp.full_like(drawn, -1),
                 accepted=jnp.ones(drawn.shape, bool), canvas_out=drawn,
                 argmax=drawn, live=jnp.ones(drawn.shape[:1], bool),
                 stop=jnp.zeros(drawn.shape[:1], bool))
