"""Translation quality: sacreBLEU and chrF beside the errors BLEU hides.

BLEU (Papineni et al. 2002) and chrF (Popovic 2015) are computed by
sacreBLEU (Post 2018) with its defaults (13a tokenisation, exponential
smoothing; chrF character 6-grams, beta 2), and reported with the signature
that makes them reproducible. Non-autoregressive decoders repeat and drop
words under a good-looking BLEU (Gu et al. 2018), so three structural rates
are reported beside it: consecutive repetition, omission of reference
content words (`quality.omission_rate` with Spanish stopwords) and length
error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from lm_decoding.evaluation import quality

# Spanish function words (articles, prepositions, pronouns, conjunctions,
# common auxiliaries), lower case: not content words for `omission_rate`.
SPANISH_STOPWORDS = frozenset("""
a al algo ante aquel aquella aquellas aquellos así aun aunque bajo cada como
con contra cual cuando de del desde donde dos e el él ella ellas ello ellos
en entre era eran es esa esas ese eso esos esta está están estaba estas este
esto estos fue fué fueron ha había han has hasta hay la las le les lo los
más me mas mi mis mucho muy nada ni no nos nosotros o os otra otro para pero
poco por porque pues que qué quien se sea sean según ser si sí sin sino so
sobre su sus también tan tanto te ti tu tus u un una uno unos unas vos
vosotros y ya yo
""".split())

_WORD = re.compile(r"\w+")


@dataclasses.dataclass(frozen=True)
class CorpusScore:
  """A corpus-level sacreBLEU score and its signature."""

  score: float
  signature: str


def _check_aligned(hypotheses: Sequence[str], references: Sequence[str]):
  if len(hypotheses) != len(references) or not hypotheses:
    raise ValueError(f"hypotheses ({len(hypotheses)}) and references "
                     f"({len(references)}) must be equally many, >= 1")


def corpus_bleu(hypotheses: Sequence[str],
                references: Sequence[str]) -> CorpusScore:
  """sacreBLEU corpus BLEU (0-100) with one reference per hypothesis.

  Raises:
    ValueError: the two lists differ in length or are empty.
  """
  return _corpus_score(BLEU(), hypotheses, references)


def corpus_chrf(hypotheses: Sequence[str],
                references: Sequence[str]) -> CorpusScore:
  """sacreBLEU corpus chrF (0-100, chrF2) with one reference each.

  Raises:
    ValueError: the two lists differ in length or are empty.
  """
  return _corpus_score(CHRF(), hypotheses, references)


def _corpus_score(metric, hypotheses, references) -> CorpusScore:
  _check_aligned(hypotheses, references)
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return CorpusScore(score.score, str(metric.get_signature()))


def consecutive_repetition_rate(texts: Sequence[str]) -> np.ndarray:
  """Per text: the fraction of its words equal to the word just before.

  Words are lower-cased runs of word characters. "y y dijo dijo Dios" has
  words y y dijo dijo dios: 2 of the 4 words after the first repeat their
  predecessor, 0.5. The signature error of one-shot NAR decoding
  (conditionally independent positions predicting the same token).

  Returns:
    float64[R] in [0, 1]; NaN for a text of fewer than 2 words.
  """
  out = np.full(len(texts), np.nan)
  for i, text in enumerate(texts):
    words = _WORD.findall(text.lower())
    if len(words) >= 2:
      out[i] = np.mean([a == b for a, b in zip(words, words[1:])])
  return out


def omission_rate(hypotheses: Sequence[str],
                  references: Sequence[str]) -> np.ndarray:
  """Per pair: fraction of the reference's Spanish content words missing.

  `quality.omission_rate` with `SPANISH_STOPWORDS`; NaN where a reference
  has no content word.

  Raises:
    ValueError: the two lists differ in length.
  """
  return quality.omission_rate(hypotheses, references, SPANISH_STOPWORDS)


def length_error(hypothesis_lengths: Any,
                 reference_lengths: Any) -> dict[str, float]:
  """Output length against reference length, in tokens.

  Args:
    hypothesis_lengths: int[R] output tokens per sentence (EOS excluded).
    reference_lengths: int[R] reference tokens per sentence.
  Returns:
    mean_abs: mean |hyp - ref| tokens; mean_signed: mean hyp - ref (< 0:
    too short); relative: mean |hyp - ref| / ref; exact: fraction with
    hyp == ref.
  Raises:
    ValueError: shapes differ, are empty, or a reference length is < 1.
  """
  hyp = np.asarray(hypothesis_lengths, np.float64)
  ref = np.asarray(reference_lengths, np.float64)
  if hyp.shape != ref.shape or hyp.ndim != 1 or not hyp.size:
    raise ValueError(f"hypothesis_lengths {hyp.shape} and reference_lengths "
                     f"{ref.shape} must be [R], R >= 1")
  if ref.min() < 1:
    raise ValueError("reference_lengths must be >= 1")
  diff = hyp - ref
  return {"mean_abs": float(np.abs(diff).mean()),
          "mean_signed": float(diff.mean()),
          "relative": float((np.abs(diff) / ref).mean()),
          "exact": float((diff == 0).mean())}
