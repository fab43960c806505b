"""Sequence-level knowledge distillation for the NAR translation models.

Kim & Rush (2016): a teacher (here the AR translation model) translates every
training source, and its outputs replace the references as the students'
(CMLM, CTC) training targets. The teacher's outputs are less varied than
human references (one translation per source, in the teacher's own word
order), which eases the multimodality that conditionally independent
outputs cannot represent (Gu et al. 2018).

The paper decodes the teacher with beam search; `distil` takes any
translation decoder, so the caller states which (experiments/translate.py
uses greedy for cost on 2 CPU cores and says so).

  translate_all     decodes prompts in batches -> tokens, NFE
  texts             tokens -> strings, each row up to its first EOS / PAD
  distil            teacher outputs for the train split (with fallbacks)
  write_distilled   the pairs file `data.targets='distilled'` trains on
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from lm_decoding.data import parallel_text
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.models import Model
from lm_decoding.special_tokens import EOS_ID, PAD_ID


def translate_all(decoder, model: Model, prompts_RxP: np.ndarray,
                  prompt_lengths_R: np.ndarray, batch_size: int
                  ) -> tuple[np.ndarray, float]:
  """Decodes every row, `batch_size` rows per decode call.

  Args:
    decoder: a translation decoder (`decode(models, prompts, lengths, key)`).
    model: bound to the decoder's 'model' role.
    prompts_RxP: int32[R, P] right-padded [source, BOS] (`parallel_text.
      prompts`).
    prompt_lengths_R: int32[R].
    batch_size: rows per call; the last call may hold fewer (one more
      compile).
  Returns:
    tokens int32[R, T] and the mean NFE per call.
  Raises:
    ValueError: batch_size < 1, or no rows.
  """
  if batch_size < 1 or len(prompts_RxP) == 0:
    raise ValueError(f"batch_size={batch_size} must be >= 1 and prompts "
                     f"non-empty (got {len(prompts_RxP)} rows)")
  tokens, nfe = [], []
  for start in range(0, len(prompts_RxP), batch_size):
    result = decoder.decode({"model": model},
                            prompts_RxP[start:start + batch_size],
                            prompt_lengths_R[start:start + batch_size], None)
    tokens.append(np.asarray(result.tokens))
    nfe.append(int(result.nfe))
  return np.concatenate(tokens), float(np.mean(nfe))


def texts(tokenizer: Tokenizer, tokens_RxT: np.ndarray
          ) -> tuple[list[str], np.ndarray]:
  """(strings, token counts int64[R]): each row up to its first EOS or PAD."""
  out, counts = [], []
  for row in np.asarray(tokens_RxT).tolist():
    ids = []
    for token in row:
      if token in (EOS_ID, PAD_ID):
        break
      ids.append(token)
    out.append(tokenizer.decode(ids))
    counts.append(len(ids))
  return out, np.array(counts)


@dataclasses.dataclass(frozen=True)
class Distilled:
  """The train split with the teacher's targets.

  Attributes:
    pairs: the train pairs of `encoded`, in order, each target replaced by
      the teacher's output, or kept where the teacher's output is unusable.
    kept_reference: how many kept their reference: the teacher's output was
      empty or ran past `max_target_tokens` without an EOS.
  """

  pairs: tuple[parallel_text.Pair, ...]
  kept_reference: int


def distil(decoder, teacher: Model, tokenizer: Tokenizer,
           encoded: parallel_text.Encoded, batch_size: int) -> Distilled:
  """Translates the sources of `encoded` with the teacher (Kim & Rush 2016).

  The students then train on exactly the sources of the reference arm; a
  row whose output is empty or has more than max_target_tokens tokens (no
  EOS in time) keeps its reference, counted in `kept_reference`.

  Args:
    decoder: the teacher's decoder (its output_length should be
      max_target_tokens + 1, so an output that fits ends with EOS).
    teacher: the AR translation model.
    tokenizer: the joint tokenizer of `encoded`.
    encoded: the train split (`parallel_text.prepare(...).splits['train']`).
    batch_size: sentences per decode call.
  """
  prompts_RxP, lengths_R = parallel_text.prompts(encoded)
  tokens_RxT, _ = translate_all(decoder, teacher, prompts_RxP, lengths_R,
                                batch_size)
  outputs, counts = texts(tokenizer, tokens_RxT)
  limit = encoded.target.shape[1]
  pairs, kept = [], 0
  for pair, output, count in zip(encoded.pairs, outputs, counts):
    if 1 <= count <= limit and output.strip():
      pairs.append(dataclasses.replace(pair, target=output))
    else:
      pairs.append(pair)
      kept += 1
  return Distilled(tuple(pairs), kept)


def write_distilled(cache_dir: str | pathlib.Path, distilled: Distilled,
                    path: str | pathlib.Path | None = None) -> pathlib.Path:
  """Writes `{cache_dir}/parallel_text.DISTILLED_FILE`.

  The file holds the distilled train pairs and the valid and test pairs of
  `path` ('' / None: the bundled pairs) with their references, so the
  students validate and test on the references; train pairs over the length
  limits are left out (the reference arm leaves them out too). It is
  written atomically (a temporary file, then a rename).

  Returns:
    The file's path.
  """
  splits = parallel_text.split_pairs(parallel_text.read_pairs(path))
  out = pathlib.Path(cache_dir, parallel_text.DISTILLED_FILE)
  out.parent.mkdir(parents=True, exist_ok=True)
  staging = out.with_name(out.name + ".tmp.gz")
  parallel_text.write_pairs(staging, list(distilled.pairs) + splits["valid"]
                            + splits["test"])
  staging.replace(out)
  return out
