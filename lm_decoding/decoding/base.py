"""The decoder boundary, the one result record, and the decoder registry.

Decoders never see the model. They call a `logits_fn` (as t5x's
`tokens_to_logits`):

    logits_fn(params, tokens: int32[B, L], positions: int32[B, L],
              cache=None, attention_mask: bool[B, L, S] | None = None)
        -> ModelOutput(logits: float32[B, L, V], cache, hidden)
    logits_fn.init_cache(batch_size, length) -> an empty cache pytree
    logits_fn.max_len -> the longest sequence / cache the model accepts
    logits_fn.vocab_size -> V (optional; else read from an abstract call)

built by `lm_decoding.models.make_logits_fn` for the Transformer (a frozen,
hashable dataclass, so it can be a static jit argument), or by a test as a
stub. A decoder may use several models, each under a named role ("model",
"draft", "target", ...): it is called with `models`, a mapping from role to
`lm_decoding.models.Model` (a logits_fn bound to its parameters; `bind`
makes the one-role mapping), and declares the roles it needs in `roles`.
Every model call goes through `forward`, which counts calls and token positions per role in a
`Cost`, so the harness can compare a 32-token block pass, a 272-token full
pass and a draft step by what they cost. Every decoder returns a
`DecodeResult`. Decoders are configured by frozen dataclasses (hashable:
static jit arguments) registered by name.

Dimension letters in names and docstrings (`tokens_BxL`, `int32[B, L]`) follow
the package's one glossary, `docs/glossary.md` (B batch rows, L a call's
positions, T new tokens, K steps, W block window, M beams, G draft length,
...), one meaning each in every layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding import debug
from lm_decoding.decoding import conventions
from lm_decoding.models.binding import LogitsFn, Model
from lm_decoding.models.output import ModelOutput


def bind(logits_fn: LogitsFn, params: Any, role: str = "model"
         ) -> dict[str, Model]:
  """{role: Model(logits_fn, params)}: the models of a one-role decoder."""
  return {role: Model(logits_fn, params)}


@flax.struct.dataclass
class Cost:
  """Forward calls (int32 scalars) and token positions processed (float32
  scalars), per role.

  `forward` adds B * L positions for a call on tokens int32[B, L]: what the
  hardware processes, padding and finished rows included. Positions are
  float32, not int32: 8,192 calls at B 64 x L 4,096 are 2^31 positions,
  past int32 (and int64 needs `jax_enable_x64`); float32 counts exactly up
  to 2^24 and in steps of B * L that are powers of two beyond, and within a
  relative 6e-8 per call otherwise.
  """

  calls: dict[str, jax.Array]
  tokens: dict[str, jax.Array]

  @classmethod
  def zero(cls, roles) -> "Cost":
    return cls(calls={r: jnp.int32(0) for r in roles},
               tokens={r: jnp.float32(0) for r in roles})

  def add(self, role: str, tokens_BxL: jax.Array) -> "Cost":
    calls = dict(self.calls, **{role: self.calls[role] + 1})
    tokens = dict(self.tokens, **{role: self.tokens[role]
                                  + int(np.prod(tokens_BxL.shape))})
    return Cost(calls=calls, tokens=tokens)

  def merge(self, role: str, calls: jax.Array, tokens: jax.Array) -> "Cost":
    """Adds another run's counts (e.g. a sub-decoder's) to `role`."""
    return Cost(calls=dict(self.calls, **{role: self.calls[role] + calls}),
                tokens=dict(self.tokens, **{role: self.tokens[role] + tokens}))

  @property
  def nfe(self) -> jax.Array:
    return sum(self.calls.values(), jnp.int32(0))


@dataclasses.dataclass(frozen=True)
class Work:
  """The expected work of one decode, before it runs (`expected_work`).

  Attributes:
    forward_tokens: token positions the model calls process (B x L per
      call, summed over calls and roles).
    drawn: positions that draw a token through the sampler.
  """

  forward_tokens: int
  drawn: int

  @property
  def positions(self) -> int:
    """The cost weight: forward and drawn positions cost alike on the
    tiny model on 2 CPU cores (within 2x over the default grid)."""
    return self.forward_tokens + self.drawn

  def __add__(self, other: "Work") -> "Work":
    return Work(self.forward_tokens + other.forward_tokens,
                self.drawn + other.drawn)


def forward(models: Mapping[str, Model], role: str, cost: Cost,
            tokens: jax.Array, positions: jax.Array, cache: Any = None,
            attention_mask: jax.Array | None = None,
            self_conditioning: jax.Array | None = None
            ) -> tuple[ModelOutput, Cost]:
  """Calls the model of `role` and counts the call in `cost`;
  `self_conditioning` (float32[B, L, V], `models.config.self_conditioned`
  models only) is passed on when given."""
  model = models[role]
  extra = ({} if self_conditioning is None
           else dict(self_conditioning=self_conditioning))
  out = model.logits_fn(model.params, tokens, positions, cache=cache,
                        attention_mask=attention_mask, **extra)
  debug.check_logits(role, out.logits, tokens)  # nothing unless debugging
  return out, cost.add(role, tokens)


@flax.struct.dataclass
class DecodeResult:
  """What every decoder returns.

  Attributes:
    tokens: int32[B, T] generated tokens (prompt excluded); PAD after a row's
      end (its first EOS, which is kept, or T).
    lengths: int32[B] generated tokens per row up to and including the first
      EOS (T if none).
    nfe: int32[] number of forward passes (logits_fn calls, all roles) made
      for the batch; a prefill counts as one.
    committed: int32[K, B] tokens committed in each row at each of the K
      decoding steps (K is static: T for AR decoders, the maximum step count
      for parallel ones). AR rows commit 0 after their EOS (so a row's sum
      is its length); parallel rows commit all T positions (net of any
      re-masking), EOS or not, and 0 at steps not run.
    calls: {role: int32[]} forward calls per role (they sum to nfe).
    forward_tokens: {role: float32[]} token positions processed per role
      (B * L summed over the role's calls; float32, see `Cost`).
    stats: {name: array} decoder-specific statistics (e.g. acceptance
      counts); empty for most decoders.
  """

  tokens: jax.Array
  lengths: jax.Array
  nfe: jax.Array
  committed: jax.Array
  calls: dict[str, jax.Array] = flax.struct.field(default_factory=dict)
  forward_tokens: dict[str, jax.Array] = flax.struct.field(
      default_factory=dict)
  stats: dict[str, jax.Array] = flax.struct.field(default_factory=dict)


def result(tokens: jax.Array, lengths: jax.Array, committed: jax.Array,
           cost: Cost, **stats: jax.Array) -> DecodeResult:
  """A `DecodeResult` whose nfe, calls and forward_tokens come from `cost`."""
  return DecodeResult(tokens=tokens, lengths=lengths, nfe=cost.nfe,
                      committed=committed, calls=dict(cost.calls),
                      forward_tokens=dict(cost.tokens), stats=stats)


class Decoder(Protocol):
  """A decoder config: a frozen dataclass with `roles` and `decode`."""

  roles: tuple[str, ...]

  def decode(self, models: Mapping[str, Model], prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Decodes continuations of right-padded `prompts` int32[B, P]."""


def jit_decode(decoder: Decoder, in_shardings: Any = None,
               out_shardings: Any = None):
  """The jit boundary of every decode: `decoder.decode` under `jax.jit`.

  Every caller that compiles a whole decode goes through here (the
  comparison harness, the benchmarks, a mesh through `sharded.jit_decode`,
  which passes the shardings), so the traced function and its arguments are
  the same everywhere.

  Args:
    decoder: a decoder config (a static, hashable dataclass).
    in_shardings, out_shardings: explicit shardings of (models, prompts,
      prompt_lengths, key) and of the `DecodeResult`, or None (one device).
  Returns:
    jitted (models, prompts int32[B, P], prompt_lengths int32[B], key) ->
    `DecodeResult`.
  """
  def run(models, prompts, prompt_lengths, key):
    return decoder.decode(models, prompts, prompt_lengths, key)

  if in_shardings is None and out_shardings is None:
    return jax.jit(run)
  return jax.jit(run, in_shardings=in_shardings, out_shardings=out_shardings)


def check_models(decoder: Any, models: Mapping[str, Model]) -> None:
  """Raises ValueError unless `models` binds exactly `decoder.roles`, each
  able to serve its role.

  Called by every decoder before anything is traced (inside a jit, once
  per trace: it reads only static fields). A model that carries a
  checkpoint's conventions (`Model.ids` set: `checkpoints.hub.load`) is
  checked by `conventions.serves`: AR decoding of a bidirectional or
  block-causal model, a denoiser on a causal one, a block length other
  than the model's, are refused here as the hub job's `adopt` refuses them.
  A model without them (the project's own, a stub) makes no claim and is
  not checked.
  """
  if not isinstance(models, Mapping) or not all(
      isinstance(m, Model) for m in models.values()):
    raise ValueError(f"models must map role names to models.Model; got "
                     f"{type(models).__name__} (use base.bind(logits_fn, "
                     f"params) for a one-model decoder)")
  wanted, given = set(decoder.roles), set(models)
  if wanted != given:
    raise ValueError(
        f"decoder {type(decoder).__name__} needs roles "
        f"{sorted(wanted)}; got {sorted(given)} (unknown: "
        f"{sorted(given - wanted)}, missing: {sorted(wanted - given)})")
  conventions.serves(decoder, {role: model for role, model in models.items()
                               if model.ids is not None})


def vocab_size(model: Model) -> int:
  """V: `logits_fn.vocab_size` when it has one, else the logits' last axis
  from one abstract call (nothing runs)."""
  if hasattr(model.logits_fn, "vocab_size"):
    return model.logits_fn.vocab_size
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  out = jax.eval_shape(
      lambda t: model.logits_fn(model.params, t, t), tokens)
  return out.logits.shape[-1]


def check_positions(model: Model, role: str, needed: int,
                    counted: str) -> None:
  """Raises ValueError unless the `role` model accepts `needed` positions.

  Args:
    model: the model; `model.logits_fn.max_len` is the longest sequence or
      cache it accepts.
    role: its role (e.g. 'model', 'draft'), named in the message.
    needed: the positions a decode call runs it over (a sequence or cache
      length).
    counted: how `needed` follows from the decoder's arguments (e.g.
      'prompt width P=2 + output_length=4'), named in the message.
  Raises:
    ValueError: `needed` above max_len: "{needed} positions ({counted})
      must be <= the {role} model's max_len={max_len}".
  """
  max_len = model.logits_fn.max_len
  if needed > max_len:
    whose = "the model's" if role == "model" else f"the {role} model's"
    raise ValueError(f"{needed} positions ({counted}) must be <= {whose} "
                     f"max_len={max_len}")


def check_token_ids(name: str, ids: Any, model: Model) -> None:
  """Raises ValueError if concrete `ids` hold an id outside [0, V).

  A Transformer embeds an id outside its vocabulary as NaN, and the decode
  then returns garbage without an error. Traced ids are not checked.
  """
  if isinstance(ids, jax.core.Tracer):
    return
  ids = np.asarray(ids)
  if not ids.size:
    return
  vocab = vocab_size(model)
  if ids.min() < 0 or ids.max() >= vocab:
    raise ValueError(f"{name} must be token ids in [0, V={vocab}) (the "
                     f"model's vocabulary); got ids from {ids.min()} to "
                     f"{ids.max()}")


def check_sequence_ids(prompts: Any, eos_ids: tuple[int, ...], pad_id: int,
                       model: Model) -> None:
  """Raises ValueError unless the prompts, and the EOS and PAD ids a decoder
  writes after them, are ids of `model`'s vocabulary (`check_token_ids`)."""
  check_token_ids("prompts", prompts, model)
  check_token_ids("eos_ids and pad_id", tuple(eos_ids) + (pad_id,), model)


def row_keys(key: jax.Array, batch: int) -> jax.Array:
  """Per-row PRNG keys: row b gets fold_in(key, b).

  A key array of shape [B] is returned as it is, so a row decoded alone with
  `row_keys(key, B)[b:b + 1]` gets the key it has in the batch: every
  decoder's output for a row is then independent of the batch size and of
  the other rows.

  Raises:
    ValueError: key None, not a typed PRNG key, or of a shape neither []
      nor [B].
  """
  if key is None:
    raise ValueError("key=None: this decoder draws random numbers; pass "
                     "jax.random.key(seed)")
  key = jnp.asarray(key)
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    raise ValueError(f"key must be a typed PRNG key (jax.random.key(seed)), "
                     f"or one per row; got dtype {key.dtype} shape "
                     f"{key.shape} (a raw jax.random.PRNGKey?)")
  if key.shape == (batch,):
    return key
  if key.shape:
    raise ValueError(f"key must be one PRNG key or one per row [{batch}]; "
                     f"got shape {key.shape}")
  return jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(batch))


