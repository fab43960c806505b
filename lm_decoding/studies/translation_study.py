"""The NAR translation study: its decoders, its scores and its report.

Gu et al. 2018 (one-shot NAT), Ghazvininejad et al. 2019 (CMLM,
Mask-Predict with a length beam), Libovicky & Helcl 2018 (CTC) against AR
greedy and beam search on the same pairs. `decoders(config)` is the grid,
`score` one decoder's quality row, `bucket_rows` BLEU by reference length;
`speedup_table`, `plots` and `report` write the study's Markdown and
figures (experiments/translate.py runs it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from matplotlib.figure import Figure
import ml_collections
import numpy as np

from lm_decoding.decoding import sampling
from lm_decoding.decoding.autoregressive import AutoregressiveDecoder
from lm_decoding.decoding.autoregressive import EarlyExitDecoder
from lm_decoding.decoding.beam_search import BeamSearchDecoder
from lm_decoding.decoding.ctc import CTCDecoder
from lm_decoding.decoding.mask_predict import MaskPredictDecoder
from lm_decoding.evaluation import cost
from lm_decoding.evaluation import translation_metrics as tm
from lm_decoding.special_tokens import EOS_ID, PAD_ID

# Length buckets, target (or source) tokens, inclusive.
BUCKETS = ((1, 12), (13, 24), (25, 36), (37, 48))


def _ar_options(config: ml_collections.ConfigDict) -> dict:
  """AR over the source read as a bidirectional prefix, up to the target
  limit + EOS."""
  return dict(output_length=config.data.max_target_tokens + 1,
              eos_ids=(EOS_ID,), pad_id=PAD_ID,
              prompt_attention="bidirectional")


def _ctc(config: ml_collections.ConfigDict) -> tuple[str, CTCDecoder]:
  upsample = config.train.ctc_upsample
  return f"CTC x{upsample}", CTCDecoder(
      output_length=config.data.max_target_tokens + 1, upsample=upsample)


def decoders(config: ml_collections.ConfigDict) -> list[tuple]:
  """[(label, member, decoder)]: AR greedy, AR beam, CMLM one-shot and
  Mask-Predict at each K and length beam (and the distilled CMLM's with
  `translate.distill`), CTC (and its distilled twin); all argmax."""
  limit, t = config.data.max_target_tokens, config.translate
  greedy = sampling.SamplingConfig(temperature=0.0)
  out = [("AR greedy", "translation_ar",
          AutoregressiveDecoder(sampling=greedy, **_ar_options(config))),
         (f"AR beam {t.num_beams}", "translation_ar",
          BeamSearchDecoder(num_beams=t.num_beams, **_ar_options(config)))]
  grids = [("cmlm", "", t.length_beams)]
  if t.distill:
    grids.append(("cmlm_distilled", " KD", t.distilled_length_beams))
  for member, suffix, beams in grids:
    for beam in beams:
      for steps in t.mask_predict_steps:
        name = "CMLM one-shot" if steps == 1 else f"Mask-Predict K={steps}"
        out.append((f"{name} l={beam}{suffix}", member, MaskPredictDecoder(
            output_length=limit, steps=steps, length_beam=beam,
            lengths="head")))
  label, ctc = _ctc(config)
  out.append((label, "ctc", ctc))
  if t.distill:
    out.append((f"{label} KD", "ctc_distilled", ctc))
  return out


def latency_decoders(config: ml_collections.ConfigDict) -> list[tuple]:
  """[(label, member, decoder)] of the batch-1 latency curve: AR greedy with
  early exit and as a fixed scan, CMLM one-shot (length beam 1), CTC."""
  greedy = sampling.SamplingConfig(temperature=0.0)
  return [
      ("AR greedy, early exit", "translation_ar",
       EarlyExitDecoder(sampling=greedy, **_ar_options(config))),
      ("AR greedy, fixed scan", "translation_ar",
       AutoregressiveDecoder(sampling=greedy, **_ar_options(config))),
      ("CMLM one-shot l=1", "cmlm", MaskPredictDecoder(
          output_length=config.data.max_target_tokens, steps=1,
          length_beam=1, lengths="head")),
      (_ctc(config)[0], "ctc", _ctc(config)[1])]


def bucketed(lengths_R: Sequence[int], limit: int | None = None
             ) -> dict[tuple[int, int], list[int]]:
  """{bucket: row indices whose length falls in it} for each non-empty
  `BUCKETS` bucket, at most `limit` rows each (None: all)."""
  lengths_R = np.asarray(lengths_R)
  out = {}
  for low, high in BUCKETS:
    rows = np.flatnonzero((lengths_R >= low) & (lengths_R <= high))
    if len(rows):
      out[low, high] = rows[:limit].tolist()
  return out


def score(label: str, member: str, hypotheses: Sequence[str],
          counts_R: np.ndarray, references: Sequence[str],
          reference_lengths_R: np.ndarray) -> tuple[dict, str]:
  """(row, sacreBLEU signature) of one decoder: BLEU, chrF, consecutive
  repetition, omission, length error (tokens); rounded for the tables."""
  bleu = tm.corpus_bleu(hypotheses, references)
  error = tm.length_error(counts_R, reference_lengths_R)
  return {
      "decoder": label, "model": member, "bleu": round(bleu.score, 2),
      "chrf": round(tm.corpus_chrf(hypotheses, references).score, 2),
      "repetition": round(float(np.nanmean(
          tm.consecutive_repetition_rate(hypotheses))), 4),
      "omission": round(float(np.nanmean(
          tm.omission_rate(hypotheses, references))), 4),
      "length_mean_abs": round(error["mean_abs"], 2),
      "length_mean_signed": round(error["mean_signed"], 2),
      "length_exact": round(error["exact"], 3)}, bleu.signature


def bucket_rows(label: str, hypotheses: Sequence[str],
                references: Sequence[str],
                reference_lengths_R: np.ndarray) -> list[dict]:
  """BLEU of `label` per reference-length bucket (non-empty ones)."""
  return [{"decoder": label, "bucket": f"{low}-{high}",
           "sentences": len(rows), "bleu": round(tm.corpus_bleu(
               [hypotheses[i] for i in rows],
               [references[i] for i in rows]).score, 2)}
          for (low, high), rows in bucketed(reference_lengths_R).items()]


def add_speedups(rows: list[dict]) -> None:
  """Adds speedup_vs_ar_greedy / _beam to each row (rows[0] is AR greedy,
  rows[1] AR beam, as `decoders` orders them)."""
  for row in rows:
    for key, ar in (("speedup_vs_ar_greedy", rows[0]),
                    ("speedup_vs_ar_beam", rows[1])):
      row[key] = round(ar["ms_per_sentence"] / row["ms_per_sentence"], 2)


def speedup_table(rows: Sequence[dict]) -> str:
  """Each NAR setting against AR greedy and AR beam: quality and speed."""
  ar_greedy, ar_beam = rows[0], rows[1]
  lines = ["| NAR setting | BLEU | BLEU - AR greedy | BLEU - AR beam | "
           "chrF | repetition | omission | ms/sentence | x AR greedy | "
           "x AR beam |", "|" + "---|" * 10]
  for row in rows[2:]:
    lines.append(
        f"| {row['decoder']} | {row['bleu']} | "
        f"{row['bleu'] - ar_greedy['bleu']:+.2f} | "
        f"{row['bleu'] - ar_beam['bleu']:+.2f} | {row['chrf']} | "
        f"{row['repetition']} | {row['omission']} | "
        f"{row['ms_per_sentence']} | {row['speedup_vs_ar_greedy']} | "
        f"{row['speedup_vs_ar_beam']} |")
  return "\n".join(lines)


def _save(fig, path: str) -> None:
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def plots(config: ml_collections.ConfigDict, rows: Sequence[dict],
          buckets: Sequence[dict], latency: Sequence[dict],
          out_dir: str) -> None:
  """mask_predict.png, buckets.png and latency.png under out_dir."""
  by_label = {r["decoder"]: r for r in rows}
  fig = Figure(figsize=(10, 4))
  left, right = fig.subplots(1, 2)
  steps = config.translate.mask_predict_steps
  curves = [("cmlm", "", "-", config.translate.length_beams)]
  if config.translate.distill:
    curves.append(("cmlm_distilled", " KD", "--",
                   config.translate.distilled_length_beams))
  for member, suffix, style, beams in curves:
    for beam in beams:
      picked = [r for r in rows if r["model"] == member
                and r["decoder"].endswith(f"l={beam}{suffix}")]
      for axis, key in ((left, "bleu"), (right, "ms_per_sentence")):
        axis.plot(steps, [r[key] for r in picked], "o" + style,
                  label=f"l={beam}{suffix}")
  for axis, key in ((left, "bleu"), (right, "ms_per_sentence")):
    axis.axhline(by_label["AR greedy"][key], color="k", ls=":",
                 label="AR greedy")
    axis.set_xlabel("Mask-Predict iterations K")
    axis.set_ylabel(key)
    axis.legend(fontsize=7)
  _save(fig, os.path.join(out_dir, "mask_predict.png"))
  fig = Figure(figsize=(7, 4))
  axis = fig.subplots()
  names = [f"{low}-{high}" for low, high in BUCKETS]
  ctc = _ctc(config)[0]
  chosen = ["AR greedy", f"AR beam {config.translate.num_beams}",
            "CMLM one-shot l=1", "Mask-Predict K=10 l=5", ctc]
  if config.translate.distill:
    chosen += ["CMLM one-shot l=1 KD", f"{ctc} KD"]
  for label in chosen:
    scores = {r["bucket"]: r["bleu"] for r in buckets
              if r["decoder"] == label}
    axis.plot(names, [scores.get(b, np.nan) for b in names], "o-",
              label=label)
  axis.set_xlabel("reference length (target tokens)")
  axis.set_ylabel("BLEU")
  axis.legend(fontsize=7)
  _save(fig, os.path.join(out_dir, "buckets.png"))
  fig = Figure(figsize=(7, 4))
  axis = fig.subplots()
  for label in dict.fromkeys(r["decoder"] for r in latency):
    picked = [r for r in latency if r["decoder"] == label]
    axis.plot([r["source_tokens"] for r in picked],
              [r["median_ms"] for r in picked], "o-", label=label)
  axis.set_xlabel("source length (tokens)")
  axis.set_ylabel("ms per sentence, batch 1 (median)")
  axis.legend(fontsize=7)
  _save(fig, os.path.join(out_dir, "latency.png"))


def _table(rows: Sequence[dict]) -> str:
  keys = list(rows[0])
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
  return "\n".join(lines)


def report(config: ml_collections.ConfigDict, rows: Sequence[dict],
           buckets: Sequence[dict], latency: Sequence[dict],
           samples: dict[str, list[str]], members: dict,
           references: Sequence[str], data_line: str, n: int,
           signature: str, seconds: float, load: Sequence[float]) -> str:
  """report.md: setting, models, the quality table, the speed-up table,
  batch-1 latency, BLEU by length and three samples (Markdown).

  Args:
    members: {name: (Model, metrics, source)} (`translation_members`).
    data_line: the encoded data's description.
    n: test pairs decoded.
    load: 1-minute load averages at the decoding's start and end.
  """
  models = []
  for name, (_, metrics, source) in members.items():
    line = (f"- {name}: {metrics['num_params']:,} parameters, "
            f"{metrics['steps']} steps, validation loss "
            f"{metrics['valid_loss']:.3f} ({source})")
    for key in ("stopped_early", "distillation"):
      if key in metrics:
        line += f"; {metrics[key]}"
    models.append(line)
  t = config.translate
  text = [
      "# NAR translation: " + (
          f"the pairs of {config.data.path}" if config.data.path
          else "English -> Spanish (KJV -> RV1909)"), "",
      f"Test: the first {n} test pairs under the limits (source and target "
      f"<= {config.data.max_source_tokens} / "
      f"{config.data.max_target_tokens} tokens; {data_line}). "
      f"Batch {t.batch_size}, argmax decoding, {seconds / 60:.1f} minutes "
      f"in all (training included, if any member trained); decoding's "
      f"{cost.load_summary(load)}.", "",
      f"Training budget per model: {config.train.num_steps} steps of batch "
      f"{config.train.batch_size}, d_model {config.model.d_model}, "
      f"{config.model.num_layers} layers (configs/translation.py).", "",
      "Models (validation loss: the training objective on the valid split, "
      "nats per target token):", "\n".join(models), "",
      f"BLEU signature: `{signature}`", "", _table(rows), "",
      "Columns: repetition = share of words equal to the word before; "
      "omission = share of the reference's content words missing; length "
      "in target tokens (signed < 0: too short); NFE = forward passes per "
      f"batch of {t.batch_size}; ms/sentence = median over {t.timed_runs} "
      "runs of the whole test set / sentences; speed-up = AR ms / decoder "
      "ms. KD = trained on the AR model's greedy outputs (sequence-level "
      "knowledge distillation).", "",
      "## Speed-up of each NAR setting over AR at its quality", "",
      speedup_table(rows), "", "## Batch-1 latency against source length",
      "", f"Median ms per sentence over up to {t.latency_sentences} test "
      "sentences per source-length bucket, decoders interleaved per "
      "sentence. The early-exit AR stops when the sentence ends; the fixed "
      "scan and the one-shot NAR run their fixed shapes whatever the "
      "length.", "", _table(latency), "", "## BLEU by reference length", "",
      _table(buckets), "", "## Samples", ""]
  for i, reference in enumerate(references[:3]):
    text.append(f"Reference: {reference}")
    text += [f"- {label}: {outs[i]}" for label, outs in samples.items()]
    text.append("")
  return "\n".join(text) + "\n"
