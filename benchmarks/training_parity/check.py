"""Training parity before/after a refactor of the trainer (issue 37, item 4).

Trains every objective `train.train` knows (and one task model of each kind
through the task trainer) for a few steps on a tiny config with a fixed
seed, and writes each step's training loss and the final validation loss to
a JSON file. Run it at two commits and compare the files: a refactor that
keeps training numerically identical gives equal files.

  PYTHONPATH=$PWD python benchmarks/training_parity/check.py OUT.json
  python benchmarks/training_parity/check.py --compare A.json B.json
"""

import importlib.util
import json
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 4


def _config(name):
  spec = importlib.util.spec_from_file_location(name, REPO / "configs" /
                                                f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def lm_config(objective):
  """configs/tiny.py at a size that trains a step in a second."""
  config = _config("tiny")
  config.update_from_flattened_dict({
      "data.vocab_size": 512, "data.seq_len": 64, "model.d_model": 64,
      "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2,
      "model.head_dim": 32, "model.mlp_dim": 128, "model.max_len": 64,
      "train.objective": objective, "train.batch_size": 8,
      "train.num_steps": STEPS, "train.learning_rate": 1e-2,
      "train.warmup_steps": 2, "train.eval_every": STEPS,
      "train.eval_batches": 1, "train.mdlm_eval_timesteps": 2,
      "train.checkpoint_every": STEPS, "train.block_length": 16,
      "peak_flops": 1e9})  # peak given: the losses are the record
  return config


def translation_config(objective):
  config = _config("translation")
  config.train.update(dict(objective=objective, batch_size=8,
                           num_steps=STEPS, warmup_steps=2, eval_every=STEPS,
                           eval_batches=1, checkpoint_every=STEPS))
  config.model.update(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                      head_dim=16, mlp_dim=64)
  config.peak_flops = 1e9
  return config


def losses(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def main(out):
  from lm_decoding.training import train
  runs = {}
  with tempfile.TemporaryDirectory() as tmp:
    only = sys.argv[2:]
    variants = [(o, lm_config(o)) for o in ("ar", "mdlm", "bd3lm", "uniform")]
    ss = lm_config("ar")
    ss.train.scheduled_sampling = dict(p_max=0.5, ramp_steps=2)
    variants.append(("ar_scheduled_sampling", ss))
    variants += [(o, translation_config(o))
                 for o in ("translation_ar", "cmlm", "ctc")]
    for name, config in variants:
      if only and name not in only:
        continue
      workdir = f"{tmp}/{name}"
      summary = train.train(config, workdir, data_dir=f"{tmp}/data_{name[:3]}",
                            progress=False)
      runs[name] = {"losses": [r.get("loss") for r in
                               losses(f"{workdir}/metrics.jsonl")],
                    "valid_loss": summary["valid_loss"]}
      print(name, runs[name], flush=True)
  with open(out, "w") as f:
    json.dump(runs, f, indent=1)


def compare(a, b):
  with open(a) as f, open(b) as g:
    first, second = json.load(f), json.load(g)
  same = first == second
  for name in sorted(set(first) | set(second)):
    print(name, "same" if first.get(name) == second.get(name) else
          f"DIFFERENT: {first.get(name)} vs {second.get(name)}")
  return 0 if same else 1


if __name__ == "__main__":
  if sys.argv[1] == "--compare":
    sys.exit(compare(sys.argv[2], sys.argv[3]))
  main(sys.argv[1])
