"""A model as everything above the models layer sees it: a logits_fn, its parameters and its conventions.

The decoders, the training of the shipped sets, the evaluation harness and
the sharded runner all pass models around as `Model`s: a `LogitsFn` (built
by `models.make_logits_fn` for the Transformer, or a test's stub) bound to
its parameters. The calling convention is spelled out in
`lm_decoding/decoding/base.py`, whose decoders call nothing else.

A model imported from a published checkpoint also carries its generation
`Conventions` (its MASK id, its EOS / end-of-turn ids, its PAD id, the
sub-block length its sampler uses), so a decoder reads them from the model
instead of taking per-model flags; the attention pattern and the token
shift are the model config's own (`TransformerConfig.attention`,
`block_length`, `token_shift`) and `conventions(model)` returns all of them
in one record. A model without conventions (one trained here, a stub) has
the project's reserved ids (`lm_decoding.special_tokens`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax

from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID


class LogitsFn(Protocol):
  """The model as decoders see it (see the module docstring)."""

  max_len: int

  def __call__(self, params: Any, tokens: jax.Array, positions: jax.Array,
               cache: Any = None,
               attention_mask: jax.Array | None = None) -> ModelOutput:
    ...

  def init_cache(self, batch_size: int, length: int) -> Any:
    ...


@dataclasses.dataclass(frozen=True)
class Conventions:
  """How a checkpoint generates: the ids and lengths its sampler assumes.

  Frozen and hashable (a static part of `Model`).

  Attributes:
    mask_id: the MASK token a masked-diffusion model denoises (LLaDA
      126336, Dream 151666, SDAR 151669, Fast-dLLM v2 151665); None for a
      model that has none (an AR model).
    eos_ids: the ids that end a generation: end of text and end of turn
      (e.g. Qwen's '<|endoftext|>' 151643 and '<|im_end|>' 151645); a row
      ends at the first of any.
    pad_id: the id that fills a row after its end; None: eos_ids[0].
    sub_block_length: Fast-dLLM v2's sub-block (its sampler commits a
      block of `block_length` in sub-blocks of this many positions); 0:
      none.
    attention: 'causal', 'bidirectional' or 'block_causal' (the model
      config's; filled in by `conventions`); None: unknown (a stub without
      a config), which `check_serves` does not check.
    block_length: the block of 'block_causal' attention, 0 otherwise.
    token_shift: True when the logits at position i predict token i + 1
      (Dream, Fast-dLLM v2); False when they predict token i (LLaDA,
      SDAR, MDLM).
  """

  mask_id: int | None = MASK_ID
  eos_ids: tuple[int, ...] = (EOS_ID,)
  pad_id: int | None = PAD_ID
  sub_block_length: int = 0
  attention: str | None = "causal"
  block_length: int = 0
  token_shift: bool = False

  def __post_init__(self):
    if not self.eos_ids or any(not isinstance(i, int) or i < 0
                               for i in self.eos_ids):
      raise ValueError(f"eos_ids={self.eos_ids!r} must be a non-empty tuple "
                       f"of ids >= 0")
    for name in ("mask_id", "pad_id"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, int) or value < 0):
        raise ValueError(f"{name}={value!r} must be an id >= 0 or None")
    if self.sub_block_length < 0 or (
        self.sub_block_length and self.block_length % self.sub_block_length):
      raise ValueError(f"sub_block_length={self.sub_block_length} must be 0 "
                       f"or divide block_length={self.block_length}")

  @property
  def fill_id(self) -> int:
    """The id after a row's end: pad_id, else the first EOS id."""
    return self.eos_ids[0] if self.pad_id is None else self.pad_id


