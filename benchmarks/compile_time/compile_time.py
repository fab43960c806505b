r"""Compile time of the block-diffusion decoders' block loop, against T / W.

  PYTHONPATH=$PWD python benchmarks/compile_time/compile_time.py OUT.json

Threshold decoding (Fast-dLLM) with the prefix cache, and BD3-LM with its
cache of committed blocks, at T = 256 after P = 16 prompt tokens, batch 1,
for block lengths W = 32 and 16 (N = T / W = 8 and 16 blocks), on
configs/tiny.py's model shape with random weights (compile time does not
depend on the weights). Each decoder is compiled ahead of time
(`cost.measure`: lower + compile, timed apart), then run; the record holds
the compile seconds, one run's seconds, the NFE, the forward tokens and a
digest of the tokens, so a change of the loop can be checked for the same
tokens and the same counted cost. The JSON record stores its command.
"""

import hashlib
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.decoding import base, make_decoder
from lm_decoding.evaluation import cost
from lm_decoding.models import (
    Model, TransformerConfig, init_params, make_logits_fn)

PROMPT_LEN, OUTPUT_LEN = 16, 256
BLOCKS = (32, 16)


def _decoders(block):
  yield "threshold prefix", make_decoder(
      "threshold", output_length=OUTPUT_LEN, block_length=block,
      threshold=0.9, kv_cache="prefix", eos_ids=())
  yield "bd3lm prefix", make_decoder(
      "bd3lm", output_length=OUTPUT_LEN, steps=OUTPUT_LEN, block_length=block,
      remasking="threshold", threshold=0.9, kv_cache="prefix", eos_ids=())


def main(out_path):
  cfg = TransformerConfig(vocab_size=4096, d_model=128, num_layers=2,
                          num_heads=4, num_kv_heads=4, head_dim=32,
                          mlp_dim=512, max_len=PROMPT_LEN + OUTPUT_LEN,
                          attention="bidirectional")
  model = Model(make_logits_fn(cfg), init_params(cfg, jax.random.key(0)))
  prompts = jax.random.randint(jax.random.key(1), (1, PROMPT_LEN), 5, 4096)
  lengths = jnp.full((1,), PROMPT_LEN, jnp.int32)
  key = jax.random.key(2)
  rows = []
  for block in BLOCKS:
    for name, decoder in _decoders(block):
      fn = base.jit_decode(decoder)
      timing, _, out = cost.measure(fn, ({"model": model}, prompts, lengths,
                                         key),
                                    warmup=0, runs=1)
      row = dict(decoder=name, block_length=block,
                 blocks=OUTPUT_LEN // block,
                 compile_s=round(timing.compile_s, 2),
                 run_s=round(timing.median_s, 3), nfe=int(out.nfe),
                 forward_tokens=int(out.forward_tokens["model"]),
                 tokens_sha1=hashlib.sha1(
                     np.asarray(out.tokens).tobytes()).hexdigest()[:12])
      print(row, flush=True)
      rows.append(row)
  record = dict(command="PYTHONPATH=$PWD python " + " ".join(sys.argv),
                jax=jax.__version__, load_1min=os.getloadavg()[0],
                prompt_length=PROMPT_LEN, output_length=OUTPUT_LEN,
                batch=1, rows=rows)
  with open(out_path, "w") as f:
    json.dump(record, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
