"""Quality metrics of generated samples: gen-PPL, entropy, repetition, omission.

Every metric that takes token arrays reads only each row's first `lengths[b]`
tokens (`DecodeResult.lengths`: up to and including the first EOS), so
padding is never counted, and a real token whose id equals PAD (0) is.

- `gen_ppl`: generative perplexity, the perplexity of samples under a separate
  evaluator AR model (as in SEDD, Lou et al. 2024, and MDLM, Sahoo et al.
  2024). Low-entropy (repetitive) samples get a flattering gen-PPL (Zheng et
  al. 2024), so the unigram entropy of each sample is reported with it.
- `repetition_rate` and `distinct_n`: n-gram repetition within a sample and
  n-gram diversity over a set of samples (distinct-n: Li et al. 2016, "A
  Diversity-Promoting Objective Function for Neural Conversation Models").
- `omission_rate`: reference content words missing from the generated text,
  a structural error of non-autoregressive decoding (Gu et al. 2018) that
  BLEU can hide.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.models.config import check_attention
from lm_decoding.special_tokens import BOS_ID

# A small English function-word list; omission ignores these by default.
ENGLISH_STOPWORDS = frozenset("""
a an the and or but nor so yet if then than as of at by for from in into on
onto to with without about over under up down out off is am are was were be
been being have has had do does did i me my we us our you your he him his she
her it its they them their this that these those there here what which who
whom not no all any some such very can will would shall should may might must
""".split())

_WORD = re.compile(r"[^\W\d_]+")  # a run of letters (any script)


def _rows(tokens: Any, lengths: Any, names: tuple[str, str] = (
    "tokens", "lengths")) -> tuple[np.ndarray, np.ndarray]:
  """Checks and converts (tokens int[B, T], lengths int[B]) to numpy."""
  tokens = np.asarray(tokens)
  lengths = np.asarray(lengths)
  if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"{names[0]} must be an int array [B, T], got "
                     f"{tokens.dtype}{list(tokens.shape)}")
  b, t = tokens.shape
  if lengths.shape != (b,) or not np.issubdtype(lengths.dtype, np.integer):
    raise ValueError(f"{names[1]} must be an int array [B={b}], got "
                     f"{lengths.dtype}{list(lengths.shape)}")
  if np.any((lengths < 0) | (lengths > t)):
    raise ValueError(f"{names[1]} must be in [0, T={t}], got "
                     f"{lengths.tolist()}")
  return tokens, lengths


def perplexity(log_probs: Any, weights: Any) -> float:
  """Corpus perplexity exp(-sum(w * log_probs) / sum(w)), in float64.

  Args:
    log_probs: float[B, T] natural-log probabilities of the scored tokens.
    weights: float[B, T] non-negative token weights (1 for a scored token, 0
      for padding); entries with weight 0 are ignored even if not finite.
  Returns:
    The perplexity (a float >= 1 for valid log-probabilities).
  Raises:
    ValueError: if the shapes differ, a weight is negative, or the total
      weight is 0.
  """
  log_probs = np.asarray(log_probs, np.float64)
  weights = np.asarray(weights, np.float64)
  if log_probs.shape != weights.shape:
    raise ValueError(f"log_probs {list(log_probs.shape)} and weights "
                     f"{list(weights.shape)} must have the same shape")
  if np.any(weights < 0):
    raise ValueError("weights must be >= 0")
  total = weights.sum()
  if total <= 0:
    raise ValueError("weights must sum to > 0 (no token to score)")
  nll = -(weights * np.where(weights > 0, log_probs, 0.0)).sum()
  return float(np.exp(nll / total))


@dataclasses.dataclass(frozen=True)
class GenPPL:
  """Generative perplexity of a batch of samples.

  Attributes:
    ppl: corpus perplexity exp(total NLL / num_tokens).
    num_tokens: number of scored (real generated) tokens.
    row_nll: float64[B] mean NLL per scored token of each row, nats (NaN for a
      row with no tokens).
    row_counts: int64[B] scored tokens per row (= lengths).
    row_entropy: float64[B] unigram entropy of each row, nats (see
      `unigram_entropy`); report it beside `ppl`.
    token_nll: float64[B, T] NLL of each generated token, nats (column k:
      the row's k-th generated token, whatever its prompt length; NaN past
      the row's length): NLL against position, e.g. for exposure bias.
  """

  ppl: float
  num_tokens: int
  row_nll: np.ndarray
  row_counts: np.ndarray
  row_entropy: np.ndarray
  token_nll: np.ndarray


def _join(prompts: np.ndarray, prompt_lengths: np.ndarray,
          tokens: np.ndarray) -> np.ndarray:
  """int32[B, P + T]: each row's prompt followed directly by its tokens."""
  p, t = prompts.shape[1], tokens.shape[1]
  j = np.arange(p + t)[None, :]
  gen = np.take_along_axis(
      tokens, np.clip(j - prompt_lengths[:, None], 0, t - 1), axis=1)
  ctx = np.take_along_axis(prompts, np.minimum(j, p - 1), axis=1)
  return np.where(j < prompt_lengths[:, None], ctx, gen).astype(np.int32)


@functools.partial(jax.jit, static_argnums=0)
def _target_log_probs(logits_fn, params, seq_BxL):
  """float32[B, L-1]: log p(seq[:, i+1] | seq[:, :i+1]) under `logits_fn`."""
  logits_BxLxV = _logits_of(logits_fn)(params, seq_BxL[:, :-1])
  log_probs_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), -1)
  return jnp.take_along_axis(
      log_probs_BxLxV, seq_BxL[:, 1:, None], axis=-1)[..., 0]


