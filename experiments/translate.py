r"""NAR translation: AR greedy / beam, one-shot CMLM, Mask-Predict, CTC, KD.

  python experiments/translate.py --config=configs/translation.py \
      --workdir=/tmp/nat

The pairs are the bundled KJV -> RV1909 verses, or your own file
(`--config.data.path`, `reference<TAB>source<TAB>target` or
`source<TAB>target`; see `lm_decoding.data.parallel_text` and
docs/import_and_data.md). The file is read, checked and split before
anything is created; bad input (a malformed or empty file, a vocabulary too
large for it, a split smaller than a batch, a bad option) ends the run with
one line, `translate: error: ...`, and removes the workdir if this run
created it.

Loads the shipped translation models (`lm_decoding/pretrained/translation/`:
translation_ar, cmlm, ctc and, with `translate.distill`, cmlm_distilled and
ctc_distilled) when their manifest's recipe matches the config and their
tokenizer the shipped one; any that does not match, or every one with
--retrain, is trained under {workdir}/{name} (`train.train`, resumed or
reused; the joint tokenizer is cached in {workdir}/data, seeded from the
shipped set when it has one). --export writes the trained ones into the
shipped set (parameters stored as bfloat16, manifest with this command)
and decodes the exported parameters as loaded back from it.

Sequence-level knowledge distillation (Kim & Rush 2016; `translate.distill`):
before a *_distilled member trains, the AR model translates every train
source (greedy, not the paper's beam: a 4-beam decode of the ~20k train
sources costs ~8x greedy on 2 CPU cores) and {workdir}/data/
distilled_pairs.tsv.gz holds the train pairs with those outputs as targets
(`training.distillation`); the distilled students train on exactly the
sources and budget of the reference ones (`data.targets='distilled'`).

Then decodes the first `translate.test_pairs` test pairs under the length
limits (file order; bundled pairs: Jonah, Micah, Mark, 1 Peter) with every
decoder and writes to {workdir}/results (or --results):

  results.csv / report.md  per decoder: BLEU (sacreBLEU, signature in the
                           report), chrF, consecutive repetition, omission,
                           length error (tokens), NFE per batch, ms/sentence
                           (median of `translate.timed_runs` whole-set runs
                           at batch `translate.batch_size`, compile
                           excluded), speed-up over AR greedy and AR beam
  speedup.md               each NAR setting: BLEU beside AR's, speed-up
  buckets.csv              BLEU by reference length (target tokens)
  latency.csv              batch-1 latency of AR (early exit and fixed scan)
                           and one-shot NAR against source length
  mask_predict.png         BLEU and ms/sentence against iterations K for
                           each length beam l (distilled: dashed)
  buckets.png              BLEU by reference-length bucket per decoder
  latency.png              batch-1 latency against source length

Every decoder is argmax (deterministic); the AR decoders read the source as
the bidirectional prefix it was trained as (`prompt_attention`).
"""

from __future__ import annotations

import csv
import os
import pathlib
import shlex
import shutil
import sys
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
from lm_decoding.decoding.autoregressive import EarlyExitDecoder  # noqa: E402
from lm_decoding.decoding.beam_search import BeamSearchDecoder  # noqa: E402
from lm_decoding.decoding.ctc import CTCDecoder  # noqa: E402
from lm_decoding.decoding.mask_predict import MaskPredictDecoder  # noqa: E402
from lm_decoding.evaluation import cost  # noqa: E402
from lm_decoding.evaluation import translation_metrics as tm  # noqa: E402
from lm_decoding.models import make_logits_fn  # noqa: E402
from lm_decoding.special_tokens import EOS_ID, PAD_ID  # noqa: E402
from lm_decoding.training import distillation, pretrained, train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "translation.py"), "Translation config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Models and data cache.",
                               required=True)
_RESULTS = flags.DEFINE_string("results", None,
                               "Output folder; default {workdir}/results.")
_RETRAIN = flags.DEFINE_bool(
    "retrain", False, "Train every model from scratch (and distil again) "
    "instead of loading the shipped ones; deletes {workdir}/{name} first.")
_EXPORT = flags.DEFINE_bool(
    "export", False, "Write the models trained here into the shipped set "
    f"({pretrained.TRANSLATION_DIR}).")
