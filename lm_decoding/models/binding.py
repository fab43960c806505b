"""A model as everything above the models layer sees it: a logits_fn and its parameters.

The decoders, the training of the shipped sets, the evaluation harness and
the sharded runner all pass models around as `Model`s: a `LogitsFn` (built
by `models.make_logits_fn` for the Transformer, or a test's stub) bound to
its parameters. The calling convention is spelled out in
`lm_decoding/decoding/base.py`, whose decoders call nothing else.
"""

from __future__ import annotations

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
