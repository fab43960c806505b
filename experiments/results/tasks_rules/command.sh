#!/bin/bash
# The commit rules' curves on the shipped task models (issue 36 item 3). Run at 874e5b5 with the
# change committed as 2e7eac6 (studies/task_rules.py, experiments/task_rules.py, task_scores.row_nfe)
# not yet committed; rules.png is the one-row layout of that code (panels in rows of 3 since cdf90ef).
# 8.3 min on the 2-core CPU shared with other jobs (load 6-11). Log: run.log.
set -euo pipefail
python experiments/task_rules.py --config=configs/tasks.py --out=experiments/results/tasks_rules \
  --config.tasks=sudoku4,permutation,countdown