_DECODE = flags.DEFINE_bool(
    "decode", True, "Decode the test pairs and write the results; "
    "--nodecode only loads, trains and (with --export) exports the models.")
_STOP_AT = flags.DEFINE_integer(
    "stop_at", None, "End each training run after this step although its "
    "schedule is train.num_steps' (a budget cut short; the manifest's "
    "metrics record the steps reached).")
SET_DIR = pretrained.TRANSLATION_DIR
STORED_DTYPE = "bfloat16"  # 5 models of ~0.8M parameters: 16 MB in float32
BUCKETS = ((1, 12), (13, 24), (25, 36), (37, 48))


def _teacher_decoder(config):
  """The distillation teacher's decoder: AR greedy (see module doc)."""
  return AutoregressiveDecoder(
      sampling=sampling.SamplingConfig(temperature=0.0),
      output_length=config.data.max_target_tokens + 1, eos_ids=(EOS_ID,),
      pad_id=PAD_ID, prompt_attention="bidirectional")


def _distil(config, data, teacher, data_dir):
  """Writes {data_dir}/distilled_pairs.tsv.gz unless there; returns a note."""
  path = pathlib.Path(data_dir, parallel_text.DISTILLED_FILE)
  if path.exists():
    return f"distilled targets reused from {path}"
  tick = time.time()
  distilled = distillation.distil(
      _teacher_decoder(config), teacher, data.tokenizer,
      data.splits["train"], config.translate.distill_batch_size)
  distillation.write_distilled(data_dir, distilled, config.data.path)
  note = (f"distilled targets: translation_ar greedy on the "
          f"{len(distilled.pairs)} train sources under the limits, "
          f"{distilled.kept_reference} kept their reference (teacher output "
          f"empty or over the limit), {time.time() - tick:.0f} s")
  print(note, flush=True)
  return note


def check(config, workdir):
  """Checks the options and reads the pairs file; creates nothing.

  Returns:
    The pairs' splits (`parallel_text.split_pairs`), for the summary line.
  Raises:
    ValueError: naming the config key, or the pairs file and its line
      (`parallel_text.read_pairs`, `split_pairs`); --workdir a file.
  """
  for member in pretrained.translation_member_configs(config).values():
    train.check_config(member)
  if os.path.isfile(workdir):
    raise ValueError(f"--workdir={workdir} is a file; give a directory")
  return parallel_text.split_pairs(parallel_text.read_pairs(config.data.path))


def prepare_data(config, workdir, retrain):
  """The tokenizer and encoded splits, cached in {workdir}/data.

  The bundled pairs start from the shipped set's tokenizer (so the shipped
  models apply); another file trains its own.

  Raises:
    ValueError: the data cache holds another tokenizer than the shipped
      set's (give another --workdir); any error of `parallel_text.prepare`
      (a vocabulary too large for the file, no pair under the limits).
  """
  data_dir = os.path.join(workdir, "data")
  shipped_tokenizer = SET_DIR / pretrained.TOKENIZER_FILE
  cached = pathlib.Path(data_dir, parallel_text.TOKENIZER_FILE)
  if shipped_tokenizer.exists() and not config.data.path:
    if not cached.exists():
      cached.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(shipped_tokenizer, cached)
    elif cached.read_bytes() != shipped_tokenizer.read_bytes():
      raise ValueError(f"{cached} is another tokenizer than the shipped "
                       f"{shipped_tokenizer}; give another --workdir")
  if retrain:
    pathlib.Path(data_dir, parallel_text.DISTILLED_FILE).unlink(
        missing_ok=True)
  return parallel_text.prepare(
      config.data.vocab_size, config.data.max_source_tokens,
      config.data.max_target_tokens, config.data.path, cache_dir=data_dir)


