r"""NAR translation: AR greedy / beam, one-shot CMLM, Mask-Predict, CTC.

  python experiments/translate.py --config=configs/translation.py \
      --workdir=/tmp/nat

Trains under --workdir what is missing (`train.train`, resumed or reused:
translation_ar, cmlm, ctc, each `train.num_steps` steps on the book-split
verse pairs; the joint tokenizer is cached in {workdir}/data), decodes the
first `translate.test_pairs` test pairs under the length limits (file order:
Jonah, Micah, Mark, 1 Peter) with every decoder, and writes to
{workdir}/results (or --results):

  results.csv / report.md  per decoder: BLEU (sacreBLEU, signature in the
                           report), chrF, consecutive repetition, omission,
                           length error (tokens), NFE per batch, ms/sentence
                           (minimum of `translate.timed_runs` whole-set
                           runs, compile excluded), speed-up over AR greedy
  buckets.csv              BLEU by reference length (target tokens)
  mask_predict.png         BLEU and ms/sentence against iterations K for
                           each length beam l
  buckets.png              BLEU by reference-length bucket per decoder

Every decoder is argmax (deterministic); the AR decoders read the source as
the bidirectional prefix it was trained as (`prompt_attention`).
"""

from __future__ import annotations

import csv
import os
import time

from absl import app
from absl import flags
from absl import logging
import matplotlib
import numpy as np
from ml_collections import config_flags

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lm_decoding.data import parallel_text  # noqa: E402
from lm_decoding.decoding import base, sampling  # noqa: E402
from lm_decoding.decoding.autoregressive import AutoregressiveDecoder  # noqa: E402
from lm_decoding.decoding.beam_search import BeamSearchDecoder  # noqa: E402
from lm_decoding.decoding.ctc import CTCDecoder  # noqa: E402
from lm_decoding.decoding.mask_predict import MaskPredictDecoder  # noqa: E402
from lm_decoding.evaluation import translation_metrics as tm  # noqa: E402
from lm_decoding.models import make_logits_fn  # noqa: E402
from lm_decoding.special_tokens import EOS_ID, PAD_ID  # noqa: E402
from lm_decoding.training import pretrained, train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "translation.py"), "Translation config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Models and data cache.",
                               required=True)
_RESULTS = flags.DEFINE_string("results", None,
                               "Output folder; default {workdir}/results.")
BUCKETS = ((1, 10), (11, 20), (21, 30), (31, 40))


def _model(config, objective, workdir):
  """Trains (or reuses) the objective's model; returns (Model, summary)."""
  cfg = config.copy_and_resolve_references()
  cfg.train.objective = objective
  model_dir = os.path.join(workdir, objective)
  summary = train.train(cfg, model_dir, progress=False,
                        data_dir=os.path.join(workdir, "data"))
  print(f"{objective}: {summary['steps']} steps, valid loss "
        f"{summary['valid_loss']:.3f} ({summary['wall_s']:.0f} s)", flush=True)
  logits_fn = make_logits_fn(train.model_config(cfg))
  return base.Model(logits_fn, pretrained.load_trained_params(cfg, model_dir)
                    ), summary


def _decoders(config):
  """[(label, objective of the model, decoder)]."""
  limit, t = config.data.max_target_tokens, config.translate
  greedy = sampling.SamplingConfig(temperature=0.0)
  ar = dict(output_length=limit + 1, eos_ids=(EOS_ID,), pad_id=PAD_ID,
            prompt_attention="bidirectional")
  out = [("AR greedy", "translation_ar",
          AutoregressiveDecoder(sampling=greedy, **ar)),
         (f"AR beam {t.num_beams}", "translation_ar",
          BeamSearchDecoder(num_beams=t.num_beams, **ar))]
  for beam in t.length_beams:
    for steps in t.mask_predict_steps:
      name = "CMLM one-shot" if steps == 1 else f"Mask-Predict K={steps}"
      out.append((f"{name} l={beam}", "cmlm", MaskPredictDecoder(
          output_length=limit, steps=steps, length_beam=beam,
          lengths="head")))
  out.append((f"CTC x{config.train.ctc_upsample}", "ctc", CTCDecoder(
      output_length=limit + 1, upsample=config.train.ctc_upsample)))
  return out


