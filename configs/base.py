"""The comparison at a model size and budget worth judging quality on.

configs/tiny.py trains in minutes and is what the tests and `--retrain` use;
its 1M-parameter models (AR perplexity ~200 after 300 steps) say more about
the training budget than about decoding. This config keeps tiny's data,
tokenizer and objectives, and grows the backbone to d256, 4
layers, 4 heads of 64, SwiGLU MLP 1024 (5.25M parameters, 21 MB in float32,
10.5 MB as shipped in bfloat16) trained for 1500 steps of 16 x 256 tokens
(6.1M tokens, about 7 epochs of the Austen train split) at one budget for
every member. On 2 CPU cores that is about an hour for the AR and MDLM
models, 2.3 hours for BD3-LM (it trains on the noisy and clean copies of
each sequence together) and about 85 minutes for the evaluator (shipped in
int8). The comparison grid below takes about 12 minutes.

Usage:
  python experiments/compare_decoding.py --config=configs/base.py \
      --workdir=/tmp/base_compare
"""

import importlib.util
import pathlib

import ml_collections

STUDENT = "bd3lm16_distilled"  # compare.stored_members
VIEW_STUDENT = "bd3lm16_distilled_view"  # its view held at the AR parent

_spec = importlib.util.spec_from_file_location(
    "full", pathlib.Path(__file__).with_name("full.py"))
full = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(full)


def get_config() -> ml_collections.ConfigDict:
  config = full.get_config()
  config.model.update(dict(d_model=256, num_layers=4, num_heads=4,
                           num_kv_heads=4, head_dim=64, mlp_dim=1024))
  # The shipped members' recipe; kept, as every member must match it. Measured
  # for future training (docs/training_speed.md; benchmarks/training_speed/
  # recipe/sweep.json, AR, 3 minutes of training a shape, learning rate and
  # warm-up fraction as here, load average ~6 on 2 cores): at the same
  # 4,096-token steps' throughput (2,150-2,180 tokens/s measured while
  # training, for B 8, 16 and 32 at L 256) the smaller batch, taking more
  # steps, reached validation perplexity 510 (B 8, 154 steps) against 806
  # (B 16, 99) and 1,663 (B 32, 48): a new base member trained for a fixed
  # hour would use batch_size=8 with twice the steps (one seed, one short
  # budget: a direction, not a tuned recipe). L stays 256: the decoders need
  # P + T = 272 positions, and tokens/s falls at longer L (2,311 at 16 x 256,
  # 1,841 at 8 x 512; experiments/results/benchmark_training/base_shapes/).
  config.train.update(dict(num_steps=1500, learning_rate=2e-3,
                           warmup_steps=150, eval_every=250))
  # The evaluator: larger than the decoded models (d384, 6 heads of 64, MLP
  # 1536: 11.0M parameters, 2.1x, as tiny's is 1.9x its AR) at their budget,
  # seed 1. Tiny's section would otherwise give a 3.7M model at 300 steps,
  # weaker than the models it scores.
  config.evaluator.model.update(
      dict(d_model=384, num_heads=6, num_kv_heads=6, mlp_dim=1536))
  config.evaluator.train.update(dict(num_steps=config.train.num_steps))
  # The MDLM at twice the AR member's training tokens, at the learning rate
  # it is stable at: at 2e-3 its gradient norm spikes (15.8 near step 200)
  # and two draws of the shared recipe ended at bounds 247.3 and 383.0; at
  # 1e-3 over 3,000 steps it ends at 132.8, within 2.5x AR's 62.0 (issue 36;
  # experiments/results/base_retrain/). The controls keep the shared recipe.
  config.member_train.mdlm = ml_collections.ConfigDict(
      dict(learning_rate=1e-3, num_steps=3000))
  # Its members are shipped in lm_decoding/pretrained/base/ (the tiny set's
  # folder holds tiny's recipes: looking there would train every member).
  config.compare.pretrained_set = "base"
  # The grid at this size: T = 256 only, 3 timed runs, and the decoders of
  # configs/full.py (the whole grid, which base derives from) less those
  # that make T full passes without a cache (AR uncached, MDLM K=T, LLaDA
  # K=T, threshold without or with the prefix cache, factor) and
  # the margin ordering: each would take minutes a row here. The kept
  # threshold row still shows how many tokens a step commits (its NFE).
  dropped = ("AR uncached |", "| steps=T", "kv_cache=none", "kv_cache=prefix",
             "| factor |", "remasking=margin")
  config.compare.decoders = tuple(
      d for d in config.compare.decoders
      if not any(piece in d for piece in dropped))
  # Two certainty-forcing students of bd3lm16_from_ar
  # (docs/self_distillation.md), shipped in the set outside the recipes
  # above and loaded by their own manifests: greedy, judged against AR
  # greedy. The threshold row is STUDENT's parallel decode at dParallel's
  # tau = 0.5. Self-speculation is lossless against a student's own
  # block-size-1 (AR) view: VIEW_STUDENT's, trained towards the AR parent's
  # next-token distribution (train.teacher_target=causal_view).
  config.compare.stored_members = (STUDENT, VIEW_STUDENT)
  config.compare.decoders += (
      "view-distilled self-speculative gamma={gamma} temp={temperature}"
      f" | self_speculative | model={VIEW_STUDENT} | gamma=8 temperature=0",
      "distilled BD3-LM {remasking} tau={threshold} block={block_length}"
      " K={steps}"
      f" temp={{temperature}} | bd3lm | model={STUDENT} | block_length=16"
      " steps=T remasking=threshold threshold=0.5 temperature=0",
  )
  config.compare.output_lengths = (256,)
  config.compare.timed_runs = 3
  return config