def _check_vocabulary(logits_fn, params, tokens, lengths, prompts,
                      prompt_lengths) -> None:
  """Raises ValueError naming the argument if a real id of `tokens` (within
  `lengths`) or `prompts` (within `prompt_lengths`) is outside [0, V), V the
  evaluator's vocabulary read from its logits' shape (nothing compiled)."""
  probe = jax.eval_shape(_logits_of(logits_fn), params,
                         jax.ShapeDtypeStruct((1, 2), jnp.int32))
  vocab = probe.shape[-1]
  for name, ids, n in (("tokens", tokens, lengths),
                       ("prompts", prompts, prompt_lengths)):
    real = np.arange(ids.shape[1])[None, :] < n[:, None]
    bad = real & ((ids < 0) | (ids >= vocab))
    if bad.any():
      row, col = np.argwhere(bad)[0]
      raise ValueError(f"{name}[{row}, {col}]={int(ids[row, col])} is outside "
                       f"the evaluator's vocabulary [0, {vocab})")


def _logits_of(logits_fn):
  """(params, tokens int32[B, L]) -> logits float[B, L, V] of `logits_fn`
  at positions 0..L-1, without a cache."""
  return lambda params, seq_BxL: logits_fn(
      params, seq_BxL, jnp.broadcast_to(
          jnp.arange(seq_BxL.shape[1], dtype=jnp.int32), seq_BxL.shape)).logits


def _scored_rows(logits_fn, tokens, lengths, prompts, prompt_lengths,
                 batch_size: int) -> tuple[np.ndarray, ...]:
  """`gen_ppl`'s inputs checked (ValueError as it says) as numpy: (tokens
  int[B, T], lengths int[B], prompts int[B, P], prompt_lengths int[B]), a
  lone BOS_ID prompt per row when `prompts` is None."""
  tokens, lengths = _rows(tokens, lengths)
  b = tokens.shape[0]
  if b == 0:
    raise ValueError("tokens must have B >= 1 rows")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  if (prompts is None) != (prompt_lengths is None):
    raise ValueError("prompts and prompt_lengths must be given together")
  if prompts is None:
    prompts = np.full((b, 1), BOS_ID, np.int32)
    prompt_lengths = np.ones((b,), np.int32)
  if np.asarray(prompts).shape[:1] != (b,):
    raise ValueError(f"prompts must have B={b} rows like tokens, got shape "
                     f"{list(np.shape(prompts))}")
  prompts, prompt_lengths = _rows(prompts, prompt_lengths,
                                  ("prompts", "prompt_lengths"))
  if np.any(prompt_lengths < 1):
    raise ValueError("prompt_lengths must be >= 1 (a context to predict the "
                     f"first token from), got {prompt_lengths.tolist()}")
  if tokens.shape[1] == 0:
    raise ValueError("tokens must have T >= 1 columns")
  seq_len = prompts.shape[1] + tokens.shape[1]
  max_len = getattr(logits_fn, "max_len", None)
  if max_len is not None and seq_len - 1 > max_len:
    raise ValueError(f"P + T - 1 = {seq_len - 1} exceeds the evaluator's "
                     f"max_len={max_len}")
  return tokens, lengths, prompts, prompt_lengths