def load_members(config, workdir, retrain, export, data):
  """{name: (Model, metrics, source)}, in the order of
  `pretrained.translation_member_configs`, for `data` (`prepare_data`)."""
  data_dir = os.path.join(workdir, "data")
  command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
  members = {}
  for name, cfg in pretrained.translation_member_configs(config).items():
    model_dir = os.path.join(workdir, name)
    params, source = (None, "--retrain") if retrain else pretrained.find(
        cfg, name, data.tokenizer, SET_DIR)
    if params is not None:
      metrics = pretrained.read_manifest(name, SET_DIR)["metrics"]
    else:
      if retrain:
        shutil.rmtree(model_dir, ignore_errors=True)
      note = None
      if cfg.data.targets == "distilled":
        note = _distil(config, data, members["translation_ar"][0], data_dir)
      print(f"{name}: {source}; training {cfg.train.num_steps} steps in "
            f"{model_dir}", flush=True)
      metrics = train.train(cfg, model_dir, progress=False,
                            data_dir=data_dir, stop_at=_STOP_AT.value)
      if note:
        metrics["distillation"] = note
      if metrics["steps"] < cfg.train.num_steps:
        metrics["stopped_early"] = (
            f"stopped at step {metrics['steps']} of the "
            f"{cfg.train.num_steps}-step schedule (--stop_at)")
      params = pretrained.load_trained_params(cfg, model_dir)
      source = f"trained in {model_dir}"
      if export:  # then decode the exported (rounded) parameters
        pretrained.export(cfg, model_dir, name, data.tokenizer, command,
                          metrics, SET_DIR, stored_dtype=STORED_DTYPE)
        params, _ = pretrained.find(cfg, name, data.tokenizer, SET_DIR)
        source += f", exported to {SET_DIR / name} and loaded back"
    print(f"{name}: {metrics['steps']} steps, valid loss "
          f"{metrics['valid_loss']:.3f} ({source})", flush=True)
    logits_fn = make_logits_fn(train.model_config(cfg))
    members[name] = (base.Model(logits_fn, params), metrics, source)
  return members


def _decoders(config):
  """[(label, member, decoder)]."""
  limit, t = config.data.max_target_tokens, config.translate
  greedy = sampling.SamplingConfig(temperature=0.0)
  ar = dict(output_length=limit + 1, eos_ids=(EOS_ID,), pad_id=PAD_ID,
            prompt_attention="bidirectional")
  out = [("AR greedy", "translation_ar",
          AutoregressiveDecoder(sampling=greedy, **ar)),
         (f"AR beam {t.num_beams}", "translation_ar",
          BeamSearchDecoder(num_beams=t.num_beams, **ar))]
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
  ctc = CTCDecoder(output_length=limit + 1, upsample=config.train.ctc_upsample)
  out.append((f"CTC x{config.train.ctc_upsample}", "ctc", ctc))
  if t.distill:
    out.append((f"CTC x{config.train.ctc_upsample} KD", "ctc_distilled", ctc))
  return out


