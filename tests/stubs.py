"""Stub `logits_fn`s for decoder tests (the LogitsFn protocol of decoding/base.py).

Import from a test module as `import stubs` (pytest puts `tests/` on sys.path).

`TableLogitsFn` is a model whose logits are read from a fixed table:

    logits[b, l] = table[b % R, positions[b, l], previous[b, l], tokens[b, l]]

(float32[V]), where `previous` is the token before the input one: the input
to its left, or for the first input of a call the token in cache slot
index - 1 (PAD = 0 at slot 0 or without a cache). So the logits depend on the
batch row (only if R > 1), the position, and the last two tokens: a
position-dependent trigram model that reads its cache — a decoder that sets
the cache index wrongly, or pairs a beam with another beam's cache row, gets
different logits. Rows are batch indices: use R > 1 only with decoders that
keep the batch layout (not beam search, which calls the model on
B * num_beams rows). The constructors cover the usual scripts:

  * `TableLogitsFn.scripted(next_tokens, vocab_size)`: a fixed function of
    (row, position): after the input at position p, row r predicts
    next_tokens[r][p] (logit `margin` there, 0 elsewhere), whatever the
    tokens. With a prompt of length P, generated token i comes from position
    P - 1 + i.
  * `TableLogitsFn.by_position(fn, vocab_size, max_len)`: row-independent;
    after position p the model predicts fn(p): decoded tokens reveal which
    positions a decoder fed (e.g. ragged prompts).
  * `TableLogitsFn.random(seed, vocab_size, max_len, masked_ids=...)`:
    row-independent random trigram logits (beam search, sampling);
    `masked_ids` (e.g. PAD) get logit -inf.

It threads a `StubCache` like the Transformer's `KVCache` (per-row write
`index`, the L inputs written at index, index advanced by L); all cache leaves
have the batch as leading axis, as beam search requires.

`calls` records the shape of every call's `tokens`: under `jax.jit` that is
one entry per trace, under `jax.disable_jit()` one per real forward pass (so a
test can check a decoder's NFE count against the calls it made). `executed`
records B * L for every call actually executed, jitted or not (a
`jax.debug.callback`, so calls skipped by `lax.cond` or a finished
`while_loop` are absent): the ground truth for a decoder's reported
`forward_tokens` and `calls`.

The stubs return `ModelOutput(logits, cache, hidden)`, hidden being the
one-hot input tokens (float32[B, L, V]), and ignore `attention_mask`.

`HashDenoiser` is a bidirectional stand-in for a masked-diffusion denoiser:
pseudo-random logits of (row context, position, token, params), where the
context hashes every visible non-MASK token of the row, so each position's
logits change when any token of its row is committed, and a row's logits are
exact and independent of the other rows. It records `executed` like
`TableLogitsFn`.

`VisibleHashLogitsFn` hashes, per query, every (slot, token) its
`attention_mask` lets it see, reading and writing a `StubCache`: cached and
uncached calls agree exactly when each query sees the same tokens (block
diffusion's prefix cache). `RecordingLogitsFn` returns zero logits and keeps
every call's inputs (checks of the layouts and masks a loss builds).

`PositionLogitsFn` gives logits table[position] in every row, whatever the
tokens (a one-pass NAR or denoiser stand-in whose output reveals which
positions a decoder fed), hidden states of ones, optional length logits,
and no cache.

`RaisingLogitsFn` fails on any use: a decoder that raises ValueError with it
has checked its input before tracing or compiling anything. Its `config`, if
given, is only read (checks of the model's attention kind). Its variants
differ in KV cache support only, and still fail on any call:
`NoInitCacheLogitsFn` has no init_cache, `NoneCacheLogitsFn`'s returns None
(a model that keeps no cache, as `HashDenoiser`), and `ConfigCacheLogitsFn`'s
builds a `KVCache` from `config`: with a `TransformerConfig` it supports a
cache, with a config that cannot build one (None by default) it raises
AttributeError.

The stubs are frozen dataclasses hashed by identity (eq=False), so they are
valid static jit arguments even though they hold numpy arrays.

Helpers of the bad-input tables (`BAD_INPUTS` in each module's test file,
every row raising one clear error before any work): `decoder` and
`decode_raising` build a decoder and decode on `RaisingLogitsFn`s;
`refused_before_work` runs an entry point's row (`train`, the main job's
`plan`); `exits_with_one_line` runs an experiment script as a user does.
`small_config` and `write_corpus` make a tiny training config and its corpus.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys
import types
from typing import Any, Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lm_decoding.decoding import base, make_decoder
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.models import KVCache, Model, init_params
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID, PAD_ID


@flax.struct.dataclass
class StubCache:
  """Stands in for `KVCache`: the tokens written to each slot.

  Attributes:
    tokens: int32[B, S] token written at each slot (0 if never written).
    index: int32[B] next write slot of each row.
  """

  tokens: jax.Array
  index: jax.Array

  def at(self, index_B):
    index_B = jnp.broadcast_to(jnp.asarray(index_B, jnp.int32),
                               self.index.shape)
    return self.replace(index=index_B)

  def rollback(self, length_B):
    return self.at(jnp.minimum(self.index, length_B))

  def reorder(self, rows_B):
    return StubCache(tokens=self.tokens[rows_B], index=self.index[rows_B])

  def where(self, rows_B, other):
    return StubCache(tokens=jnp.where(rows_B[:, None], self.tokens,
                                      other.tokens),
                     index=jnp.where(rows_B, self.index, other.index))


@dataclasses.dataclass(frozen=True, eq=False)
class TableLogitsFn:
  """A position-dependent trigram model read from a table (see module doc).

  Attributes:
    table: float32[R, N, V, V, V] numpy array indexed by (row, position,
      previous token, token); N is `max_len`.
    calls: shapes of the `tokens` of every call (see module doc).
  """

  table: np.ndarray
  calls: list = dataclasses.field(default_factory=list)
  executed: list = dataclasses.field(default_factory=list)

  @property
  def max_len(self) -> int:
    return self.table.shape[1]

  @property
  def vocab_size(self) -> int:
    return self.table.shape[-1]

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params, attention_mask
    self.calls.append(tuple(tokens.shape))
    size = int(np.prod(tokens.shape))
    jax.debug.callback(lambda: self.executed.append(size))
    batch = tokens.shape[0]
    tokens = tokens.astype(jnp.int32)
    first_previous_B = jnp.zeros((batch,), jnp.int32)
    if cache is not None:
      slot_B = jnp.maximum(cache.index - 1, 0)
      stored_B = jnp.take_along_axis(cache.tokens, slot_B[:, None], 1)[:, 0]
      first_previous_B = jnp.where(cache.index > 0, stored_B, 0)
    previous_BxL = jnp.concatenate([first_previous_B[:, None], tokens[:, :-1]],
                                   axis=1)
    rows_Bx1 = (jnp.arange(batch) % self.table.shape[0])[:, None]
    logits_BxLxV = jnp.asarray(self.table)[rows_Bx1, positions, previous_BxL,
                                           tokens]
    hidden = jax.nn.one_hot(tokens, self.table.shape[-1])
    if cache is None:
      return ModelOutput(logits_BxLxV, None, hidden)
    written = jax.vmap(lambda buf, new, i: jax.lax.dynamic_update_slice(
        buf, new, (i,)))(cache.tokens, tokens, cache.index)
    return ModelOutput(logits_BxLxV, cache.replace(
        tokens=written, index=cache.index + tokens.shape[1]), hidden)

  def init_cache(self, batch_size: int, length: int) -> StubCache:
    return StubCache(tokens=jnp.zeros((batch_size, length), jnp.int32),
                     index=jnp.zeros((batch_size,), jnp.int32))

  def next_log_probs(self, row: int, position: int, previous: int,
                     token: int) -> np.ndarray:
    """float64[V] log-softmax of the logits after (previous, token)."""
    logits = self.table[row % self.table.shape[0], position, previous, token]
    logits = logits.astype(np.float64)
    top = logits.max()
    return logits - top - np.log(np.exp(logits - top).sum())

  @classmethod
  def scripted(cls, next_tokens: Sequence[Sequence[int]], vocab_size: int,
               margin: float = 10.0) -> "TableLogitsFn":
    """Row r predicts next_tokens[r][p] after the input at position p.

    max_len is the longest script; rows are read modulo the number of scripts.
    """
    max_len = max(len(script) for script in next_tokens)
    table = np.zeros((len(next_tokens), max_len) + (vocab_size,) * 3,
                     np.float32)
    for r, script in enumerate(next_tokens):
      for p, token in enumerate(script):
        table[r, p, ..., token] = margin
    return cls(table)

  @classmethod
  def by_position(cls, fn: Callable[[int], int], vocab_size: int,
                  max_len: int, margin: float = 10.0) -> "TableLogitsFn":
    """Every row predicts fn(p) after the input at position p."""
    return cls.scripted([[fn(p) for p in range(max_len)]], vocab_size, margin)

  @classmethod
  def random(cls, seed: int, vocab_size: int, max_len: int,
             masked_ids: Sequence[int] = (), scale: float = 2.0
             ) -> "TableLogitsFn":
    """Row-independent random trigram logits ~ N(0, scale^2); masked ids -inf."""
    rng = np.random.default_rng(seed)
    table = scale * rng.standard_normal((1, max_len) + (vocab_size,) * 3)
    table[..., list(masked_ids)] = -np.inf
    return cls(table.astype(np.float32))


def _hash_to_logits(x: jax.Array) -> jax.Array:
  """float32 logits in [0, 4) from uint32 hashes (a murmur3-style finaliser,
  so neighbouring inputs give unrelated logits)."""
  for shift, factor in ((15, 2246822519), (13, 3266489917), (16, 1)):
    x = (x ^ (x >> shift)) * jnp.uint32(factor)
  return (x >> 8).astype(jnp.float32) * (4.0 / 2 ** 24)


@dataclasses.dataclass(frozen=True, eq=False)
class HashDenoiser:
  """Pseudo-random, context-dependent denoiser logits (see module doc).

  The context hashes the row's visible non-MASK tokens (keys no query of the
  row may attend to, e.g. PAD, excluded) in uint32 arithmetic. At unmasked
  positions the next token id gets +5: a decoder that re-samples committed
  positions would change them. `params` is a uint32 scalar seed. No cache.
  """

  vocab: int = 16
  max_len: int = 64
  mask_id: int = MASK_ID
  executed: list = dataclasses.field(default_factory=list)

  @property
  def vocab_size(self) -> int:
    return self.vocab

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    size = int(np.prod(tokens.shape))
    jax.debug.callback(lambda: self.executed.append(size))
    u32 = lambda x: jnp.asarray(x, jnp.uint32)
    visible = tokens != self.mask_id
    if attention_mask is not None:
      visible &= attention_mask.any(1)
    terms = u32(tokens + 1) * u32(2 * positions + 1) * u32(2654435761)
    context_B = jnp.sum(jnp.where(visible, terms, u32(0)), 1, dtype=jnp.uint32)
    x = (context_B[:, None, None] + u32(positions)[..., None] * u32(40503)
         + jnp.arange(self.vocab, dtype=jnp.uint32) * u32(97) + u32(params))
    logits = _hash_to_logits(x)
    bonus = jax.nn.one_hot((tokens + 1) % self.vocab, self.vocab) * 5.0
    return ModelOutput(logits + bonus * (tokens != self.mask_id)[..., None],
                       cache)

  def init_cache(self, batch_size, length):
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class VisibleHashLogitsFn:
  """Logits that hash every (slot, token) a query may attend to, per row.

  Honours `attention_mask` and a `StubCache` (keys are the cache slots,
  holding the tokens written there, the L new ones included), so cached and
  uncached calls agree exactly when, and only when, each query sees the same
  tokens at the same positions. PAD gets logit -inf. Records B * L per
  executed call.
  """

  vocab: int = 8
  max_len: int = 24
  executed: list = dataclasses.field(default_factory=list)

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params
    size = int(np.prod(tokens.shape))
    jax.debug.callback(lambda: self.executed.append(size))
    u32 = lambda x: jnp.asarray(x, jnp.uint32)
    keys, slots = tokens, positions
    if attention_mask is None:  # e.g. an abstract shape probe
      attention_mask = jnp.ones(tokens.shape + tokens.shape[1:], bool)
    if cache is not None:
      keys = jax.vmap(lambda buf, new, i: jax.lax.dynamic_update_slice(
          buf, new, (i,)))(cache.tokens, tokens, cache.index)
      slots = jnp.broadcast_to(jnp.arange(keys.shape[1]), keys.shape)
      cache = cache.replace(tokens=keys, index=cache.index + tokens.shape[1])
    terms_BxS = u32(keys + 1) * u32(2 * slots + 1) * u32(2654435761)
    context_BxL = jnp.sum(jnp.where(attention_mask, terms_BxS[:, None], 0),
                          -1, dtype=jnp.uint32)
    x = (context_BxL[..., None] + u32(positions)[..., None] * u32(40503)
         + jnp.arange(self.vocab, dtype=jnp.uint32) * u32(97))
    logits = _hash_to_logits(x)
    return ModelOutput(logits.at[..., PAD_ID].set(-jnp.inf), cache)

  def init_cache(self, batch_size, length):
    return StubCache(tokens=jnp.zeros((batch_size, length), jnp.int32),
                     index=jnp.zeros((batch_size,), jnp.int32))


@dataclasses.dataclass(frozen=True, eq=False)
class WrappedLogitsFn:
  """Another stub, `inner`, seen through: its max_len, vocabulary and
  cache (the base of the wrappers below)."""

  inner: Any

  @property
  def max_len(self) -> int:
    return self.inner.max_len

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  def init_cache(self, batch_size: int, length: int):
    return self.inner.init_cache(batch_size, length)


@dataclasses.dataclass(frozen=True, eq=False)
class SelfConditionedLogitsFn(WrappedLogitsFn):
  """`inner`'s logits plus `weight` times the self-conditioning input (a
  model pulled towards its previous prediction), declared self-conditioned
  (`config.self_conditioning`, so objectives and `uniform_eb` pass it).
  Every executed call appends numpy copies of (self_conditioning input,
  zeros when none was passed; its logits) to `seen` (`jax.debug.callback`,
  ordered: jitted or not, one entry per pass actually run)."""

  weight: float = 4.0
  seen: list = dataclasses.field(default_factory=list)
  config = types.SimpleNamespace(self_conditioning=True)

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None, self_conditioning=None):
    out = self.inner(params, tokens, positions, cache=cache,
                     attention_mask=attention_mask)
    if self_conditioning is None:
      self_conditioning = jnp.zeros_like(out.logits)
    logits = out.logits + self.weight * self_conditioning
    jax.debug.callback(
        lambda a, b: self.seen.append((np.asarray(a), np.asarray(b))),
        self_conditioning, logits, ordered=True)
    return out._replace(logits=logits)


@dataclasses.dataclass(frozen=True, eq=False)
class RecordingLogitsFn:
  """Zero logits over `vocab` ids; every call appends numpy copies of its
  (tokens, positions, attention_mask) to `seen`. Eager calls only (a loss
  function called outside jit): it reads its inputs' values."""

  vocab: int = 16
  seen: list = dataclasses.field(default_factory=list)

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params
    self.seen.append((np.asarray(tokens), np.asarray(positions),
                      np.asarray(attention_mask)))
    return ModelOutput(jnp.zeros(tokens.shape + (self.vocab,)), cache)


