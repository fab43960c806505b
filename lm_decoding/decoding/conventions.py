"""A decoder given the conventions of the models it binds.

A checkpoint's `Model` carries its MASK, EOS and PAD ids (`models.binding.
Conventions`; the token shift and attention pattern are its config's), so
no decoder needs per-model flags: `adopt(decoder, models)` returns the
decoder with its `mask_id`, `eos_ids` and `pad_id` fields (those it has)
set from the model that fills them, after checking (`serves`) that every
model can serve its role, before anything is compiled. Which role fills
which field, and what each role needs, comes from the decoder's fields and
its `role_causal` (the draft-and-verify decoders'):

  role that writes MASK tokens   the one role of a decoder with a
                                 `mask_id` field, or a non-causal role
                                 of `role_causal`; needs a model with a
                                 MASK id, a non-causal one (unless the
                                 decoder's own `attention` is 'causal'),
                                 and the decoder's `block_length` (when
                                 set) equal to a block-causal model's
  role decoded left to right     the one role of a decoder without a
                                 `mask_id` field (AR decoding), a causal
                                 role of `role_causal`, or a denoising loop
                                 with attention='causal'; needs 'causal'
                                 attention
  ids of the output (EOS, PAD)   the 'target' role when there is one, else
                                 'model'

A block-causal model (SDAR, Fast-dLLM v2) is served only by the decoders
that build its block masks (`BLOCK_DECODERS`: 'bd3lm', with the model's
block length; Fast-dLLM v2's sampler is `remasking='threshold'` with
`sub_block_length=8`; and 'self_speculative', which drafts under its own
block mask and verifies at block size 1, checking the model itself); the
other denoisers pass masks that let every position see the whole canvas,
which is not the model as trained, and are refused by name.

A decoder whose fields are already set to other ids than the project's
defaults keeps them only if they equal the model's: two sources that
disagree are refused by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from lm_decoding.models.binding import Model, check_serves, conventions
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID

_DEFAULTS = {"mask_id": MASK_ID, "eos_ids": (EOS_ID,), "pad_id": PAD_ID}
# The registered decoders that run a block-causal model under its own block
# masks (module docstring).
BLOCK_DECODERS = ("bd3lm", "self_speculative")


def _fields(decoder: Any) -> set[str]:
  return {f.name for f in dataclasses.fields(decoder)}


def role_needs(decoder: Any) -> dict[str, tuple[bool, bool]]:
  """{role: (causal, masked)}: whether the role's model is run left to right
  (AR decoding, drafting, verification; or a denoising loop whose own
  `attention` field is 'causal') and whether MASK tokens are written into
  its input (module docstring)."""
  declared = {role: (causal, not causal) for role, causal in
              getattr(decoder, "role_causal", {}).items()}
  if len(decoder.roles) == 1 and decoder.roles[0] not in declared:
    masked = "mask_id" in _fields(decoder)
    causal = (not masked
              or getattr(decoder, "attention", "bidirectional") == "causal")
    declared[decoder.roles[0]] = (causal, masked)
  return declared


def _block_length(decoder: Any) -> int | None:
  """The block length W a denoiser commits (`block_size()`: its
  `block_length`, or the whole output when None), None if it has none."""
  if hasattr(decoder, "block_size"):
    return decoder.block_size()
  return getattr(decoder, "block_length", None)


def serves(decoder: Any, models: Mapping[str, Model]) -> None:
  """Raises ValueError, naming the decoder and role, when a bound model
  cannot serve it (`models.binding.check_serves`: AR decoding of a
  bidirectional or block-causal model, a denoiser on a causal model, a
  block length other than the model's, MASK decoding of a model without a
  MASK id; and a block-causal model under a decoder outside
  `BLOCK_DECODERS`)."""
  name = getattr(decoder, "registry_name", type(decoder).__name__)
  for role, (causal, masked) in role_needs(decoder).items():
    if role not in models:
      continue
    user = f"decoder {name!r} (role {role!r})"
    block = None if causal else _block_length(decoder)
    check_serves(models[role], user, causal=causal, block_length=block,
                 masked=masked)
    c = conventions(models[role])
    if (not causal and c.attention == "block_causal"
        and name not in BLOCK_DECODERS):
      raise ValueError(
          f"{user} attends over the whole canvas; the model is block-causal"
          f" (block_length={c.block_length}): use one of {BLOCK_DECODERS} "
          f"with block_length={c.block_length}")


def adopt(decoder: Any, models: Mapping[str, Model]) -> Any:
  """`decoder` with the bound models' MASK / EOS / PAD ids (module
  docstring), once `serves` has passed.

  Args:
    decoder: a registered decoder config (a frozen dataclass).
    models: {role: Model}, the models it will decode with.
  Returns:
    The decoder with `mask_id` from the denoising role, and `eos_ids`
    (unless set to () for fixed-length decoding) and `pad_id` from the
    output role (the model's fill id: its PAD, else its first EOS); a
    threshold block decoder without sub-blocks gets the model's
    `sub_block_length` (Fast-dLLM v2's 8) when it divides the block, and
    `ar_first_token=True` with it (v2's sampler, token for token).
  Raises:
    ValueError: a model that cannot serve its role, or a field set to ids
      other than the project's defaults and the model's (named).
  """
  serves(decoder, models)
  fields, needs = _fields(decoder), role_needs(decoder)
  masked = [r for r, (_, mask) in needs.items() if mask and r in models]
  output = "target" if "target" in models else "model"
  wanted = {}
  if "mask_id" in fields and masked:
    wanted["mask_id"] = conventions(models[masked[0]]).mask_id
  if output in models:
    ids = conventions(models[output])
    if "eos_ids" in fields and decoder.eos_ids != ():
      wanted["eos_ids"] = ids.eos_ids
    if "pad_id" in fields:
      wanted["pad_id"] = ids.fill_id
  if masked and "sub_block_length" in fields and (
      getattr(decoder, "remasking", None) == "threshold"
      and decoder.sub_block_length is None):
    sub = conventions(models[masked[0]]).sub_block_length
    if sub and decoder.block_length and decoder.block_length % sub == 0:
      # Fast-dLLM v2's sampler: sub-blocks, each block's first token by
      # argmax before the block is denoised.
      wanted["sub_block_length"] = sub
      wanted["ar_first_token"] = True
  for field, value in wanted.items():
    if field not in _DEFAULTS:  # no project default: set only when unset
      continue
    current = getattr(decoder, field)
    if current not in (_DEFAULTS[field], value):
      raise ValueError(f"{field}={current!r} is set on the decoder but the "
                       f"model's is {value!r}; leave it unset")
  return dataclasses.replace(decoder, **wanted)
