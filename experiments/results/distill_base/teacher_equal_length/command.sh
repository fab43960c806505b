#!/usr/bin/env bash
# The teacher (bd3lm16_from_ar, the students' root) at block size 1 (self-speculation at temperature 0 is its AR greedy decode), 64 prompts: is the entropy gap inherited?
cd /work/wt/train11 && . /work/venv/bin/activate
PYTHONPATH=$PWD nice -n 2 python experiments/distill_measure.py --config=configs/base.py --set_dir=/work/runs/distill/set --models=bd3lm16_from_ar:16 --thresholds=0.5 --self_speculative_gammas=4 --timed_runs=1 --num_prompts=64 --out=/work/runs/distill/teacher_eq/measure > /work/runs/distill/teacher_eq/measure.log 2>&1
echo "measure rc=$? $(date -Is)" >> /work/runs/distill/teacher_eq/driver.log
