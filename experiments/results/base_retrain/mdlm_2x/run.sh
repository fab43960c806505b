#!/usr/bin/env bash
# Issue 36 item 1: the base mdlm recipe at learning rate 1e-3 (mdlm_lr1e3/'s stable one) for 3,000 steps, twice
# the AR member's 1,500 (cosine over 3,000; warm-up 150 as shipped), seed 0: does twice the compute bring the bound
# within 2.5x AR? Resumable: rerun it and train.py continues from the latest checkpoint (every 100 steps).
set -uo pipefail
cd /work/wt/mdlm2x   # a frozen worktree at ae8c2d0
. /work/venv/bin/activate
W=/work/runs/mdlm2x
mkdir -p $W
echo "== start $(date -Is) $(git rev-parse HEAD)" >> $W/driver.log
PYTHONPATH=$PWD nice -n 10 python experiments/train.py --config=configs/base.py --member=mdlm \
  --config.train.learning_rate=1e-3 --config.train.num_steps=3000 --config.train.checkpoint_every=100 \
  --config.seed=0 --workdir=$W/run --data_dir=/work/runs/base36/data --pretrained_tokenizer \
  --export_dir=$W/set --stored_dtype=bfloat16 --export_pretrained=mdlm >> $W/train.log 2>&1
echo "== end rc=$? $(date -Is)" >> $W/driver.log
