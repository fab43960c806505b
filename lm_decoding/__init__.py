"""lm_decoding: sequential vs parallel decoding of one JAX/Flax Transformer, measured."""

__version__ = "0.1.0"
