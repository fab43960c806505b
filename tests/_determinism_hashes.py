"""Decodes every registered decoder on a stub; prints `name sha256` per line.

Run by tests/test_determinism.py in a fresh process (and imported there for
the same hashes in-process): one seed must give bit-identical tokens in any
process.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

import stubs
from lm_decoding.decoding import base, make_decoder, registered, sampling
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.special_tokens import PAD_ID

PROMPTS = jnp.asarray([[5, 6, 7], [7, 0, 0], [9, 5, 0]], jnp.int32)
PROMPT_LENGTHS = jnp.asarray([3, 1, 2], jnp.int32)
OUTPUT_LENGTH = 4


def build(name: str) -> base.Decoder:
  """Decoder `name` drawing at temperature 1 where it samples, K = T."""
  cls = base.decoder_class(name)
  fields = {f.name for f in dataclasses.fields(cls)}
  options = {"output_length": OUTPUT_LENGTH}
  if issubclass(cls, ScheduledDecoder):
    options["steps"] = OUTPUT_LENGTH
  if "sampling" in fields:
    options["sampling"] = sampling.SamplingConfig(temperature=1.0)
  return make_decoder(name, **options)


# One stub for every call: a stub is a static jit argument hashed by
# identity, so a new one would recompile every decode.
STUB = stubs.TableLogitsFn.random(7, 12, 16, masked_ids=(PAD_ID,))


def decode(name: str, seed: int) -> base.DecodeResult:
  """Decoder `name`'s record with key(seed) on a random stub."""
  decoder = build(name)
  return decoder.decode(stubs.bind_roles(decoder, STUB), PROMPTS,
                        PROMPT_LENGTHS, jax.random.key(seed))


def tokens(name: str, seed: int) -> np.ndarray:
  """int32[B, T] tokens of decoder `name` with key(seed) on a random stub."""
  return np.asarray(decode(name, seed).tokens)


def digest(array: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


if __name__ == "__main__":
  for decoder_name in registered():
    print(decoder_name, digest(tokens(decoder_name, seed=0)))
