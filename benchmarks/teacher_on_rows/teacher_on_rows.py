"""The teacher's next-token distribution on its own distillation rows (attempt 19's check).

For the first 64 greedy and the first 64 temperature-0.5 rows of attempt 13's distillation set, over the continuation's
tokens before PAD: the teacher's mean NLL of the row's token, the mean entropy of its distribution and how often its
argmax is the row's token (1.0 on greedy rows when the teacher's index i predicts token i). Prints JSON. A third
argument names another causal member of the set as the teacher (default `ar`).

  PYTHONPATH=. python benchmarks/teacher_on_rows/teacher_on_rows.py \
      /work/runs/distill/set /work/runs/distill/base13/data/tokens.npy
"""

import json
import pathlib
import sys
import types

import jax
import numpy as np

from lm_decoding.config_reference import load_config
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training.pretrained import loading


def main(set_dir: str, rows_path: str, teacher_name: str = "ar") -> None:
  config = load_config(pathlib.Path("configs/distill.py"), "base")
  config.data.seq_len, config.train.teacher = 256, teacher_name
  tokenizer = types.SimpleNamespace(
      model_proto=(pathlib.Path(set_dir) / "tokenizer.model").read_bytes())
  teacher, _ = loading.teacher_log_probs(config, tokenizer, set_dir)
  rows = np.load(rows_path)
  half = len(rows) // 2
  out = {"command": " ".join(["python", *sys.argv])}
  for name, part in (("greedy", rows[:64]), ("temperature 0.5", rows[half:half + 64])):
    log_p = np.asarray(jax.jit(teacher)(part))[:, 16:]
    tokens = part[:, 16:]
    scored = tokens != PAD_ID
    nll = -np.take_along_axis(log_p, tokens[..., None], -1)[..., 0]
    entropy = -(np.exp(log_p) * log_p).sum(-1)
    out[name] = {"tokens": int(scored.sum()), "nll": float(nll[scored].mean()),
                 "entropy": float(entropy[scored].mean()),
                 "argmax_is_token": float((log_p.argmax(-1) == tokens)[scored].mean())}
  print(json.dumps(out, indent=2))


if __name__ == "__main__":
  main(*sys.argv[1:])
