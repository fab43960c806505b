"""Jacobi Forcing: consistency training of the `ar` member on its own Jacobi
trajectories (CLLM, Kou et al. 2024, arXiv:2403.00835; Jacobi Forcing,
arXiv:2512.14681), so that the lossless `jacobi` decoder fixes more than one
token per call.

The member is configs/{size}.py's `ar` (same backbone, data and validation
rows) trained further with `objectives.jacobi_forcing` on a Jacobi state set
written by experiments/jacobi_data.py (states of blocks of 16 after the
16-token prefixes of a distillation set's greedy rows), from `ar`'s
parameters. Validation is the AR perplexity of `ar`'s own validation rows
(same length, batches and count), so the two figures compare directly.

Usage (docs/jacobi_forcing.md):
  python experiments/train.py --config=configs/jacobi.py:base \
      --config.data.jacobi_set=/tmp/jacobi/states \
      --workdir=/tmp/jacobi/member --data_dir=/tmp/jacobi/states/data_cache \
      --pretrained_tokenizer --export_dir=/tmp/jacobi/set \
      --export_pretrained=ar_jacobi
"""

import ml_collections

from lm_decoding.config_reference import load_sized
from lm_decoding.training.pretrained import member_recipes

_STEPS = {"tiny": 100, "base": 200}


def get_config(size: str = "tiny") -> ml_collections.ConfigDict:
  config = member_recipes.member_configs(
      load_sized(__file__, size))["ar"]
  steps = _STEPS[size]
  config.train.update(dict(
      objective="jacobi_forcing",  # objectives/jacobi_forcing.py
      init_from="ar",  # a member of --export_dir
      consistency_weight=1.0,  # block positions' weight; the prefix's is 1
      learning_rate=round(0.1 * config.train.learning_rate, 10),  # 0.1 x ar's
      eval_batch_size=config.train.batch_size,  # ar's validation rows
      batch_size=8,  # state rows a step
      num_steps=steps, warmup_steps=steps // 10, eval_every=steps // 2,
      checkpoint_every=max(1, steps // 4)))
  # The Jacobi state set experiments/jacobi_data.py wrote (required).
  config.data.jacobi_set = ""
  return config
