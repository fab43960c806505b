#!/bin/bash
# $1 = worktree name, $2 = member; trains the member's base recipe for 4 steps (warm-up 1) at that worktree's commit
c=$1; m=${2:-mdlm}; cd /work/wt/$c
rm -rf /work/runs/gap/$c/$m
mkdir -p /work/runs/gap/$c
PYTHONPATH=$PWD nice -n 1 /work/venv/bin/python experiments/train.py --config=configs/base.py --member=$m --workdir=/work/runs/gap/$c/$m --data_dir=/work/runs/base36/data --pretrained_tokenizer --config.train.num_steps=4 --config.train.warmup_steps=1 --config.train.eval_every=4 > /work/runs/gap/$c/$m.log 2>&1
echo "$c $m rc=$?"
