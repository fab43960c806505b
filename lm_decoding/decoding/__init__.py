"""Decoders over a logits_fn.

Importing this package imports every module in it, so each decoder module
registers its decoders by name (`base.register`) without being listed here:
a new decoder is its own module, its test, and one line of experiment config.

The registry holds the LM decoders: each continues a prompt under one
contract (`decode(models, prompts, prompt_lengths, key)`, `sampling` and
`eos_ids` options, EOS ending a row, output_length tokens), which the
registry-wide tests check for every name. The non-autoregressive
translation decoders, `ctc.CTCDecoder` and `mask_predict.MaskPredictDecoder`,
are deliberately left out: their contract is different. The prompt is a
source sentence [source, BOS] and the output its translation, whose length
is predicted (a length head, or CTC's collapsed frames), not generated until
EOS; EOS is appended by the decoder, never chosen, so `eos_ids` has no
meaning; both are argmax decoders of a model trained for them (a CMLM with a
length head, a CTC NAT over an upsampled source), not of any LM, so a
`sampling` option would be an untested knob; and CTC's output width is a
function of the source, not of output_length. They are used through their
classes (`experiments/translate.py`), with their own tests
(tests/test_nat_decoders.py).
"""

import importlib
import pkgutil

from lm_decoding.decoding.base import (
    DecodeResult, bind, make_decoder, registered)

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DecodeResult", "bind", "make_decoder", "registered"]
