"""Interleaved A/B of the cached AR decoder between source trees.

  SIZE=110m PAIRS=3 python ab.py TREE_A,TREE_B 1 8

Each TREE holds lm_decoding/ and experiments/ (e.g. `git archive REV lm_decoding
experiments | tar -x -C TREE`). Runs decode_one.py (a fresh process: the
GPT-2-shaped model of benchmark_ar.py, greedy, T = 128, median of 3 timed
calls after a warm-up, ms per step and a checksum of the tokens) for A, B, A,
B, ...; prints medians, the median per-pair ratio A/B and whether the tokens
were the same."""
import subprocess, sys, os, numpy as np, ast
paths = sys.argv[1].split(","); batches = sys.argv[2:]; pairs = int(os.environ.get("PAIRS", 3))
res = {p: [] for p in paths}
for i in range(pairs):
  for p in paths:
    o = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode_one.py"), *batches], env={**os.environ, "PYTHONPATH": p}, capture_output=True, text=True)
    line = [l for l in o.stdout.splitlines() if l.startswith("RESULT")]
    if not line: print(o.stderr[-2000:]); sys.exit(1)
    r = ast.literal_eval(line[0][7:]); res[p].append(r); print(p, r, flush=True)
for b in map(int, batches):
  meds = {p: np.median([r[b][0] for r in res[p]]) for p in paths}
  ratios = [np.median([ra[b][0] / rb[b][0] for ra, rb in zip(res[paths[0]], res[p])]) for p in paths]
  same = [len({r[b][1] for r in res[p]} | {r[b][1] for r in res[paths[0]]}) == 1 for p in paths]
  print("B", b, {os.path.basename(p): round(m, 2) for p, m in meds.items()}, "base/variant pair-median", [round(x, 3) for x in ratios], "same tokens", same)
