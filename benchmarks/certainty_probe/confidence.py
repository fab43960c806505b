"""How sure are the teacher and the certainty-forcing students, in the
training layout? (issue 36, item 5; the record is README.md beside this)

  python benchmarks/certainty_probe/confidence.py SET_DIR DATA_DIR MEMBER...

On 16 rows of the distillation set DATA_DIR (rows 0-7 greedy, 8-15 sampled
continuations; first 128 tokens), every block masked at rate 0.5 (no
complementary row) in the BD3-LM layout: the certainty-forcing terms (CE,
fraction of masked positions whose argmax is right, entropy of
softmax(logits / 0.5) there) and the raw confidence the threshold decoder
reads (the top probability of softmax(logits)): its mean and the fraction
of masked positions above 0.3 and 0.5. Prints one Markdown row per member.
"""

import sys

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.models import make_logits_fn
from lm_decoding.special_tokens import MASK_ID
from lm_decoding.training.objectives import certainty_forcing as cf
from lm_decoding.training.pretrained import store
from lm_decoding.training import train
from lm_decoding.training.objectives.bd3lm import bd3lm_logits


def main(set_dir, data_dir, *members):
  logging.set_verbosity(logging.FATAL)
  tokens, manifest = cf.read_distillation_set(data_dir)
  half = manifest["rows"] // 2
  rows = jnp.asarray(tokens[np.r_[0:8, half:half + 8]][:, :128])
  masked = cf.semi_ar_masks(jax.random.key(0), rows, 16, True, 0.5, False)
  x_t = jnp.where(masked, MASK_ID, rows)
  m = np.asarray(masked)
  print("| member | CE | correct | entropy at T=0.5 on correct | raw top p mean"
        " | raw top p > 0.3 | raw top p > 0.5 |\n|---|---|---|---|---|---|---|")
  for name in members:
    recipe, params = store.load_stored(name, set_dir)
    config = train.model_config(recipe)
    fn = make_logits_fn(config)
    logits = jax.jit(lambda p: bd3lm_logits(fn, p, rows, x_t, 16))(params)
    _, terms = cf.certainty_forcing_terms(logits, rows, masked)
    top = np.asarray(jnp.max(jax.nn.softmax(logits, -1), -1))[m]
    print(f"| {name} | {float(terms['ce']):.3f} | {float(terms['correct']):.3f}"
          f" | {float(terms['entropy']):.3f} | {top.mean():.3f} | "
          f"{(top > 0.3).mean():.3f} | {(top > 0.5).mean():.3f} |", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
