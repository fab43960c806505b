"""Draft-and-verify decoding: speculative sampling and its one verification loop.

A draft proposes gamma tokens after a row's last token; the target scores
those gamma + 1 positions in ONE cached call; the longest acceptable prefix of
the draft is kept, plus one token from the target (a correction at the first
rejection, or a bonus after full acceptance). A round therefore commits
between 1 and gamma + 1 tokens per row for one target call.

Speculative sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling"): draft token d_i, drawn
from q_i, is accepted with probability min(1, p_i(d_i) / q_i(d_i)); the first
rejected position i draws its token from norm(max(0, p_i - q_i)); after full
acceptance the bonus token comes from p_gamma. p and q are the distributions
`sampling.probabilities` gives after the processors plain sampling applies
(repetition penalty with the row's tokens so far, temperature, top-k, top-p,
min-p), so every committed token is distributed exactly as under plain
sampling from the target with those processors. In greedy mode p and q are
one-hot and the output is the target's greedy decoding, token for token.

A draft that is a deterministic function of the context (Jacobi iterates,
prompt lookup, a fixed skeleton) is the special case q = one-hot(d): d_i is
accepted with probability p_i(d_i) and a rejection draws from p_i without
d_i. Subclasses differ only in how they draft (`start`, `propose`,
`advance`); the verification, the caches and the bookkeeping are here.

Layout (per row b; positions are absolute, slot = position in both caches):
  sequence  int32[B, L], L = S + 1 for caches of S = P + T + gamma - 1
            slots (the most a round writes): the prompt at 0..P_b - 1,
            generated token i at P_b + i, PAD after.
  pos_b     position of the row's last token x (P_b - 1 + n_b after n_b
            generated tokens); the target cache holds positions < pos_b.
  round     feed [x, d_0 .. d_{gamma-1}] at pos_b .. pos_b + gamma to the
            target (cache index pos_b), p_i = target distribution at pos_b+i;
            accept a tokens; commit d_0 .. d_{a-1} and the target's token;
            roll the target cache back to pos_b + a + 1 (the committed
            tokens but the last, which the next round feeds).
A row ends at its first EOS (kept) or after T tokens; ended rows are frozen
(still fed, for static shapes; nothing they produce is kept). The loop is a
`lax.while_loop` of at most T rounds that stops when every row has ended.

Randomness: row b's key is split into a key for draws before the loop and
one for the rounds; round r uses fold_in(round key, r), split into the
draft's draws, the acceptance uniforms and the target's draw, so a row
decodes the same alone or in any batch.

Cost: the target's prefill (one call over the prompts) plus one call of
gamma + 1 tokens per round; the draft's calls as each subclass states.
`DecodeResult.stats`:
  rounds          int32[B] verification rounds while the row was live;
  accept_counts   int32[B, gamma + 1] rounds in which exactly a draft
                  tokens were accepted and committed, a = 0 .. gamma (draft
                  tokens after an accepted EOS, or past T, are not
                  counted). The acceptance rate of draft position i is
                  sum_{a > i} / sum_{a >= i}.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import flax.struct
import jax
import jax.numpy as jnp

from lm_decoding import debug
from lm_decoding.checks import is_count
from lm_decoding.decoding import base, rows, sampling
from lm_decoding.decoding.autoregressive import SequenceConfig, prefill_body
from lm_decoding.decoding.base import DecodeResult, register
from lm_decoding.models import Model
from lm_decoding.models.config import check_attention


@flax.struct.dataclass
class Round:
  """The verification loop's carry (leading axis B on per-row arrays)."""

  sequence: jax.Array  # int32[B, L] prompt + generated, PAD after
  prompt_lengths: jax.Array  # int32[B]
  generated: jax.Array  # int32[B] tokens committed so far (n_b)
  done: jax.Array  # bool[B]
  seen: jax.Array | None  # bool[B, V] ids in the row (repetition penalty)
  cache: Any  # the target's cache; index = pos on entry to a round
  draft: Any  # the drafter's own state (a cache, a guess, a skeleton)
  committed: jax.Array  # int32[T, B] tokens committed per row per round
  accept_counts: jax.Array  # int32[B, gamma + 1]
  round: jax.Array  # int32[] rounds run
  cost: base.Cost

  @property
  def pos(self) -> jax.Array:
    """int32[B] position of each row's last token."""
    return self.prompt_lengths + self.generated - 1


