"""Compares two snapshot.py pickles record by record (arrays bit for bit).

  python compare.py OLD.pkl NEW.pkl
"""
import pickle, sys, numpy as np, jax
old = pickle.load(open(sys.argv[1], "rb")); new = pickle.load(open(sys.argv[2], "rb"))
bad = 0; n = 0
for k in old:
  if k not in new: continue
  n += 1
  def strip(r):
    r = dict(r)
    if "denoise" in r and hasattr(r["denoise"], "state"):
      r["denoise"] = (r["denoise"].tokens, r["denoise"].committed, r["denoise"].cost, r["denoise"].states, r["denoise"].max_logit_error)
    return r
  old[k], new[k] = strip(old[k]), strip(new[k])
  try:
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), old[k], new[k])
  except Exception as e:
    bad += 1; print("DIFF", k, str(e)[:400])
print("compared", n, "differ", bad)
