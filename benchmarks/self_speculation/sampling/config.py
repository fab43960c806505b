"""Self-speculation of the view student at temperature 1, against AR sampling.

The base grid (configs/base.py) decodes `bd3lm16_distilled_view` greedily;
speculative sampling (Leviathan et al. 2023) makes the same loop lossless at
temperature 1 too: every token is distributed as sampling from the student's
block-size-1 view, which its training holds at the AR parent's next-token
distribution. This grid asks whether that puts it on the sampling front: AR
cached (the sampling reference), AR greedy (the greedy one) and the view's
self-speculation at gamma 2, 4 and 8, temperature 1 and 0, on the base
main job's prompts, batch sizes and timed runs.

Usage:
  python experiments/compare_decoding.py \
      --config=benchmarks/self_speculation/sampling/config.py \
      --workdir=/tmp/selfspec_sampling
"""

import importlib.util
import pathlib

import ml_collections

_spec = importlib.util.spec_from_file_location(
    "base", pathlib.Path(__file__).parents[3] / "configs" / "base.py")
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.compare.stored_members = (base.VIEW_STUDENT,)
  view = f"self_speculative | model={base.VIEW_STUDENT}"
  config.compare.decoders = (
      "AR cached | ar | model=ar",
      "AR greedy temp={temperature} | ar | model=ar | temperature=0",
      *(f"view-distilled self-speculative gamma={{gamma}} temp={{temperature}}"
        f" | {view} | gamma={gamma} temperature={temperature}"
        for temperature in (1, 0) for gamma in (2, 4, 8)),
  )
  return config
