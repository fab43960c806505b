r"""A short real run of the data pipeline and training on a corpus in each format.

  python experiments/corpus_formats.py --workdir=/tmp/corpus_formats \
      --out=experiments/results/corpus_formats

Builds four corpora under {workdir}/corpora from the real texts of
--source_dir (see its PROVENANCE.md), one for each kind of `data.path` and
`data.format` that docs/corpus.md ("Your own corpus") documents:

  paragraphs  austen.txt          Austen's novels as a plain-text file of
                                  blank-line separated paragraphs (auto)
  lines       kjv_en.txt          the King James Version, one verse a line
                                  (auto)
  folder      kjv_books/          the same verses, one file per book (66
                                  files; data.format=lines given explicitly)
  gz          austen_lines.txt.gz Austen, one paragraph a line, gzipped (auto)

then runs `experiments/train.py --config=configs/tiny.py` on each for
--num_steps steps in a fresh workdir {workdir}/{name}, and writes that run's
console output (the detected format, the split sizes, the training bar, the
final validation perplexity) to `{out}/{name}.log` (the progress bar's
carriage returns written as new lines) and a table of all four to
`{out}/summary.md`. The corpora and training workdirs stay in --workdir;
nothing of them is committed.
"""

import gzip
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags

from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import pipeline

REPO = pathlib.Path(__file__).resolve().parent.parent

_SOURCE_DIR = flags.DEFINE_string(
    "source_dir", "/work/shared/data",
    "Folder holding austen.txt.gz and kjv_rv1909_pairs.tsv.gz.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "/tmp/lm_decoding_corpus_formats", "The run's folder: the "
    "corpora ({workdir}/corpora) and one training workdir per corpus "
    "({workdir}/{name}, emptied first).")
_OUT = flags.DEFINE_string(
    "out", str(REPO / "experiments" / "results" / "corpus_formats"),
    "The record's folder: the logs and summary.md.")
_NUM_STEPS = flags.DEFINE_integer("num_steps", 30, "Training steps per run.")

# name -> (data.path relative to {workdir}/corpora, data.format, path kind)
RUNS = {
    "paragraphs": ("austen.txt", "auto", "text file"),
    "lines": ("kjv_en.txt", "auto", "text file"),
    "folder": ("kjv_books", "lines", "folder"),
    "gz": ("austen_lines.txt.gz", "auto", ".gz file"),
}
VOCAB_SIZE = 4096  # the tiny config's
# A short run: the tiny config's model and data, few steps, a small eval.
OVERRIDES = ("--config.train.warmup_steps=10",
             "--config.train.eval_batches=4")


def kjv_verses(source_dir: pathlib.Path) -> list[tuple[str, str]]:
  """(book, English verse) for each line of kjv_rv1909_pairs.tsv.gz, in order."""
  verses = []
  with gzip.open(source_dir / "kjv_rv1909_pairs.tsv.gz", "rt",
                 encoding="utf-8") as f:
    for line in f:
      reference, english, _ = line.rstrip("\n").split("\t")
      verses.append((reference.rsplit(" ", 1)[0], english))
  return verses


def build_corpora(source_dir: pathlib.Path, corpus_dir: pathlib.Path) -> None:
  """Writes the four corpora of the module docstring into `corpus_dir`."""
  if corpus_dir.exists():
    shutil.rmtree(corpus_dir)
  books = corpus_dir / "kjv_books"
  books.mkdir(parents=True)
  with gzip.open(source_dir / "austen.txt.gz", "rt", encoding="utf-8") as f:
    austen = f.read()
  (corpus_dir / "austen.txt").write_text(austen, encoding="utf-8")
  paragraphs = corpus_lib.load_paragraphs(str(corpus_dir / "austen.txt"))
  with gzip.open(corpus_dir / "austen_lines.txt.gz", "wt",
                 encoding="utf-8") as f:
    f.write("\n".join(paragraphs) + "\n")
  verses = kjv_verses(source_dir)
  (corpus_dir / "kjv_en.txt").write_text(
      "\n".join(text for _, text in verses) + "\n", encoding="utf-8")
  by_book = {}
  for book, text in verses:
    by_book.setdefault(book, []).append(text)
  for number, (book, texts) in enumerate(by_book.items(), start=1):
    name = f"{number:02d}_{book.lower().replace(' ', '_')}.txt"
    (books / name).write_text("\n".join(texts) + "\n", encoding="utf-8")


def last_valid_ppl(workdir: pathlib.Path) -> tuple[float, float]:
  """(step-0, final) validation perplexity from `{workdir}/metrics.jsonl`."""
  with open(workdir / "metrics.jsonl") as f:
    ppls = [r["valid_ppl"] for r in map(json.loads, filter(str.strip, f))
            if "valid_ppl" in r]
  return ppls[0], ppls[-1]


