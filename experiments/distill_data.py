r"""Writes a certainty-forcing distillation set: a teacher's continuations of
training prefixes (`lm_decoding.training.self_distillation`, dParallel).

  python experiments/distill_data.py --config=configs/tiny.py \
      --set_dir=lm_decoding/pretrained --teacher=ar --decoder=ar \
      --temperatures=0,1 --num_prefixes=256 --prompt_length=16 \
      --output_length=240 --out=/work/runs/distill/tiny/data

Each of the --num_prefixes prefixes (P tokens of the training split, drawn
by --seed at --prefix_at: cuts of the stream at multiples of P, or the starts
of its documents, as the held-out prompts are) is continued for T = --output_length tokens by --decoder on the
--teacher member of --set_dir, once per temperature of --temperatures (0:
greedy), never drawing PAD or MASK (`self_distillation.UNTARGETED_IDS`);
rows [prefix | continuation] of P + T tokens, the greedy ones first. The
manifest names the teacher, decoder, prefixes, counts, seconds and this
command; `experiments/train.py --config.data.distillation_set=OUT
--config.train.objective=certainty_forcing` trains on it.
"""

import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags

from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import records
from lm_decoding.training import self_distillation
from lm_decoding.training.pretrained import loading, recipes, store

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "tiny.py"), "The set's config (data path).")
_SET_DIR = flags.DEFINE_string("set_dir", str(recipes.DEFAULT_DIR),
                               "The pretrained set holding the teacher.")
_TEACHER = flags.DEFINE_string("teacher", "ar", "The teacher member.")
_DECODER = flags.DEFINE_string("decoder", "ar", "A registered decoder with "
                               "role 'model' and a `sampling` field.")
_TEMPERATURES = flags.DEFINE_list(
    "temperatures", ["0", "1"], "One continuation per prefix at each; a "
    "repeated temperature samples again with its own key (one greedy entry "
    "at most).")
_NUM_PREFIXES = flags.DEFINE_integer("num_prefixes", 256, "Prefixes (R).")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 16, "P, tokens.")
_OUTPUT_LENGTH = flags.DEFINE_integer("output_length", 240, "T, tokens.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Rows per decode call.")
_PREFIX_AT = flags.DEFINE_enum(
    "prefix_at", "cuts", self_distillation.PREFIX_PLACES,
    "Where the prefixes start in the training stream.")
_SEED = flags.DEFINE_integer("seed", 0, "Prefixes and sampling.")
_OUT = flags.DEFINE_string("out", None, "Output folder.", required=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)  # orbax's restore chatter
  config = _CONFIG.value
  start = time.time()
  try:
    temperatures = self_distillation.temperature_labels(_TEMPERATURES.value)
    manifest = recipes.read_manifest(_TEACHER.value, _SET_DIR.value)
    member = ml_collections.ConfigDict(manifest["recipe"])
    data_dir = os.path.join(_OUT.value, "data_cache")
    store.seed_data_cache(config, data_dir, _SET_DIR.value)
    corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                              data_dir, config.data.format)
    tokenizer = Tokenizer.load(os.path.join(_SET_DIR.value,
                                            recipes.TOKENIZER_FILE))
    teacher = loading.load_models(
        {_TEACHER.value: member}, data_dir, tokenizer, progress=False,
        out_dir=_SET_DIR.value)[_TEACHER.value]
    if not teacher.shipped:
      raise ValueError(f"--teacher={_TEACHER.value!r} did not load from "
                       f"{_SET_DIR.value}: {teacher.source}")
    prefixes = self_distillation.distillation_prefixes(
        corpus.tokens["train"], _PROMPT_LENGTH.value, _NUM_PREFIXES.value,
        _SEED.value, at=_PREFIX_AT.value)
    decoders = {
        f"{_DECODER.value} {label}": base.make_decoder(
            _DECODER.value, output_length=_OUTPUT_LENGTH.value,
            sampling=SamplingConfig(
                temperature=t, suppress_ids=self_distillation.UNTARGETED_IDS))
        for label, t in temperatures.items()}
    tokens, seconds = self_distillation.timed_continuations(
        decoders, teacher.model, prefixes, jax.random.key(_SEED.value),
        _BATCH_SIZE.value)
    out = self_distillation.write_distillation_set(_OUT.value, tokens, {
        "teacher": _TEACHER.value, "teacher_commit": manifest.get("commit"),
        "set_dir": os.path.abspath(_SET_DIR.value),
        "decoders": list(decoders), "prompt_length": _PROMPT_LENGTH.value,
        "suppress_ids": list(self_distillation.UNTARGETED_IDS),
        "output_length": _OUTPUT_LENGTH.value,
        "prefixes": {"split": "train", "count": _NUM_PREFIXES.value,
                     "seed": _SEED.value, "at": _PREFIX_AT.value},
        "decode_seconds": seconds, "wall_s": time.time() - start,
        "device": jax.devices()[0].device_kind,
        "command": records.command(), "commit": recipes.current_commit()})
  except (ValueError, OSError) as e:
    sys.exit(f"distill_data: error: {e}")
  print(f"wrote {tokens.shape[0]} rows of {tokens.shape[1]} tokens to {out} "
        f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
  app.run(main)
