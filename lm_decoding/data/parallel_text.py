"""Parallel text for translation: the bundled pairs or a user's own file.

The bundled file is English (King James Version) -> Spanish (Reina-Valera
1909), one Bible verse per pair (`kjv_rv1909_pairs.tsv.gz`, see
PROVENANCE.md). Any other file works the same way (`read_pairs`): UTF-8 text
by the reading rules of `corpus.decode_text` (signatures, UTF-16 with its
mark, CRLF/CR line ends, control characters), gzip if its name ends in .gz,
one pair per line in one of two layouts, the same on every line:

  reference<TAB>source<TAB>target   'Genesis 1:1', 'talk_17 3', 's12', ...
  source<TAB>target                 blank lines separate documents: pair k
                                    of document d gets reference 'doc{d} {k}';
                                    a file without blank lines between pairs
                                    gives each pair the reference 'line{n}'
                                    (its line number): its own group

Blank lines are skipped; a line with another number of fields, or an empty
source or target, is a ValueError naming the file and the line.

A pair's group is its reference up to the last space (`Pair.group`: 'Genesis
1:1' -> 'Genesis', 'doc3 7' -> 'doc3'; a reference without a space is its
own group). The split keeps every group in one split (`split_pairs`):

  the Bible's books, when the file holds every held-out book:
    valid: VALID_BOOKS (Ruth, Joel, Philippians, James)
    test:  TEST_BOOKS  (Jonah, Micah, Mark, 1 Peter)
    train: every other book (58 books);
  otherwise by fraction: a group goes to valid when the CRC-32 of its name,
    divided by 2**32, is below VALID_FRACTION, to test when below
    VALID_FRACTION + TEST_FRACTION, else to train. Deterministic, and the same
    for any file holding the group (a distilled file, a subset), whatever
    the order or the other groups; valid and test each hold about 10% of
    the groups. A split left empty is a ValueError (too few groups).

One joint SentencePiece tokenizer (`tokenizer.Tokenizer`, the project's
reserved ids) is trained on the train split's sources and targets together.

Layout for a prefix LM (source bidirectional, target after it), one row:

    [s_1 .. s_Src, BOS, t_1 .. t_T, EOS, PAD ...]     (`layout`)
     \\---- prefix: Src + 1 ----/

The source never holds BOS (encoding never produces it), so every objective
recovers the prefix length as (index of the first BOS) + 1 and the target
length as the tokens between BOS and EOS (`prefix_and_target_lengths`). The
prompt of an AR decoder is the prefix, right-padded (`prompts`).
"""
from __future__ import annotations

import collections
import dataclasses
import gzip
import pathlib
import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.special_tokens import BOS_ID, EOS_ID, PAD_ID

BUNDLED_PAIRS = "kjv_rv1909_pairs.tsv.gz"
VALID_BOOKS = ("Ruth", "Joel", "Philippians", "James")
TEST_BOOKS = ("Jonah", "Micah", "Mark", "1 Peter")
SPLITS = ("train", "valid", "test")
VALID_FRACTION = TEST_FRACTION = 0.1  # of the groups, without the books
BLANK_ID = PAD_ID  # the CTC blank: PAD is never a target token


@dataclasses.dataclass(frozen=True)
class Pair:
  """One aligned pair: `reference` ('Genesis 1:1', 'doc3 7'), source text,
  target text."""

  reference: str
  source: str
  target: str

  @property
  def group(self) -> str:
    """The reference before its last space ('1 Peter', 'doc3'); the whole
    reference when it has no space. The split keeps a group together."""
    return self.reference.rsplit(" ", 1)[0]


def bundled_pairs_path() -> pathlib.Path:
  """Path of the bundled pairs file (package data of `lm_decoding.data`)."""
  return pathlib.Path(__file__).with_name(BUNDLED_PAIRS)


