#!/bin/bash
# The sort task (issue 36 item 3): its AR, MDLM and BD3-LM at the task models' budget (configs/tasks.py:
# 360 s of training steps each, the permutation models' recipe with the sort task), then the commit
# rules' curves on its MDLM and BD3-LM. 2-core CPU shared with two long trainings (1-minute load 5-8),
# everything at nice 10.
#
# 1. Train and score every decoder (report.md, results.csv, accuracy_*.png, curves/; log: train.log, the
#    progress bars removed). Run at 1f4ccc0 (the sort task's first commit; b7b6af6 moved the list tasks'
#    shared layout into layout.ListTask without changing a token): 22.6 min, MDLM 1713 steps, BD3-LM 997,
#    AR 2285. The order mdlm,bd3lm,ar only put the rules' models first.
# 2. Export MDLM and BD3-LM (bfloat16, as the shipped task models) into a task set OUTSIDE the repository,
#    /work/runs/sort36/set (not shipped: lm_decoding/pretrained/tasks is near its size limit), at b7b6af6.
# 3. The commit rules on them (rules.md, rules.csv, rules_summary.csv, rules.png; log: run.log), at ecba1db:
#    1.8 min. The bfloat16 parameters decode a puzzle or two differently from step 1's float32 ones
#    (one cell a step, margin: 0.867 here, 0.871 in report.md).
set -euo pipefail
python experiments/tasks.py --config=configs/tasks.py --workdir=/work/runs/sort36/tasks \
  --out=experiments/results/tasks_sort --config.tasks=sort --config.kinds=mdlm,bd3lm,ar
python experiments/export_task_models.py --config=configs/tasks.py --workdir=/work/runs/sort36/tasks \
  --config.tasks=sort --config.kinds=mdlm,bd3lm --out_dir=/work/runs/sort36/set \
  --command="python experiments/tasks.py --config=configs/tasks.py --workdir=/work/runs/sort36/tasks --out=experiments/results/tasks_sort --config.tasks=sort --config.kinds=mdlm,bd3lm,ar"
python experiments/task_rules.py --config=configs/tasks.py --out=experiments/results/tasks_sort \
  --config.tasks=sort --models=/work/runs/sort36/set
