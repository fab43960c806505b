"""Certainty-forcing self-distillation of `bd3lm16_from_ar` (dParallel).

The student is the adapted block-diffusion member (blocks of 16, token shift,
complementary masks) trained further with
`certainty_forcing.certainty_forcing_loss` on a distillation set written by
experiments/distill_data.py (the AR parent's greedy and sampled
continuations of 16-token training prefixes, rows of 16 + 240 tokens), from
the member's parameters. Then it is decoded by `bd3lm` with threshold
commits at tau = 0.5 (experiments/distill_measure.py).

`configs/distill.py` (the default, `:tiny`) starts from configs/tiny.py's
member, `configs/distill.py:base` from configs/base.py's; at the base size
the budget is 120 steps of 8 rows cut to their first 128 tokens (16 + 112:
0.12M tokens, 2% of the parent's; on a shared 2-core CPU that is what fits
in about half an hour), decoded at T = 256 all the same.

Usage:
  python experiments/train.py --config=configs/distill.py:base \
      --config.data.distillation_set=/work/runs/distill/base/data \
      --workdir=/work/runs/distill/base/student --init_from=bd3lm16_from_ar \
      --export_dir=/work/runs/distill/set --export_pretrained=bd3lm16_distilled
"""

import ml_collections

from lm_decoding.config_reference import load_sized
from lm_decoding.training.pretrained import member_recipes

_STEPS = {"tiny": 120, "base": 120}


def get_config(size: str = "tiny") -> ml_collections.ConfigDict:
  config = member_recipes.member_configs(
      load_sized(__file__, size))["bd3lm16_from_ar"]
  steps = _STEPS[size]
  config.train.update(dict(
      objective="certainty_forcing",
      init_from="bd3lm16_from_ar",  # a member of --export_dir
      prompt_length=16,  # the distillation set's prefix: one block
      certainty_weight=2.0,  # beta: CE + beta x entropy on correct positions
      certainty_temperature=0.5,  # the entropy of softmax(logits / this)
      # 'random': dParallel's masks; 'left_to_right': d3LLM's trajectory
      # states (a suffix of each block; needs complementary_masks=False)
      mask_order="random",
      # '' or a causal member of --export_dir (the AR parent, 'ar'): its
      # whole next-token distribution is the target of each block's first
      # masked position instead of the row's token, where no later token
      # of the block is shown (certainty_forcing.block_anchors: every block
      # with 'left_to_right', mostly the masked block starts with 'random')
      teacher="",
      # where the teacher is the target: 'anchors' (above),
      # 'causal_view': the student's block-size-1 view at every
      # continuation token, a term added to the loss (the anchors keep
      # the row's token), or 'masked': every masked position before the
      # row's end, given the row's earlier tokens
      teacher_target="anchors",
      view_weight=1.0,  # the 'causal_view' term's weight
      # CDLM's consistency term: the student at a later state of the same
      # trajectory is the target at the drawn one (above 0 with mask_order
      # 'left_to_right' only; certainty_forcing.later_states)
      consistency_weight=0.0,
      batch_size=8, num_steps=steps, warmup_steps=steps // 10,
      eval_every=steps // 2, eval_batches=2,
      checkpoint_every=max(1, steps // 8)))
  # The rows experiments/distill_data.py wrote (tokens.npy, manifest.json).
  config.data.distillation_set = ""
  # True: the PAD after a row's EOS becomes EOS to the end of its block,
  # masked and scored like any token, so the student learns to end
  # (self_distillation.eos_filled).
  config.data.eos_fill = False
  if size == "base":  # the rows' first 128 tokens: half a step's compute
    config.data.seq_len = 128
  return config