def _latency(config, members, prompts, prompt_lengths):
  """Batch-1 ms per sentence against source length (median per bucket).

  Up to `translate.latency_sentences` sentences per source-length bucket;
  each sentence is decoded by every decoder in turn (interleaved), after
  one compile call per decoder.
  """
  limit = config.data.max_target_tokens
  greedy = sampling.SamplingConfig(temperature=0.0)
  ar = dict(output_length=limit + 1, eos_ids=(EOS_ID,), pad_id=PAD_ID,
            prompt_attention="bidirectional", sampling=greedy)
  decoders = [
      ("AR greedy, early exit", "translation_ar", EarlyExitDecoder(**ar)),
      ("AR greedy, fixed scan", "translation_ar", AutoregressiveDecoder(**ar)),
      ("CMLM one-shot l=1", "cmlm", MaskPredictDecoder(
          output_length=limit, steps=1, length_beam=1, lengths="head")),
      (f"CTC x{config.train.ctc_upsample}", "ctc", CTCDecoder(
          output_length=limit + 1, upsample=config.train.ctc_upsample))]
  source_lengths = prompt_lengths - 1
  picked = []
  for low, high in BUCKETS:
    rows = np.flatnonzero((source_lengths >= low) & (source_lengths <= high))
    picked += [(low, high, i) for i in rows[:config.translate.latency_sentences]]
  for _, member, decoder in decoders:  # compile
    distillation.translate_all(decoder, members[member][0], prompts[:1],
                               prompt_lengths[:1], 1)
  times = {label: [] for label, _, _ in decoders}
  for _, _, i in picked:
    for label, member, decoder in decoders:
      tick = time.perf_counter()
      distillation.translate_all(decoder, members[member][0],
                                 prompts[i:i + 1], prompt_lengths[i:i + 1], 1)
      times[label].append(1e3 * (time.perf_counter() - tick))
  rows = []
  for label, _, _ in decoders:
    for low, high in BUCKETS:
      chosen = [t for (lo, _, _), t in zip(picked, times[label]) if lo == low]
      if chosen:
        rows.append({"decoder": label, "source_tokens": f"{low}-{high}",
                     "sentences": len(chosen),
                     "median_ms": round(float(np.median(chosen)), 2)})
  return rows


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
  start = time.time()
  created = not os.path.exists(workdir)
  try:  # bad input: one line, and no workdir left behind
    splits = check(config, workdir)
    print(f"pairs: {config.data.path or 'bundled KJV / RV1909 pairs'}: "
          + ", ".join(f"{name} {len(pairs)}" for name, pairs in
                      splits.items()), flush=True)
    data = prepare_data(config, workdir, _RETRAIN.value)
    print(f"encoded: {data.describe()}", flush=True)
    # Training checks its own data before it compiles (e.g. a valid split
    # smaller than a batch): the same one line, the same cleanup.
    members = load_members(config, workdir, _RETRAIN.value, _EXPORT.value,
                           data)
  except ValueError as e:
    if created:
      shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(f"translate: error: {e}")
  os.makedirs(out_dir, exist_ok=True)
  if not _DECODE.value:
    return
  test = data.splits["test"]
  n = config.translate.test_pairs or len(test.pairs)
  prompts, prompt_lengths = parallel_text.prompts(test)
  prompts, prompt_lengths = prompts[:n], prompt_lengths[:n]
  references = [p.target for p in test.pairs[:n]]
  reference_lengths = test.target_lengths[:n]
  batch = config.translate.batch_size
  rows, bucket_rows, samples = [], [], {}
  signature = ""
  load = [os.getloadavg()[0]]  # 1-minute load average: other jobs skew timings
  for label, member, decoder in _decoders(config):
    model = members[member][0]
    distillation.translate_all(decoder, model, prompts[:batch],
                               prompt_lengths[:batch], batch)  # compile
    times = []
    for _ in range(config.translate.timed_runs):
      tick = time.perf_counter()
      tokens, nfe = distillation.translate_all(decoder, model, prompts,
                                               prompt_lengths, batch)
      times.append(time.perf_counter() - tick)
    hypotheses, counts = distillation.texts(data.tokenizer, tokens)
    bleu = tm.corpus_bleu(hypotheses, references)
    signature = bleu.signature
    error = tm.length_error(counts, reference_lengths)
    rows.append({
        "decoder": label, "model": member,
        "bleu": round(bleu.score, 2),
        "chrf": round(tm.corpus_chrf(hypotheses, references).score, 2),
        "repetition": round(float(np.nanmean(
            tm.consecutive_repetition_rate(hypotheses))), 4),
        "omission": round(float(np.nanmean(
            tm.omission_rate(hypotheses, references))), 4),
        "length_mean_abs": round(error["mean_abs"], 2),
        "length_mean_signed": round(error["mean_signed"], 2),
        "length_exact": round(error["exact"], 3),
        "nfe": nfe,
        "ms_per_sentence": round(1e3 * float(np.median(times)) / n, 3)})
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
  ar_greedy, ar_beam = rows[0], rows[1]
  for row in rows:
    row["speedup_vs_ar_greedy"] = round(
        ar_greedy["ms_per_sentence"] / row["ms_per_sentence"], 2)
    row["speedup_vs_ar_beam"] = round(
        ar_beam["ms_per_sentence"] / row["ms_per_sentence"], 2)
  latency_rows = _latency(config, members, prompts, prompt_lengths)
  load.append(os.getloadavg()[0])
  _write_csv(os.path.join(out_dir, "results.csv"), rows)
  _write_csv(os.path.join(out_dir, "buckets.csv"), bucket_rows)
  _write_csv(os.path.join(out_dir, "latency.csv"), latency_rows)
  _plots(config, rows, bucket_rows, latency_rows, out_dir)
  speedup = _speedup_table(rows)
  with open(os.path.join(out_dir, "speedup.md"), "w") as f:
    f.write(speedup + "\n")
  _report(config, rows, bucket_rows, latency_rows, speedup, samples, members,
          references, data, n, signature, time.time() - start, load, out_dir)
  print(f"wrote {out_dir} ({time.time() - start:.0f} s)")