def _run(decoder, model, prompts, lengths, batch):
  """Decodes every row in batches: (tokens int32[N, T], NFE per batch)."""
  tokens, nfe = [], []
  for start in range(0, len(prompts), batch):
    result = decoder.decode({"model": model}, prompts[start:start + batch],
                            lengths[start:start + batch], None)
    tokens.append(np.asarray(result.tokens))
    nfe.append(int(result.nfe))
  return np.concatenate(tokens), float(np.mean(nfe))


def _texts(tokenizer, tokens_NxT):
  """(texts, token counts): each row up to its first EOS / PAD."""
  texts, counts = [], []
  for row in tokens_NxT:
    ids = []
    for token in row.tolist():
      if token in (EOS_ID, PAD_ID):
        break
      ids.append(token)
    texts.append(tokenizer.decode(ids))
    counts.append(len(ids))
  return texts, np.array(counts)


def _write_csv(path, rows):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)  # orbax logs every restore
  config, workdir = _CONFIG.value, _WORKDIR.value
  out_dir = _RESULTS.value or os.path.join(workdir, "results")
  os.makedirs(out_dir, exist_ok=True)
  start = time.time()
  models, summaries = {}, {}
  for objective in train.TRANSLATION_OBJECTIVES:
    models[objective], summaries[objective] = _model(config, objective,
                                                     workdir)
  data = parallel_text.prepare(
      config.data.vocab_size, config.data.max_source_tokens,
      config.data.max_target_tokens, config.data.path,
      cache_dir=os.path.join(workdir, "data"))
  test = data.splits["test"]
  n = config.translate.test_pairs or len(test.pairs)
  prompts, prompt_lengths = parallel_text.prompts(test)
  prompts, prompt_lengths = prompts[:n], prompt_lengths[:n]
  references = [p.target for p in test.pairs[:n]]
  reference_lengths = test.target_lengths[:n]
  batch = config.translate.batch_size
  rows, bucket_rows, samples = [], [], {}
  signature = ""
  for label, objective, decoder in _decoders(config):
    model = models[objective]
    _run(decoder, model, prompts[:batch], prompt_lengths[:batch], batch)
    times = []
    for _ in range(config.translate.timed_runs):
      tick = time.perf_counter()
      tokens, nfe = _run(decoder, model, prompts, prompt_lengths, batch)
      times.append(time.perf_counter() - tick)
    hypotheses, counts = _texts(data.tokenizer, tokens)
    bleu = tm.corpus_bleu(hypotheses, references)
    signature = bleu.signature
    error = tm.length_error(counts, reference_lengths)
    rows.append({
        "decoder": label, "model": objective,
        "bleu": round(bleu.score, 2),
        "chrf": round(tm.corpus_chrf(hypotheses, references).score, 2),
        "repetition": round(float(np.nanmean(
            tm.consecutive_repetition_rate(hypotheses))), 4),
        "omission": round(float(np.nanmean(
            tm.omission_rate(hypotheses, references))), 4),
        "length_mean_abs": round(error["mean_abs"], 2),
        "length_mean_signed": round(error["mean_signed"], 2),
        "length_exact": round(error["exact"], 3),
        "nfe": nfe, "ms_per_sentence": round(1e3 * min(times) / n, 3)})
    for low, high in BUCKETS:
      chosen = [i for i in range(n) if low <= reference_lengths[i] <= high]
      if chosen:
        bucket_rows.append({
            "decoder": label, "bucket": f"{low}-{high}",
            "sentences": len(chosen), "bleu": round(tm.corpus_bleu(
                [hypotheses[i] for i in chosen],
                [references[i] for i in chosen]).score, 2)})
    samples[label] = hypotheses[:3]
    print(f"{label}: BLEU {rows[-1]['bleu']} ms/sent "
          f"{rows[-1]['ms_per_sentence']}", flush=True)
  ar_ms = rows[0]["ms_per_sentence"]
  for row in rows:
    row["speedup_vs_ar_greedy"] = round(ar_ms / row["ms_per_sentence"], 2)
  _write_csv(os.path.join(out_dir, "results.csv"), rows)
  _write_csv(os.path.join(out_dir, "buckets.csv"), bucket_rows)
  _plots(config, rows, bucket_rows, out_dir)
  _report(config, rows, bucket_rows, samples, summaries, references,
          data, n, signature, time.time() - start, out_dir)
  print(f"wrote {out_dir} ({time.time() - start:.0f} s)")


