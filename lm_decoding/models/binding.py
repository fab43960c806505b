"""A model as everything above the models layer sees it: a logits_fn and its parameters.

The decoders, the training of the shipped sets, the evaluation harness and
the sharded runner all pass models around as `Model`s: a `LogitsFn` (built
by `models.make_logits_fn` for the Transformer, or a test's stub) bound to
its parameters. The calling convention is spelled out in
`lm_decoding/decoding/base.py`, whose decoders call nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax

from lm_decoding.models.output import ModelOutput


class LogitsFn(Protocol):
  """The model as decoders see it (see the module docstring)."""

  max_len: int

  def __call__(self, params: Any, tokens: jax.Array, positions: jax.Array,
               cache: Any = None,
               attention_mask: jax.Array | None = None) -> ModelOutput:
    ...

  def init_cache(self, batch_size: int, length: int) -> Any:
    ...


@flax.struct.dataclass
class Model:
  """A logits_fn bound to its parameters: one role of a decoder.

  A pytree whose `logits_fn` is static (part of the tree structure), so a
  mapping of `Model`s can be passed straight through `jax.jit`.
  """

  logits_fn: LogitsFn = flax.struct.field(pytree_node=False)
  params: Any = None


def causal_view(model: Model) -> Model:
  """The same weights with causal attention by default.

  A block-causal (block-diffusion) model at block size 1 is a causal model:
  each position sees itself and the positions before it, and with a token
  shift its logits at i predict token i + 1, as its AR parent's (S2D2,
  arXiv:2603.25702). A logits_fn exposing `config` (a `TransformerConfig`,
  or a stub carrying one) is copied (`dataclasses.replace`) with
  `config.attention='causal'` and `block_length=0`, so every call given no
  `attention_mask` is causal, cached or not; one without a config (a stub
  choosing its own attention) is returned as it is. The parameters are
  shared, not copied.
  """
  config = getattr(model.logits_fn, "config", None)
  if config is None:
    return model
  causal = config.replace(attention="causal", block_length=0)
  return Model(dataclasses.replace(model.logits_fn, config=causal),
               model.params)
