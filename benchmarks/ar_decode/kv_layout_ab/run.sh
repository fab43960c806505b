#!/bin/bash
# Interleaved A/B of the cached greedy AR decoder between two checkouts:
#   A=/path/to/old B=/path/to/new OUT=results.jsonl bash run.sh
# Each point (d_model layers heads vocab batch new_tokens runs) runs in a
# fresh process per checkout, A then B, and the whole list twice; nothing
# else ran on the machine (the one other job was paused with SIGSTOP).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
points=("256 6 4 16384 1 512 5" "512 10 8 16384 1 256 3"
        "512 10 8 16384 8 256 3" "256 6 4 16384 32 256 3"
        "256 6 4 16384 8 512 3")
for rep in 1 2; do
  for p in "${points[@]}"; do
    for tree in "$A" "$B"; do
      PYTHONPATH="$tree" python "$here/ab.py" $p >> "$OUT"
    done
  done
done
echo DONE >> "$OUT"
