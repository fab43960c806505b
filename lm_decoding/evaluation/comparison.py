"""The comparison harness: every planned decoder measured alike.

`run` takes the decoders `entries.plan` built (one per entry and output
length T, equal ones merged) and measures each at every batch size B.

Two modes per (decoder, T, B), on the same prompts and key (row b's key is
fold_in(key, b), so a row decodes the same in any batch):
- fixed length: eos_ids=() so every row is exactly T tokens; compiled
  (compile time apart) and timed `runs` times straight away (no warm-up:
  the minimum and the median of the runs are robust to a slow first run);
  NFE, calls and forward token positions per role.
- EOS mode: the tokenizer's EOS ends a row. Decoded once, at the largest
  batch; a smaller batch's rows are its first rows there. Real tokens are
  those up to and including a row's first EOS. EOS mode's time is the
  fixed-length time when it made the same forward calls and positions per
  role (the same work), else it is timed itself (e.g. an early-exit
  decoder), so real tokens/s = real tokens / minimum EOS-mode time, the same
  formula for every decoder.
At the largest batch the EOS-mode samples are scored under the evaluator
(with the self-correction rate of a decoder that counts it), and rows with
a KV cache (`kv_cache` other than "none") get it measured, untimed: the
largest logit error of the cached window against an uncached pass (the
decoder's `cache_error`), and token
agreement with the same decoder with kv_cache="none" (same key, fixed
length).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.sharding import Mesh

from lm_decoding.checks import is_count
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import base, sharded
from lm_decoding.evaluation import comparison_rows, cost, quality
from lm_decoding.evaluation.entries import Planned
from lm_decoding.models import Model
from lm_decoding.parallel import sharding

SAMPLES_SHOWN = 2  # prompts whose continuations the report shows


@dataclasses.dataclass(frozen=True)
class Comparison:
  """What `run` measured.

  Attributes:
    rows: one dict per (planned decoder, B), in run order (columns:
      `report.COLUMNS`).
    samples: {(label, T): texts} EOS-mode continuations at the largest B.
    prompts: the prompt texts (decoded).
    human: gen-PPL and entropy of the human reference continuations under
      the evaluator ({"gen_ppl", "entropy", "length"}).
    merged: (T, row label, series labels) of rows standing for several
      entries.
  """

  rows: list[dict]
  samples: dict[tuple[str, int], list[str]]
  prompts: list[str]
  human: dict
  merged: list[tuple[int, str, tuple[str, ...]]]


def _jit_decode(decoder, args: tuple, mesh: Mesh | None, rules):
  """The jitted decode of `args`; on a mesh with explicit shardings
  (`sharded.jit_decode`)."""
  if mesh is not None:
    return sharded.jit_decode(decoder, args, mesh, rules)
  return base.jit_decode(decoder)


# One compile, in positions (`Work.positions`): the default grid's 36
# compiles took 4.6 s each on average on 2 shared CPU cores, half the job,
# as many positions as at the tiny model's ~26 us per position there.
COMPILE_POSITIONS = 175_000


def _expected_cost(p: Planned, batch: int, largest: bool, prompt_len: int,
                   runs: int) -> float:
  """The expected cost of one work unit of `run`, in positions.

  The timed runs (plus, at the largest batch, the EOS-mode decode and, for
  a cached decoder, the error measurement and its kv_cache="none"
  reference) at the decoder's `expected_work(B, P).positions` each (the
  decoder owns its estimate: `base.Work`), and
  `COMPILE_POSITIONS` per compile.
  """
  positions = p.decoder.expected_work(batch, prompt_len).positions
  decodes, compiles = runs, 1
  if largest:
    decodes, compiles = decodes + 1 + p.cached, compiles + 1 + 2 * p.cached
  total = decodes * positions + compiles * COMPILE_POSITIONS
  if largest and p.cached:
    total += p.reference.expected_work(batch, prompt_len).positions
  return float(total)


def _mean(values: np.ndarray) -> float:
  """Mean over the finite entries; NaN (without a warning) if none."""
  finite = values[~np.isnan(values)]
  return float(finite.mean()) if finite.size else math.nan


def _quality(evaluator: Model, tokenizer: Tokenizer, tokens, lengths,
             prompts, prompt_lengths) -> tuple[dict, list[str]]:
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  ppl = quality.gen_ppl(evaluator.logits_fn, evaluator.params, tokens,
                        lengths, np.asarray(prompts),
                        np.asarray(prompt_lengths))
  record = {"gen_ppl": ppl.ppl, "entropy": _mean(ppl.row_entropy),
            "rep_4": _mean(quality.repetition_rate(tokens, lengths, 4)),
            "distinct_2": quality.distinct_n(tokens, lengths, 2)}
  texts = [tokenizer.decode(row[:n]) for row, n in zip(tokens, lengths)]
  return record, texts


def _human(evaluator, tokenizer, prompts, references, width: int) -> dict:
  """gen-PPL and entropy of the reference continuations (real text).

  Their tokens (at most `width`, the longest T) are laid out [R, width] like
  the samples of that T, so scoring them reuses that compiled evaluator.
  """
  ids = [tokenizer.encode(text)[:width] for text in references]
  tokens = np.array([i + [0] * (width - len(i)) for i in ids], np.int32)
  lengths = np.array([len(i) for i in ids], np.int32)
  scores, _ = _quality(evaluator, tokenizer, tokens, lengths, prompts,
                       np.full(len(ids), prompts.shape[1], np.int32))
  return {"gen_ppl": scores["gen_ppl"], "entropy": scores["entropy"],
          "length": float(lengths.mean())}


def _check_run(prompts: np.ndarray, batch_sizes: Sequence[int], runs: int,
               mesh: Mesh | None, rules) -> int:
  """The largest batch size (quality is scored there), after `run`'s
  argument checks; raises ValueError as `run` documents."""
  quality_batch = max(batch_sizes)
  if len(prompts) < quality_batch:
    raise ValueError(f"{len(prompts)} prompts < largest batch size "
                     f"{quality_batch}")
  if not is_count(runs):
    raise ValueError(f"runs={runs!r} must be an integer >= 1")
  if mesh is not None:
    for b in batch_sizes:
      sharding.batch_sharding(mesh, (b,), rules)  # raises before compiling
  return quality_batch


def _place_used(planned: Sequence[Planned], models: Mapping[str, Model],
                mesh: Mesh, rules) -> dict[str, Model]:
  """`models` with every member a planned row binds placed on `mesh`."""
  used = {member for p in planned for _, member in p.roles}
  return dict(models, **sharded.place_models(
      {m: models[m] for m in used}, mesh, rules))


def _schedule(planned: Sequence[Planned], batch_sizes: Sequence[int],
              quality_batch: int, prompt_len: int, runs: int
              ) -> tuple[list[tuple[int, int]], list[float]]:
  """([(row index, B)] in run order, their expected costs): per output
  length, the largest batch first (its EOS run serves the smaller ones)."""
  lengths = dict.fromkeys(p.output_length for p in planned)
  work = [(i, b) for t in lengths for b in sorted(batch_sizes, reverse=True)
          for i, p in enumerate(planned) if p.output_length == t]
  weights = [_expected_cost(planned[i], b, b == quality_batch, prompt_len,
                            runs) for i, b in work]
  return work, weights


def _decode_args(p: Planned, b: int, models: Mapping[str, Model],
                 prompts: np.ndarray, seed: int, mesh: Mesh | None,
                 rules) -> tuple:
  """(models by role, prompts int32[B, P], prompt lengths int32[B], key):
  the first B prompts, split by 'batch' on a mesh; the key depends on T
  only, so row b's key is the same at every B."""
  batch_prompts = jnp.asarray(prompts[:b], jnp.int32)
  prompt_lengths = jnp.full((b,), prompts.shape[1], jnp.int32)
  if mesh is not None:
    batch_prompts = sharding.shard_batch(batch_prompts, mesh, rules)
    prompt_lengths = sharding.shard_batch(prompt_lengths, mesh, rules)
  return ({role: models[member] for role, member in p.roles}, batch_prompts,
          prompt_lengths,
          jax.random.fold_in(jax.random.key(seed), p.output_length))