def gen_ppl(logits_fn: Any, params: Any, tokens: Any, lengths: Any,
            prompts: Any = None, prompt_lengths: Any = None,
            batch_size: int = 16) -> GenPPL:
  """Generative perplexity of samples under an evaluator causal LM.

  Each row's generated tokens `tokens[b, :lengths[b]]` are scored one by one
  given the row's prompt `prompts[b, :prompt_lengths[b]]` (or a lone BOS_ID
  when `prompts` is None) and the generated tokens before them: the sequence
  prompt + tokens is fed to the evaluator at positions 0, 1, ..., and the
  prediction at position i scores token i + 1. Padding is never scored (the
  weights come from the lengths, not from token ids, so a real token with id
  PAD=0 is scored). Rows are evaluated in chunks of `batch_size`, the last
  chunk padded with dummy rows of weight 0, so one compile serves all chunks
  and the result does not depend on `batch_size` (up to float rounding if
  the evaluator's per-row outputs depend on the batch shape).

  The evaluator is not the model being decoded: pass a separate, causal AR
  model's `logits_fn` and params (see `lm_decoding.decoding.base`); it is
  called without a cache as `logits_fn(params, tokens, positions)`. A
  non-causal evaluator (its `config.attention`, read by
  `models.config.check_attention`) is refused: it would see the token it
  scores and give a flattering gen-PPL.

  Args:
    logits_fn: the evaluator's logits function (hashable: a static jit arg).
    params: the evaluator's parameters.
    tokens: int[B, T] generated tokens (prompt excluded).
    lengths: int[B] real generated tokens per row, in [0, T].
    prompts: optional int[B, P] right-padded prompts.
    prompt_lengths: int[B] prompt lengths in [1, P]; required with prompts.
    batch_size: rows per evaluator call, >= 1.
  Returns:
    A `GenPPL` (corpus PPL, token count, per-row mean NLL, counts, entropy).
  Raises:
    ValueError: on malformed shapes or out-of-range lengths, batch_size < 1,
      prompts without prompt_lengths (or the reverse), no token to score,
      P + T - 1 above `logits_fn.max_len`, an evaluator that is not causal,
      or a real token or prompt id outside [0, V) of the evaluator's
      vocabulary (its logits' last dimension; all before any compile).
  """
  check_attention(logits_fn, causal=True, user="gen_ppl's evaluator")
  tokens, lengths, prompts, prompt_lengths = _scored_rows(
      logits_fn, tokens, lengths, prompts, prompt_lengths, batch_size)
  _check_vocabulary(logits_fn, params, tokens, lengths, prompts,
                    prompt_lengths)
  seq = _join(prompts, prompt_lengths, tokens)
  b, seq_len = seq.shape
  seq = np.concatenate([seq, np.full((-b % batch_size, seq_len), BOS_ID,
                                     np.int32)])  # one compile for all chunks
  log_probs = np.concatenate([
      np.asarray(_target_log_probs(logits_fn, params, seq[i:i + batch_size]))
      for i in range(0, seq.shape[0], batch_size)])[:b].astype(np.float64)
  return _summary(log_probs, tokens, lengths, prompt_lengths)


def _summary(log_probs: np.ndarray, tokens: np.ndarray, lengths: np.ndarray,
             prompt_lengths: np.ndarray) -> GenPPL:
  """The `GenPPL` of the evaluator's log_probs float64[B, P + T - 1] over
  the generated tokens (targets P_b .. P_b + lengths_b - 1)."""
  target = np.arange(1, log_probs.shape[1] + 1)[None, :]
  end = (prompt_lengths + lengths)[:, None]
  weights = ((target >= prompt_lengths[:, None])
             & (target < end)).astype(np.float64)
  ppl = perplexity(log_probs, weights)
  counts = weights.sum(axis=1).astype(np.int64)
  row_nll_sum = -np.where(weights > 0, log_probs, 0.0).sum(axis=1)
  with np.errstate(invalid="ignore", divide="ignore"):
    row_nll = np.where(counts > 0, row_nll_sum / counts, np.nan)
  k = np.arange(tokens.shape[1])[None, :]
  token_nll = np.where(k < lengths[:, None], -np.take_along_axis(
      log_probs, prompt_lengths[:, None] - 1 + k, axis=1), np.nan)
  return GenPPL(ppl=ppl, num_tokens=int(counts.sum()), row_nll=row_nll,
                row_counts=counts, row_entropy=unigram_entropy(tokens, lengths),
                token_nll=token_nll)


def unigram_entropy(tokens: Any, lengths: Any) -> np.ndarray:
  """Entropy of each row's token histogram, nats.

  H_b = -sum_v p_b(v) ln p_b(v), with p_b the frequency of token v among
  `tokens[b, :lengths[b]]`. E.g. [a, a, b, b] has ln 2; a constant row has 0.

  Args:
    tokens: int[B, T] token ids.
    lengths: int[B] real tokens per row, in [0, T].
  Returns:
    float64[B]; NaN for a row with no tokens.
  Raises:
    ValueError: on malformed shapes or out-of-range lengths.
  """
  tokens, lengths = _rows(tokens, lengths)
  out = np.full(tokens.shape[0], np.nan)
  for i, (row, n) in enumerate(zip(tokens, lengths)):
    if n:
      p = np.unique(row[:n], return_counts=True)[1] / n
      out[i] = -(p * np.log(p)).sum()
  return out


