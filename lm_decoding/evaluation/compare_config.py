"""The checks of a `compare` config block (`configs/tiny.py` and the others)
that the harness's main jobs run before any data preparation or training:
its scalar options (`check_options`) and its baseline (`check_baseline`);
each entry's own options are checked by `entries.plan`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lm_decoding.checks import is_count
from lm_decoding.evaluation import frontier
from lm_decoding.evaluation.entries import Entry


def check_options(cmp: Any, member_max_len: Mapping[str, int]) -> None:
  """Checks the scalar options of a `compare` config block.

  Args:
    cmp: `config.compare`.
    member_max_len: {member: model.max_len} of every model.
  Raises:
    ValueError: naming the key and the allowed range: output_lengths or
      batch_sizes empty or not all distinct integers >= 1; timed_runs, prompt_len or
      reference_len not an integer >= 1; temperature not finite >= 0;
      tolerance_gen_ppl or tolerance_entropy not finite > 0
      (`frontier.Tolerance`); prompt_len + T above a model's max_len.
  """
  for key in ("output_lengths", "batch_sizes"):
    values = cmp[key]
    if (isinstance(values, (str, int)) or not len(values)
        or not all(is_count(v) for v in values)
        or len(set(values)) < len(values)):
      raise ValueError(f"compare.{key}={values!r} must be a non-empty tuple "
                       "of distinct integers >= 1")
  for key in ("timed_runs", "prompt_len", "reference_len"):
    if not is_count(cmp[key]):
      raise ValueError(f"compare.{key}={cmp[key]!r} must be an integer >= 1")
  temperature = cmp.temperature
  if (isinstance(temperature, bool) or not isinstance(temperature,
                                                      (int, float))
      or not 0 <= temperature < math.inf):
    raise ValueError(f"compare.temperature={temperature!r} must be a finite "
                     "number >= 0")
  frontier.Tolerance(cmp.tolerance_gen_ppl, cmp.tolerance_entropy)
  longest = cmp.prompt_len + max(cmp.output_lengths)
  for member, max_len in member_max_len.items():
    if longest > max_len:
      raise ValueError(
          f"compare.prompt_len + max(compare.output_lengths) = {longest} "
          f"must be <= the {member} model's max_len={max_len} "
          "(--config.model.max_len; the shipped models then no longer match "
          "and are retrained)")


def check_baseline(baseline: str, entries: Sequence[Entry]) -> None:
  """Raises ValueError unless `compare.baseline` is an entry's series label."""
  series = [e.series for e in entries]
  if baseline not in series:
    raise ValueError(f"compare.baseline={baseline!r} must be the label of an "
                     f"entry of compare.decoders: {series}")
