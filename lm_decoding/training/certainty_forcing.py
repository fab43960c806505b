"""Certainty-forcing self-distillation of a block-diffusion model (dParallel).

dParallel (Chen et al. 2025, arXiv:2509.26488) fine-tunes a masked-diffusion
LM on its own (or its teacher's) continuations so that it commits several
tokens per forward pass at a confidence threshold of about 0.5. Two parts:

Data (`teacher_continuations`, `write_distillation_set`): R prefixes of P
training tokens, each continued for T tokens by a registered decoder on the
teacher (the AR parent with the cached `ar` decoder is the cheapest; greedy
and sampled); rows [prefix (P) | continuation (T)], PAD after an EOS, saved
as `tokens.npy` int32[R, P + T] beside `manifest.json` (teacher, decoder,
prefixes, counts, seconds, command).

Loss (`certainty_forcing_loss`): semi-autoregressive masking mapped onto the
BD3-LM training layout (`objectives._bd3lm_logits`, one pass over
[x_t ; x_0]): every block of the continuation is "the current block" at
once, each of its tokens masked with probability `mask_rate` (0.5, the
reference's fixed ratio); the blocks before it are its clean copy, and the
blocks after it are hidden by the block-causal mask (dParallel masks them
fully; a block decoder never sees them either). The prefix is never masked
nor scored. The complementary row (Fast-dLLM v2's complementary masks, also
in the reference) masks exactly the continuation tokens the first row keeps,
so every token is scored once per pair. On the masked positions M, with
SUBS log-probabilities (MASK excluded):

  loss = mean_{i in M} -log p(x_i)
         + weight * mean_{i in C} H(softmax(logits_i / temperature)),

C = {i in M : argmax logits_i = x_i} (the positions the model already gets
right; the entropy is pushed down only there), weight 2.0 and temperature
0.5 (`CERTAINTY_WEIGHT`, `CERTAINTY_TEMPERATURE`). The student is then
decoded by `bd3lm` with remasking='threshold' at tau = 0.5.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.checks import is_count, is_number
from lm_decoding.models import Model
from lm_decoding.models.config import check_attention
from lm_decoding.models.diffusion import subs_log_probs
from lm_decoding.special_tokens import MASK_ID, PAD_ID
from lm_decoding.training.objectives import (
    _bd3lm_logits, _check_block_length, _check_tokens, maskable, shifted)

CERTAINTY_WEIGHT = 2.0  # beta of the entropy term (the recipe)
CERTAINTY_TEMPERATURE = 0.5  # the entropy is of softmax(logits / 0.5)
MASK_RATE = 0.5  # dParallel's fixed masking ratio of the current block
TOKENS_FILE = "tokens.npy"
MANIFEST_FILE = "manifest.json"


def semi_ar_masks(key: jax.Array, x0_BxL: jax.Array, prompt_length: int,
                  token_shift: bool, mask_rate: float = MASK_RATE,
                  complementary: bool = True) -> jax.Array:
  """bool[C B, L]: the positions masked in each training row (C = 2 with
  `complementary`, the second B rows masking exactly the continuation tokens
  the first B keep; else C = 1).

  A position may be masked only if it is in the continuation (index >=
  `prompt_length`), not PAD, and not token 0 under a token shift
  (`objectives.maskable`); each such position is masked independently with
  probability `mask_rate`. Blocks are not drawn here: in the BD3-LM layout
  every block is a current block (module docstring).

  Args:
    key: PRNG key.
    x0_BxL: int32[B, L] rows [prefix | continuation].
    prompt_length: P, the prefix never masked, in [0, L - 1].
    token_shift: whether the model predicts token i at position i - 1.
    mask_rate: probability in (0, 1) that a maskable token is masked.
    complementary: add the complementary rows.
  Returns:
    bool[2B, L] (or [B, L]) masks.
  """
  length = x0_BxL.shape[1]
  keep_BxL = (maskable(x0_BxL, token_shift)
              & (jnp.arange(length) >= prompt_length)[None, :])
  u_BxL = jax.random.uniform(key, x0_BxL.shape, jnp.float32)
  masked_BxL = keep_BxL & (u_BxL < mask_rate)
  if not complementary:
    return masked_BxL
  return jnp.concatenate([masked_BxL, keep_BxL & ~masked_BxL])


def certainty_forcing_terms(logits_BxLxV: jax.Array, x0_BxL: jax.Array,
                            masked_BxL: jax.Array, *,
                            weight: float = CERTAINTY_WEIGHT,
                            temperature: float = CERTAINTY_TEMPERATURE,
                            mask_id: int = MASK_ID):
  """The certainty-forcing loss on given logits (module docstring).

  Args:
    logits_BxLxV: float[B, L, V], index i predicting token i.
    x0_BxL: int32[B, L] targets.
    masked_BxL: bool[B, L] the masked (scored) positions M.
    weight: beta >= 0 of the entropy term.
    temperature: > 0, of the softmax whose entropy is taken.
    mask_id: the MASK id, given probability 0 (SUBS).
  Returns:
    (loss float32[], metrics {'ce', 'entropy', 'correct' (the fraction of M
    in C), 'nll' (summed CE), 'tokens' (|M|)}). With no masked position
    the CE is 0; with no correct one the entropy term is 0.
  """
  x_t_BxL = jnp.where(masked_BxL, mask_id, x0_BxL)
  log_p = subs_log_probs(logits_BxLxV, x_t_BxL, mask_id)
  nll_BxL = -jnp.take_along_axis(log_p, x0_BxL[..., None], -1)[..., 0]
  count = masked_BxL.sum()
  nll = jnp.where(masked_BxL, nll_BxL, 0.0).sum()
  ce = nll / jnp.maximum(count, 1)
  correct_BxL = masked_BxL & (jnp.argmax(log_p, -1) == x0_BxL)
  log_q = subs_log_probs(logits_BxLxV / temperature, x_t_BxL, mask_id)
  entropy_BxL = -(jnp.exp(log_q) * log_q).sum(-1)
  num_correct = correct_BxL.sum()
  entropy = (jnp.where(correct_BxL, entropy_BxL, 0.0).sum()
             / jnp.maximum(num_correct, 1))
  metrics = {"ce": ce, "entropy": entropy,
             "correct": num_correct / jnp.maximum(count, 1),
             "nll": nll, "tokens": count}
  return ce + weight * entropy, metrics


def certainty_forcing_loss(logits_fn, params, tokens_BxL: jax.Array,
                           key: jax.Array, *, block_length: int,
                           prompt_length: int = 0,
                           complementary: bool = True,
                           weight: float = CERTAINTY_WEIGHT,
                           temperature: float = CERTAINTY_TEMPERATURE,
                           mask_rate: float = MASK_RATE,
                           mask_id: int = MASK_ID):
  """dParallel's certainty-forcing loss on the BD3-LM layout.

  `semi_ar_masks` draws the masks (both rows of a complementary pair), one
  pass over [x_t ; x_0] per row gives every block's denoising logits
  (`objectives._bd3lm_logits`, token shift included), and
  `certainty_forcing_terms` scores them.

  Args:
    logits_fn, params: the block-diffusion model (non-causal attention).
    tokens_BxL: int32[B, L] rows [prefix | continuation], PAD-padded.
    key: PRNG key of the masks.
    block_length: W, dividing L; should divide `prompt_length` so that the
      continuation's blocks start where `decoding.bd3lm` starts them.
    prompt_length: P in [0, L - 1], never masked.
    complementary, weight, temperature, mask_rate, mask_id: as
      `semi_ar_masks` and `certainty_forcing_terms`.
  Returns:
    (loss float32[], metrics) of `certainty_forcing_terms`.
  Raises:
    ValueError: tokens not int[B, L]; block_length not dividing L;
      prompt_length, weight, temperature or mask_rate outside its range; a
      causal model.
  """
  _check_tokens(tokens_BxL, min_length=1)
  length = tokens_BxL.shape[1]
  _check_block_length(block_length, length)
  if not is_count(prompt_length, minimum=0) or prompt_length >= length:
    raise ValueError(f"prompt_length={prompt_length!r} must be an integer in "
                     f"[0, {length - 1}]")
  if not (is_number(weight) and 0 <= weight < math.inf):
    raise ValueError(f"weight={weight!r} must be a number in [0, inf)")
  if not (is_number(temperature) and 0 < temperature < math.inf):
    raise ValueError(f"temperature={temperature!r} must be a number in "
                     "(0, inf)")
  if not (is_number(mask_rate) and 0 < mask_rate < 1):
    raise ValueError(f"mask_rate={mask_rate!r} must be a number in (0, 1)")
  check_attention(logits_fn, causal=False, user="certainty_forcing_loss")
  masked_CxL = semi_ar_masks(key, tokens_BxL, prompt_length,
                             shifted(logits_fn), mask_rate, complementary)
  x0_CxL = jnp.tile(tokens_BxL, (masked_CxL.shape[0] // tokens_BxL.shape[0],
                                 1))
  x_t_CxL = jnp.where(masked_CxL, mask_id, x0_CxL)
  logits = _bd3lm_logits(logits_fn, params, x0_CxL, x_t_CxL, block_length)
  return certainty_forcing_terms(logits, x0_CxL, masked_CxL, weight=weight,
                                 temperature=temperature, mask_id=mask_id)


def distillation_prefixes(stream: np.ndarray, prompt_length: int, count: int,
                          seed: int) -> np.ndarray:
  """int32[count, P]: `count` distinct prefixes of P tokens of the token
  stream `stream` (a training split), cut at multiples of P and drawn
  without replacement by `numpy.random.default_rng(seed)`.

  Raises:
    ValueError: P or count below 1, or more prefixes asked than the stream
      holds.
  """
  if not is_count(prompt_length) or not is_count(count):
    raise ValueError(f"prompt_length={prompt_length!r} and count={count!r} "
                     "must be integers >= 1")
  available = len(stream) // prompt_length
  if count > available:
    raise ValueError(f"count={count} prefixes of {prompt_length} tokens; the "
                     f"stream holds {available}")
  starts = np.random.default_rng(seed).choice(available, count,
                                              replace=False) * prompt_length
  return np.stack([stream[s:s + prompt_length] for s in starts]).astype(
      np.int32)


def teacher_continuations(decoder, teacher: Model, prefixes_RxP: np.ndarray,
                          key: jax.Array, batch_size: int) -> np.ndarray:
  """int32[R, P + T]: each prefix followed by the `decoder`'s continuation.

  The rows are decoded in chunks of `batch_size` (the last one padded with
  copies of its first row, so one compile serves every chunk); chunk c
  uses `fold_in(key, c)`, and a registered decoder's rows decode alike in
  any batch, so the result depends on (decoder, teacher, prefixes, key,
  batch_size) only. Tokens after a row's EOS are PAD.

  Args:
    decoder: a registered decoder config with role 'model' (e.g. `ar`).
    teacher: the model it decodes with.
    prefixes_RxP: int32[R, P] prompts (full length, no PAD).
    key: PRNG key (unused by greedy decoders).
    batch_size: rows per decode call, >= 1.
  Raises:
    ValueError: batch_size below 1, no prefix, or as the decoder's decode.
  """
  if not is_count(batch_size):
    raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
  prefixes_RxP = np.asarray(prefixes_RxP, np.int32)
  rows, prompt_length = prefixes_RxP.shape
  if rows < 1:
    raise ValueError("prefixes_RxP must hold at least one row")
  models = {"model": teacher}
  out = []
  for c, start in enumerate(range(0, rows, batch_size)):
    chunk = prefixes_RxP[start:start + batch_size]
    padded = np.concatenate(
        [chunk, np.repeat(chunk[:1], batch_size - len(chunk), 0)])
    result = decoder.decode(models, jnp.asarray(padded),
                            jnp.full((batch_size,), prompt_length, jnp.int32),
                            jax.random.fold_in(key, c))
    out.append(np.asarray(result.tokens)[:len(chunk)])
  return np.concatenate([prefixes_RxP, np.concatenate(out)], axis=1)


def write_distillation_set(out_dir: str | pathlib.Path, tokens_RxL: np.ndarray,
                           manifest: dict) -> pathlib.Path:
  """Writes `tokens.npy` (int32[R, L]) and `manifest.json` (`manifest` plus
  'rows' and 'tokens', the non-PAD count) into `out_dir` (created).

  Returns:
    `out_dir` as a path.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  tokens_RxL = np.asarray(tokens_RxL, np.int32)
  np.save(out / TOKENS_FILE, tokens_RxL)
  manifest = {**manifest, "rows": int(tokens_RxL.shape[0]),
              "tokens": int((tokens_RxL != PAD_ID).sum())}
  (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
  return out


def read_distillation_set(path: str | pathlib.Path
                          ) -> tuple[np.ndarray, dict]:
  """(tokens int32[R, L], manifest) of a set `write_distillation_set` wrote.

  Raises:
    ValueError: `path` holds no such set.
  """
  path = pathlib.Path(path)
  if not (path / TOKENS_FILE).is_file() or not (path / MANIFEST_FILE).is_file():
    raise ValueError(f"data.distillation_set={str(path)!r} holds no "
                     f"{TOKENS_FILE} and {MANIFEST_FILE} (write it with "
                     "experiments/distill_data.py)")
  return (np.load(path / TOKENS_FILE).astype(np.int32),
          json.loads((path / MANIFEST_FILE).read_text()))


def timed_continuations(decoders: dict, teacher: Model,
                        prefixes_RxP: np.ndarray, key: jax.Array,
                        batch_size: int) -> tuple[np.ndarray, dict]:
  """(tokens int32[D R, P + T], {label: seconds}): `teacher_continuations`
  of every decoder of `decoders` ({label: config}) in order, decoder d with
  `fold_in(key, d)`, with each one's wall seconds (compile included: the
  generation's compute, counted in the student's)."""
  rows, seconds = [], {}
  for d, (label, decoder) in enumerate(decoders.items()):
    tick = time.time()
    rows.append(teacher_continuations(decoder, teacher, prefixes_RxP,
                                      jax.random.fold_in(key, d), batch_size))
    seconds[label] = time.time() - tick
  return np.concatenate(rows), seconds

