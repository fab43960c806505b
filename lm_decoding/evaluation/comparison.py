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
from lm_decoding.decoding.rows import eos_counts
from lm_decoding.evaluation import cost, entries, quality
from lm_decoding.evaluation.entries import Planned
from lm_decoding.models import Model, count_params
from lm_decoding.parallel import sharding

SPREAD_FLAG = 0.10  # timing spread (IQR / median) above which a row is flagged
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


def _per_device_columns(row: dict, models: Mapping[str, Model],
                        roles, seconds: float, devices: int) -> dict:
  """Weight bandwidth and model FLOP/s per device of a row.

  Each forward call reads every weight of its model once (the bytes
  roofline's assumption, `cost.roofline_s`) and does 2 FLOPs per parameter
  per token position (attention scores excluded); both are summed over the
  roles' calls and positions and divided by the time and the device count.
  """
  weight_bytes = flops = 0.0
  for role, member in roles:
    params = models[member].params
    weight_bytes += row["calls"][role] * cost.tree_bytes(params)
    flops += 2.0 * row["forward_tokens"][role] * count_params(params)
  return {"devices": devices,
          "weight_GBps_per_device": weight_bytes / seconds / devices / 1e9,
          "GFLOPs_per_device": flops / seconds / devices / 1e9}


def _work(result: base.DecodeResult) -> tuple:
  return (tuple(sorted((r, int(c)) for r, c in result.calls.items())),
          tuple(sorted((r, int(c)) for r, c in result.forward_tokens.items())))


def _timing_columns(timing: cost.Timing) -> dict:
  median = timing.median_s
  return {"ms_min": timing.min_s * 1e3, "ms_median": median * 1e3,
          "spread": timing.iqr_s / median if median > 0 else math.nan,
          "compile_s": timing.compile_s}


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


def _summary(row: dict) -> str:
  """The one line printed when a row is finished."""
  fwd = ", ".join(f"{r} {n:,}" for r, n in row["forward_tokens"].items())
  line = (f"{row['decoder']} | T={row['output_length']} "
          f"B={row['batch_size']} | NFE {row['nfe']}, fwd tokens {fwd} | "
          f"{row['ms_min']:.1f} ms min, {row['ms_median']:.1f} median, "
          f"spread {row['spread']:.0%}{' (noisy)' if row['noisy'] else ''} | "
          f"real tok/s {row['real_tokens_per_s']:.0f}")
  if "gen_ppl" in row:
    line += (f" | gen-PPL {row['gen_ppl']:.1f}, entropy "
             f"{row['entropy']:.2f}")
  if "max_logit_error" in row:
    line += (f" | cache error {row['max_logit_error']:.3g}, agreement "
             f"{row['agreement']:.1%}")
  return line


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


def _cost_row(p: Planned, b: int, fixed: base.DecodeResult,
              timing: cost.Timing, prompt_len: int) -> dict:
  """A row's identity, model calls and timing columns, from the timed
  fixed-length run."""
  t = p.output_length
  row = {"decoder": p.label, "series": list(p.series),
         "models": ", ".join(f"{r}={m}" for r, m in p.roles),
         "batch_size": b, "output_length": t, "nfe": int(fixed.nfe),
         "calls": {r: int(c) for r, c in fixed.calls.items()},
         "forward_tokens": {r: int(c)
                            for r, c in fixed.forward_tokens.items()},
         **_timing_columns(timing)}
  row["noisy"] = bool(row["spread"] > SPREAD_FLAG)
  row["full_pass"] = all(
      row["forward_tokens"][r] == c * b * (prompt_len + t)
      for r, c in row["calls"].items())
  row["cached"] = p.cached
  row["context"] = (p.decoder.context().record
                    if hasattr(p.decoder, "context") else "")
  row["reference"] = p.reference_label
  row["judged_against"] = p.judged_against
  row["ms_per_token"] = row["ms_min"] / t
  return row


def _eos_columns(eos_fn, args: tuple, fixed: base.DecodeResult,
                 eos: base.DecodeResult, same_work: bool,
                 timing: cost.Timing, eos_ids: tuple[int, ...], runs: int
                 ) -> dict:
  """Tokens up to EOS and their rate; the EOS run (`eos_fn`, the jitted
  EOS-stopping decode) is timed apart only when it did other work than the
  fixed-length run (`_work`)."""
  b = args[1].shape[0]
  eos_tokens, eos_lengths = eos.tokens[:b], np.asarray(eos.lengths[:b])
  eos_s = timing.min_s
  if not same_work:
    eos_s = cost.measure(eos_fn, args, 0, runs)[0].min_s
  real_tokens = int(eos_lengths.sum())
  return dict(
      eos_tokens_per_row=real_tokens / b,
      eos_timed_apart=not same_work,
      real_tokens_per_s=real_tokens / eos_s,
      all_eos=int(eos_counts(fixed.tokens, eos_ids)[1]),
      empty=int(eos_counts(eos_tokens, eos_ids)[0]))


