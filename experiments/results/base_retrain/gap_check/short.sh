#!/bin/bash
# $1 = worktree name; trains the base mdlm recipe for 4 steps (warm-up 1) at that commit
c=$1; cd /work/wt/$c
rm -rf /work/runs/gap/$c/w
PYTHONPATH=$PWD nice -n 1 /work/venv/bin/python experiments/train.py --config=configs/base.py --member=mdlm --workdir=/work/runs/gap/$c/w --data_dir=/work/runs/base36/data --pretrained_tokenizer --config.train.num_steps=4 --config.train.warmup_steps=1 --config.train.eval_every=4 > /work/runs/gap/$c/log 2>&1
echo "$c rc=$?"
