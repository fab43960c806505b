r"""NAR translation: AR greedy / beam, one-shot CMLM, Mask-Predict, CTC, KD.

  python experiments/translate.py --config=configs/translation.py \
      --workdir=/tmp/nat [--out=experiments/results/translation]

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
decoder and writes to --out (default --workdir, the run's folder):

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
the bidirectional prefix it was trained as (`prompt_attention`). The whole
test set is decoded by every decoder in turn, `translate.timed_runs` rounds
(`cost.interleaved`), after one compile call each.

The members come from `lm_decoding.training.translation_members`, the
decoders, scores and report from `lm_decoding.studies.translation_study`.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
from ml_collections import config_flags

from lm_decoding.data import parallel_text
from lm_decoding.evaluation import cost, records
from lm_decoding.studies import translation_study as study
from lm_decoding.training import distillation
from lm_decoding.training import translation_members

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs",
                           "translation.py"), "Translation config file.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run's folder: outputs, the data cache "
    "({workdir}/data) and the models trained here ({workdir}/{name}).",
    required=True)
_OUT = flags.DEFINE_string("out", "", "The record's folder (e.g. "
                           "experiments/results/translation); '' = --workdir.")
_RETRAIN = flags.DEFINE_bool(
    "retrain", False, "Train every model from scratch (and distil again) "
    "instead of loading the shipped ones; deletes {workdir}/{name} first.")
_EXPORT = flags.DEFINE_bool(
    "export", False, "Write the models trained here into the shipped set "
    f"({translation_members.SET_DIR}).")
_DECODE = flags.DEFINE_bool(
    "decode", True, "Decode the test pairs and write the results; "
    "--nodecode only loads, trains and (with --export) exports the models.")
_STOP_AT = flags.DEFINE_integer(
    "stop_at", None, "End each training run after this step although its "
    "schedule is train.num_steps' (a budget cut short; the manifest's "
    "metrics record the steps reached).")


def latency_rows(config, members, prompts, prompt_lengths) -> list[dict]:
  """Batch-1 ms per sentence against source length (median per bucket).

  Up to `translate.latency_sentences` sentences per source-length bucket;
  each sentence is decoded by every decoder in turn (`cost.interleaved`),
  after one compile call per decoder.
  """
  decoders = study.latency_decoders(config)
  one = lambda decoder, member, i: distillation.translate_all(
      decoder, members[member][0], prompts[i:i + 1],
      prompt_lengths[i:i + 1], 1)
  for _, member, decoder in decoders:  # compile
    one(decoder, member, 0)
  runs = {bucket: [cost.interleaved(
      {label: functools.partial(one, decoder, member, i)
       for label, member, decoder in decoders}, 1)[0] for i in sentences]
          for bucket, sentences in study.bucketed(
              prompt_lengths - 1, config.translate.latency_sentences).items()}
  return [{"decoder": label, "source_tokens": f"{low}-{high}",
           "sentences": len(times), "median_ms": round(float(np.median(
               [1e3 * t[label][0] for t in times])), 2)}
          for label, _, _ in decoders
          for (low, high), times in runs.items()]


def load(config, workdir: str):
  """(data, members), or exit with one line and no workdir left behind."""
  created = not os.path.exists(workdir)
  try:
    splits = translation_members.check(config, workdir)
    print(f"pairs: {config.data.path or 'bundled KJV / RV1909 pairs'}: "
          + ", ".join(f"{name} {len(pairs)}" for name, pairs in
                      splits.items()), flush=True)
    data = translation_members.prepare_data(config, workdir, _RETRAIN.value)
    print(f"encoded: {data.describe()}", flush=True)
    # Training checks its own data before it compiles (e.g. a valid split
    # smaller than a batch): the same one line, the same cleanup.
    members = translation_members.load_members(
        config, workdir, data, _RETRAIN.value, _EXPORT.value,
        records.command(), _STOP_AT.value)
  except ValueError as e:
    if created:
      shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(f"translate: error: {e}")
  return data, members


def main(argv):
  del argv
  logging.set_verbosity(logging.FATAL)  # orbax logs every restore
  config, workdir = _CONFIG.value, _WORKDIR.value
  out_dir = _OUT.value or workdir
  start = time.time()
  data, members = load(config, workdir)
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
  grid = study.decoders(config)
  decode = lambda decoder, member, rows: distillation.translate_all(
      decoder, members[member][0], prompts[:rows], prompt_lengths[:rows],
      batch)
  load_avg = [os.getloadavg()[0]]  # other jobs skew timings
  for _, member, decoder in grid:  # compile
    decode(decoder, member, batch)
  times, outputs = cost.interleaved(
      {label: functools.partial(decode, decoder, member, n)
       for label, member, decoder in grid}, config.translate.timed_runs)
  rows, buckets, samples, signature = [], [], {}, ""
  for label, member, _ in grid:
    tokens, nfe = outputs[label]
    hypotheses, counts = distillation.texts(data.tokenizer, tokens)
    row, signature = study.score(label, member, hypotheses, counts,
                                 references, reference_lengths)
    rows.append(dict(row, nfe=nfe, ms_per_sentence=round(
        1e3 * float(np.median(times[label])) / n, 3)))
    buckets += study.bucket_rows(label, hypotheses, references,
                                 reference_lengths)
    samples[label] = hypotheses[:3]
    print(f"{label}: BLEU {row['bleu']} ms/sent "
          f"{rows[-1]['ms_per_sentence']}", flush=True)
  study.add_speedups(rows)
  latency = latency_rows(config, members, prompts, prompt_lengths)
  load_avg.append(os.getloadavg()[0])
  for name, table in (("results", rows), ("buckets", buckets),
                      ("latency", latency)):
    records.write_csv(table, os.path.join(out_dir, f"{name}.csv"))
  study.plots(config, rows, buckets, latency, out_dir)
  with open(os.path.join(out_dir, "speedup.md"), "w") as f:
    f.write(study.speedup_table(rows) + "\n")
  with open(os.path.join(out_dir, "report.md"), "w") as f:
    f.write(study.report(config, rows, buckets, latency, samples, members,
                         references, data.describe(), n, signature,
                         time.time() - start, load_avg))
  print(f"wrote {out_dir} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
  app.run(main)
