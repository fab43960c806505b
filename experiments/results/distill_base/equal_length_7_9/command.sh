#!/usr/bin/env bash
# Students 7 and 9 (64 prompts) measured again for the entropies at equal length.
cd /work/wt/train11 && . /work/venv/bin/activate
PYTHONPATH=$PWD nice -n 2 python experiments/distill_measure.py --config=configs/base.py --set_dir=/work/runs/distill/set --models=bd3lm16_distilled_mix3:16,bd3lm16_distilled_traj:16 --thresholds=0.5,0.7 --self_speculative_gammas= --timed_runs=3 --num_prompts=64 --out=/work/runs/distill/eq9/measure > /work/runs/distill/eq9/measure.log 2>&1
echo "measure rc=$? $(date -Is)" >> /work/runs/distill/eq9/driver.log