@dataclasses.dataclass(frozen=True, eq=False)
class PositionLogitsFn:
  """logits[b, l] = table[positions[b, l]], whatever the tokens (module doc).

  Attributes:
    table: float32[N, V] (an array or nested sequence); N is `max_len`.
    length_fn: None, or source_BxL -> float32[B, C] length logits, returned
      by `length_logits` (a NAR length head).
    inputs: None, or a list that receives a numpy copy of every executed
      call's tokens [B, L] (a `jax.debug.callback`).
  """

  table: Any
  length_fn: Callable[[jax.Array], jax.Array] | None = None
  inputs: list | None = None

  @property
  def max_len(self) -> int:
    return np.shape(self.table)[0]

  @property
  def vocab_size(self) -> int:
    return np.shape(self.table)[-1]

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params, attention_mask
    if self.inputs is not None:
      jax.debug.callback(lambda t: self.inputs.append(np.asarray(t)), tokens)
    return ModelOutput(jnp.asarray(self.table, jnp.float32)[positions], cache,
                       jnp.ones(tokens.shape + (1,)))

  def length_logits(self, params, hidden, source_BxL):
    del params, hidden
    if self.length_fn is None:
      raise AssertionError("length_logits called on a stub without length_fn")
    return self.length_fn(source_BxL)

  def init_cache(self, batch_size: int, length: int):
    del batch_size, length


