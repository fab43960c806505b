"""lm_decoding: sequential vs parallel decoding of one JAX/Flax Transformer, measured.

Dimension letters in names and docstrings (`logits_BxLxV`, `int32[B, L]`)
mean one thing each, in every layer: the glossary is `docs/glossary.md`.
"""

__version__ = "0.1.0"
