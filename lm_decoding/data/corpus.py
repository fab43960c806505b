"""Plain-text corpora read as paragraphs and split into train/valid/test.

Reading rule (the only normalisation applied anywhere in the data pipeline):
the text is split into lines at '\\n'; each line is stripped of surrounding
whitespace (so CRLF line ends, indentation and trailing blanks vanish); a
paragraph is a maximal run of non-empty lines, and its lines are joined with
single spaces. Whitespace inside a line is kept as it is. Paragraphs are the
unit of everything downstream: the split, tokenisation (one paragraph, then
EOS) and the prompts of evaluation.

Split rule (deterministic, over whole paragraphs, never tokens): the
paragraphs of the whole corpus, in reading order, are grouped into
consecutive chunks of `chunk_paragraphs` (default 50; the last chunk may be
shorter). Chunk k goes to 'valid' if k % 20 == 18, to 'test' if
k % 20 == 19, and to 'train' otherwise: 90/5/5 by paragraphs, with held-out
text spread evenly over the corpus (every novel of the bundled corpus
contributes) while neighbouring paragraphs stay together, so held-out
paragraphs rarely sit next to training ones. A corpus of fewer than
19 * chunk_paragraphs paragraphs has empty held-out splits.
"""

from __future__ import annotations

import gzip
import importlib.resources
import pathlib

SPLITS = ("train", "valid", "test")
CHUNK_PARAGRAPHS = 50
SPLIT_PERIOD = 20  # chunks per cycle: 18 train, then one valid, one test
BUNDLED_CORPUS = "austen.txt.gz"


def bundled_corpus_path() -> pathlib.Path:
  """Path of the bundled corpus: Jane Austen's six novels (see PROVENANCE.md)."""
  return pathlib.Path(
      str(importlib.resources.files("lm_decoding.data") / BUNDLED_CORPUS))


def resolve_path(path: str | None) -> pathlib.Path:
  """The corpus path `path` names: the bundled corpus when None or ''.

  Raises:
    ValueError: `path` (the `data.path` setting) does not exist.
  """
  if not path:
    return bundled_corpus_path()
  resolved = pathlib.Path(path).expanduser().resolve()
  if not resolved.exists():
    raise ValueError(
        f"data.path={path!r} does not exist; give a UTF-8 text file (.txt or "
        ".txt.gz), a folder of *.txt files, or '' for the bundled corpus")
  return resolved


def corpus_files(path: str | None) -> list[pathlib.Path]:
  """The files a corpus path stands for, in reading order.

  A file stands for itself; a folder for all `*.txt` files below it
  (recursively), sorted by their path relative to the folder.

  Raises:
    ValueError: `path` does not exist, or is a folder without *.txt files.
  """
  resolved = resolve_path(path)
  if resolved.is_file():
    return [resolved]
  files = sorted(resolved.rglob("*.txt"),
                 key=lambda f: f.relative_to(resolved).as_posix())
  files = [f for f in files if f.is_file()]
  if not files:
    raise ValueError(f"data.path={path!r} is a folder without *.txt files")
  return files


def read_text(file: pathlib.Path) -> str:
  """The UTF-8 text of `file` (gunzipped if its name ends in .gz).

  Raises:
    ValueError: the file is not valid UTF-8.
  """
  data = file.read_bytes()
  if file.name.endswith(".gz"):
    data = gzip.decompress(data)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"data.path file {str(file)!r} is not UTF-8: {e}") from e


def paragraphs(text: str) -> list[str]:
  """Paragraphs of `text` by the reading rule of this module's docstring."""
  result, lines = [], []
  for line in text.split("\n"):
    line = line.strip()
    if line:
      lines.append(line)
    elif lines:
      result.append(" ".join(lines))
      lines = []
  if lines:
    result.append(" ".join(lines))
  return result


def split_paragraphs(
    texts: list[str], chunk_paragraphs: int = CHUNK_PARAGRAPHS
) -> dict[str, list[str]]:
  """Paragraphs per split by the split rule of this module's docstring.

  Raises:
    ValueError: chunk_paragraphs < 1.
  """
  if chunk_paragraphs < 1:
    raise ValueError(f"chunk_paragraphs={chunk_paragraphs} must be >= 1")
  chunk_split = ["train"] * (SPLIT_PERIOD - 2) + ["valid", "test"]
  splits = {name: [] for name in SPLITS}
  for i, text in enumerate(texts):
    splits[chunk_split[(i // chunk_paragraphs) % SPLIT_PERIOD]].append(text)
  return splits


def load_paragraphs(path: str | None) -> list[str]:
  """All paragraphs of the corpus at `path`, files in reading order.

  Args:
    path: a UTF-8 text file (.txt, or .gz compressed), a folder of *.txt
      files (read recursively, sorted), or None / '' for the bundled corpus.

  Raises:
    ValueError: `path` does not exist, holds no *.txt file, or is not UTF-8.
  """
  return [p for f in corpus_files(path) for p in paragraphs(read_text(f))]


def load_splits(
    path: str | None, chunk_paragraphs: int = CHUNK_PARAGRAPHS
) -> dict[str, list[str]]:
  """Paragraph texts of the corpus at `path` per split ('train', 'valid', 'test').

  See the module docstring for the reading and split rules and
  `load_paragraphs` for `path`.

  Raises:
    ValueError: bad `path` (see `load_paragraphs`) or chunk_paragraphs < 1.
  """
  return split_paragraphs(load_paragraphs(path), chunk_paragraphs)