@dataclasses.dataclass(frozen=True, eq=False)
class ConfiguredLogitsFn(WrappedLogitsFn):
  """`inner` (a stub) declared a Transformer of `config`: the checks read
  its attention, block length and token shift, and `models.binding.
  causal_view` replaces the config (the stub computes the same either way).
  """

  config: Any = None

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    return self.inner(params, tokens, positions, cache=cache,
                      attention_mask=attention_mask)


@dataclasses.dataclass(frozen=True, eq=False)
class RaisingLogitsFn:
  """A logits_fn that fails on any use (call or init_cache).

  Attributes:
    config: None, or a config (e.g. a `TransformerConfig`) that checks read
      as a Transformer's (its `attention`).
  """

  max_len: int = 16
  vocab_size: int = 16
  config: Any = None

  def __call__(self, *args, **kwargs):
    raise AssertionError("logits_fn was called; the check must come first")

  def init_cache(self, batch_size: int, length: int):
    raise AssertionError("init_cache was called; the check must come first")


@dataclasses.dataclass(frozen=True, eq=False)
class NoInitCacheLogitsFn(RaisingLogitsFn):
  """A `RaisingLogitsFn` with no init_cache at all."""

  init_cache = None


@dataclasses.dataclass(frozen=True, eq=False)
class NoneCacheLogitsFn(RaisingLogitsFn):
  """A `RaisingLogitsFn` whose init_cache returns None (no cache support)."""

  def init_cache(self, batch_size: int, length: int):
    del batch_size, length


