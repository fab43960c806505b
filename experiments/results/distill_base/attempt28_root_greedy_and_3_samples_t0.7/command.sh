#!/usr/bin/env bash
# Issue 36 item 5, attempt 28: several sampled continuations per prefix. The AR parent's greedy continuation and three
# temperature-0.7 samples of each of 1024 document-start prefixes (4096 rows); attempt 16's recipe (300 steps from the
# root bd3lm16_from_ar; trajectory states, EOS fill) with the certainty term at weight 1.0.
set -uo pipefail
cd /work/wt/t28
. /work/venv/bin/activate
W=/work/runs/distill/base28
D=$W/data
echo "start $(date -Is) $(git rev-parse HEAD)" >> $W/driver.log
if [[ ! -f $D/manifest.json ]]; then
PYTHONPATH=$PWD nice -n 2 python experiments/distill_data.py --config=configs/base.py --set_dir=/work/runs/distill/set --teacher=ar --decoder=ar --temperatures=0,0.7,0.7,0.7 --num_prefixes=1024 --prefix_at=document_starts --prompt_length=16 --output_length=240 --batch_size=64 --out=$D > $W/data.log 2>&1
echo "data rc=$? $(date -Is)" >> $W/driver.log
fi
PYTHONPATH=$PWD nice -n 2 python experiments/train.py --config=configs/distill.py:base --config.data.distillation_set=$D --config.data.eos_fill=True --config.train.mask_order=left_to_right --config.train.complementary_masks=False --config.train.batch_size=16 --config.train.init_from=bd3lm16_from_ar --config.train.certainty_weight=1.0 --config.data.seq_len=256 --config.train.num_steps=300 --config.train.warmup_steps=10 --config.train.eval_every=100 --config.train.checkpoint_every=20 --workdir=$W/student --data_dir=$D/data_cache --pretrained_tokenizer --export_dir=/work/runs/distill/set --stored_dtype=bfloat16 --export_pretrained=bd3lm16_distilled_root_samples3 >> $W/train.log 2>&1
echo "train rc=$? $(date -Is)" >> $W/driver.log
PYTHONPATH=$PWD nice -n 2 python experiments/distill_measure.py --config=configs/base.py --set_dir=/work/runs/distill/set --models=bd3lm16_distilled_root_samples3:16 --thresholds=0.5,0.7 --in_order_thresholds=0.5 --self_speculative_gammas=8 --timed_runs=3 --num_prompts=64 --out=$W/measure > $W/measure.log 2>&1
echo "measure rc=$? $(date -Is)" >> $W/driver.log