def accept_exact(uniform_G, p_d_G, q_d_G):
  """bool[G]: d_i accepted with probability min(1, p(d_i) / q(d_i))."""
  return uniform_G * q_d_G < p_d_G


def residual(p_V, q_V):
  """float32[V]: norm(max(0, p - q)), the rejection distribution; p itself
  where p <= q everywhere (then no rejection could have happened)."""
  r = jnp.maximum(p_V - q_V, 0.0)
  total = r.sum()
  return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), p_V)


def leading_true(ok_G: jax.Array) -> jax.Array:
  """int32[]: length of the run of True at the start of ok."""
  return jnp.sum(jnp.cumprod(ok_G.astype(jnp.int32)), dtype=jnp.int32)


def pick(config: sampling.SamplingConfig, key: jax.Array,
         dist_V: jax.Array) -> jax.Array:
  """int32[...]: a token from `dist_V` float32[..., V], the distribution
  `sampling.probabilities` gave under `config`: its argmax when `config` is
  greedy (dist is then one-hot: the same token, without drawing noise over
  V), else a draw (`sampling.categorical`)."""
  if sampling.is_greedy(config.temperature):
    return sampling.argmax(dist_V)
  return sampling.categorical(key, jnp.log(dist_V), config.gumbel_noise)


def _seen_before(seen_BxV, draft_BxG):
  """bool[B, G + 1, V]: the row's ids before each verified position."""
  vocab = seen_BxV.shape[-1]
  hot_BxGxV = jax.nn.one_hot(draft_BxG, vocab, dtype=jnp.int32)
  cumulative = jnp.cumsum(hot_BxGxV, axis=1) > 0
  before = jnp.concatenate([jnp.zeros_like(cumulative[:, :1]), cumulative], 1)
  return seen_BxV[:, None, :] | before