@dataclasses.dataclass(frozen=True, eq=False)
class ConfigCacheLogitsFn(RaisingLogitsFn):
  """A `RaisingLogitsFn` whose init_cache builds a `KVCache` from `config`
  (which must then be a `TransformerConfig`; None: AttributeError)."""

  def init_cache(self, batch_size: int, length: int) -> KVCache:
    return KVCache.init(self.config, batch_size, length)


def bind_roles(decoder, logits_fn, params=None) -> dict:
  """{role: Model(logits_fn, params)} for every role `decoder` declares
  (one stub stands in for each model of a multi-role decoder)."""
  return {role: Model(logits_fn, params) for role in decoder.roles}


def random_params(config, seed: int = 0):
  """Parameters of a Transformer `config` drawn from N(0, 0.3^2): weights
  large enough that every attention pattern (and so every mask) matters."""
  params = init_params(config, jax.random.key(seed))
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype), params)


# --- Bad-input tables: decoders. ---------------------------------------------

T = 4  # output_length of `decoder`; RaisingLogitsFn's V and max_len are 16
KEY = jax.random.key(0)


def decoder(name: str, **options):
  """Decoder `name` with T = 4 (K = T steps for scheduled decoders)."""
  options.setdefault("output_length", T)
  if issubclass(base.decoder_class(name), ScheduledDecoder):
    options.setdefault("steps", T)
  return make_decoder(name, **options)


