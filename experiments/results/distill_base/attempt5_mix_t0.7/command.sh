#!/usr/bin/env bash
# Issue 36 item 5, attempt 5: greedy + temperature-0.7 rows of the AR parent; student continues from attempt 4's.
set -uo pipefail
cd /work/wt/run36
. /work/venv/bin/activate
W=/work/runs/distill/base5
if [[ ! -f $W/data/manifest.json ]]; then
PYTHONPATH=$PWD nice -n 2 python experiments/distill_data.py --config=configs/base.py --set_dir=/work/runs/distill/set --teacher=ar --decoder=ar --temperatures=0,0.7 --num_prefixes=1024 --prompt_length=16 --output_length=240 --batch_size=64 --out=$W/data > $W/data.log 2>&1 || exit 1
fi
PYTHONPATH=$PWD nice -n 2 python experiments/train.py --config=configs/distill.py:base --config.data.distillation_set=$W/data --config.train.init_from=bd3lm16_distilled_g256 --config.data.seq_len=256 --config.train.num_steps=150 --config.train.warmup_steps=10 --config.train.eval_every=75 --config.train.checkpoint_every=15 --workdir=$W/student --data_dir=$W/data/data_cache --pretrained_tokenizer --export_dir=/work/runs/distill/set --stored_dtype=bfloat16 --export_pretrained=bd3lm16_distilled_mix > $W/train.log 2>&1
echo "train rc=$? $(date -Is)" >> $W/driver.log
