#!/usr/bin/env bash
# Issue 36 item 4: the base `ar` trained on its own Jacobi trajectories (configs/jacobi.py:base), from the
# greedy rows of the attempt-21 distillation set (the shipped `ar`'s greedy continuations of 1,024 document-start
# prefixes, experiments/results/distill_base/attempt21_causal_view/data_manifest.json). Resumable.
set -uo pipefail
cd /work/wt/jacobi   # branch jacobi at 2c33381 (main fb80d52: the same code, rebased)
. /work/venv/bin/activate
W=/work/runs/jacobi
export PYTHONPATH=$PWD
echo "== start $(date -Is) $(git rev-parse HEAD)" >> $W/driver.log
[[ -f $W/states/manifest.json ]] || nice -n 5 python experiments/jacobi_data.py --set_dir=lm_decoding/pretrained/base \
  --model=ar --distillation_set=/work/runs/distill/base21/data --num_rows=512 --num_blocks=4 --block_length=16 \
  --states_per_block=4 --out=$W/states >> $W/data.log 2>&1
echo "== states rc=$? $(date -Is)" >> $W/driver.log
nice -n 5 python experiments/train.py --config=configs/jacobi.py:base --config.data.jacobi_set=$W/states \
  --workdir=$W/member --data_dir=/work/runs/base36/data --pretrained_tokenizer \
  --export_dir=$W/set --stored_dtype=bfloat16 --export_pretrained=ar_jacobi >> $W/train.log 2>&1
echo "== train rc=$? $(date -Is)" >> $W/driver.log
