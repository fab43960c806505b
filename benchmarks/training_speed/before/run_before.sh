#!/bin/bash
# The base benchmark with the step's code as before this work: this checkout
# (HEAD) with lm_decoding/models/transformer.py and
# lm_decoding/training/objectives.py as at bd54893, so the same harness
# (experiments/benchmark_training.py) times the old model and losses.
#   bash benchmarks/training_speed/before/run_before.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git -C "$root" archive HEAD | tar -x -C "$tree"
for f in lm_decoding/models/transformer.py lm_decoding/training/objectives.py; do
  git -C "$root" show "bd54893:$f" > "$tree/$f"
done
cd "$tree"
PYTHONPATH="$tree" python experiments/benchmark_training.py \
    --config=configs/base.py --workdir="$tree/out" "$@"
mkdir -p "$root/experiments/results/benchmark_training/base_before"
cp "$tree/out/"* "$root/experiments/results/benchmark_training/base_before/"