def _cache_columns(p: Planned, args: tuple, fixed: base.DecodeResult,
                   fixed_tokens: Mapping[tuple, jax.Array], mesh: Mesh | None,
                   rules) -> dict:
  """A cached decoder's largest logit error against exact recomputation
  (its own `cache_error`) and its token agreement with its uncached
  reference (decoded here unless the reference row already ran)."""
  b = args[1].shape[0]
  error = p.decoder.cache_error(*args)
  reference = fixed_tokens.get((p.reference, p.roles, b))
  if reference is None:
    reference = _jit_decode(p.reference, args, mesh, rules)(*args).tokens
  return dict(max_logit_error=float(error),
              agreement=float(jnp.mean(fixed.tokens == reference)))


@dataclasses.dataclass(frozen=True)
class _Setup:
  """What every row of one `run` shares (its arguments, see there)."""

  models: Mapping[str, Model]
  evaluator: Model
  tokenizer: Tokenizer
  prompts: np.ndarray
  seed: int
  runs: int
  mesh: Mesh | None
  rules: object
  quality_batch: int


def _measure(setup: _Setup, p: Planned, b: int,
             fixed_tokens: dict[tuple, jax.Array], eos_run: dict
             ) -> tuple[dict, list[str] | None]:
  """(row, its first samples' texts or None): one planned decoder timed at
  batch `b`, its EOS mode, and at the largest batch its quality and cache
  columns. Adds its fixed-length tokens to `fixed_tokens`; `eos_run` keeps
  the EOS-mode decode of the largest batch (run first) for the smaller."""
  args = _decode_args(p, b, setup.models, setup.prompts, setup.seed,
                      setup.mesh, setup.rules)
  timing, _, fixed = cost.measure(
      _jit_decode(p.decoder, args, setup.mesh, setup.rules), args, 0,
      setup.runs)
  fixed_tokens[p.decoder, p.roles, b] = fixed.tokens
  eos_fn = _jit_decode(p.eos_decoder, args, setup.mesh, setup.rules)
  largest = b == setup.quality_batch
  if largest:  # first: work runs the largest batch first
    eos = eos_fn(*args)
    eos_run["eos"] = eos, (comparison_rows.work_done(eos)
                           == comparison_rows.work_done(fixed))
  eos, same_work = eos_run["eos"]
  row = comparison_rows.cost_row(p, b, fixed, timing, setup.prompts.shape[1])
  row.update(comparison_rows.eos_columns(
      eos_fn, args, fixed, eos, same_work, timing,
      (setup.tokenizer.eos_id,), setup.runs))
  texts = None
  if largest:
    scores, texts = _quality(setup.evaluator, setup.tokenizer,
                             eos.tokens[:b], np.asarray(eos.lengths[:b]),
                             args[1], args[2])
    row.update(scores)
    row.update(comparison_rows.self_correction(eos))
    texts = texts[:SAMPLES_SHOWN]
    if p.cached:
      row.update(_cache_columns(p, args, fixed, fixed_tokens, setup.mesh,
                                setup.rules))
  if setup.mesh is not None:
    row.update(comparison_rows.per_device_columns(
        row, setup.models, p.roles, timing.min_s, setup.mesh.size))
  return row, texts