def _self_correction(result: base.DecodeResult) -> dict:
  """For a decoder whose stats count acceptances ('accepted') and those that
  revised an earlier one ('revised'): revised / accepted, pooled over the
  rows; {} for the others."""
  if "revised" not in result.stats:
    return {}
  accepted = int(jnp.sum(result.stats["accepted"]))
  return dict(self_correction=int(jnp.sum(result.stats["revised"]))
              / max(accepted, 1))


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


def _greedy_agreement(rows: Sequence[dict], planned: Sequence[Planned],
                      fixed_tokens: Mapping[tuple, jax.Array],
                      quality_batch: int) -> None:
  """Adds "greedy_agreement" to each greedy row at the largest batch that is
  judged against another greedy row (AR greedy): the fraction of its fixed-length
  tokens [B, T] equal to that row's, position by position (same prompts; a
  decoder that reproduces AR greedy scores 1)."""
  by_label = {(p.label, p.output_length): p for p in planned
              if entries.greedy(p.decoder)}
  for row, p in zip(rows, planned):
    ref = by_label.get((p.judged_against, p.output_length))
    if (row["batch_size"] == quality_batch and ref is not None
        and ref is not p and entries.greedy(p.decoder)):
      row["greedy_agreement"] = float(jnp.mean(
          fixed_tokens[p.decoder, p.roles, quality_batch]
          == fixed_tokens[ref.decoder, ref.roles, quality_batch]))


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
      columns `_per_device_columns` adds (devices, weight GB/s and GFLOP/s
      per device).
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
  bar = tqdm.tqdm(total=sum(weights), disable=not progress, smoothing=0,
                  bar_format="{desc} {percentage:3.0f}%|{bar}| "
                  "[{elapsed}<{remaining}]")
  fixed_tokens: dict[tuple, jax.Array] = {}
  eos_runs: dict[int, tuple[base.DecodeResult, bool]] = {}
  rows, samples = [], {}
  for (i, b), weight in zip(work, weights):
    p, t = planned[i], planned[i].output_length
    bar.set_description(f"{p.label} T={t} B={b}")
    args = _decode_args(p, b, models, prompts, seed, mesh, rules)
    timing, _, fixed = cost.measure(
        _jit_decode(p.decoder, args, mesh, rules), args, 0, runs)
    fixed_tokens[p.decoder, p.roles, b] = fixed.tokens
    eos_fn = _jit_decode(p.eos_decoder, args, mesh, rules)
    if b == quality_batch:  # first: work runs the largest batch first
      eos = eos_fn(*args)
      eos_runs[i] = eos, _work(eos) == _work(fixed)
    eos, same_work = eos_runs[i]
    row = _cost_row(p, b, fixed, timing, prompt_len)
    row.update(_eos_columns(eos_fn, args, fixed, eos, same_work, timing,
                            (tokenizer.eos_id,), runs))
    if b == quality_batch:
      scores, texts = _quality(evaluator, tokenizer, eos.tokens[:b],
                               np.asarray(eos.lengths[:b]), args[1], args[2])
      row.update(scores)
      row.update(_self_correction(eos))
      samples[p.label, t] = texts[:SAMPLES_SHOWN]
      if p.cached:
        row.update(_cache_columns(p, args, fixed, fixed_tokens, mesh, rules))
    if mesh is not None:
      row.update(_per_device_columns(row, models, p.roles, timing.min_s,
                                     mesh.size))
    rows.append(row)
    bar.update(weight)
    if progress:
      tqdm.tqdm.write(_summary(row))
  bar.close()
  _greedy_agreement(rows, [planned[i] for i, _ in work], fixed_tokens,
                    quality_batch)
  human = _human(evaluator, tokenizer, prompts[:quality_batch],
                 references[:quality_batch],
                 max(p.output_length for p in planned))
  return Comparison(
      rows=rows, samples=samples,
      prompts=[tokenizer.decode(p) for p in prompts[:SAMPLES_SHOWN]],
      human=human,
      merged=[(p.output_length, p.label, p.series) for p in planned
              if len(p.series) > 1])
