r"""Which batch shape trains the best base AR model in a fixed wall time.

  PYTHONPATH=$PWD python benchmarks/training_speed/recipe/sweep.py \
      --shapes=8x256,16x256,32x256 --minutes=3 \
      --out=benchmarks/training_speed/recipe/sweep.json

For each shape B x L of configs/base.py's AR member (model, data, learning
rate and warm-up fraction as shipped): the train step's tokens/s
(`throughput.measure`, 3 timed steps), then `train.train` for the steps that
fit --minutes at that rate (the cosine schedule ends there), validated at
the end on the first --eval_rows validation sequences (the same ones for
every B at one L). The record: per shape the
measured tokens/s, steps, tokens seen, the training seconds, the
validation loss and perplexity, and the load averages.
"""

import importlib.util
import json
import os
import tempfile

from absl import app
from absl import flags

from lm_decoding.evaluation import records
from lm_decoding.training import throughput
from lm_decoding.training import train

_SHAPES = flags.DEFINE_list("shapes", ["8x256", "16x256", "32x256"],
                            "Batch shapes BxL.")
_MINUTES = flags.DEFINE_float("minutes", 3.0, "Training minutes a shape.")
_OUT = flags.DEFINE_string("out", None, "JSON record.", required=True)
_EVAL_ROWS = flags.DEFINE_integer(
    "eval_rows", 256, "Validation sequences, the same for every shape of "
    "one length (eval_batches = eval_rows / B).")
_WORKDIR = flags.DEFINE_string(
    "workdir", "/tmp/sweep", "The run's folder: the data cache ({workdir}/"
    "data/); each shape trains in a temporary folder.")


def _base_config():
  path = os.path.join(os.path.dirname(__file__), "..", "..", "..",
                      "configs", "base.py")
  spec = importlib.util.spec_from_file_location("base", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def main(argv):
  del argv
  record = {"command": "PYTHONPATH=$PWD " + records.command(),
            "minutes": _MINUTES.value, "load_start": os.getloadavg(),
            "shapes": []}
  os.makedirs(_WORKDIR.value, exist_ok=True)
  for text in _SHAPES.value:
    batch, length = map(int, text.split("x"))
    config = _base_config()
    config.train.batch_size, config.data.seq_len = batch, length
    config.peak_flops = 1.0  # the MFU is not what this sweep reads
    rate = throughput.measure(config, warmup=1, runs=3)[0].tokens_per_s
    steps = max(10, int(_MINUTES.value * 60 * rate / (batch * length)))
    shipped = _base_config().train
    config.train.update(dict(
        num_steps=steps, eval_every=steps, checkpoint_every=steps,
        eval_batches=max(1, _EVAL_ROWS.value // batch),
        warmup_steps=max(1, round(steps * shipped.warmup_steps
                                  / shipped.num_steps))))
    with tempfile.TemporaryDirectory() as workdir:
      summary = train.train(config, workdir, progress=False,
                            data_dir=_WORKDIR.value)
    entry = {"batch": batch, "length": length, "measured_tokens_per_s": rate,
             "steps": steps, "tokens": steps * batch * length,
             "train_s": summary["train_s"], "wall_s": summary["wall_s"],
             "train_tokens_per_s": summary["train_tokens_per_s"],
             "valid_loss": summary["valid_loss"],
             "valid_ppl": summary["valid_ppl"], "load": os.getloadavg()}
    record["shapes"].append(entry)
    print(json.dumps(entry), flush=True)
    records.write_json(record, _OUT.value, record["command"])


if __name__ == "__main__":
  app.run(main)