def _speedup_table(rows):
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


def _plots(config, rows, bucket_rows, latency_rows, out_dir):
  by_label = {r["decoder"]: r for r in rows}
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
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
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "mask_predict.png"), dpi=100)
  plt.close(fig)
  fig, axis = plt.subplots(figsize=(7, 4))
  buckets = [f"{low}-{high}" for low, high in BUCKETS]
  chosen = ["AR greedy", f"AR beam {config.translate.num_beams}",
            "CMLM one-shot l=1", "Mask-Predict K=10 l=5",
            f"CTC x{config.train.ctc_upsample}"]
  if config.translate.distill:
    chosen += ["CMLM one-shot l=1 KD", f"CTC x{config.train.ctc_upsample} KD"]
  for label in chosen:
    score = {r["bucket"]: r["bleu"] for r in bucket_rows
             if r["decoder"] == label}
    axis.plot(buckets, [score.get(b, np.nan) for b in buckets], "o-",
              label=label)
  axis.set_xlabel("reference length (target tokens)")
  axis.set_ylabel("BLEU")
  axis.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "buckets.png"), dpi=100)
  plt.close(fig)
  fig, axis = plt.subplots(figsize=(7, 4))
  for label in dict.fromkeys(r["decoder"] for r in latency_rows):
    picked = [r for r in latency_rows if r["decoder"] == label]
    axis.plot([r["source_tokens"] for r in picked],
              [r["median_ms"] for r in picked], "o-", label=label)
  axis.set_xlabel("source length (tokens)")
  axis.set_ylabel("ms per sentence, batch 1 (median)")
  axis.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "latency.png"), dpi=100)
  plt.close(fig)


def _table(rows, keys):
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
  return "\n".join(lines)


def _report(config, rows, bucket_rows, latency_rows, speedup, samples,
            members, references, data, n, signature, seconds, load, out_dir):
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
      f"{config.data.max_target_tokens} tokens; {data.describe()}). "
      f"Batch {t.batch_size}, argmax decoding, {seconds / 60:.1f} minutes "
      f"in all (training included, if any member trained); decoding's "
      f"{cost.load_summary(load)}.", "",
      f"Training budget per model: {config.train.num_steps} steps of batch "
      f"{config.train.batch_size}, d_model {config.model.d_model}, "
      f"{config.model.num_layers} layers (configs/translation.py).", "",
      "Models (validation loss: the training objective on the valid split, "
      "nats per target token):", "\n".join(models), "",
      f"BLEU signature: `{signature}`", "",
      _table(rows, list(rows[0])), "",
      "Columns: repetition = share of words equal to the word before; "
      "omission = share of the reference's content words missing; length "
      "in target tokens (signed < 0: too short); NFE = forward passes per "
      f"batch of {t.batch_size}; ms/sentence = median over {t.timed_runs} "
      "runs of the whole test set / sentences; speed-up = AR ms / decoder "
      "ms. KD = trained on the AR model's greedy outputs (sequence-level "
      "knowledge distillation).", "",
      "## Speed-up of each NAR setting over AR at its quality", "", speedup,
      "", "## Batch-1 latency against source length", "",
      f"Median ms per sentence over up to {t.latency_sentences} test "
      "sentences per source-length bucket, decoders interleaved per "
      "sentence. The early-exit AR stops when the sentence ends; the fixed "
      "scan and the one-shot NAR run their fixed shapes whatever the "
      "length.", "", _table(latency_rows, list(latency_rows[0])), "",
      "## BLEU by reference length", "",
      _table(bucket_rows, list(bucket_rows[0])), "", "## Samples", ""]
  for i, reference in enumerate(references[:3]):
    text.append(f"Reference: {reference}")
    text += [f"- {label}: {outs[i]}" for label, outs in samples.items()]
    text.append("")
  with open(os.path.join(out_dir, "report.md"), "w") as f:
    f.write("\n".join(text) + "\n")


if __name__ == "__main__":
  app.run(main)
