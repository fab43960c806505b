#!/bin/bash
# The commit rules' curves on the shipped task models (issue 36 item 3), run at e9164b3: 3.2 min on the
# 2-core CPU shared with other jobs (load 4-5). Log: run.log. A first run of the same command on the
# uncommitted code of 2e7eac6 gave the same quality columns (only ms_per_problem differed).
set -euo pipefail
python experiments/task_rules.py --config=configs/tasks.py --out=experiments/results/tasks_rules \
  --config.tasks=sudoku4,permutation,countdown
