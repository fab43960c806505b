"""Plain-text corpora read as documents and split into train/valid/test.

Sources (`data.path`): one UTF-8 text file, gunzipped first if its name ends
in '.gz'; or a folder, standing for every '*.txt' and '*.txt.gz' file below
it (recursively; names starting with '.' skipped), read in the order of their
paths relative to the folder; or '' / None for the bundled corpus. Every file
must hold text: a missing path, an empty file, a binary file (NUL bytes), a
broken .gz or a file that is not UTF-8 is a ValueError naming the file and
`data.path`.

Reading rules (`decode_text`, shared by every text file the project reads,
corpora and parallel text alike; the only normalisation applied anywhere in
the data pipeline):
  encoding        UTF-8; a UTF-8 signature (BOM, EF BB BF) at the start is
                  dropped; a file starting with a UTF-16 byte-order mark
                  (FF FE or FE FF) is read as UTF-16 of that byte order.
                  Anything else that is not valid UTF-8 (Latin-1, cp1252,
                  UTF-16 without its mark) is a ValueError naming the file,
                  the line and the offending byte.
  NUL             a NUL character means a binary file: ValueError.
  line ends       '\\r\\n' (Windows), '\\r' (old Mac) and '\\n' all end
                  a line.
  control chars   every other C0 control character except the tab (form
                  feed, vertical tab, escape, ...), DEL and the C1 controls
                  (U+0080-U+009F) become a space, so they act as whitespace.
Line rule: each line is stripped of surrounding whitespace (indentation and
trailing blanks vanish); whitespace inside a line is kept as it is.

Formats (`data.format`): a document is
  'paragraphs'  a maximal run of non-empty lines (blank lines between
                documents), its lines joined with single spaces;
  'lines'       one non-empty line (blank lines are skipped);
  'auto'        'paragraphs' if, over the whole corpus, the runs of non-empty
                lines hold at most AUTO_MAX_LINES = 20 lines on average (prose
                wrapped into blank-line separated paragraphs), else 'lines'
                (one document per line, maybe with a few blank lines).
Documents never cross files. They are the unit of everything downstream: the
split, tokenisation (one document, then EOS) and the prompts of evaluation.

Split rule (deterministic, whole documents): the corpus, all documents in
reading order, is cut into `n` cycles of equal character length, n = the
number of documents // 200, between 1 and MAX_CYCLES = 10; each cycle is cut
into 20 equal parts, of which the 19th goes to 'valid', the 20th to 'test'
and the others to 'train'. A document goes where its middle character lies.
So valid and test each hold about 5% of the characters (hence of the tokens),
spread over the corpus in n stretches of neighbouring documents.

Long documents (cut rule): a document longer than one part, C / (20 n)
characters of a corpus of C (the text of one stretch of 'valid'; 0.5% of the
corpus when n = 10), would put its whole length into the one split its middle
falls in. Such a document is first cut where the part boundaries fall inside
it, each cut moved to the nearest whitespace within a tenth of a part (the
space is dropped; a hard cut at the boundary when there is none), so each
piece lies in one part and is a document of its own. n is counted before
cutting. Documents are already paragraphs or lines, so the only line breaks
left inside a paragraph are the spaces that joined its lines, and a cut is
always between words when the text has spaces. Documents up to one part are
never cut: the bundled corpus (longest paragraph 14,695 characters, a part
20,008) splits as it did before the rule. On a corpus of 8,000 short
paragraphs and one of 400,000 characters (a third of the text) the split
held 93.0% / 3.5% / 3.5% without the rule and holds its 90% / 5% / 5% within
0.1 point with it (tests/test_data.py). `split_shares` gives the shares a
split got; `pipeline.Corpus.describe` prints them. Whether the splits are
large enough for a config is checked on their tokens by
`pipeline.check_corpus_size`.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import importlib.resources
import pathlib
import re
import zlib

SPLITS = ("train", "valid", "test")
FORMATS = ("auto", "paragraphs", "lines")
AUTO_MAX_LINES = 20  # 'auto': mean lines per run of non-empty lines
CYCLE_PARTS = ("train",) * 18 + ("valid", "test")
SPLIT_FRACTIONS = {name: CYCLE_PARTS.count(name) / len(CYCLE_PARTS)
                   for name in SPLITS}  # of the characters
MAX_CYCLES = 10
DOCUMENTS_PER_CYCLE = 200
BUNDLED_CORPUS = "austen.txt.gz"
TEXT_SUFFIXES = (".txt", ".txt.gz")  # files a folder stands for


@dataclasses.dataclass(frozen=True)
class Reading:
  """How a corpus was read.

  Attributes:
    source: the resolved path, or 'bundled corpus austen.txt.gz'.
    num_files: files read.
    requested: the `data.format` asked for ('auto', 'paragraphs', 'lines').
    format: the format used ('paragraphs' or 'lines').
    lines_per_run: mean non-empty lines per run of non-empty lines (what
      'auto' decides by).
    num_documents: documents read, before the cut rule (n counts these).
  """

  source: str
  num_files: int
  requested: str
  format: str
  lines_per_run: float
  num_documents: int = 0

  def describe(self) -> str:
    """One line: the source and the format, with why when it was detected."""
    files = "1 file" if self.num_files == 1 else f"{self.num_files} files"
    if self.requested == "auto":
      how = (f"data.format='auto' detected {self.format!r}: runs of non-empty "
             f"lines hold {self.lines_per_run:.1f} lines on average ("
             f"'paragraphs' up to {AUTO_MAX_LINES}, else 'lines')")
    else:
      how = f"data.format={self.format!r}"
    return f"data: {self.source} ({files}); {how}"


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
        ".txt.gz), a folder of *.txt / *.txt.gz files, or '' for the bundled "
        "corpus")
  return resolved


def corpus_files(path: str | None) -> list[pathlib.Path]:
  """The files a corpus path stands for, in reading order (module docstring).

  Raises:
    ValueError: `path` does not exist, or is a folder without text files.
  """
  resolved = resolve_path(path)
  if resolved.is_file():
    return [resolved]
  files = sorted(
      (f.relative_to(resolved) for f in resolved.rglob("*")
       if f.name.endswith(TEXT_SUFFIXES) and f.is_file()),
      key=lambda f: f.as_posix())
  files = [resolved / f for f in files
           if not any(part.startswith(".") for part in f.parts)]
  if not files:
    raise ValueError(
        f"data.path={path!r} is a folder without *.txt or *.txt.gz files")
  return files


def read_text(file: pathlib.Path) -> str:
  """The UTF-8 text of `file` (gunzipped if its name ends in .gz).

  Raises:
    ValueError: the file cannot be read, is a broken .gz, is not UTF-8, holds
      NUL bytes (binary) or holds no text; the message names the file and
      `data.path`.
  """
  where = f"data.path file {str(file)!r}"
  try:
    data = file.read_bytes()
    if file.name.endswith(".gz"):
      data = gzip.decompress(data)
  except (OSError, EOFError, zlib.error) as e:
    raise ValueError(f"{where} cannot be read: {e}") from e
  text = decode_text(data, where)
  if not text.strip():
    raise ValueError(f"{where} is empty (no text)")
  return text


_SIGNATURES = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
               (codecs.BOM_UTF16_BE, "utf-16-be"))
# C0 controls but tab and newline, DEL, C1 controls: read as a space.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def decode_text(data: bytes, where: str) -> str:
  """The text of a file's bytes by the reading rules (module docstring).

  Args:
    data: the file's bytes (gunzipped).
    where: names the file in messages, e.g. "data.path file 'x.tsv'".
  Returns:
    The text, lines ending in '\\n', control characters as spaces.
  Raises:
    ValueError: not valid in its encoding (UTF-8, or UTF-16 after its
      mark), naming the line (1-based) and the byte; a NUL (binary).
  """
  codec = "utf-8"
  for signature, name in _SIGNATURES:
    if data.startswith(signature):
      data, codec = data[len(signature):], name
      break
  if codec == "utf-8" and b"\0" in data:
    raise ValueError(f"{where} is binary (it holds NUL bytes), not text "
                     f"(UTF-16 text needs its byte-order mark)")
  try:
    text = data.decode(codec)
  except UnicodeDecodeError as e:
    line = data[:e.start].decode(codec, "replace").count("\n") + 1
    raise ValueError(f"{where} is not {codec.upper()} text: line {line} "
                     f"holds byte 0x{data[e.start]:02x}; convert it, e.g. "
                     f"iconv -f latin1 -t utf-8") from e
  if "\0" in text:
    raise ValueError(f"{where} is binary (it holds NUL characters), not "
                     f"text")
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  return _CONTROL.sub(" ", text)


def line_runs(text: str) -> list[list[str]]:
  """Maximal runs of non-empty lines of `text`, by the line rule."""
  runs, run = [], []
  for line in text.split("\n"):
    line = line.strip()
    if line:
      run.append(line)
    elif run:
      runs.append(run)
      run = []
  if run:
    runs.append(run)
  return runs


def read_corpus(path: str | None,
                data_format: str = "auto") -> tuple[list[str], Reading]:
  """All documents of the corpus at `path`, files in reading order.

  Args:
    path: `data.path`: a text file (.gz compressed or not), a folder of
      *.txt / *.txt.gz files, or None / '' for the bundled corpus.
    data_format: `data.format`, one of FORMATS (module docstring).

  Returns:
    (documents, reading): the document texts and how they were read.

  Raises:
    ValueError: data_format not in FORMATS, or a bad `path` (see
      `corpus_files` and `read_text`).
  """
  if data_format not in FORMATS:
    raise ValueError(f"data.format={data_format!r} must be one of {FORMATS}")
  files = corpus_files(path)
  runs = [run for file in files for run in line_runs(read_text(file))]
  lines_per_run = sum(len(run) for run in runs) / len(runs)
  resolved = data_format
  if data_format == "auto":
    resolved = "paragraphs" if lines_per_run <= AUTO_MAX_LINES else "lines"
  if resolved == "paragraphs":
    documents = [" ".join(run) for run in runs]
  else:
    documents = [line for run in runs for line in run]
  source = (f"bundled corpus {BUNDLED_CORPUS}" if not path
            else str(resolve_path(path)))
  return documents, Reading(source=source, num_files=len(files),
                            requested=data_format, format=resolved,
                            lines_per_run=lines_per_run,
                            num_documents=len(documents))


def load_documents(path: str | None, data_format: str = "auto") -> list[str]:
  """The documents of `read_corpus(path, data_format)`."""
  return read_corpus(path, data_format)[0]


def load_paragraphs(path: str | None) -> list[str]:
  """The documents of the corpus at `path` in the 'paragraphs' format."""
  return load_documents(path, "paragraphs")


def num_cycles(num_documents: int) -> int:
  """n of the split rule: cycles for a corpus of `num_documents` documents."""
  return max(1, min(MAX_CYCLES, num_documents // DOCUMENTS_PER_CYCLE))


def _cut_at(text: str, offset: int, window: int) -> tuple[int, int]:
  """(end of this piece, start of the next) for a cut near `offset` of `text`:
  the whitespace nearest to it within `window` characters, else `offset`."""
  lo, hi = max(0, offset - window), min(len(text), offset + window + 1)
  spaces = [lo + m.start() for m in re.finditer(r"\s", text[lo:hi])]
  if not spaces:
    return offset, offset
  space = min(spaces, key=lambda i: (abs(i - offset), i))
  return space, space + 1


def cut_long_documents(texts: list[str], cycles: int) -> list[str]:
  """`texts` with every document longer than one part cut at the part
  boundaries inside it (the cut rule of this module's docstring).

  Args:
    texts: documents in reading order.
    cycles: n of the split rule, counted on `texts`.

  Returns:
    The documents, those up to one part unchanged (the same list when none is
    longer), longer ones replaced by their non-empty pieces in order.
  """
  total = sum(len(t) for t in texts)
  parts = len(CYCLE_PARTS) * cycles
  if not texts or max(len(t) for t in texts) * parts <= total:
    return texts
  window = total // (10 * parts)
  out, start = [], 0
  for text in texts:
    if len(text) * parts <= total:
      out.append(text)
    else:  # boundaries k C / parts strictly inside [start, start + len)
      first = start * parts // total + 1
      last = ((start + len(text)) * parts - 1) // total
      begin = 0
      for k in range(first, last + 1):
        offset = -(-k * total // parts) - start  # ceil: first char of part k
        end, next_begin = _cut_at(text, offset, window)
        if end > begin:
          out.append(text[begin:end].strip())
          begin = max(begin, next_begin)
      out.append(text[begin:].strip())
    start += len(text)
  return [t for t in out if t]


def split_documents(texts: list[str],
                    cut: bool = True) -> dict[str, list[str]]:
  """Documents per split by the split and cut rules of this module's docstring.

  Exact integer arithmetic: the document whose characters start at offset s
  and number c (of C in all) lies in part floor(20 n (2 s + c) / (2 C)) mod 20.
  `cut=False` skips the cut rule (the split before it, to compare with).
  """
  cycles = num_cycles(len(texts))
  if cut:
    texts = cut_long_documents(texts, cycles)
  splits = {name: [] for name in SPLITS}
  total = 2 * sum(len(t) for t in texts)
  parts = len(CYCLE_PARTS) * cycles
  start = 0
  for text in texts:
    middle = 2 * start + len(text)
    splits[CYCLE_PARTS[parts * middle // total % len(CYCLE_PARTS)]].append(text)
    start += len(text)
  return splits


def split_shares(splits: dict[str, list[str]]) -> dict[str, float]:
  """The fraction of the characters each split holds (they sum to 1)."""
  sizes = {name: sum(len(t) for t in splits[name]) for name in SPLITS}
  total = sum(sizes.values()) or 1
  return {name: sizes[name] / total for name in SPLITS}


def load_splits(path: str | None,
                data_format: str = "auto") -> dict[str, list[str]]:
  """Document texts of the corpus at `path` per split (train, valid, test).

  See the module docstring for the formats and the split rule, and
  `read_corpus` for the arguments and errors.
  """
  return split_documents(load_documents(path, data_format))