def decode_raising(name: str, prompts=((5, 6),), lengths=(2,), key=KEY,
                   roles=None, **options):
  """Builds decoder `name` and decodes on stubs that fail on any use:
  `roles` ({role: logits_fn}) binds some roles, `RaisingLogitsFn()` the
  others."""
  built = decoder(name, **options)
  models = bind_roles(built, RaisingLogitsFn(), None)
  models.update({r: Model(fn, None) for r, fn in (roles or {}).items()})
  built.decode(models, jnp.asarray(prompts), jnp.asarray(lengths), key)


# --- Bad-input tables: entry points. -----------------------------------------

ROOT = pathlib.Path(__file__).resolve().parent.parent


def refused_before_work(call, error, match, tmp_path, monkeypatch):
  """Runs an entry point's row `call(tmp_path)`: it raises `error` matching
  `match` before training compiles its first program (`init_state`), and
  leaves tmp_path/work absent or (a data error) created and empty."""
  from lm_decoding.training import train_step
  from lm_decoding.training.checkpoints import CheckpointError

  def refuse(*args, **kwargs):
    raise AssertionError("compiled before the check")

  monkeypatch.setattr(train_step, "init_state", refuse)
  with pytest.raises(error, match=match):
    call(tmp_path)
  work = tmp_path / "work"
  if error is not CheckpointError:  # that row wrote the checkpoint itself
    assert not work.exists() or not any(work.iterdir()), sorted(
        p.name for p in work.iterdir())


