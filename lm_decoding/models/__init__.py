"""Transformer backbone and its KV cache."""

from lm_decoding.models.binding import Model
from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.kv_cache import KVCache
from lm_decoding.models.transformer import (
    Transformer, abstract_params, count_params, init_params, make_logits_fn)

__all__ = ["Model", "TransformerConfig", "KVCache", "Transformer", "abstract_params",
           "count_params", "init_params", "make_logits_fn"]