def processed(config: sampling.SamplingConfig, logits_BxLxV, seen_BxLxV):
  """float32[B, L, V]: `sampling.probabilities` at every position."""
  batch, length, vocab = logits_BxLxV.shape
  flat = lambda x: None if x is None else x.reshape(batch * length, vocab)
  probs = sampling.probabilities(flat(logits_BxLxV), config, flat(seen_BxLxV))
  return probs.reshape(batch, length, vocab)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftVerifyDecoder(SequenceConfig):
  """The verification loop; subclasses draft (see the module docstring).

  Attributes (besides `SequenceConfig`'s output_length, eos_ids, pad_id):
    gamma: draft tokens per round, >= 1.
    sampling: the processors p and q are taken after (greedy: temperature 0).
  A subclass sets `roles` (always with "target") and implements `start`,
  `propose` and, if its state needs it, `advance`; `accepts`, `correction`
  and `bonus` are the acceptance rule (speculative sampling's by default).
  """

  gamma: int = 4
  sampling: sampling.SamplingConfig = sampling.SamplingConfig()
  roles: ClassVar[tuple[str, ...]] = ("target",)
  # What each role's model must be, checked before tracing: causal or not
  # (read from `logits_fn.config.attention` by `config.check_attention`,
  # where the logits_fn has a config), and whether the loop keeps a KV cache
  # for it (`check_cache`).
  role_causal: ClassVar[Mapping[str, bool]] = {"target": True}
  cached_roles: ClassVar[tuple[str, ...]] = ("target",)

  def __post_init__(self):
    super().__post_init__()
    if not is_count(self.gamma):
      raise ValueError(f"gamma={self.gamma!r} must be an integer >= 1")
    if not isinstance(self.sampling, sampling.SamplingConfig):
      raise ValueError(f"sampling={self.sampling!r} must be a SamplingConfig")
    if self.prompt_attention != "causal":
      raise ValueError(f"prompt_attention={self.prompt_attention!r} must be "
                       "'causal': draft-and-verify decoders prefill causally")

  # --- what a subclass provides ---------------------------------------------

  def expected_work(self, batch: int, prompt_width: int) -> base.Work:
    """T / 2 rounds (about one draft token accepted per round) of gamma + 1
    target positions after a prefill, and for an AR draft model ("draft"
    role) gamma draft positions a round after its own prefill."""
    work = self.verify_work(batch, prompt_width)
    if "draft" in self.roles:
      draft = batch * -(-self.output_length // 2) * self.gamma
      work += base.Work(batch * prompt_width + draft, draft)
    return work

  def verify_work(self, batch: int, prompt_width: int) -> base.Work:
    """The target's part of `expected_work`: a prefill, then T / 2 rounds
    of gamma + 1 positions."""
    target = batch * -(-self.output_length // 2) * (self.gamma + 1)
    return base.Work(batch * prompt_width + target, target)

  def start(self, models, prompts_BxP, prompt_lengths_B, cache_length, cost,
            key_B):
    """(draft state, cost) before the first round; `key_B` holds each row's
    key for draws made before it (e.g. a skeleton)."""
    del models, prompts_BxP, prompt_lengths_B, cache_length, key_B
    return None, cost

  def propose(self, models, state: Round, key_B):
    """(draft int32[B, G], q float32[B, G, V] or None, draft state, cost).

    q None: a deterministic draft (q = one-hot(draft)). `key_B` holds each
    row's key for this round's draft draws.
    """
    raise NotImplementedError

  def advance(self, state: Round, accepted_B, p_BxG1xV, new_pos_B):
    """The draft state after a round that accepted `accepted_B` tokens."""
    del accepted_B, p_BxG1xV, new_pos_B
    return state.draft

  def accepts(self, uniform_BxG, p_BxG1xV, q_d_BxG, draft_BxG, logits_BxG1xV):
    """bool[B, G]: which draft tokens pass the test (exact: min(1, p/q))."""
    del logits_BxG1xV
    p_d = jnp.take_along_axis(p_BxG1xV[:, :-1], draft_BxG[..., None], -1)[..., 0]
    return accept_exact(uniform_BxG, p_d, q_d_BxG)

  def correction(self, p_V, q_V):
    """float32[V] the distribution of the target's token at a rejection."""
    return residual(p_V, q_V)

  def bonus(self, state: Round, p_BxV, logits_BxV):
    """float32[B, V] the distribution of the token after a fully accepted
    draft (speculative sampling: p_gamma itself)."""
    del state, logits_BxV
    return p_BxV

  # --- the loop --------------------------------------------------------------

  def cache_length_for(self, width: int) -> int:
    """Slots each cache gets: `cache_length`, by default P + T + gamma - 1
    (a round writes up to position pos + gamma <= P + T - 2 + gamma).

    Raises:
      ValueError: cache_length below P + T + gamma - 1.
    """
    needed = width + self.output_length + self.gamma - 1
    if self.cache_length is not None and self.cache_length < needed:
      raise ValueError(
          f"cache_length={self.cache_length} must be >= prompt width P="
          f"{width} + output_length={self.output_length} + gamma="
          f"{self.gamma} - 1 = {needed}")
    return needed if self.cache_length is None else self.cache_length

  def role_length(self, role: str, width: int) -> tuple[int, str]:
    """(positions the `role` model must accept, how that is counted): by
    default the cache length, `cache_length_for(width)`."""
    del role
    return self.cache_length_for(width), (
        f"prompt width P={width} + output_length={self.output_length} + "
        f"gamma={self.gamma} - 1")

  def _check(self, models, prompts, prompt_lengths):
    prompts, prompt_lengths = rows.check_prompts(prompts, prompt_lengths,
                                                needs_prompt=True)
    length = self.cache_length_for(prompts.shape[1])
    vocab = base.vocab_size(models["target"])
    for role, model in models.items():
      if role in self.role_causal:
        check_attention(model.logits_fn, causal=self.role_causal[role],
                        user=f"the {role} model of {type(self).__name__}")
      base.check_positions(model, role,
                           *self.role_length(role, prompts.shape[1]))
      if role != "target" and base.vocab_size(model) != vocab:
        raise ValueError(
            f"the {role} model's vocabulary V={base.vocab_size(model)} must "
            f"equal the target's V={vocab} (draft and target must share one "
            f"tokenizer)")
    base.check_sequence_ids(prompts, self.eos_ids, self.pad_id,
                            models["target"])
    if hasattr(self, "mask_id"):
      base.check_token_ids("mask_id", self.mask_id, models["target"])
    return length, prompts, prompt_lengths

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Decodes output_length tokens after right-padded prompts.

    Args:
      models: {role: Model} for every role in `roles` ("target", and
        "draft" for decoders with a draft model).
      prompts: int32[B, P] right-padded prompts.
      prompt_lengths: int32[B] real tokens per row, in [1, P].
      key: PRNG key (or one per row, `base.row_keys`). May be None when
        sampling is greedy.
    Returns:
      A `DecodeResult`: tokens int32[B, output_length]; committed
      int32[output_length, B] per round; stats `rounds`, `accept_counts`.
    Raises:
      ValueError: roles not exactly `roles`; bad prompts or ids; models of
        different vocabularies; more positions than a model's max_len
        (`role_length`: P + output_length + gamma - 1 unless a subclass
        needs fewer); a causal model where `role_causal`
        wants a non-causal one or the reverse (a bidirectional target would
        let each verified position see the draft tokens after it; a causal
        diffusion draft was not trained to fill masks); a model without KV
        cache support in a role of `cached_roles` (`check_cache`). All
        before compiling.
    """
    base.check_models(self, models)
    return self.verify(models, prompts, prompt_lengths, key)

  def verify(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """`decode` after its role check: `models` holds the loop's roles,
    "target" and any the drafter calls (a decoder that binds other roles
    derives these from them, as `self_speculative.SelfSpeculativeDecoder`).
    Checks the models and inputs (see `decode`'s Raises) and runs the
    loop."""
    length, prompts, prompt_lengths = self._check(models, prompts,
                                                  prompt_lengths)
    batch = prompts.shape[0]
    if key is None and sampling.is_greedy(self.sampling.temperature):
      key = jax.random.key(0)  # greedy: the draws cannot change the output
    keys_B = base.row_keys(key, batch)
    for role in self.cached_roles:
      check_cache(role, models[role], batch, length)
    return _decode(self, length, models, prompts, prompt_lengths, keys_B)


# What a model's init_cache raises when it cannot build a cache (e.g. a
# config without the cache's shape fields); anything else propagates.
_CACHE_ERRORS = (AttributeError, TypeError, ValueError, NotImplementedError)


def check_cache(role: str, model: Model, batch: int, length: int) -> None:
  """Raises ValueError unless the `role` model supports a KV cache.

  The loop needs `logits_fn.init_cache(batch_size, length)` returning a
  cache with per-row `at(index)` and `rollback(length)` (as
  `models.KVCache`). The cache is built abstractly (`jax.eval_shape`):
  nothing is allocated or compiled. A model fails the check if it has no
  init_cache, if init_cache returns no such cache (None: a model without
  cache support, as the test denoisers), or if it raises one of
  `_CACHE_ERRORS` (its config cannot build a cache); the message names the
  role, what is needed and what was found.
  """
  name = type(model.logits_fn).__name__
  init = getattr(model.logits_fn, "init_cache", None)
  got, error = None, None
  if not callable(init):
    got = f"{name} has no init_cache"
  else:
    try:
      cache = jax.eval_shape(lambda: init(batch, length))
    except _CACHE_ERRORS as e:
      error = e
      got = (f"{name}.init_cache({batch}, {length}) raised "
             f"{type(e).__name__}: {e}")
    else:
      if not (hasattr(cache, "at") and hasattr(cache, "rollback")):
        got = f"{name}.init_cache returned {type(cache).__name__}"
  if got is not None:
    raise ValueError(
        f"the {role} model must support a KV cache: its logits_fn needs "
        f"init_cache(batch_size, length) returning a cache with at() and "
        f"rollback() (as models.KVCache); {got}") from error


def start(decoder: DraftVerifyDecoder, cache_length: int, models, prompts_BxP,
          prompt_lengths_B, key_B) -> Round:
  """The carry before round 0: both prefills done, nothing generated.

  The prefills are the AR decoders' (`autoregressive.prefill_body`, causal);
  each cache is then set back to index P_b - 1, the slot of the last prompt
  token x, which the first round feeds again (module docstring).
  """
  batch, width = prompts_BxP.shape
  logits_BxV, cache, cost = prefill_body(
      models, "target", base.Cost.zero(models), prompts_BxP, prompt_lengths_B,
      cache_length)
  draft, cost = decoder.start(models, prompts_BxP, prompt_lengths_B,
                              cache_length, cost, key_B)
  vocab = logits_BxV.shape[-1]
  valid_BxP = jnp.arange(width)[None, :] < prompt_lengths_B[:, None]
  seen = (sampling.token_presence(prompts_BxP, valid_BxP, vocab)
          if decoder.sampling.repetition_penalty != 1 else None)
  sequence = jnp.where(valid_BxP, prompts_BxP, decoder.pad_id)
  sequence = jnp.pad(sequence, ((0, 0), (0, cache_length + 1 - width)),
                     constant_values=decoder.pad_id)
  return Round(
      sequence=sequence.astype(jnp.int32), prompt_lengths=prompt_lengths_B,
      generated=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool), seen=seen,
      cache=cache.at(prompt_lengths_B - 1), draft=draft,
      committed=jnp.zeros((decoder.output_length, batch), jnp.int32),
      accept_counts=jnp.zeros((batch, decoder.gamma + 1), jnp.int32),
      round=jnp.int32(0), cost=cost)


def round_keys(state: Round, keys_B) -> jax.Array:
  """PRNG keys [B, 3] of this round: the draft's draws, the acceptance
  uniforms, the target's draw (see the module docstring)."""
  return jax.vmap(lambda k: jax.random.split(
      jax.random.fold_in(k, state.round), 3))(keys_B)


def verify_round(decoder: DraftVerifyDecoder, models, state: Round,
                 keys_B) -> Round:
  """One round: draft, one target call on gamma + 1 positions, accept,
  commit, roll both caches back (see the module docstring).

  The three parts, `decoder.propose`, `score` and `settle`, are separate
  functions so that each can be timed alone (experiments/speculative.py).
  """
  keys_Bx3 = round_keys(state, keys_B)
  draft_BxG, q_BxGxV, draft_state, cost = decoder.propose(
      models, state, keys_Bx3[:, 0])
  state = state.replace(draft=draft_state, cost=cost)
  out, cost = score(models, state, draft_BxG)
  return settle(decoder, state.replace(cost=cost), draft_BxG, q_BxGxV, out,
                keys_Bx3)


def score(models, state: Round, draft_BxG) -> tuple[Any, base.Cost]:
  """(ModelOutput, cost): the target's one cached call on [x, draft] at
  positions pos .. pos + gamma (logits float32[B, gamma + 1, V])."""
  pos_B = state.pos
  x_B = state.sequence[jnp.arange(pos_B.shape[0]), pos_B]
  fed_BxG1 = jnp.concatenate([x_B[:, None], draft_BxG], 1)
  positions_BxG1 = pos_B[:, None] + jnp.arange(fed_BxG1.shape[1])[None, :]
  return base.forward(models, "target", state.cost, fed_BxG1, positions_BxG1,
                      cache=state.cache.at(pos_B))


def settle(decoder: DraftVerifyDecoder, state: Round, draft_BxG, q_BxGxV,
           out, keys_Bx3) -> Round:
  """The rest of a round after `score`: the acceptance test, the target's
  token, the commit (cut at EOS and T), both caches rolled back, the
  statistics and the draft's `advance`."""
  gamma = decoder.gamma
  pos_B = state.pos
  seen = (None if state.seen is None
          else _seen_before(state.seen, draft_BxG))
  p_BxG1xV = processed(decoder.sampling, out.logits, seen)
  vocab = p_BxG1xV.shape[-1]
  if q_BxGxV is None:
    q_BxGxV = jax.nn.one_hot(draft_BxG, vocab, dtype=jnp.float32)
  q_d_BxG = jnp.take_along_axis(q_BxGxV, draft_BxG[..., None], -1)[..., 0]
  uniform_BxG = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(
      keys_Bx3[:, 1])
  ok_BxG = decoder.accepts(uniform_BxG, p_BxG1xV, q_d_BxG, draft_BxG,
                           out.logits)
  accepted_B = jax.vmap(leading_true)(ok_BxG)
  token_B = _target_tokens(decoder, state, p_BxG1xV, q_BxGxV, out.logits,
                           accepted_B, keys_Bx3[:, 2])
  new_BxG1, count_B, is_eos = _cut(decoder, state, draft_BxG, accepted_B,
                                   token_B)
  index_G1 = jnp.arange(gamma + 1)
  live_B = ~state.done
  sequence = jax.vmap(lambda s, n, p, live: jnp.where(
      live, jax.lax.dynamic_update_slice(s, n, (p + 1,)), s))(
          state.sequence, new_BxG1, pos_B, live_B)
  seen = state.seen
  if seen is not None:
    valid = index_G1[None] < count_B[:, None]
    seen = seen | sampling.token_presence(new_BxG1, valid, vocab)
  generated = state.generated + count_B
  ended_B = (is_eos & (index_G1[None] < count_B[:, None])).any(1)
  new_pos_B = jnp.where(live_B, pos_B + count_B, pos_B)
  # Draft tokens past the cut (after an EOS, past T) were not committed:
  # the statistics count only the accepted ones that were.
  committed_draft_B = jnp.minimum(accepted_B, count_B)
  accept_counts = state.accept_counts + (
      live_B[:, None] & (committed_draft_B[:, None] == index_G1[None])
  ).astype(jnp.int32)
  state = state.replace(
      sequence=sequence, generated=generated,
      done=state.done | ended_B | (generated >= decoder.output_length),
      seen=seen, cache=out.cache.rollback(new_pos_B),
      committed=state.committed.at[state.round].set(count_B),
      accept_counts=accept_counts, round=state.round + 1)
  return state.replace(
      draft=decoder.advance(state, accepted_B, p_BxG1xV, new_pos_B))


def _target_tokens(decoder: DraftVerifyDecoder, state: Round, p_BxG1xV,
                   q_BxGxV, logits_BxG1xV, accepted_B, keys_B) -> jax.Array:
  """int32[B]: the target's token of each row: drawn from the correction at
  the first rejected position a < gamma, else from the bonus distribution."""
  gamma = decoder.gamma

  def target_token(key, p_G1xV, q_GxV, a, bonus_V):
    q_padded = jnp.concatenate([q_GxV, jnp.zeros_like(q_GxV[:1])], 0)
    dist = jnp.where(a < gamma, decoder.correction(p_G1xV[a], q_padded[a]),
                     bonus_V)
    return pick(decoder.sampling, key, dist)

  bonus_BxV = decoder.bonus(state, p_BxG1xV[:, -1], logits_BxG1xV[:, -1])
  return jax.vmap(target_token)(keys_B, p_BxG1xV, q_BxGxV, accepted_B,
                                bonus_BxV)


def _cut(decoder: DraftVerifyDecoder, state: Round, draft_BxG, accepted_B,
         token_B) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(new int32[B, gamma + 1], count int32[B], is_eos bool[B, gamma + 1]):
  the accepted draft then the target's token, cut after the first EOS (kept)
  and at T tokens, PAD past the count (0 for ended rows)."""
  gamma = decoder.gamma
  index_G1 = jnp.arange(gamma + 1)
  new_BxG1 = jnp.where(index_G1[None] < accepted_B[:, None],
                       jnp.pad(draft_BxG, ((0, 0), (0, 1))), token_B[:, None])
  is_eos = rows.is_eos(new_BxG1, decoder.eos_ids)
  first_eos_B = jnp.where(is_eos.any(1), jnp.argmax(is_eos, 1), gamma + 1)
  count_B = jnp.minimum(jnp.minimum(accepted_B + 1, first_eos_B + 1),
                        decoder.output_length - state.generated)
  count_B = jnp.where(~state.done, count_B, 0)
  new_BxG1 = jnp.where(index_G1[None] < count_B[:, None], new_BxG1,
                       decoder.pad_id)
  return new_BxG1, count_B, is_eos


def finish(decoder: DraftVerifyDecoder, state: Round) -> DecodeResult:
  """The `DecodeResult` of a finished loop."""
  steps_T = jnp.arange(decoder.output_length)
  index_BxT = state.prompt_lengths[:, None] + steps_T[None, :]
  tokens = jnp.take_along_axis(state.sequence, index_BxT, 1)
  tokens = jnp.where(steps_T[None] < state.generated[:, None], tokens,
                     decoder.pad_id)
  rounds_B = (state.committed > 0).sum(0, dtype=jnp.int32)
  return base.result(tokens, state.generated, state.committed, state.cost,
                     rounds=rounds_B, accept_counts=state.accept_counts)


@debug.jit(static_argnames=("decoder", "cache_length"))
def _decode(decoder, cache_length, models, prompts, prompt_lengths, keys_B):
  keys_Bx2 = jax.vmap(jax.random.split)(keys_B)
  state = start(decoder, cache_length, models, prompts.astype(jnp.int32),
                prompt_lengths.astype(jnp.int32), keys_Bx2[:, 0])
  state = jax.lax.while_loop(
      lambda s: (s.round < decoder.output_length) & ~jnp.all(s.done),
      lambda s: verify_round(decoder, models, s, keys_Bx2[:, 1]), state)
  return finish(decoder, state)


def draw(config: sampling.SamplingConfig, keys_B, logits_BxV, seen_BxV):
  """(token int32[B], q float32[B, V]): one draft token per row, drawn with
  the row's key from q, the processed distribution `sampling.probabilities`."""
  q_BxV = sampling.probabilities(logits_BxV, config, seen_BxV)
  tokens_B = jax.vmap(lambda k, q: pick(config, k, q))(keys_B, q_BxV)
  return tokens_B, q_BxV


@register("speculative")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeDecoder(DraftVerifyDecoder):
  """Speculative sampling with a small autoregressive draft model.

  Roles: "target" (the model whose distribution is sampled) and "draft" (a
  cheaper causal model with the same vocabulary and tokenizer). The draft
  keeps its own KV cache; each round it proposes gamma tokens in gamma calls:
  the first feeds two tokens [sequence[c], sequence[c + 1]] at its cache
  index c, which is pos (the last token x, and a placeholder the next call
  overwrites) or pos - 1 (after a round that accepted every draft token,
  whose last draft token the draft has not yet seen, and x); the other
  gamma - 1 calls feed one draft token each. After verification the draft
  cache is rolled back to min(its index, the new pos). Cost per round:
  gamma draft calls and one target call of gamma + 1 tokens; plus one
  prefill each. The output distribution is exactly the target's (see the
  module docstring).
  """

  roles: ClassVar[tuple[str, ...]] = ("target", "draft")
  role_causal: ClassVar[Mapping[str, bool]] = {"target": True,
                                               "draft": True}
  cached_roles: ClassVar[tuple[str, ...]] = ("target", "draft")

  def start(self, models, prompts_BxP, prompt_lengths_B, cache_length, cost,
            key_B):
    del key_B
    _, cache, cost = prefill_body(models, "draft", cost, prompts_BxP,
                                  prompt_lengths_B, cache_length)
    return cache.at(prompt_lengths_B - 1), cost

  def propose(self, models, state, key_B):
    pos_B, fed_B = state.pos, state.draft.index
    rows_B = jnp.arange(pos_B.shape[0])
    pair_Bx2 = jax.vmap(lambda s, c: jax.lax.dynamic_slice(s, (c,), (2,)))(
        state.sequence, fed_B)
    out, cost = base.forward(models, "draft", state.cost, pair_Bx2,
                             fed_B[:, None] + jnp.arange(2)[None, :],
                             cache=state.draft)
    logits_BxV = out.logits[rows_B, pos_B - fed_B]
    keys_BxG = jax.vmap(lambda k: jax.vmap(lambda j: jax.random.fold_in(k, j))(
        jnp.arange(self.gamma)))(key_B)

    def step(carry, j):
      logits_BxV, cache, seen, cost = carry
      token_B, q_BxV = draw(self.sampling, keys_BxG[:, j], logits_BxV, seen)
      seen = None if seen is None else seen.at[rows_B, token_B].set(True)
      out, cost = base.forward(models, "draft", cost, token_B[:, None],
                               (pos_B + j + 1)[:, None], cache=cache)
      return (out.logits[:, 0], out.cache, seen, cost), (token_B, q_BxV)

    carry = (logits_BxV, out.cache.at(pos_B + 1), state.seen, cost)
    carry, (draft_GxB, q_GxBxV) = jax.lax.scan(
        step, carry, jnp.arange(self.gamma - 1))
    logits_BxV, cache, seen, cost = carry
    last_B, last_q_BxV = draw(self.sampling, keys_BxG[:, -1], logits_BxV, seen)
    draft_BxG = jnp.concatenate([draft_GxB.T, last_B[:, None]], 1)
    q_BxGxV = jnp.concatenate([q_GxBxV.transpose(1, 0, 2),
                               last_q_BxV[:, None]], 1)
    return draft_BxG, q_BxGxV, cache, cost

  def advance(self, state, accepted_B, p_BxG1xV, new_pos_B):
    del accepted_B, p_BxG1xV
    return state.draft.rollback(new_pos_B)