@flax.struct.dataclass
class Model:
  """A logits_fn bound to its parameters: one role of a decoder.

  A pytree whose `logits_fn` and `ids` are static (part of the tree
  structure), so a mapping of `Model`s can be passed straight through
  `jax.jit`. `ids`: the checkpoint's `Conventions` (their attention and
  token-shift fields are ignored: `conventions` reads those from the
  config); None: the project's reserved ids.
  """

  logits_fn: LogitsFn = flax.struct.field(pytree_node=False)
  params: Any = None
  ids: Conventions | None = flax.struct.field(pytree_node=False,
                                              default=None)


def conventions(model: Model) -> Conventions:
  """The model's ids (`model.ids`, else the project's) with the attention
  pattern and token shift of its config (`logits_fn.config`; a logits_fn
  without one, a stub, reads as attention None, unknown, and unshifted)."""
  config = getattr(model.logits_fn, "config", None)
  ids = model.ids or Conventions()
  return dataclasses.replace(
      ids, attention=getattr(config, "attention", None),
      block_length=getattr(config, "block_length", 0),
      token_shift=bool(getattr(config, "token_shift", False)))


def check_serves(model: Model, user: str, *, causal: bool | None = None,
                 block_length: int | None = None,
                 masked: bool = False) -> None:
  """Raises ValueError, naming `user`, when the model cannot serve it.

  Called before anything is compiled.

  Args:
    model: the model a decoder binds.
    user: the decoder (or role) named in the message, e.g. "decoder 'ar'".
    causal: True: the decoder runs the model left to right (AR decoding,
      drafting, verification) and needs 'causal' attention; False: it
      denoises whole windows and needs a non-causal model; None: either.
    block_length: the block length a block decoder commits; a
      block-causal model serves only its own block length. None: not a
      block decoder.
    masked: the decoder writes MASK tokens, so the model must have one.
  Raises:
    ValueError: AR decoding of a bidirectional or block-causal model, a
      denoiser on a causal model, a block length other than the model's,
      or MASK decoding of a model with no MASK id.
  """
  c = conventions(model)
  if (causal is not None and c.attention is not None
      and (c.attention == "causal") != causal):
    wanted = "'causal'" if causal else "non-causal"
    raise ValueError(f"{user} needs {wanted} attention; the model's is "
                     f"{c.attention!r}")
  if (block_length is not None and c.attention == "block_causal"
      and block_length != c.block_length):
    raise ValueError(f"{user} has block_length={block_length}; the model "
                     f"is block-causal with block_length={c.block_length} "
                     f"and serves only that")
  if masked and c.mask_id is None:
    raise ValueError(f"{user} writes MASK tokens; the model has no MASK id "
                     f"(an AR checkpoint)")


def causal_view(model: Model) -> Model:
  """The same weights with causal attention by default.

  A block-causal (block-diffusion) model at block size 1 is a causal model:
  each position sees itself and the positions before it, and with a token
  shift its logits at i predict token i + 1, as its AR parent's (S2D2,
  arXiv:2603.25702). The logits_fn is `causal_logits_fn`'s; the parameters
  are shared, not copied.
  """
  return Model(causal_logits_fn(model.logits_fn), model.params, model.ids)


def causal_logits_fn(logits_fn):
  """`logits_fn` whose every call given no `attention_mask` is causal,
  cached or not (`causal_view`'s). One exposing `config` (a
  `TransformerConfig`, or a stub carrying one) is copied
  (`dataclasses.replace`) with `config.attention='causal'` and
  `block_length=0`; one without a config (a stub choosing its own
  attention) is returned as it is.
  """
  config = getattr(logits_fn, "config", None)
  if config is None:
    return logits_fn
  return _with_config(logits_fn,
                      config.replace(attention="causal", block_length=0))


def _with_config(logits_fn, config):
  """`logits_fn` with `config`; a wrapper (a sharded logits_fn, whose config
  is its inner one's) gets its inner logits_fn replaced."""
  if "config" in {f.name for f in dataclasses.fields(logits_fn)}:
    return dataclasses.replace(logits_fn, config=config)
  return dataclasses.replace(
      logits_fn, logits_fn=_with_config(logits_fn.logits_fn, config))
