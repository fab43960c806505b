#!/usr/bin/env bash
# Issue 36 item 5, attempt 30: attempt 16's recipe (300 steps from the root bd3lm16_from_ar; trajectory states, EOS
# fill, certainty weight 2.0) on attempt 21's rows (the same distill_data command as attempt 16's set: the AR parent's
# greedy + temperature-0.5 continuations of 1024 document-start prefixes, 2048 rows, 277,592 tokens), with CDLM's
# consistency term at weight 1.0 (train.consistency_weight). Resumable: rerun and train.py continues.
set -uo pipefail
cd /work/main
. /work/venv/bin/activate
W=/work/runs/distill/base30
D=/work/runs/distill/base21/data
echo "start $(date -Is) $(git rev-parse HEAD)" >> $W/driver.log
nice -n 2 python experiments/train.py --config=configs/distill.py:base --config.data.distillation_set=$D --config.data.eos_fill=True --config.train.mask_order=left_to_right --config.train.complementary_masks=False --config.train.batch_size=16 --config.train.init_from=bd3lm16_from_ar --config.train.consistency_weight=1.0 --config.data.seq_len=256 --config.train.num_steps=300 --config.train.warmup_steps=10 --config.train.eval_every=100 --config.train.checkpoint_every=20 --workdir=$W/student --data_dir=$D/data_cache --pretrained_tokenizer --export_dir=/work/runs/distill/set --stored_dtype=bfloat16 --export_pretrained=bd3lm16_distilled_root_consistency > $W/train.log 2>&1
echo "train rc=$? $(date -Is)" >> $W/driver.log
# then, at 9a37199 (alone, chain2.sh in /work/runs/rec50):
python experiments/distill_measure.py --config=configs/base.py --set_dir=/work/runs/distill/set --models=bd3lm16_distilled_root_consistency:16 --thresholds=0.5,0.7 --self_speculative_gammas=8 --timed_runs=3 --num_prompts=64 --out=/work/runs/distill/base30/measure
