"""Decoders over a logits_fn.

Importing this package imports every module in it, so each decoder module
registers its decoders by name (`base.register`) without being listed here:
a new decoder is its own module, its test, and one line of experiment config.
"""

import importlib
import pkgutil

from lm_decoding.decoding.base import (
    DecodeResult, Model, bind, make_decoder, registered)

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DecodeResult", "Model", "bind", "make_decoder", "registered"]