def run_one(name: str, corpus_dir: pathlib.Path, work_root: pathlib.Path,
            out_dir: pathlib.Path, num_steps: int) -> dict:
  """Trains on corpus `name`, writes its log; returns its summary row."""
  relative, data_format, kind = RUNS[name]
  path = corpus_dir / relative
  workdir = work_root / name
  shutil.rmtree(workdir, ignore_errors=True)
  command = [sys.executable, "experiments/train.py",
             "--config=configs/tiny.py", f"--workdir={workdir}",
             f"--config.data.path={path}",
             f"--config.data.format={data_format}",
             f"--config.data.vocab_size={VOCAB_SIZE}",
             f"--config.train.num_steps={num_steps}",
             f"--config.train.eval_every={num_steps}",
             f"--config.train.checkpoint_every={num_steps}", *OVERRIDES]
  print(f"== {name}: {' '.join(command[1:])}", flush=True)
  start = time.time()
  done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, check=False,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
  wall_s = time.time() - start
  console = done.stdout.replace("\r", "\n")
  log = (f"$ python {' '.join(command[1:])}\n{console}"
         f"[exit status {done.returncode}, {wall_s:.0f} s wall]\n")
  (out_dir / f"{name}.log").write_text(log, encoding="utf-8")
  print(console, flush=True)
  if done.returncode:
    raise RuntimeError(f"{name}: train.py exited with {done.returncode}")
  # A cache hit: reads the text again, reuses the run's tokenizer and splits.
  corpus = pipeline.prepare(str(path), VOCAB_SIZE, workdir, data_format)
  ppl_0, ppl = last_valid_ppl(workdir)
  return {"name": name, "kind": kind, "path": relative,
          "files": corpus.reading.num_files, "requested": data_format,
          "format": corpus.reading.format,
          "documents": {k: len(v) for k, v in corpus.splits.items()},
          "characters": {k: sum(map(len, v)) for k, v in corpus.splits.items()},
          "tokens": {k: int(v.size) for k, v in corpus.tokens.items()},
          "ppl_0": ppl_0, "ppl": ppl, "wall_s": wall_s}


def summary_markdown(rows: list[dict], num_steps: int) -> str:
  """The summary table of every run, with what its columns mean."""
  def splits(row, key):
    return " / ".join(f"{row[key][s]:,}" for s in ("train", "valid", "test"))
  lines = [
      "# One short run per corpus format",
      "",
      f"`python experiments/corpus_formats.py` (tiny config, {num_steps} "
      "training steps of 16 x 256 tokens, warmup 10, validation on 4 batches "
      "at step 0 and at the end; 2-core CPU shared with other jobs). Each "
      "run's console output is in `{format}.log` beside this file.",
      "",
      "| format | data.path | path kind | data.format | detected | documents "
      "(train / valid / test) | characters (train / valid / test) | tokens "
      "(train / valid / test) | valid PPL step 0 | valid PPL final | wall s |",
      "|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in rows:
    kind = (f"{row['kind']} ({row['files']} files)" if row["files"] > 1
            else row["kind"])
    lines.append(
        f"| {row['name']} | `{row['path']}` | {kind} | {row['requested']} | "
        f"{row['format']} | {splits(row, 'documents')} | "
        f"{splits(row, 'characters')} | {splits(row, 'tokens')} | "
        f"{row['ppl_0']:,.0f} | {row['ppl']:,.1f} | {row['wall_s']:.0f} |")
  lines += [
      "",
      "- **detected**: the format used; with `data.format=auto` the run "
      "detects it and says why (mean non-empty lines per run of non-empty "
      "lines, `paragraphs` up to 20), otherwise it is the one given.",
      "- **documents / characters / tokens**: each split's size as the run "
      "printed it (tokens with one EOS per document, under the 4,096-piece "
      "tokenizer trained on that corpus's train split); the split is by "
      "characters in whole documents, about 90% / 5% / 5%.",
      f"- **valid PPL**: validation perplexity of the AR model at step 0 "
      f"(untrained: close to the vocabulary size, 4,096) and after "
      f"{num_steps} steps. Corpora differ in text and tokenizer, so the "
      "final numbers show that training runs, not which corpus is easier.",
      ""]
  return "\n".join(lines)


def main(argv):
  del argv
  workdir, out_dir = pathlib.Path(_WORKDIR.value), pathlib.Path(_OUT.value)
  corpus_dir = workdir / "corpora"
  out_dir.mkdir(parents=True, exist_ok=True)
  build_corpora(pathlib.Path(_SOURCE_DIR.value), corpus_dir)
  rows = [run_one(name, corpus_dir, workdir, out_dir,
                  _NUM_STEPS.value) for name in RUNS]
  summary = summary_markdown(rows, _NUM_STEPS.value)
  (out_dir / "summary.md").write_text(summary, encoding="utf-8")
  print(summary)


if __name__ == "__main__":
  app.run(main)
