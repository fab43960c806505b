"""Decoders over a logits_fn; importing this package registers every decoder."""

from lm_decoding.decoding import autoregressive  # noqa: F401  "ar", "ar_early_exit", "ar_uncached"
from lm_decoding.decoding import beam_search  # noqa: F401  "ar_beam"
from lm_decoding.decoding import masked_diffusion  # noqa: F401  "mdlm", "llada"
from lm_decoding.decoding.base import DecodeResult, make_decoder, registered

__all__ = ["DecodeResult", "make_decoder", "registered"]