def read_pairs(path: str | pathlib.Path | None = None) -> list[Pair]:
  """Reads a pairs file in either layout (module docstring).

  Args:
    path: the file; None or '' reads the bundled KJV / RV1909 pairs.
  Returns:
    The pairs in file order.
  Raises:
    ValueError: the file is missing, unreadable, empty or undecodable
      (`corpus.read_text`: the file and the line named); a line with a
      number of fields other than the first line's (2 or 3), or an empty
      reference, source or target (the file, the line and the column
      named).
  """
  path = pathlib.Path(path) if path else bundled_pairs_path()
  if not path.is_file():
    raise ValueError(f"data.path={str(path)!r}: no pairs file there")
  rows, width, document, blank_before = [], None, 0, True
  for number, line in enumerate(corpus.read_text(path).split("\n"), 1):
    if not line.strip():
      blank_before = True
      continue
    fields = [field.strip() for field in line.split("\t")]
    width = width or len(fields)
    if len(fields) != width or width not in (2, 3):
      raise ValueError(
          f"{path}:{number}: expected {width if width in (2, 3) else '2 or 3'}"
          f" tab-separated fields (reference<TAB>source<TAB>target or "
          f"source<TAB>target, as the first line); got {len(fields)}: "
          f"{line[:80]!r}")
    names = ("reference", "source", "target")[3 - width:]
    for column, (name, field) in enumerate(zip(names, fields), 1):
      if not field:
        raise ValueError(f"{path}:{number}: the {name} (column {column}) is "
                         f"empty: {line[:80]!r}")
    document += blank_before
    blank_before = False
    rows.append((number, document, fields))
  if width == 3:
    return [Pair(*fields) for _, _, fields in rows]
  in_document = collections.Counter()
  pairs = []
  for number, d, fields in rows:  # references (module docstring)
    in_document[d] += 1
    reference = f"doc{d} {in_document[d]}" if document > 1 else f"line{number}"
    pairs.append(Pair(reference, *fields))
  return pairs


def write_pairs(path: str | pathlib.Path, pairs: Sequence[Pair]) -> None:
  """Writes `reference<TAB>source<TAB>target` lines (gzip if .gz), the
  format `read_pairs` reads back.

  Raises:
    ValueError: a field is empty or holds a tab or newline (the message names
      the pair's reference).
  """
  path = pathlib.Path(path)
  for pair in pairs:
    fields = (pair.reference, pair.source, pair.target)
    if not all(fields) or any(c in f for f in fields for c in "\t\n"):
      raise ValueError(f"pair {pair.reference!r}: a field is empty or holds "
                       "a tab or newline")
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "wt", encoding="utf-8") as f:
    f.writelines(f"{p.reference}\t{p.source}\t{p.target}\n" for p in pairs)


DISTILLED_FILE = "distilled_pairs.tsv.gz"
TARGETS = ("reference", "distilled")


def pairs_path(path: str, targets: str, cache_dir: str | pathlib.Path
               ) -> str | pathlib.Path:
  """The pairs file a translation config trains on (`data.targets`).

  'reference': `path` ('' = the bundled pairs). 'distilled':
  `{cache_dir}/DISTILLED_FILE`, the same pairs with the train targets
  replaced by a teacher's outputs (`training.distillation`).

  Raises:
    ValueError: `targets` not in TARGETS, or no distilled file in
      `cache_dir` (run the distillation step first).
  """
  if targets not in TARGETS:
    raise ValueError(f"data.targets={targets!r}; allowed: {TARGETS}")
  if targets == "reference":
    return path
  distilled = pathlib.Path(cache_dir, DISTILLED_FILE)
  if not distilled.is_file():
    raise ValueError(f"data.targets='distilled' but {distilled} does not "
                     "exist: distil the train split first "
                     "(experiments/translate.py does)")
  return distilled


def split_pairs(pairs: Sequence[Pair]) -> dict[str, list[Pair]]:
  """{'train', 'valid', 'test'}: whole groups, by the Bible's books when
  every held-out book is there, else by fraction (module docstring).

  Deterministic (file order kept within each split); a group is in exactly
  one split.

  Raises:
    ValueError: no pairs, or a split by fraction that leaves valid or test
      empty (the message gives the number of groups).
  """
  if not pairs:
    raise ValueError("no pairs to split (the file holds none)")
  groups = {p.group for p in pairs}  # for verses: the books
  if set(VALID_BOOKS + TEST_BOOKS) <= groups:
    place = {g: "valid" if g in VALID_BOOKS else "test" if g in TEST_BOOKS
             else "train" for g in groups}
  else:
    place = {g: fraction_split(g) for g in groups}
  splits = {name: [] for name in SPLITS}
  for pair in pairs:
    splits[place[pair.group]].append(pair)
  empty = [name for name in SPLITS if not splits[name]]
  if empty:
    raise ValueError(
        f"the split by fraction of {len(groups)} groups (references up to "
        f"their last space) leaves {empty} empty; give more pairs or more "
        f"groups (about {VALID_FRACTION:.0%} go to valid and "
        f"{TEST_FRACTION:.0%} to test)")
  return splits


