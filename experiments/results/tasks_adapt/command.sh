#!/bin/bash
# The adaptation record: Sudoku 4x4 MDLM adapted from the AR model of experiments/results/tasks/
# (120 s, a third of the budget) beside the from-scratch MDLM resumed from 360 s to 480 s (the
# adapted model's total: 360 s of its AR parent + 120 s). The workdir starts as a copy of the
# record's models (its run's workdir: /work/runs/tasks/run1, made by the command in
# experiments/results/tasks/report.md); the mdlm checkpoint resumes at its 360 s step.
set -euo pipefail
mkdir -p /work/runs/tasks2/adapt/sudoku4
cp -r /work/runs/tasks/run1/sudoku4/ar /work/runs/tasks/run1/sudoku4/mdlm /work/runs/tasks2/adapt/sudoku4/
python experiments/tasks.py --config=configs/tasks.py --workdir=/work/runs/tasks2/adapt \
  --results=experiments/results/tasks_adapt --config.tasks=sudoku4 --config.kinds=mdlm \
  --config.train.budget_s=480 --config.adapt=mdlm:ar --config.eval.steps=8,16
