#!/usr/bin/env bash
# Issue 36 item 1: base mdlm at learning rate 1e-3 (the shipped recipe's 2e-3 spikes), seeds 0 and 1.
set -uo pipefail
cd /work/wt/mdlm_lr
. /work/venv/bin/activate
W=/work/runs/mdlm_lr
mkdir -p $W; for s in ${SEEDS:-0 1}; do
  n=mdlm_lr1e3_s$s
  if [[ -f $W/set_s$s/mdlm/manifest.json ]]; then echo "== $n done"; continue; fi
  echo "== $n start $(date -Is) $(git rev-parse HEAD)"
  PYTHONPATH=$PWD python experiments/train.py --config=configs/base.py --member=mdlm \
    --config.train.learning_rate=1e-3 --config.seed=$s --workdir=$W/$n \
    --data_dir=/work/runs/base36/data --pretrained_tokenizer --export_dir=$W/set_s$s \
    --stored_dtype=bfloat16 --export_pretrained=mdlm > $W/$n.log 2>&1
  echo "== $n end rc=$? $(date -Is)"
done