def fraction_split(group: str) -> str:
  """'valid', 'test' or 'train': where the split by fraction puts `group`
  (CRC-32 of its UTF-8 name / 2**32 against the fractions)."""
  u = zlib.crc32(group.encode("utf-8")) / 2 ** 32
  return ("valid" if u < VALID_FRACTION
          else "test" if u < VALID_FRACTION + TEST_FRACTION else "train")


def train_tokenizer(pairs: Sequence[Pair], vocab_size: int) -> Tokenizer:
  """A joint SentencePiece tokenizer on the sources and targets of `pairs`.

  Raises:
    ValueError: vocab_size out of the tokenizer's range (see
      `Tokenizer.train`).
  """
  texts = [p.source for p in pairs] + [p.target for p in pairs]
  return Tokenizer.train(texts, vocab_size)


def encode_text(tokenizer: Tokenizer, text: str, max_tokens: int,
                name: str = "source") -> list[int]:
  """Token ids of one side of a pair, checked against its length limit.

  Raises:
    ValueError: empty `text`, or more than `max_tokens` tokens (the message
      names the limit and the length found).
  """
  if not text.strip():
    raise ValueError(f"{name} is empty; a {name} needs 1 to "
                     f"max_{name}_tokens={max_tokens} tokens")
  ids = tokenizer.encode(text)
  if len(ids) > max_tokens:
    raise ValueError(f"{name} has {len(ids)} tokens; the limit is "
                     f"max_{name}_tokens={max_tokens} ({text[:40]!r}...)")
  return ids


@dataclasses.dataclass(frozen=True)
class Encoded:
  """Encoded pairs, PAD-padded (numpy).

  Attributes:
    source: int32[R, Src] source ids, Src = max_source_tokens.
    source_lengths: int32[R] in [1, Src].
    target: int32[R, T] target ids, T = max_target_tokens.
    target_lengths: int32[R] in [1, T].
    pairs: the R pairs kept (their texts are the references).
    dropped: pairs of the input left out for exceeding a limit.
  """

  source: np.ndarray
  source_lengths: np.ndarray
  target: np.ndarray
  target_lengths: np.ndarray
  pairs: tuple[Pair, ...]
  dropped: int


def _pad(rows: list[list[int]], width: int) -> np.ndarray:
  out = np.full((len(rows), width), PAD_ID, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[Pair],
                 max_source_tokens: int, max_target_tokens: int) -> Encoded:
  """Encodes pairs, leaving out (and counting) those over either limit.

  Raises:
    ValueError: a limit < 1, or no pair fits the limits.
  """
  for name, value in (("max_source_tokens", max_source_tokens),
                      ("max_target_tokens", max_target_tokens)):
    if value < 1:
      raise ValueError(f"{name}={value} must be >= 1")
  kept, sources, targets = [], [], []
  for pair in pairs:
    source, target = tokenizer.encode(pair.source), tokenizer.encode(
        pair.target)
    if 1 <= len(source) <= max_source_tokens and (
        1 <= len(target) <= max_target_tokens):
      kept.append(pair)
      sources.append(source)
      targets.append(target)
  if not kept:
    raise ValueError(f"no pair fits max_source_tokens={max_source_tokens} "
                     f"and max_target_tokens={max_target_tokens}")
  return Encoded(
      source=_pad(sources, max_source_tokens),
      source_lengths=np.array([len(s) for s in sources], np.int32),
      target=_pad(targets, max_target_tokens),
      target_lengths=np.array([len(t) for t in targets], np.int32),
      pairs=tuple(kept), dropped=len(pairs) - len(kept))


