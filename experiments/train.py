r"""Trains the backbone with the AR or masked-diffusion (MDLM) objective.

  python experiments/train.py --config=configs/tiny.py --workdir=/tmp/ar \
      --config.train.objective=ar --config.train.num_steps=600

Resumes from the latest checkpoint in --workdir automatically.
"""

import json

from absl import app
from absl import flags
from ml_collections import config_flags

from lm_decoding.training import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/tiny.py", "Experiment configuration file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)


def main(argv):
  del argv
  summary = train.train(_CONFIG.value, _WORKDIR.value)
  print(json.dumps(summary, indent=2))


if __name__ == "__main__":
  app.run(main)
