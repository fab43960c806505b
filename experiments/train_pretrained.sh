#!/usr/bin/env bash
# Retrains the whole shipped pretrained set (lm_decoding/pretrained/) from
# scratch: AR, MDLM and BD3-LM on the tiny config's backbone, and the larger
# evaluator AR model with another seed, all on the bundled corpus with one
# tokenizer and one training budget (configs/tiny.py). Each run resumes if
# interrupted; each manifest records its exact command.
#
#   bash experiments/train_pretrained.sh [WORKDIR]     # default /tmp/pretrain
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/pretrain}"
rm -rf lm_decoding/pretrained/{ar,mdlm,bd3lm,evaluator,tokenizer.model}
train() {
  local name="$1"; shift
  python experiments/train.py --config=configs/tiny.py \
      --workdir="$work/$name" --data_dir="$work/data" \
      --export_pretrained="$name" "$@"
}
train ar --config.train.objective=ar
train mdlm --config.train.objective=mdlm
train bd3lm --config.train.objective=bd3lm
train evaluator --config.train.objective=ar --config.seed=1 \
    --config.model.d_model=192 --config.model.num_heads=6 \
    --config.model.num_kv_heads=6 --config.model.mlp_dim=768
