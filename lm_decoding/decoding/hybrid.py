"""Hybrids of parallel drafting and autoregressive verification.

Both decoders take a masked-diffusion model (role "draft", bidirectional,
e.g. the shipped MDLM) and a causal AR model (role "target") with one
vocabulary, and run the verification loop of `speculative.DraftVerifyDecoder`.

"diffusion_draft": the diffusion model drafts the gamma positions after a
  row's last token in `draft_steps` parallel steps (the context visible,
  everything after the gamma positions hidden by the attention mask, MASK
  never drawn); the AR target verifies them by speculative sampling. Each
  step draws every still-masked draft position from q, the processed
  distribution of its logits (`sampling.probabilities`), and commits some of
  them; the q a token was drawn from is the q the verification uses.
  * order="left_to_right": step s commits the draft positions
    [floor(s gamma / k), floor((s + 1) gamma / k)). A token then depends
    only on the accepted prefix and the drafts to its LEFT (drawn at earlier
    steps), and given those it is drawn from exactly the q used to verify
    it: the speculative-sampling argument holds and the output is EXACTLY
    the target's distribution (tested by chi-square against enumeration).
  * order="confidence": step s commits the n_s masked positions whose drawn
    token is most probable (LLaDA's low-confidence remasking, n_s from
    `schedule.transfer_schedule`). A token may then have been drawn with
    drafts to its RIGHT already in the context, so the q used to verify it
    is not its conditional given the prefix and the drafts before it: the
    output is NOT exactly the target's distribution. Measured on stubs (a
    random trigram target, a denoiser whose logits depend on every visible
    token; V = 6, T = 3, gamma = k = 3, 12,000 draws;
    tests/test_speculative.py): total variation distance 0.066 from the
    exactly enumerated target distribution, against 0.028 for left_to_right,
    which is this many draws' sampling noise (its chi-square test passes).
  Cost per round: draft_steps draft calls over the whole [B, S] buffer of
  S = P + T + gamma - 1 positions (no cache: the draft is bidirectional) and
  one target call of gamma + 1 tokens.

"skeleton_polish": "diffusion skeleton + AR polish". The diffusion model
  drafts the whole continuation once (MDLM ancestral sampling, `draft_steps`
  steps over T positions); the AR model then re-scores it gamma + 1 tokens
  per call (the gamma fed and the one after them), left to right, keeping each skeleton token whose AR probability
  (softmax of the raw logits, before any processor) is >= `threshold` and
  regenerating the first one below it from the AR distribution (after the
  processors); the skeleton tokens after a regenerated one are kept and
  re-scored in the new context. Spans the AR model finds unlikely are thus
  rewritten token by token while the rest of the skeleton stands. Not
  exact: threshold 0 returns the skeleton unchanged; with greedy sampling
  and threshold 1 the output is the AR model's greedy decoding. Cost: the
  skeleton's draft calls (T + P positions each) and one target call of
  gamma + 1 tokens per round (at least ceil(T / (gamma + 1)) rounds).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Mapping

import jax
import jax.numpy as jnp

from lm_decoding.checks import is_count, is_number
from lm_decoding.decoding import base, sampling, schedule
from lm_decoding.decoding.base import register
from lm_decoding.decoding.engine import windows
from lm_decoding.decoding.mdlm import MDLMDecoder
from lm_decoding.decoding.speculative import DraftVerifyDecoder, processed
from lm_decoding.models import masks
from lm_decoding.models.selection import top_n
from lm_decoding.special_tokens import MASK_ID

ORDERS = ("left_to_right", "confidence")
# Both decoders' models: a causal AR target, a non-causal denoiser draft.
DIFFUSION_ROLES = {"target": True, "draft": False}


def _check_draft_options(decoder):
  if decoder.sampling.repetition_penalty != 1:
    raise ValueError(f"sampling.repetition_penalty="
                     f"{decoder.sampling.repetition_penalty} must be 1: the "
                     "diffusion draft draws positions in parallel")
  check_mask_id(decoder)


def check_mask_id(decoder):
  """Raises ValueError unless `decoder.mask_id` is an id >= 0 other than
  its pad_id and eos_ids (the draft fills MASK positions)."""
  if (not is_count(decoder.mask_id, minimum=0)
      or decoder.mask_id == decoder.pad_id
      or decoder.mask_id in decoder.eos_ids):
    raise ValueError(f"mask_id={decoder.mask_id!r} must be an id >= 0 other "
                     f"than pad_id={decoder.pad_id} and eos_ids="
                     f"{decoder.eos_ids}")


@register("diffusion_draft")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DiffusionDraftDecoder(DraftVerifyDecoder):
  """A masked-diffusion draft verified by an AR target (module docstring).

  Attributes (besides `DraftVerifyDecoder`'s gamma, sampling, ...):
    draft_steps: k in [1, gamma], parallel steps per draft.
    order: "left_to_right" (exact) or "confidence" (not exact).
    mask_id: the draft model's MASK id.
  """

  draft_steps: int = 1
  order: str = "left_to_right"
  mask_id: int = MASK_ID
  roles: ClassVar[tuple[str, ...]] = ("target", "draft")
  role_causal: ClassVar[Mapping[str, bool]] = DIFFUSION_ROLES

  def __post_init__(self):
    super().__post_init__()
    if not (is_count(self.draft_steps) and self.draft_steps <= self.gamma):
      raise ValueError(f"draft_steps={self.draft_steps!r} must be an integer "
                       f"in [1, gamma={self.gamma}]")
    if self.order not in ORDERS:
      raise ValueError(f"order={self.order!r}; allowed: {ORDERS}")
    _check_draft_options(self)

  def _commits(self, step, masked_BxG, confidence_BxG):
    """bool[B, G]: the draft positions committed at `step`."""
    gamma, k = self.gamma, self.draft_steps
    if self.order == "left_to_right":
      index_G = jnp.arange(gamma)
      chunk_G = (index_G >= step * gamma // k) & (
          index_G < (step + 1) * gamma // k)
      return jnp.broadcast_to(chunk_G, masked_BxG.shape)
    count = schedule.transfer_schedule(gamma, k)[step]
    return jax.vmap(lambda c, m: top_n(c, m, count))(confidence_BxG,
                                                     masked_BxG)

  def propose(self, models, state, key_B):
    gamma = self.gamma
    sequence = state.sequence[:, :-1]  # the cache's S slots: all it needs
    batch, width = sequence.shape
    pos_B = state.pos
    index_L = jnp.arange(width)
    slot_BxG = pos_B[:, None] + 1 + jnp.arange(gamma)[None, :]
    rows_Bx1 = jnp.arange(batch)[:, None]
    tokens = jnp.where(index_L[None] <= pos_B[:, None], sequence, self.pad_id)
    tokens = tokens.at[rows_Bx1, slot_BxG].set(self.mask_id)
    attention = masks.key_padding_mask(
        index_L[None] <= (pos_B + gamma)[:, None], width)
    positions = jnp.broadcast_to(index_L, (batch, width))

    def step(carry, s):
      tokens, draft, q, masked, cost = carry
      out, cost = base.forward(models, "draft", cost, tokens, positions,
                               attention_mask=attention)
      logits = windows(out.logits, pos_B + 1, gamma).astype(jnp.float32)
      probs = processed(self.sampling, logits.at[..., self.mask_id].set(
          -jnp.inf), None)
      keys = jax.vmap(lambda k: jax.vmap(
          lambda i: jax.random.fold_in(k, s * gamma + i))(jnp.arange(gamma)))(
              key_B)
      drawn = jax.vmap(jax.vmap(sampling.categorical))(keys, jnp.log(probs))
      confidence = jnp.take_along_axis(probs, drawn[..., None], -1)[..., 0]
      commit = self._commits(s, masked, confidence) & masked
      draft = jnp.where(commit, drawn, draft)
      q = jnp.where(commit[..., None], probs, q)
      tokens = tokens.at[rows_Bx1, slot_BxG].set(
          jnp.where(masked & ~commit, self.mask_id, draft))
      return (tokens, draft, q, masked & ~commit, cost), None

    vocab = base.vocab_size(models["target"])
    carry = (tokens, jnp.full((batch, gamma), self.pad_id, jnp.int32),
             jnp.zeros((batch, gamma, vocab), jnp.float32),
             jnp.ones((batch, gamma), bool), state.cost)
    (_, draft, q, _, cost), _ = jax.lax.scan(step, carry,
                                             jnp.arange(self.draft_steps))
    return draft, q, None, cost


@register("skeleton_polish")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SkeletonPolishDecoder(DraftVerifyDecoder):
  """Diffusion skeleton + AR polish (module docstring).

  Attributes (besides `DraftVerifyDecoder`'s gamma, sampling, ...):
    draft_steps: MDLM steps for the skeleton, >= 1; None means
      output_length.
    threshold: AR probability in [0, 1] a skeleton token needs to be kept.
    mask_id: the draft model's MASK id.
  """

  draft_steps: int | None = None
  threshold: float = 0.01
  mask_id: int = MASK_ID
  roles: ClassVar[tuple[str, ...]] = ("target", "draft")
  role_causal: ClassVar[Mapping[str, bool]] = DIFFUSION_ROLES

  def __post_init__(self):
    super().__post_init__()
    if self.draft_steps is not None and not is_count(self.draft_steps):
      raise ValueError(f"draft_steps={self.draft_steps!r} must be an integer "
                       ">= 1 or None (= output_length)")
    if not is_number(self.threshold) or not 0 <= self.threshold <= 1:
      raise ValueError(f"threshold={self.threshold!r} must be a number in "
                       "[0, 1]")
    _check_draft_options(self)

  def skeleton_decoder(self) -> MDLMDecoder:
    """The MDLM sampler that drafts the skeleton."""
    return MDLMDecoder(
        output_length=self.output_length,
        steps=self.draft_steps or self.output_length, sampling=self.sampling,
        mask_id=self.mask_id, pad_id=self.pad_id, eos_ids=self.eos_ids)

  def expected_work(self, batch: int, prompt_width: int) -> base.Work:
    """The target's rounds (`verify_work`) plus the skeleton decoder's own
    work."""
    return (self.verify_work(batch, prompt_width)
            + self.skeleton_decoder().expected_work(batch, prompt_width))

  def role_length(self, role, width):
    """The draft reads the prompt and the T skeleton positions only (P + T);
    the target's cache takes P + T + gamma - 1 slots."""
    if role == "draft":
      return width + self.output_length, (
          f"prompt width P={width} + output_length={self.output_length}: "
          "the skeleton")
    return super().role_length(role, width)

  def start(self, models, prompts_BxP, prompt_lengths_B, cache_length, cost,
            key_B):
    del cache_length
    out = self.skeleton_decoder().decode({"model": models["draft"]},
                                         prompts_BxP, prompt_lengths_B, key_B)
    cost = cost.merge("draft", out.calls["model"],
                      out.forward_tokens["model"])
    skeleton = jnp.pad(out.tokens, ((0, 0), (0, self.gamma + 1)),
                       constant_values=self.pad_id)
    return skeleton, cost

  def propose(self, models, state, key_B):
    del models, key_B
    return (windows(state.draft, state.generated, self.gamma), None,
            state.draft, state.cost)

  def _keeps(self, logits, tokens):
    """bool[...]: the AR probability of `tokens` is >= threshold."""
    log_p = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    log_p_d = jnp.take_along_axis(log_p, tokens[..., None], -1)[..., 0]
    floor = -math.inf if self.threshold == 0 else math.log(self.threshold)
    return log_p_d >= floor

  def accepts(self, uniform_BxG, p_BxG1xV, q_d_BxG, draft_BxG, logits_BxG1xV):
    del uniform_BxG, p_BxG1xV, q_d_BxG
    return self._keeps(logits_BxG1xV[:, :-1], draft_BxG)

  def correction(self, p_V, q_V):
    del q_V
    return p_V

  def bonus(self, state, p_BxV, logits_BxV):
    """The skeleton's next token if it passes, else a draw from p."""
    next_B = windows(state.draft, state.generated + self.gamma, 1)[:, 0]
    keep_B = self._keeps(logits_BxV, next_B)
    return jnp.where(keep_B[:, None],
                     jax.nn.one_hot(next_B, p_BxV.shape[-1]), p_BxV)
