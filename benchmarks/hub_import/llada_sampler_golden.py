"""Writes tests/goldens/llada_sampler.npz: the 64 tokens LLaDA's own sampler
(`generate` in github:ML-GSAI/LLaDA generate.py: greedy, low-confidence
remasking, semi-autoregressive blocks) draws from a stub denoiser, the
golden of tests/test_hub_import.py's sampler test (our 'llada' decoder on
the same stub).

Run with the authors' generate.py importable as `llada_generate` (it is not
part of this repository):

  PYTHONPATH=/path/to/dir/with/llada_generate python \
      benchmarks/hub_import/llada_sampler_golden.py tests/goldens/llada_sampler.npz

The stub (`stub_weights`, repeated in the test) is a bidirectional bag-of-
tokens model: logits[i] = A[i] + E[x_i] C + mean_j E[x_j] B, float64 here.
"""

import sys

import numpy as np
import torch

from llada_generate import generate  # not shipped here

VOCAB, MASK_ID, WIDTH, DIM = 24, 23, 4, 8
PROMPTS = np.array([[3, 9, 14, 2], [7, 7, 1, 20]])
GEN_LENGTH, STEPS, BLOCK_LENGTH = 64, 32, 16


def stub_weights():
  """{A [L, V], E [V, D], B [D, V], C [D, V]} from RandomState(0)."""
  rng = np.random.RandomState(0)
  length = WIDTH + GEN_LENGTH
  return dict(A=rng.standard_normal((length, VOCAB)) * 4.0,
              E=rng.standard_normal((VOCAB, DIM)),
              B=rng.standard_normal((DIM, VOCAB)) * 2.0,
              C=rng.standard_normal((DIM, VOCAB)) * 2.0)


class Stub(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.w = {k: torch.tensor(v) for k, v in stub_weights().items()}

  @property
  def device(self):
    return torch.device("cpu")

  def forward(self, x, attention_mask=None):
    del attention_mask
    e = self.w["E"][x]  # [B, L, D]
    logits = (self.w["A"][None, :x.shape[1]] + e @ self.w["C"]
              + (e.mean(1, keepdim=True) @ self.w["B"]))

    class Out:
      pass
    out = Out()
    out.logits = logits
    return out


def main(path):
  tokens = generate(Stub(), torch.tensor(PROMPTS), steps=STEPS,
                    gen_length=GEN_LENGTH, block_length=BLOCK_LENGTH,
                    temperature=0.0, remasking="low_confidence",
                    mask_id=MASK_ID)
  out = tokens[:, WIDTH:].numpy()
  print(out)
  np.savez(path, prompts=PROMPTS, tokens=out)


if __name__ == "__main__":
  main(sys.argv[1])
