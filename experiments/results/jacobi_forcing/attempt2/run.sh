#!/usr/bin/env bash
# Issue 36 item 4, Jacobi Forcing attempt 2: attempt 1 (attempt1_run.sh) with every state of each trajectory
# (--states_per_block=16) and 1,000 steps instead of 200 (configs/jacobi.py:base otherwise). Resumable.
set -uo pipefail
cd /work/main   # at fb80d52 when started (its code: experiments/results/jacobi_forcing/attempt1/run.sh)
. /work/venv/bin/activate
W=/work/runs/jacobi2
mkdir -p $W/set && cp -rn /work/runs/jacobi/set/{ar,evaluator,tokenizer.model} $W/set/
echo "== start $(date -Is) $(git rev-parse HEAD)" >> $W/driver.log
[[ -f $W/states/manifest.json ]] || nice -n 5 python experiments/jacobi_data.py --set_dir=lm_decoding/pretrained/base \
  --model=ar --distillation_set=/work/runs/distill/base21/data --num_rows=512 --num_blocks=4 --block_length=16 \
  --states_per_block=16 --out=$W/states >> $W/data.log 2>&1
echo "== states rc=$? $(date -Is)" >> $W/driver.log
nice -n 5 python experiments/train.py --config=configs/jacobi.py:base --config.data.jacobi_set=$W/states \
  --config.train.num_steps=1000 --config.train.warmup_steps=100 --config.train.eval_every=250 \
  --config.train.checkpoint_every=100 --workdir=$W/member --data_dir=/work/runs/base36/data --pretrained_tokenizer \
  --export_dir=$W/set --stored_dtype=bfloat16 --export_pretrained=ar_jacobi >> $W/train.log 2>&1
echo "== train rc=$? $(date -Is)" >> $W/driver.log
