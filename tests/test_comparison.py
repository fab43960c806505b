"""The comparison harness and report: structure, honest counts, crossover."""

import csv
import os

import jax
import numpy as np
import pytest

from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.evaluation import comparison, report
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn

VOCAB = 400


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return Tokenizer.train(corpus.load_paragraphs("")[:400], VOCAB)


def model(attention, seed, d_model=32):
  cfg = TransformerConfig(vocab_size=VOCAB, d_model=d_model, num_layers=1,
                          num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64,
                          max_len=32, attention=attention)
  return comparison.Model(make_logits_fn(cfg),
                          init_params(cfg, jax.random.key(seed)), attention)


def test_run_measures_every_decoder_and_scores_the_largest_batch(
    tokenizer, tmp_path):
  specs = [s for s in comparison.standard_specs(
      mdlm_steps=(2, 0), llada_steps=4, llada_block_length=4)
           if s.label in ("AR cached", "MDLM K=2", "LLaDA K=4 block=4")]
  assert len(specs) == 3  # (compile time bounds how many run here)
  prompts = np.random.default_rng(0).integers(5, VOCAB, (2, 4)).astype(np.int32)
  rows, extras = comparison.run(
      specs, model("causal", 0), model("bidirectional", 1),
      model("causal", 2, d_model=48), tokenizer, prompts,
      ["a single man", "a good wife"], lengths=(8,), batch_sizes=(1, 2),
      temperature=1.0, runs=1, progress=False)
  assert len(rows) == len(specs) * 2
  labels = [s.label for s in specs]
  assert {r["decoder"] for r in rows} == set(labels)
  for r in rows:
    t = r["output_length"]
    if r["decoder"] == "AR cached":
      assert r["nfe"] == t and r["ttft_ms"] > 0  # prefill + T - 1 steps
    if r["decoder"] == "MDLM K=2":
      assert 1 <= r["nfe"] <= 2
    if r["decoder"].startswith("LLaDA"):
      assert r["nfe"] <= 4
    assert r["ms_per_sequence"] > 0 and r["compile_s"] >= 0
    assert 0 < r["generated_tokens"] <= t * r["batch_size"]
    scored = r["batch_size"] == 2
    assert ("gen_ppl" in r) == scored
    if scored:
      assert r["gen_ppl"] > 1 and 0 <= r["omission"] <= 1
      assert ("all_eos" in r) == (r["family"] == "parallel")
  ar = [r for r in rows if r["decoder"] == "AR cached"]
  assert all(r["roofline_ratio"] > 0 for r in ar)
  assert set(extras["samples"]) == set(labels)

  paths = report.write(rows, extras, "# test", str(tmp_path))
  for path in paths.values():
    assert os.path.getsize(path) > 0
  with open(paths["csv"]) as f:
    assert len(list(csv.DictReader(f))) == len(rows)
  text = open(paths["report"]).read()
  assert "## Crossover" in text and "| MDLM K=2 |" in text


def test_standard_specs_cover_both_families():
  specs = comparison.standard_specs(mdlm_steps=(8, 0), llada_steps=32,
                                    llada_block_length=32)
  assert [s.label for s in specs] == [
      "AR cached", "AR uncached", "MDLM K=8", "MDLM K=T", "LLaDA K=32",
      "LLaDA K=32 block=32"]
  decoder = specs[3].build(64, 0.7, (3,))
  assert (decoder.steps, decoder.gen_length, decoder.sampling.temperature) == (
      64, 64, 0.7)
  assert specs[0].build(16, 0.7, (3,)).sampling.temperature == 0.7


def test_bad_decoder_option_fails_before_any_decode(tokenizer):
  specs = [comparison.DecoderSpec("LLaDA bad", "llada", comparison.PARALLEL,
                                  options=(("block_length", 3),), steps=4)]
  prompts = np.full((1, 2), 7, np.int32)
  with pytest.raises(ValueError, match="block_length=3"):
    comparison.run(specs, model("causal", 0), model("bidirectional", 1),
                   model("causal", 2), tokenizer, prompts, ["x"], lengths=(8,),
                   batch_sizes=(1,), temperature=1.0, runs=1, progress=False)


def _row(decoder, family, b, t, ms, nfe):
  return dict(decoder=decoder, family=family, batch_size=b, output_length=t,
              ms_per_sequence=ms, nfe=nfe)


def test_crossover_and_break_even_steps_from_rows():
  rows = [_row("AR cached", "sequential", 1, 32, 10.0, 32),
          _row("AR cached", "sequential", 1, 64, 20.0, 64),
          _row("MDLM K=8", "parallel", 1, 32, 16.0, 8),
          _row("MDLM K=8", "parallel", 1, 64, 16.0, 8),
          _row("MDLM K=T", "parallel", 1, 32, 64.0, 32),
          _row("MDLM K=T", "parallel", 1, 64, 128.0, 64)]
  assert report.crossover(rows) == {("MDLM K=8", 1): [64],
                                    ("MDLM K=T", 1): []}
  # K* = AR ms / (parallel ms per forward), from the row with most NFE.
  assert report.break_even_steps(rows) == {(1, 32): pytest.approx(5.0),
                                           (1, 64): pytest.approx(10.0)}
