#!/usr/bin/env bash
# Issue 36 item 1: the base set retrained at today's code, exported outside the repository.
set -uo pipefail
cd /work/wt/train36
. /work/venv/bin/activate
W=/work/runs/base36
for m in ${MEMBERS:-bd3lm}; do
  if [[ -f $W/set/$m/manifest.json ]]; then echo "== $m done"; continue; fi
  echo "== $m start $(date -Is) $(git rev-parse HEAD)"
  PYTHONPATH=$PWD python experiments/train.py --config=configs/base.py --member=$m --workdir=$W/$m \
    --data_dir=$W/data --pretrained_tokenizer --export_dir=$W/set --stored_dtype=bfloat16 \
    --export_pretrained=$m >> $W/$m.log 2>&1
  echo "== $m end rc=$? $(date -Is)"
done