def _plots(config, rows, bucket_rows, out_dir):
  by_label = {r["decoder"]: r for r in rows}
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  steps = config.translate.mask_predict_steps
  for beam in config.translate.length_beams:
    picked = [r for r in rows if r["model"] == "cmlm"
              and r["decoder"].endswith(f"l={beam}")]
    left.plot(steps, [r["bleu"] for r in picked], "o-", label=f"l={beam}")
    right.plot(steps, [r["ms_per_sentence"] for r in picked], "o-",
               label=f"l={beam}")
  for axis, key in ((left, "bleu"), (right, "ms_per_sentence")):
    axis.axhline(by_label["AR greedy"][key], color="k", ls="--",
                 label="AR greedy")
    axis.set_xlabel("Mask-Predict iterations K")
    axis.set_ylabel(key)
    axis.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "mask_predict.png"), dpi=100)
  plt.close(fig)
  fig, axis = plt.subplots(figsize=(7, 4))
  buckets = [f"{low}-{high}" for low, high in BUCKETS]
  chosen = ["AR greedy", f"AR beam {config.translate.num_beams}",
            "CMLM one-shot l=1", "Mask-Predict K=10 l=5",
            f"CTC x{config.train.ctc_upsample}"]
  for label in chosen:
    score = {r["bucket"]: r["bleu"] for r in bucket_rows
             if r["decoder"] == label}
    axis.plot(buckets, [score.get(b, np.nan) for b in buckets], "o-",
              label=label)
  axis.set_xlabel("reference length (target tokens)")
  axis.set_ylabel("BLEU")
  axis.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "buckets.png"), dpi=100)
  plt.close(fig)


def _table(rows, keys):
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
  return "\n".join(lines)


def _report(config, rows, bucket_rows, samples, summaries, references, data,
            n, signature, seconds, out_dir):
  models = "\n".join(
      f"- {name}: {s['num_params']:,} parameters, {s['steps']} steps, "
      f"validation loss {s['valid_loss']:.3f} nats/token"
      for name, s in summaries.items())
  text = [
      "# NAR translation: English -> Spanish (KJV -> RV1909)", "",
      f"Test: the first {n} test pairs under the limits (source and target "
      f"<= {config.data.max_source_tokens} / "
      f"{config.data.max_target_tokens} tokens; {data.describe()}). "
      f"Batch {config.translate.batch_size}, argmax decoding, "
      f"{seconds / 60:.1f} minutes in all.", "", "Models:", models, "",
      f"BLEU signature: `{signature}`", "",
      _table(rows, list(rows[0])), "",
      "Columns: repetition = share of words equal to the word before; "
      "omission = share of the reference's content words missing; length "
      "in target tokens (signed < 0: too short); NFE = forward passes per "
      f"batch of {config.translate.batch_size}; ms/sentence = minimum over "
      f"{config.translate.timed_runs} runs of the whole test set / "
      "sentences; speed-up = AR greedy ms / decoder ms.", "",
      "## BLEU by reference length", "", _table(bucket_rows,
                                                list(bucket_rows[0])), "",
      "## Samples", ""]
  for i, reference in enumerate(references[:3]):
    text.append(f"Reference: {reference}")
    text += [f"- {label}: {outs[i]}" for label, outs in samples.items()]
    text.append("")
  with open(os.path.join(out_dir, "report.md"), "w") as f:
    f.write("\n".join(text) + "\n")


if __name__ == "__main__":
  app.run(main)