def _ngrams(tokens: np.ndarray, lengths: np.ndarray,
            n: int) -> Iterator[list[tuple[int, ...]]]:
  """Yields, per row, the list of its n-grams of real tokens in order."""
  if n < 1:
    raise ValueError(f"n={n} must be >= 1")
  for row, length in zip(tokens, lengths):
    row = row[:length].tolist()
    yield [tuple(row[i:i + n]) for i in range(length - n + 1)]


def repetition_rate(tokens: Any, lengths: Any, n: int) -> np.ndarray:
  """Fraction of each row's n-grams that repeat an earlier n-gram of the row.

  A row of L real tokens has the L - n + 1 n-grams g_i = x[i:i+n]; g_i is a
  repeat if g_j == g_i for some j < i. The rate is (#repeats) / (L - n + 1).
  E.g. n = 2 on [a, b, a, b, c]: bigrams ab, ba, ab, bc, one repeat, 1/4.
  Per row, distinct-n = 1 - repetition_rate (unique n-grams are the first
  occurrences).

  Args:
    tokens: int[B, T] token ids.
    lengths: int[B] real tokens per row, in [0, T].
    n: n-gram order, >= 1 (the project reports n = 1..4).
  Returns:
    float64[B] in [0, 1]; NaN for a row with fewer than n tokens.
  Raises:
    ValueError: on malformed shapes, out-of-range lengths or n < 1.
  """
  tokens, lengths = _rows(tokens, lengths)
  out = np.full(tokens.shape[0], np.nan)
  for i, grams in enumerate(_ngrams(tokens, lengths, n)):
    if grams:
      out[i] = 1.0 - len(set(grams)) / len(grams)
  return out


def distinct_n(tokens: Any, lengths: Any, n: int) -> float:
  """Distinct-n over a set of samples: unique n-grams / total n-grams.

  n-grams are taken within each row's real tokens (never across rows) and
  pooled over all rows; an n-gram occurring in several rows counts once in
  the numerator (Li et al. 2016). For the per-row value use
  1 - `repetition_rate`.

  Args:
    tokens: int[B, T] token ids.
    lengths: int[B] real tokens per row, in [0, T].
    n: n-gram order, >= 1.
  Returns:
    A float in (0, 1]; NaN if no row has n tokens.
  Raises:
    ValueError: on malformed shapes, out-of-range lengths or n < 1.
  """
  tokens, lengths = _rows(tokens, lengths)
  grams = [g for row in _ngrams(tokens, lengths, n) for g in row]
  return len(set(grams)) / len(grams) if grams else float("nan")


def content_words(text: str,
                  stopwords: frozenset[str] = ENGLISH_STOPWORDS) -> set[str]:
  """The set of lower-cased letter runs of `text` that are not stopwords.

  Words are maximal runs of letters (any script; digits, `_` and
  punctuation split words, so "don't" gives "don" and "t").
  """
  return {w for w in _WORD.findall(text.lower()) if w not in stopwords}


def omission_rate(hypotheses: Sequence[str], references: Sequence[str],
                  stopwords: frozenset[str] = ENGLISH_STOPWORDS) -> np.ndarray:
  """Fraction of each reference's content words missing from its hypothesis.

  Content words are word types (a set: repeats count once) from
  `content_words`, stopwords excluded (pass `frozenset()` to keep all). For
  reference "The cat sat on the mat" and hypothesis "a cat on a cat", the
  content words {cat, sat, mat} miss {sat, mat}: 2/3. Average rows with
  `np.nanmean`.

  Hypotheses come first, references second, as in every metric of this
  package and in sacrebleu.

  Args:
    hypotheses: N generated texts (decoded strings).
    references: N reference texts, aligned with `hypotheses`.
    stopwords: lower-case words to ignore.
  Returns:
    float64[R] in [0, 1]; NaN where a reference has no content word.
  Raises:
    ValueError: if the two sequences differ in length.
  """
  if len(references) != len(hypotheses):
    raise ValueError(f"hypotheses ({len(hypotheses)}) and references "
                     f"({len(references)}) must have the same length")
  out = np.full(len(references), np.nan)
  for i, (ref, hyp) in enumerate(zip(references, hypotheses)):
    wanted = content_words(ref, stopwords)
    if wanted:
      out[i] = len(wanted - content_words(hyp, stopwords)) / len(wanted)
  return out