def id_tuple(ids: Any) -> tuple[int, ...]:
  """A token id or an iterable of ids as a tuple of ints (e.g. eos_ids)."""
  if isinstance(ids, (int, np.integer)):
    return (int(ids),)
  return tuple(int(i) for i in ids)


_REGISTRY: dict[str, type] = {}


def register(name: str):
  """Class decorator registering a decoder config under `name`."""
  def wrap(cls):
    if name in _REGISTRY:
      raise ValueError(f"decoder {name!r} is already registered")
    _REGISTRY[name] = cls
    cls.registry_name = name
    return cls
  return wrap


def registered() -> tuple[str, ...]:
  """Names of all registered decoders, sorted."""
  return tuple(sorted(_REGISTRY))


def decoder_class(name: str) -> type:
  """The decoder config class registered as `name`.

  Raises:
    ValueError: unknown name (the message lists the registered ones).
  """
  if name not in _REGISTRY:
    raise ValueError(
        f"unknown decoder name={name!r}; registered: {registered()}")
  return _REGISTRY[name]


def make_decoder(name: str, **options) -> Decoder:
  """Builds the decoder config registered as `name` with `options`.

  Raises:
    ValueError: unknown name (the message lists the registered ones) or an
      option the decoder does not take.
  """
  cls = decoder_class(name)
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(options) - fields
  if unknown:
    raise ValueError(f"decoder {name!r} takes no options {sorted(unknown)}; "
                     f"allowed: {sorted(fields)}")
  return cls(**options)