def _measure_all(setup: _Setup, planned: Sequence[Planned],
                 work: Sequence[tuple[int, int]], weights: Sequence[float],
                 progress: bool) -> tuple[list[dict], dict, dict]:
  """(rows, samples {(label, T): texts}, fixed-length tokens by (decoder,
  roles, B)) of every (planned row index, B) of `work`, in that order, under
  one tqdm bar weighted by `weights`."""
  bar = tqdm.tqdm(total=sum(weights), disable=not progress, smoothing=0,
                  bar_format="{desc} {percentage:3.0f}%|{bar}| "
                  "[{elapsed}<{remaining}]")
  fixed_tokens: dict[tuple, jax.Array] = {}
  eos_runs: dict[int, dict] = {}
  rows, samples = [], {}
  for (i, b), weight in zip(work, weights):
    bar.set_description(f"{planned[i].label} T={planned[i].output_length} "
                        f"B={b}")
    row, texts = _measure(setup, planned[i], b, fixed_tokens,
                          eos_runs.setdefault(i, {}))
    if texts is not None:
      samples[planned[i].label, planned[i].output_length] = texts
    rows.append(row)
    bar.update(weight)
    if progress:
      tqdm.tqdm.write(comparison_rows.summary(row))
  bar.close()
  return rows, samples, fixed_tokens