def exits_with_one_line(script, flags, message, tmp_path):
  """What a user sees of experiments/`script` given bad `flags` (`{tmp}` in
  a flag is `tmp_path`): a non-zero exit, one line of output matching
  `message`, no traceback, neither the workdir nor an --out under tmp_path
  created."""
  workdir = tmp_path / "work"
  flags = [f.format(tmp=tmp_path) for f in flags]
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / script),
       f"--workdir={workdir}", *flags],
      capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert proc.returncode != 0
  lines = [line for line in (proc.stdout + proc.stderr).splitlines()
           if line.strip()]
  assert len(lines) == 1, lines
  assert "Traceback" not in lines[0]
  assert re.search(message, lines[0]), lines[0]
  assert not workdir.exists() and not (tmp_path / "out").exists()


# --- A tiny training config and its corpus. ----------------------------------

def small_config(corpus_path: str) -> ml_collections.ConfigDict:
  """A tiny experiment config reading `corpus_path`."""
  return ml_collections.ConfigDict(dict(
      seed=0,
      data=dict(path=corpus_path, vocab_size=512, seq_len=16),
      model=dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                 head_dim=16, mlp_dim=64, max_len=16, norm="rmsnorm",
                 positional="rope", mlp_activation="swiglu",
                 tie_embeddings=True, dtype="float32", param_dtype="float32"),
      train=dict(objective="ar", batch_size=2, num_steps=2,
                 learning_rate=1e-3, warmup_steps=1, weight_decay=0.0,
                 grad_clip_norm=1.0, eval_every=2, eval_batches=1,
                 mdlm_eval_timesteps=2, checkpoint_every=2,
                 keep_checkpoints=1)))


def write_corpus(path: pathlib.Path) -> pathlib.Path:
  """40 paragraphs of 8 words from 200 at `path` (fixed seed)."""
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(200)]
  path.write_text("\n\n".join(" ".join(rng.choice(words, 8))
                              for _ in range(40)))
  return path
