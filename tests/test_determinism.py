"""Determinism: one seed, bit-identical tokens, for every registered decoder.

Across two runs in one process and across processes here, and the main job's
quality columns across reruns with one seed; across batch sizes
and batch compositions in `test_iterative.test_batch_equals_each_row_alone`
(B = 1, 3, 8, every decoder); and with or without `jax.jit` (chex variants:
the decode jitted whole from outside, and run op by op under
`jax.disable_jit()`, give the record of its own jitted run). What is not deterministic on GPU is written down
in docs/errors_and_reproducibility.md ("Reproducibility").
"""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
from absl.testing import parameterized

import _determinism_hashes as hashes
import stubs
from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import registered
from lm_decoding.evaluation import comparison, entries
from lm_decoding.models import Model

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.parametrize("name", registered())
def test_same_seed_same_tokens_in_one_process(name):
  first = hashes.tokens(name, seed=0)
  np.testing.assert_array_equal(hashes.tokens(name, seed=0), first)
  if name != "ar_beam":  # beam search draws nothing: the key is unused
    others = [hashes.tokens(name, seed=s) for s in (1, 2, 3)]
    assert any((o != first).any() for o in others), "the seed is ignored"


def test_same_seed_same_tokens_across_processes():
  """One subprocess decodes every decoder; its hashes equal this process's.
  It compiles every program itself (no persistent compilation cache)."""
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false",
             PYTHONPATH=os.pathsep.join(
                 [str(HERE), str(HERE.parent),
                  os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, str(HERE / "_determinism_hashes.py")],
                        capture_output=True, text=True, timeout=300, env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  theirs = dict(line.split() for line in proc.stdout.splitlines())
  assert set(theirs) == set(registered())
  mine = {name: hashes.digest(hashes.tokens(name, seed=0))
          for name in registered()}
  assert theirs == mine


@functools.cache
def jitted_record(name: str):
  """The whole `DecodeResult` of decoder `name`'s own jitted decode (seed 0)."""
  return hashes.decode(name, seed=0)


class JitOrNotTest(chex.TestCase):
  """Every registered decoder, on the random stub at temperature 1: the
  record (tokens, lengths, committed, NFE, per-role calls and forward tokens,
  stats) is bit-identical whether the decode is jitted whole from outside or
  runs op by op, to that of its own jit."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*registered())
  def test_record_is_the_same_jitted_or_not(self, name):
    decode = self.variant(functools.partial(hashes.decode, name))
    if self.variant.type == chex.ChexVariantType.WITHOUT_JIT:
      with jax.disable_jit():  # the decoder's own jit too
        out = decode(seed=0)
    else:
      out = decode(seed=0)
    chex.assert_trees_all_equal(out, jitted_record(name), strict=True)


QUALITY = ("gen_ppl", "entropy", "rep_4", "distinct_2", "eos_tokens_per_row",
           "nfe", "calls", "forward_tokens", "all_eos", "empty")


def test_main_job_rerun_gives_the_same_quality_columns():
  """comparison.run twice with one seed on stub models (AR, MDLM, threshold
  with a dual cache): every quality column and sample is identical."""
  vocab = 400  # the tokenizer's; the stubs use its first 12 ids
  tokenizer = Tokenizer.train(corpus.load_paragraphs("")[:200], vocab)
  stub = stubs.TableLogitsFn.random(3, 12, 16, masked_ids=(0,))
  table = np.full(stub.table.shape[:-1] + (vocab,), -np.inf, np.float32)
  table[..., :12] = stub.table
  model = Model(stubs.TableLogitsFn(table), None)
  texts = ["AR cached | ar | model=ar",
           "MDLM K={steps} | mdlm | model=mdlm | steps=4",
           "thr {kv_cache} | threshold | model=mdlm | kv_cache=dual"]
  planned = entries.plan(entries.parse_entries(texts), (4,), 1.0,
                         ("ar", "mdlm", "evaluator"))
  prompts = np.asarray([[5, 6, 7], [7, 8, 9]], np.int32)

  def run():
    return comparison.run(planned, {"ar": model, "mdlm": model}, model,
                          tokenizer, prompts, ["one", "two"], (2,), 1,
                          seed=3, progress=False)

  first, second = run(), run()
  assert len(first.rows) == len(second.rows) == 3  # one per entry at B = 2
  for a, b in zip(first.rows, second.rows):
    assert np.isfinite(a["gen_ppl"])  # scored at B = 2: NaN != NaN below
    assert {k: a.get(k) for k in QUALITY} == {k: b.get(k) for k in QUALITY}
  assert first.samples == second.samples and first.human == second.human