def layout(encoded: Encoded) -> np.ndarray:
  """int32[R, Src + T + 2] rows [source, BOS, target, EOS, PAD ...] (module
  docstring): the training sequences of every translation objective."""
  n, s = encoded.source.shape
  t = encoded.target.shape[1]
  rows = np.full((n, s + t + 2), PAD_ID, np.int32)
  for i in range(n):
    src = encoded.source[i, :encoded.source_lengths[i]]
    tgt = encoded.target[i, :encoded.target_lengths[i]]
    row = np.concatenate([src, [BOS_ID], tgt, [EOS_ID]])
    rows[i, :len(row)] = row
  return rows


def prompts(encoded: Encoded) -> tuple[np.ndarray, np.ndarray]:
  """The AR / NAR decoders' prompts: [source, BOS] right-padded.

  Returns:
    prompts int32[R, Src + 1] and prompt_lengths int32[R] (source length + 1).
  """
  n, s = encoded.source.shape
  out = np.full((n, s + 1), PAD_ID, np.int32)
  out[:, :s] = encoded.source
  out[np.arange(n), encoded.source_lengths] = BOS_ID
  return out, encoded.source_lengths + 1


def prefix_and_target_lengths(tokens_BxL: jax.Array
                              ) -> tuple[jax.Array, jax.Array]:
  """Prefix (source + BOS) and target lengths of `layout` rows (traceable).

  Args:
    tokens_BxL: int32[B, L] rows laid out as [source, BOS, target, EOS, PAD].
  Returns:
    prefix_lengths int32[B] (first BOS index + 1) and target_lengths
    int32[B] (tokens after BOS up to the first EOS, EOS excluded).
  """
  position_L = jnp.arange(tokens_BxL.shape[1])
  prefix_B = jnp.argmax(tokens_BxL == BOS_ID, axis=1).astype(jnp.int32) + 1
  is_end_BxL = (tokens_BxL == EOS_ID) & (position_L[None] >= prefix_B[:, None])
  end_B = jnp.where(is_end_BxL.any(1), jnp.argmax(is_end_BxL, axis=1),
                    tokens_BxL.shape[1])
  return prefix_B, (end_B - prefix_B).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TranslationData:
  """The tokenizer and the encoded splits of one pairs file."""

  tokenizer: Tokenizer
  splits: dict[str, Encoded]

  def describe(self) -> str:
    """One line per split: pairs kept, pairs over the limits."""
    return "; ".join(f"{name} {len(e.pairs)} pairs ({e.dropped} over the "
                     f"length limits)" for name, e in self.splits.items())


TOKENIZER_FILE = "translation_tokenizer.model"


def prepare(vocab_size: int, max_source_tokens: int, max_target_tokens: int,
            path: str | pathlib.Path | None = None,
            cache_dir: str | pathlib.Path | None = None) -> TranslationData:
  """Reads, splits (`split_pairs`), trains the joint tokenizer on train,
  encodes.

  Pairs over `max_source_tokens` / `max_target_tokens` are left out of every
  split and counted (`Encoded.dropped`). With `cache_dir`, the tokenizer is
  read from `{cache_dir}/TOKENIZER_FILE` when there (training it takes about
  a minute on 2 cores), else trained and written there, so the models
  trained and decoded under one directory share it.

  Raises:
    ValueError: see `read_pairs`, `split_pairs`, `train_tokenizer`,
      `encode_pairs`; a cached tokenizer of another vocab_size (the message
      names the file).
  """
  splits = split_pairs(read_pairs(path))
  cached = pathlib.Path(cache_dir, TOKENIZER_FILE) if cache_dir else None
  if cached is not None and cached.is_file():
    tokenizer = Tokenizer.load(str(cached))
    if tokenizer.vocab_size != vocab_size:
      raise ValueError(f"{cached} has vocab_size {tokenizer.vocab_size}, "
                       f"not {vocab_size}; use another directory")
  else:
    tokenizer = train_tokenizer(splits["train"], vocab_size)
    if cached is not None:
      cached.parent.mkdir(parents=True, exist_ok=True)
      cached.write_bytes(tokenizer.model_proto)
  return TranslationData(tokenizer, {
      name: encode_pairs(tokenizer, pairs, max_source_tokens,
                         max_target_tokens) for name, pairs in splits.items()})
