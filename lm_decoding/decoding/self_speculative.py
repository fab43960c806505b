"""Lossless self-speculation: a block-diffusion model drafts for itself at
block size 1.

A block-diffusion model with a token shift (BD3-LM adapted from an AR parent,
`TransformerConfig.token_shift`: the logits at position i predict token
i + 1) is, at block size 1, an AR model: every position sees itself and the
positions before it (`models.binding.causal_view`). The same weights can
therefore draft a block in diffusion mode and verify it in AR mode, and the
output is exactly that AR model's (S2D2, arXiv:2603.25702: self-speculative
decoding of block-diffusion models; SSD, arXiv:2510.04147, the same idea for
LLaDA and Dream, with the draft and its verification in one forward).

"self_speculative" runs the one verification loop of
`speculative.DraftVerifyDecoder` with the model in two roles, both the same
parameters: "target", the causal view, which prefills and verifies (the
exact KV cache of the committed tokens, rolled back per row at rejections),
and "draft", the model as trained. Each round the drafter makes ONE cached
call on [x, MASK x gamma] at positions pos .. pos + gamma (x: the row's last
token, cache index pos):

    position   pos    pos+1  ...  pos+gamma
    fed        x      MASK   ...  MASK         drafted block: pos+1..pos+gamma
    attends    cache  cache, x and the whole block (bidirectional)
               and x
    predicts   d_0    d_1    ...  (unused: the next block's first token)

as the BD3-LM training layout with a token shift (`objectives.bd3lm_loss`):
the block's first token is predicted by the clean token before it (here
causally: x's logits are the AR model's own), the others by the MASK
positions before them, which see the committed prefix and the block. The
call's cache writes are dropped: the target's call on [x, d_0 .. d_{gamma-1}]
writes the same slots. d_j is drawn from q_j, the processed distribution
(`sampling.probabilities`, after the row's repetition penalty for its
committed tokens) of the draft logits with MASK excluded; verification is
speculative sampling (Leviathan et al. 2023): accepted with probability
min(1, p/q), greedy: exactly when d_j is the AR argmax. Every committed token
is therefore distributed as plain sampling from the block-size-1 model with
the same processors, and greedy output is its greedy decoding, token for
token.

gamma is the drafted block: the model's training block length W or a
sub-block of it (checked where the config declares W: `block_length` of
'block_causal' attention; the shipped BD3-LMs are declared 'bidirectional',
their W in the recipe's `train.block_length`). A round commits between 1
and gamma + 1 tokens; greedy, d_0 is the target's own next token up to the
float rounding of two calls of different widths, so a round nearly always
commits 2 or more.

Cost per round: one draft call and one verify call of gamma + 1 positions
each (role "model" counts both, B (gamma + 1) positions each), plus the
causal prefill. TPF (tokens per verifying call) = tokens / rounds
(`stats["rounds"]`); `stats["accept_counts"]` is the acceptance-length
histogram (`speculative` module docstring).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

import jax
import jax.numpy as jnp

from lm_decoding.decoding import base
from lm_decoding.decoding.base import DecodeResult, register
from lm_decoding.decoding.hybrid import check_mask_id
from lm_decoding.decoding.speculative import (DraftVerifyDecoder, pick,
                                              processed)
from lm_decoding.models import Model, masks
from lm_decoding.models.binding import causal_view
from lm_decoding.models.config import check_attention, token_shift
from lm_decoding.special_tokens import MASK_ID


def draft_mask(index_B: jax.Array, length: int,
               cache_length: int) -> jax.Array:
  """bool[B, L, S]: the draft call's mask (module docstring). Query 0 (x)
  sees the written slots up to its own (causal); queries 1..L-1 (the MASK
  block) see every written slot, the block included.

  Args:
    index_B: int32[B] slot of x, the call's first query.
    length: L = gamma + 1 queries.
    cache_length: S slots.
  """
  causal = masks.cache_query_mask(index_B, length, cache_length, True)
  block = masks.cache_query_mask(index_B, length, cache_length, False)
  return jnp.where((jnp.arange(length) == 0)[None, :, None], causal, block)


def check_block_diffusion(model: Model, gamma: int, user: str) -> None:
  """Raises ValueError unless `model` can draft for itself at block size 1.

  Read from `logits_fn.config` (a Transformer's, or a stub's that carries
  one): attention must be non-causal (a diffusion model: 'block_causal', or
  'bidirectional' as the shipped BD3-LMs are declared, their block being a
  decoder option; `config.check_attention`), token_shift True (logits at i
  predict token i + 1, as its AR parent's: at block size 1 the same model
  is that AR model), and, where the config declares a block
  (`block_length` of 'block_causal'), gamma <= it (the drafted block is the
  training block or a sub-block of it). A logits_fn without a config (a
  stub) is accepted, there being nothing to read.
  """
  config = getattr(model.logits_fn, "config", None)
  if config is None:
    return
  check_attention(model.logits_fn, causal=False, user=user)
  if not token_shift(model.logits_fn):
    raise ValueError(
        f"{user} needs a model with a token shift (logits at i predict "
        f"token i + 1, as its AR parent's); logits_fn.config.token_shift="
        f"{config.token_shift!r}")
  if config.block_length and gamma > config.block_length:
    raise ValueError(
        f"gamma={gamma} must be in [1, block_length={config.block_length}] "
        f"(the model's training block: the draft is that block or a "
        f"sub-block of it)")


@register("self_speculative")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SelfSpeculativeDecoder(DraftVerifyDecoder):
  """A block-diffusion model drafting for itself at block size 1 (module
  docstring).

  Role "model": a block-diffusion model with a token shift (e.g. the base
  set's `bd3lm4_from_ar`). Attributes (besides `DraftVerifyDecoder`'s
  output_length, eos_ids, pad_id, sampling):
    gamma: drafted block length, >= 1: the model's training block length W
      or less (a sub-block); checked against `config.block_length` where
      the config declares one, else the caller's to match (the shipped
      members' W is `train.block_length` in their recipe).
    mask_id: the model's MASK id.
  """

  mask_id: int = MASK_ID
  roles: ClassVar[tuple[str, ...]] = ("model",)

  def __post_init__(self):
    super().__post_init__()
    check_mask_id(self)

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Decodes output_length tokens after right-padded prompts.

    Args:
      models: {"model": the block-diffusion model}.
      prompts: int32[B, P] right-padded prompts.
      prompt_lengths: int32[B] real tokens per row, in [1, P].
      key: PRNG key (or one per row); may be None when greedy.
    Returns:
      A `DecodeResult` as `DraftVerifyDecoder.decode`'s, calls and
      forward_tokens under "model" (draft and verify calls together).
    Raises:
      ValueError: roles not exactly ("model",); a causal model, one
        without a token shift, or a declared block shorter than gamma
        (`check_block_diffusion`); and `DraftVerifyDecoder.decode`'s. All
        before compiling.
    """
    base.check_models(self, models)
    model = models["model"]
    check_block_diffusion(model, self.gamma, type(self).__name__)
    out = self.verify({"target": causal_view(model), "draft": model},
                      prompts, prompt_lengths, key)
    total = lambda counts: {"model": counts["target"] + counts["draft"]}
    return out.replace(calls=total(out.calls),
                       forward_tokens=total(out.forward_tokens))

  def propose(self, models, state, key_B):
    gamma = self.gamma
    pos_B = state.pos
    batch = pos_B.shape[0]
    x_B = state.sequence[jnp.arange(batch), pos_B]
    fed_BxG1 = jnp.concatenate(
        [x_B[:, None], jnp.full((batch, gamma), self.mask_id, jnp.int32)], 1)
    positions_BxG1 = pos_B[:, None] + jnp.arange(gamma + 1)[None, :]
    cache_length = state.sequence.shape[1] - 1  # the Round layout's S
    out, cost = base.forward(
        models, "draft", state.cost, fed_BxG1, positions_BxG1,
        cache=state.cache.at(pos_B),
        attention_mask=draft_mask(pos_B, gamma + 1, cache_length))
    logits_BxGxV = out.logits[:, :gamma].at[..., self.mask_id].set(-jnp.inf)
    seen = (None if state.seen is None else jnp.broadcast_to(
        state.seen[:, None], logits_BxGxV.shape))
    q_BxGxV = processed(self.sampling, logits_BxGxV, seen)
    keys_BxG = jax.vmap(lambda k: jax.vmap(lambda j: jax.random.fold_in(k, j))(
        jnp.arange(gamma)))(key_B)
    draft_BxG = jax.vmap(jax.vmap(lambda k, q: pick(self.sampling, k, q)))(
        keys_BxG, q_BxGxV)
    return draft_BxG.astype(jnp.int32), q_BxGxV, None, cost

  def expected_work(self, batch: int, prompt_width: int) -> base.Work:
    """The forward token positions and drawn positions of one decode, before
    it runs: the causal prefill (B P) and T / 2 rounds (about two tokens a
    round: d_0 is the target's own token) of a draft and a verify call of
    B (gamma + 1) positions each; the draft draws gamma positions a row,
    the verification gamma + 1."""
    rounds = -(-self.output_length // 2)
    per_call = batch * (self.gamma + 1)
    return base.Work(batch * prompt_width + 2 * rounds * per_call,
                     rounds * batch * (2 * self.gamma + 1))