def run(planned: Sequence[Planned], models: Mapping[str, Model],
        evaluator: Model, tokenizer: Tokenizer, prompts: np.ndarray,
        references: Sequence[str], batch_sizes: Sequence[int], runs: int,
        seed: int = 0, progress: bool = True, mesh: Mesh | None = None,
        rules=sharding.DEFAULT_RULES) -> Comparison:
  """Decodes, times and scores every planned decoder at every batch size.

  Args:
    planned: from `plan`.
    models: {member: Model} for every member the rows bind.
    evaluator: the causal model that scores samples (gen-PPL).
    tokenizer: decodes samples and prompts.
    prompts: int32[R, P] held-out prompts, R >= max(batch_sizes); batch B
      decodes the first B (row b's key does not depend on B).
    references: R human continuations (text) of the prompts.
    batch_sizes: B values; quality is scored at the largest.
    runs: timed runs per measurement, >= 1.
    seed: the key of output length T is fold_in(key(seed), T).
    progress: one tqdm bar over all (decoder, T, B), weighted by expected
      cost, and a line per finished row.
    mesh: None (default): one device, as always. A mesh
      (`sharding.mesh_from_config`): the decoders' models are placed on it
      and every decode runs under `sharded.jit_decode` (prompts split by
      'batch'; the evaluator stays on one device), and each row gets the
      columns `comparison_rows.per_device_columns` adds (devices, weight
      GB/s and GFLOP/s per device).
    rules: logical-axis rules for `mesh`.
  Returns:
    A `Comparison`.
  Raises:
    ValueError: fewer prompts than the largest batch, runs < 1; with a
      mesh, a batch size the batch mesh axes do not divide.
  """
  quality_batch = _check_run(prompts, batch_sizes, runs, mesh, rules)
  if mesh is not None:
    models = _place_used(planned, models, mesh, rules)
  prompt_len = prompts.shape[1]
  work, weights = _schedule(planned, batch_sizes, quality_batch, prompt_len,
                            runs)
  setup = _Setup(models, evaluator, tokenizer, prompts, seed, runs, mesh,
                 rules, quality_batch)
  rows, samples, fixed_tokens = _measure_all(setup, planned, work, weights,
                                             progress)
  comparison_rows.greedy_agreement(rows, [planned[i] for i, _ in work],
                                   fixed_tokens, quality_batch)
  human = _human(evaluator, tokenizer, prompts[:quality_batch],
                 references[:quality_batch],
                 max(p.output_length for p in planned))
  return Comparison(
      rows=rows, samples=samples,
      prompts=[tokenizer.decode(p) for p in prompts[:SAMPLES_SHOWN]],
      human=human,
      merged=[(p.output_length, p.label, p.series) for p in planned
              if len(p.series) > 1])
