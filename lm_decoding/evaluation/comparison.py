"""The comparison harness: every decoder, timed, counted and scored alike.

For each output length T and batch size B, each decoder in a list of
`DecoderSpec`s decodes the same held-out prompts; `cost.decode_cost` times it
(compile apart, warm-up, median of runs) and the largest batch's samples are
scored for quality under an evaluator AR model that is not the decoded model.
One sampling temperature is used for every decoder.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import autoregressive
from lm_decoding.decoding import iterative
from lm_decoding.decoding.base import LogitsFn, bind, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import cost, quality

SEQUENTIAL, PARALLEL = "sequential", "parallel"


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
  """One decoder of the comparison.

  Attributes:
    label: its name in the report (e.g. "MDLM K=32").
    name: the registered decoder name ("ar", "mdlm", ...).
    family: SEQUENTIAL (decodes with the AR model) or PARALLEL (with the
      masked-diffusion model).
    options: fixed decoder options, as (name, value) pairs.
    steps: denoising steps K of a parallel decoder; 0 means K = T.
  """

  label: str
  name: str
  family: str
  options: tuple[tuple[str, Any], ...] = ()
  steps: int | None = None

  def build(self, length: int, temperature: float, eos_ids: tuple[int, ...]):
    """The decoder config generating `length` tokens per row.

    A `block_length` above `length` is clamped to it (one block).
    """
    options = dict(self.options, eos_ids=eos_ids)
    if "block_length" in options:
      options["block_length"] = min(options["block_length"], length)
    if self.family == SEQUENTIAL:
      options.update(max_new_tokens=length,
                     sampling=SamplingConfig(temperature=temperature))
    else:
      options.update(gen_length=length,
                     sampling=SamplingConfig(temperature=temperature),
                     steps=self.steps or length)
    return make_decoder(self.name, **options)


def standard_specs(mdlm_steps: Sequence[int], llada_steps: int,
                   llada_block_length: int) -> list[DecoderSpec]:
  """AR cached and uncached, MDLM at each K, LLaDA with and without blocks."""
  specs = [DecoderSpec("AR cached", "ar", SEQUENTIAL),
           DecoderSpec("AR uncached", "ar_uncached", SEQUENTIAL)]
  for k in mdlm_steps:
    specs.append(DecoderSpec(f"MDLM K={k or 'T'}", "mdlm", PARALLEL, steps=k))
  specs.append(DecoderSpec(f"LLaDA K={llada_steps or 'T'}", "llada", PARALLEL,
                           steps=llada_steps))
  specs.append(DecoderSpec(
      f"LLaDA K={llada_steps or 'T'} block={llada_block_length}", "llada",
      PARALLEL, options=(("block_length", llada_block_length),),
      steps=llada_steps))
  return specs


@dataclasses.dataclass(frozen=True)
class Model:
  """A model as the harness uses it: its logits_fn and parameters."""

  logits_fn: LogitsFn
  params: Any
  name: str


def _ttft_s(model: Model, prompts, prompt_lengths, cache_length: int,
            runs: int) -> float:
  """Median time of one prefill (the first token's logits), seconds."""
  fn = jax.jit(functools.partial(autoregressive.prefill, model.logits_fn,
                                 cache_length=cache_length))
  return cost.time_fn(fn, model.params, prompts, prompt_lengths,
                      runs=runs).median_s


def _quality(evaluator: Model, tokenizer: Tokenizer, tokens, lengths, prompts,
             prompt_lengths, references: Sequence[str]) -> dict:
  tokens = np.asarray(tokens)
  lengths = np.asarray(lengths)
  ppl = quality.gen_ppl(evaluator.logits_fn, evaluator.params, tokens, lengths,
                        np.asarray(prompts), np.asarray(prompt_lengths))
  texts = [tokenizer.decode(row[:n]) for row, n in zip(tokens, lengths)]
  record = {"gen_ppl": ppl.ppl,
            "entropy": float(np.nanmean(ppl.row_entropy)),
            "omission": float(np.nanmean(
                quality.omission_rate(references[:len(texts)], texts))),
            "distinct_2": quality.distinct_n(tokens, lengths, 2),
            "mean_length": float(lengths.mean())}
  for n in (1, 2, 3, 4):
    record[f"rep_{n}"] = float(np.nanmean(
        quality.repetition_rate(tokens, lengths, n)))
  return record, texts


def run(specs: Sequence[DecoderSpec], ar: Model, mdlm: Model,
        evaluator: Model, tokenizer: Tokenizer, prompts: np.ndarray,
        references: Sequence[str], lengths: Sequence[int],
        batch_sizes: Sequence[int], temperature: float, runs: int,
        seed: int = 0, progress: bool = True) -> tuple[list[dict], dict]:
  """Decodes, times and scores every (spec, output length, batch size).

  Args:
    specs: the decoders.
    ar, mdlm: the causal and the masked-diffusion model.
    evaluator: the AR model that scores samples (gen-PPL); not `ar`.
    tokenizer: decodes samples to text.
    prompts: int32[N, P] held-out prompts, N >= max(batch_sizes).
    references: N reference continuations (for omission rate).
    lengths: output lengths T.
    batch_sizes: batch sizes B; quality is scored at the largest.
    temperature: the one sampling temperature of every decoder.
    runs: timed runs per measurement (median reported).
  Returns:
    (rows, samples): one dict per measurement (cost and, at the largest
    batch, quality), and {label: {T: texts}} of the scored samples.
  Raises:
    ValueError: fewer prompts than the largest batch, or a decoder option
      out of range (before anything is compiled).
  """
  quality_batch = max(batch_sizes)
  if len(prompts) < quality_batch:
    raise ValueError(f"{len(prompts)} prompts < largest batch size "
                     f"{quality_batch}")
  eos_ids = (tokenizer.eos_id,)
  models = {SEQUENTIAL: ar, PARALLEL: mdlm}
  decoders = {(s.label, t): s.build(t, temperature, eos_ids)
              for s in specs for t in lengths}  # validates every option first
  ar_param_bytes = cost.param_bytes(ar.params)
  kv_bytes_per_token = ar.logits_fn.init_cache(1, 1).bytes_per_slot()
  bandwidth = cost.measure_bandwidth()
  rows, samples = [], {}
  work = [(t, b, s) for t in lengths for b in batch_sizes for s in specs]
  for t, b, spec in tqdm.tqdm(work, desc="decode", disable=not progress):
    model = models[spec.family]
    decoder = decoders[spec.label, t]
    batch_prompts = jnp.asarray(prompts[:b], jnp.int32)
    prompt_lengths = jnp.full((b,), prompts.shape[1], jnp.int32)
    key = jax.random.fold_in(jax.random.key(seed), t)
    fn = jax.jit(lambda params, *args: decoder.decode(
        bind(model.logits_fn, params), *args))
    ttft = None
    if spec.family == SEQUENTIAL:
      ttft = _ttft_s(model, batch_prompts, prompt_lengths,
                     prompts.shape[1] + t, runs)
    record = cost.decode_cost(fn, model.params, batch_prompts, prompt_lengths,
                              key, runs=runs, ttft_s=ttft)
    row = {"decoder": spec.label, "family": spec.family, "model": model.name,
           "output_length": t, "temperature": temperature,
           "ms_per_position": record.ms_per_sequence / t,
           **dataclasses.asdict(record)}
    if spec.name == "ar":
      bound = cost.ar_decode_roofline_s(ar_param_bytes, kv_bytes_per_token * b,
                                        prompts.shape[1], t, bandwidth)
      row.update(roofline_ms=bound * 1e3,
                 roofline_ratio=record.ms_per_sequence / (bound * 1e3))
    if b == quality_batch:
      if spec.family == PARALLEL:  # one run gives both the raw and cut tokens
        raw = decoder.denoise(bind(model.logits_fn, model.params),
                              batch_prompts, prompt_lengths, key).tokens
        row["all_eos"] = int(iterative.eos_counts(raw, eos_ids)[1])
        tokens, lengths = iterative.finish_at_eos(raw, eos_ids,
                                                  decoder.pad_id)
      else:
        result = fn(model.params, batch_prompts, prompt_lengths, key)
        tokens, lengths = result.tokens, result.lengths
      scores, texts = _quality(evaluator, tokenizer, tokens, lengths,
                               batch_prompts, prompt_lengths, references)
      row.update(scores)
      row["empty"] = int(np.isin(np.asarray(tokens)[:, 0], eos_ids).sum())
      samples.setdefault(spec.label, {})[t] = texts
    rows.append(row)
  return rows, {"bandwidth_bytes_per_s": bandwidth,
                "ar_param_bytes": ar_param_bytes,
                "kv_bytes_per_token": kv_bytes_per_token, "samples": samples}
