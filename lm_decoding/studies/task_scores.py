"""Every applicable decoder scored on an exact-answer task's test split.

`decoder_grid` lists the decoders that apply to a model kind (AR: greedy,
sampling, beam; MDLM: MDLM's ancestral sampler, LLaDA with the four
orderings, Fast-dLLM's threshold and factor rules, ReMDM re-masking; BD3-LM:
its block sampler, ancestral and low-confidence), each with the step counts
K it runs at. `score_decoder` decodes the whole split in one batch (every
row [prompt | T answer slots], no EOS: the answer has a fixed length) and
returns one record: exact match, validity and token accuracy
(`data.tasks.score_rows`), exact match per difficulty, NFE and tokens per
forward (of the batch, and of a row decoded alone: `row_nfe`), and the time
of the batch call (compile excluded) per problem.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import jax
import numpy as np

from lm_decoding.data.tasks import Split, Task, score_rows
from lm_decoding.decoding.base import make_decoder
from lm_decoding.models import Model
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost

GREEDY = SamplingConfig(temperature=0.0)
SAMPLE = SamplingConfig(temperature=1.0)


@dataclasses.dataclass(frozen=True)
class DecoderRun:
  """One decoder run: label (e.g. 'llada/margin'), steps K (None for AR
  and for the Fast-dLLM rules, whose steps depend on the confidences), and
  the decoder config."""

  label: str
  steps: int | None
  decoder: object


def _step_counts(steps: Sequence[int], answer_length: int,
                 multiple: int = 1) -> list[int]:
  """The given K that are <= T and multiples of `multiple` (BD3-LM: of the
  number of blocks), sorted, without repeats."""
  return sorted({k for k in steps if k <= answer_length and k % multiple == 0})


def decoder_grid(kind: str, answer_length: int, steps: Sequence[int],
                 block_length: int, num_beams: int, threshold: float,
                 factor: float) -> list[DecoderRun]:
  """The decoders of a model `kind` ('ar', 'mdlm' or 'bd3lm').

  Args:
    kind: the model kind.
    answer_length: T.
    steps: candidate step counts K of the parallel decoders.
    block_length: BD3-LM's W (dividing T).
    num_beams: AR beam width.
    threshold, factor: Fast-dLLM's confidence threshold and factor.
  Raises:
    ValueError: unknown kind.
  """
  t = dict(output_length=answer_length, eos_ids=())
  if kind == "ar":
    return [DecoderRun("ar/greedy", None,
                       make_decoder("ar", **t, sampling=GREEDY)),
            DecoderRun("ar/sample", None,
                       make_decoder("ar", **t, sampling=SAMPLE)),
            DecoderRun(f"ar_beam/{num_beams}", None,
                       make_decoder("ar_beam", **t, num_beams=num_beams))]
  if kind == "bd3lm":
    blocks = answer_length // block_length
    return [DecoderRun(f"bd3lm/{rule}", k,
                       make_decoder("bd3lm", **t, steps=k,
                                    block_length=block_length,
                                    remasking=rule, sampling=sampling))
            for rule, sampling in (("ancestral", SAMPLE),
                                   ("low_confidence", GREEDY))
            for k in _step_counts(steps, answer_length, blocks)]
  if kind != "mdlm":
    raise ValueError(f"kind={kind!r}; allowed: ('ar', 'mdlm', 'bd3lm')")
  ks = _step_counts(steps, answer_length)
  out = [DecoderRun("mdlm", k, make_decoder("mdlm", **t, steps=k)) for k in ks]
  out += [DecoderRun(f"llada/{order}", k,
                     make_decoder("llada", **t, steps=k, remasking=order))
          for order in ("random", "low_confidence", "margin", "entropy")
          for k in ks]
  out += [DecoderRun(f"threshold/{threshold}", None,
                     make_decoder("threshold", **t, threshold=threshold)),
          DecoderRun(f"factor/{factor}", None,
                     make_decoder("factor", **t, factor=factor)),
          DecoderRun("remdm", answer_length,
                     make_decoder("remdm", **t, steps=answer_length,
                                  sampling=GREEDY))]
  return out


def row_nfe(result) -> float:
  """The mean over rows of the forward passes a row takes decoded alone:
  the steps at which it committed a token, plus the batch's calls made
  outside any step (a prefill, BD3-LM's block-end passes), which every row
  makes.

  Exact for the decoders whose every step commits at least one token in
  each row not yet done (the self-paced rules, one token a step, AR); a
  decoder with steps that commit nothing (MDLM's ancestral sampler) is
  undercounted.

  Args:
    result: a `DecodeResult` (committed int32[K, B], nfe).
  """
  committed_KxB = np.asarray(result.committed) > 0
  outside = int(result.nfe) - int(committed_KxB.any(1).sum())
  return float(committed_KxB.sum(0).mean() + outside)


def score_decoder(task: Task, split: Split, entry: DecoderRun,
                  models: Mapping[str, Model], seed: int) -> dict:
  """Decodes `split` with `entry.decoder` and scores it (module docstring).

  Returns:
    {decoder, steps, exact, valid, token_accuracy, nfe, tokens_per_forward,
     row_nfe, ms_per_problem, compile_s, problems, exact@<difficulty>...}:
     rates in [0, 1]; nfe for the batch (rows decode together, so a
     self-paced rule runs until its slowest row is done); row_nfe
     (`row_nfe`) the mean forward passes of a row decoded alone.
  """
  batch = len(split.problems)
  lengths = np.full(batch, task.prompt_length, np.int32)
  timing, _, result = cost.measure(
      lambda m, p, n, k: entry.decoder.decode(m, p, n, k),
      (dict(models), split.prompts, lengths, jax.random.key(seed)),
      warmup=0, runs=1)
  scores = score_rows(task, split.problems, np.asarray(result.tokens))
  nfe = int(result.nfe)
  row = {"decoder": entry.label, "steps": entry.steps,
         "exact": float(scores["exact"].mean()),
         "valid": float(scores["valid"].mean()),
         "token_accuracy": float(scores["token_accuracy"].mean()),
         "nfe": nfe, "tokens_per_forward": task.answer_length / nfe,
         "row_nfe": row_nfe(result),
         "ms_per_problem": timing.median_s * 1e3 / batch,
         "compile_s": timing.compile_s, "problems": batch}
  for level in sorted(set(split.difficulty.tolist())):
    chosen = split.difficulty == level
    row[f"exact@{level}"] = float(scores["exact"][chosen].mean())
  return row
