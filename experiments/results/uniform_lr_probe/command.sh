#!/bin/bash
# The base 'uniform' recipe (configs/base.py --member=uniform, peak learning
# rate 2e-3) at 3x and 1/3x the peak learning rate, on the same 1500-step
# warmup-cosine schedule, each stopped after its step-500 evaluation
# (run at commit 01a9dcf, 2026-12-03, on the shared 2-core CPU, one at a time).
# lr0.002_shipped.jsonl is the shipped base member's own training log
# (lm_decoding/pretrained/base/TRAINING.md item 8).
for lr in 0.006 0.0006; do
  wd=/work/runs/lrprobe/lr$lr
  python experiments/train.py --config=configs/base.py --member=uniform --workdir=$wd \
    --data_dir=/work/runs/base_controls/data --pretrained_tokenizer \
    --export_dir=lm_decoding/pretrained/base --config.train.learning_rate=$lr &
  pid=$!
  until grep -q '"step": 500, .*valid_loss' $wd/metrics.jsonl 2>/dev/null; do sleep 10; done
  kill $pid; wait $pid
  cp $wd/metrics.jsonl experiments/results/uniform_lr_probe/lr$lr.jsonl
done
