"""The decoder boundary, the one result record, and the decoder registry.

Decoders never see the model. They call a `logits_fn` (as t5x's
`tokens_to_logits`):

    logits_fn(params, tokens: int32[B, L], positions: int32[B, L],
              cache=None, input_mask: bool[B, L] | None = None)
        -> (logits: float32[B, L, V], cache)
    logits_fn.init_cache(batch_size, length) -> an empty cache pytree
    logits_fn.max_len -> the longest sequence / cache the model accepts

built by `lm_decoding.models.make_logits_fn` for the Transformer (a frozen,
hashable dataclass, so it can be a static jit argument), or by a test as a
stub. Every decoder returns a `DecodeResult`, so one harness times,
counts and scores them all. Decoders are configured by frozen dataclasses
(hashable: static jit arguments) registered by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax
import numpy as np


class LogitsFn(Protocol):
  """The model as decoders see it (see the module docstring)."""

  max_len: int

  def __call__(self, params: Any, tokens: jax.Array, positions: jax.Array,
               cache: Any = None,
               input_mask: jax.Array | None = None) -> tuple[jax.Array, Any]:
    ...

  def init_cache(self, batch_size: int, length: int) -> Any:
    ...


@flax.struct.dataclass
class DecodeResult:
  """What every decoder returns.

  Attributes:
    tokens: int32[B, T] generated tokens (prompt excluded); PAD after a row's
      end (its first EOS, which is kept, or T).
    lengths: int32[B] generated tokens per row up to and including the first
      EOS (T if none).
    nfe: int32[] number of forward passes (logits_fn calls) made for the
      batch; a prefill counts as one.
    committed: int32[S, B] tokens committed in each row at each of the S
      decoding steps (S is static: T for AR decoders, the step count for
      parallel ones); rows that finished early commit 0.
  """

  tokens: jax.Array
  lengths: jax.Array
  nfe: jax.Array
  committed: jax.Array


class Decoder(Protocol):
  """A decoder config: a frozen dataclass with a `decode` method."""

  def decode(self, logits_fn: LogitsFn, params: Any, prompts: jax.Array,
             prompt_lengths: jax.Array, key: jax.Array) -> DecodeResult:
    """Decodes continuations of right-padded `prompts` int32[B, P]."""


def is_count(value: Any, minimum: int = 1) -> bool:
  """True for an integer (not a bool) >= minimum: a size or step option."""
  return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
          and value >= minimum)


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


def make_decoder(name: str, **options) -> Decoder:
  """Builds the decoder config registered as `name` with `options`.

  Raises:
    ValueError: unknown name (the message lists the registered ones) or an
      option the decoder does not take.
  """
  if name not in _REGISTRY:
    raise ValueError(
        f"unknown decoder name={name!r}; registered: {registered()}")
  cls = _REGISTRY[name]
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(options) - fields
  if unknown:
    raise ValueError(f"decoder {name!r} takes no options {sorted(unknown)}; "
                     f"allowed: {sorted(fields)}")
  return cls(**options)
