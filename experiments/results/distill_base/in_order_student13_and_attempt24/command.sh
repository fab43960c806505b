#!/usr/bin/env bash
# Issue 36 item 5: threshold commits left to right only (bd3lm in_order=True) on the shipped student 13 and attempt 24's.
set -uo pipefail
cd /work/wt/m27
. /work/venv/bin/activate
W=/work/runs/distill/inorder
echo "start $(date -Is) $(git rev-parse HEAD)" >> $W/driver.log
PYTHONPATH=$PWD nice -n 5 python experiments/distill_measure.py --config=configs/base.py --set_dir=/work/runs/distill/set --models=bd3lm16_distilled:16,bd3lm16_distilled_root_view16:16 --thresholds= --in_order_thresholds=0.5,0.3 --self_speculative_gammas= --timed_runs=3 --num_prompts=64 --out=$W/measure > $W/measure.log 2>&1
echo "measure rc=$? $(date -Is)" >> $W/driver.log
