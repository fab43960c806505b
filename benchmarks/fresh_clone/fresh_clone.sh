#!/usr/bin/env bash
# A fresh clone to the verdict with the README's install line and main-job command, timed
# (issue 30 goal: at most 15 minutes on 2 cores). Usage: bash benchmarks/fresh_clone/fresh_clone.sh [REPO]
set -euo pipefail
rm -rf /tmp/fresh /tmp/compare
git clone -q "${1:-.}" /tmp/fresh
cd /tmp/fresh
t0=$(date +%s)
python3 -m venv .venv && . .venv/bin/activate && pip install -q -e ".[test,peer]"
t1=$(date +%s)
python experiments/compare_decoding.py --config=configs/tiny.py --workdir=/tmp/compare > /tmp/fresh_main.log 2>&1
tail -n 6 /tmp/fresh_main.log
t2=$(date +%s)
echo "install_s=$((t1-t0)) main_job_s=$((t2-t1)) total_s=$((t2-t0)) commit=$(git rev-parse --short HEAD)"
