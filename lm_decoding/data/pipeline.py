"""Language-model data: a tokenized, cached corpus; packed sequences; batches; prompts.

`prepare` reads a corpus (`corpus.read_corpus`, `corpus.split_documents`),
trains a tokenizer on its train split and encodes every split as one flat
token stream in which each document's ids are followed by EOS. Tokenizer and
streams are cached under `{workdir}/data/{key}/`, key a hash of the corpus
text per split, vocab_size and FORMAT_VERSION, so the second call reads them
back instead of training and encoding again. `Corpus.describe` says how the
corpus was read and how large every split is; `check_corpus_size` says, in
the first seconds, whether the splits are large enough for a config. `pack`
cuts a stream into fixed-length training sequences and `batches` deals them
out in a seed-determined order that training resumed at any step reproduces;
`process_batches` reads one process's share of each of those batches (grain
sharding) for multi-host training.
`prompts` cuts held-out documents into prompts and reference continuations
for generation quality metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import pathlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence

import grain
import ml_collections
import numpy as np

from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data.tokenizer import EOS_ID, Tokenizer

# Bump when reading, splitting, tokenizer training or encoding changes, so
# stale caches are not reused.
FORMAT_VERSION = 2  # 2: data.format, splits by characters in whole documents
TOKENIZER_FILE = "tokenizer.model"
META_FILE = "meta.json"
# Rows a lazy grain dataset of the (endless) global batch order spans.
_UNBOUNDED = 2**62


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """A tokenized corpus.

  Attributes:
    tokenizer: trained on the train split.
    splits: document texts per split ('train', 'valid', 'test').
    tokens: per split, int32[n]: each document's ids, then EOS, in order.
    cache_dir: where tokenizer and streams are cached.
    reading: how the text was read (source, files, format).
  """

  tokenizer: Tokenizer
  splits: Mapping[str, list[str]]
  tokens: Mapping[str, np.ndarray]
  cache_dir: pathlib.Path
  reading: corpus_lib.Reading

  def describe(self) -> str:
    """Lines to print: how the corpus was read, then every split's size."""
    num_split = sum(len(texts) for texts in self.splits.values())
    num_read = self.reading.num_documents or num_split
    shares = corpus_lib.split_shares(self.splits)
    cut = (f", {num_split - num_read:,} more after cutting long documents"
           if num_split > num_read else "")
    lines = [
        self.reading.describe(),
        "data: split by characters, whole documents, train/valid/test "
        + "/".join(f"{corpus_lib.SPLIT_FRACTIONS[name]:.0%}"
                   for name in corpus_lib.SPLITS)
        + " asked, " + "/".join(f"{shares[name]:.1%}"
                                for name in corpus_lib.SPLITS)
        + f" got, in {corpus_lib.num_cycles(num_read)} stretch(es){cut}; "
        f"cached in {self.cache_dir}"]
    for name in corpus_lib.SPLITS:
      lines.append(
          f"  {name:5} {len(self.splits[name]):>10,} documents "
          f"{self.tokens[name].size:>12,} tokens "
          f"{sum(len(t) for t in self.splits[name]):>13,} characters")
    return "\n".join(lines)


def cache_key(splits: Mapping[str, Sequence[str]], vocab_size: int) -> str:
  """16 hex digits identifying (corpus text per split, vocab_size, FORMAT_VERSION).

  The corpus is identified by its content, not its path: an edited file gets a
  new key and a moved one keeps its key.
  """
  digest = hashlib.sha256(f"v{FORMAT_VERSION}|vocab{vocab_size}".encode())
  for name in corpus_lib.SPLITS:
    digest.update(f"|{name}:{len(splits[name])}".encode())
    for text in splits[name]:
      digest.update(text.encode("utf-8"))
      digest.update(b"\0")
  return digest.hexdigest()[:16]


def encode_documents(tokenizer: Tokenizer,
                     texts: Sequence[str]) -> np.ndarray:
  """int32[n]: the ids of each text followed by EOS, concatenated."""
  ids = []
  for text in texts:
    ids.extend(tokenizer.encode(text))
    ids.append(EOS_ID)
  return np.asarray(ids, dtype=np.int32)


def write_atomic(path: pathlib.Path, data: bytes) -> None:
  """Writes `data` to `path` through a temporary file in its folder and
  os.replace, so a reader never sees it half written; the file gets the
  mode a plain write would (0o666 less the umask, not mkstemp's 0o600)."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def _array_bytes(array: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  np.save(buffer, array, allow_pickle=False)
  return buffer.getvalue()


def _cached_tokenizer(cache_dir: pathlib.Path, splits, vocab_size: int,
                      reading) -> Tokenizer:
  """The tokenizer cached in `cache_dir`, or one trained on the train split
  and written there atomically.

  Raises:
    ValueError: `Tokenizer.train`'s, with the train split's size.
  """
  tokenizer_path = cache_dir / TOKENIZER_FILE
  if tokenizer_path.exists():
    return Tokenizer.load(str(tokenizer_path))
  try:
    tokenizer = Tokenizer.train(splits["train"], vocab_size)
  except ValueError as e:
    raise ValueError(
        f"data.{e} (the train split of {reading.source} has "
        f"{len(splits['train']):,} documents, "
        f"{sum(len(t) for t in splits['train']):,} characters)") from e
  cache_dir.mkdir(parents=True, exist_ok=True)
  write_atomic(tokenizer_path, tokenizer.model_proto)
  return tokenizer


def _meta(reading, tokenizer: Tokenizer, splits, tokens) -> dict:
  """meta.json of a prepared corpus: format version, source, sizes."""
  return dict(
      format_version=FORMAT_VERSION,
      source=reading.source,
      files=reading.num_files,
      format=reading.format,
      vocab_size=tokenizer.vocab_size,
      documents={k: len(v) for k, v in splits.items()},
      tokens={k: int(v.size) for k, v in tokens.items()},
      characters={k: sum(len(t) for t in v) for k, v in splits.items()},
      shares={k: round(v, 6)
              for k, v in corpus_lib.split_shares(splits).items()})


def prepare(path: str | None, vocab_size: int, workdir: str | os.PathLike,
            data_format: str = "auto") -> Corpus:
  """Reads, splits, tokenizes and caches the corpus at `path`.

  On a cache miss trains the tokenizer on the train split and encodes every
  split (`encode_documents`); each file is written atomically, so an
  interrupted or concurrent run leaves either no file or a whole one. On a hit
  only the corpus text is read (to compute the key). Prints nothing: print
  `Corpus.describe()` and call `check_corpus_size` next.

  Args:
    path: `data.path`: corpus file or folder, or None / '' for the bundled
      corpus (see `corpus.read_corpus`).
    vocab_size: `data.vocab_size`: tokenizer size, reserved ids and byte
      pieces included.
    workdir: cache root; files go to `{workdir}/data/{cache_key}/`
      (tokenizer.model, {split}.npy, meta.json).
    data_format: `data.format`: 'auto', 'paragraphs' or 'lines' (see
      `corpus`).

  Raises:
    ValueError: bad `path` (missing, empty, binary, not UTF-8), `data_format`
      or `vocab_size` (below the minimum, or more pieces than the train split
      holds); the message names the config key.
  """
  documents, reading = corpus_lib.read_corpus(path, data_format)
  splits = corpus_lib.split_documents(documents)
  cache_dir = pathlib.Path(workdir) / "data" / cache_key(splits, vocab_size)
  tokenizer = _cached_tokenizer(cache_dir, splits, vocab_size, reading)
  tokens = {}
  for name in corpus_lib.SPLITS:
    array_path = cache_dir / f"{name}.npy"
    if array_path.exists():
      tokens[name] = np.load(array_path, allow_pickle=False)
    else:
      tokens[name] = encode_documents(tokenizer, splits[name])
      write_atomic(array_path, _array_bytes(tokens[name]))
  meta_path = cache_dir / META_FILE
  if not meta_path.exists():
    write_atomic(meta_path, json.dumps(
        _meta(reading, tokenizer, splits, tokens), indent=2).encode())
  return Corpus(tokenizer=tokenizer, splits=splits, tokens=tokens,
                cache_dir=cache_dir, reading=reading)


def document_spans(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(starts, lengths), int64[D] each: the D documents of an EOS-ended stream.

  Lengths count the document's ids, not its EOS.
  """
  ends = np.flatnonzero(stream == EOS_ID)
  starts = np.concatenate([[0], ends + 1])[:-1]
  return starts, ends - starts


def _check_training_splits(corpus: Corpus,
                           config: ml_collections.ConfigDict) -> None:
  """Raises ValueError unless the train and valid splits hold one batch
  each (`check_corpus_size`)."""
  seq_len = config.data.seq_len
  batch_key, batch_size = "train.batch_size", config.train.batch_size
  evaluator_batch = (config.get("evaluator", {}).get("train", {})
                     .get("batch_size", 0))
  if evaluator_batch > batch_size:
    batch_key, batch_size = "evaluator.train.batch_size", evaluator_batch
  needed = batch_size * seq_len
  total_tokens = sum(int(t.size) for t in corpus.tokens.values())
  chars_per_token = sum(len(t) for texts in corpus.splits.values()
                        for t in texts) / max(total_tokens, 1)
  for name in ("train", "valid"):
    have = int(corpus.tokens[name].size)
    if have < needed:
      fraction = corpus_lib.SPLIT_FRACTIONS[name]
      minimum = math.ceil(needed / fraction)
      raise ValueError(
          f"corpus too small for the config: the {name} split has {have:,} "
          f"tokens, fewer than {batch_key} x data.seq_len = {batch_size} x "
          f"{seq_len} = {needed:,} tokens (one {name} batch); the {name} "
          f"split is {fraction:.0%} of the text, so data.path needs at least "
          f"{minimum:,} tokens (about {math.ceil(minimum * chars_per_token):,}"
          f" characters at {chars_per_token:.1f} characters per token) and "
          f"{corpus.reading.source} has {total_tokens:,}; give a larger "
          f"corpus or lower data.seq_len or {batch_key}")


def check_corpus_size(corpus: Corpus,
                      config: ml_collections.ConfigDict) -> None:
  """Raises unless the splits of `corpus` are large enough for `config`.

  Pure and fast (a pass over the token streams): call it right after
  `prepare`, before anything is trained. Needs:
    - train and valid splits: one batch each, B x data.seq_len tokens, with B
      the largest of train.batch_size and evaluator.train.batch_size (if
      set): what training (`pack`, `batches`) and its validation take;
    - test split, when `config` has a `compare` section:
      max(compare.batch_sizes) documents of at least compare.prompt_len +
      compare.reference_len tokens (EOS not counted): what `prompts` takes.

  Args:
    corpus: from `prepare`.
    config: an experiment config (configs/tiny.py) or a member config
      (`member_recipes.member_configs`, which has no `compare` section).

  Raises:
    ValueError: a split is too small; the message gives what the split has,
      the minimum, the config keys it comes from, and for token counts the
      corpus size that would suffice.
  """
  _check_training_splits(corpus, config)
  if "compare" not in config:
    return
  cmp = config.compare
  num_prompts = max(cmp.batch_sizes, default=0)
  length = cmp.prompt_len + cmp.reference_len
  _, lengths = document_spans(corpus.tokens["test"])
  long_enough = int((lengths >= length).sum())
  if long_enough < num_prompts:
    raise ValueError(
        f"corpus too small for the config: the test split has {long_enough} "
        f"documents of at least compare.prompt_len + compare.reference_len = "
        f"{cmp.prompt_len} + {cmp.reference_len} = {length} tokens (of "
        f"{lengths.size} documents, the longest {lengths.max(initial=0)} "
        f"tokens), fewer than max(compare.batch_sizes) = {num_prompts} "
        f"prompts; give a corpus with more or longer documents (data.path; "
        f"the test split is {corpus_lib.SPLIT_FRACTIONS['test']:.0%} of the "
        f"text) or lower compare.prompt_len, compare.reference_len or "
        f"compare.batch_sizes")


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
  """Cuts a token stream into consecutive sequences of seq_len tokens.

  Sequences cross document boundaries (marked by EOS); the ragged tail of
  n % seq_len tokens is dropped.

  Args:
    stream: int[n] token ids.
    seq_len: tokens per sequence.

  Returns:
    int32[n // seq_len, seq_len]; row m is stream[m * seq_len:(m + 1) * seq_len].

  Raises:
    ValueError: `stream` is not 1-D, seq_len < 1, or n < seq_len.
  """
  stream = np.asarray(stream)
  if stream.ndim != 1:
    raise ValueError(f"stream must be 1-D; got shape {stream.shape}")
  if not 1 <= seq_len <= stream.size:
    raise ValueError(
        f"seq_len={seq_len} must be in [1, {stream.size}] (the stream length)")
  num = stream.size // seq_len
  return stream[:num * seq_len].reshape(num, seq_len).astype(np.int32)


@functools.lru_cache(maxsize=4)
def _epoch_order(num_sequences: int, seed: int, epoch: int) -> np.ndarray:
  """int64[num_sequences]: the permutation of sequences in epoch `epoch`
  (cached: a per-process reader asks for it once per row)."""
  order = np.random.default_rng((seed, epoch)).permutation(num_sequences)
  order.flags.writeable = False
  return order


def _batch_indices(num_sequences: int, batch_size: int, seed: int,
                   step: int) -> np.ndarray:
  """int64[batch_size]: the rows of the packed sequences in batch `step`."""
  e, j = divmod(step, num_sequences // batch_size)
  return _epoch_order(num_sequences, seed, e)[j * batch_size:
                                              (j + 1) * batch_size]


def _check_batching(packed: np.ndarray, batch_size: int, seed: int,
                    start_step: int) -> None:
  """Raises the ValueError of `batches` for bad arguments."""
  if packed.ndim != 2:
    raise ValueError(f"packed must be 2-D [R, L]; got shape {packed.shape}")
  num = packed.shape[0]
  if not 1 <= batch_size <= num:
    raise ValueError(
        f"batch_size={batch_size} must be in [1, {num}] (sequences)")
  if seed < 0:
    raise ValueError(f"seed={seed} must be >= 0")
  if start_step < 0:
    raise ValueError(f"start_step={start_step} must be >= 0")


def batches(packed: np.ndarray, batch_size: int, seed: int,
            start_step: int = 0) -> Iterator[np.ndarray]:
  """Infinite iterator of training batches; batch k depends only on (seed, k).

  An epoch is R // batch_size steps (R = number of sequences); epoch e visits
  the sequences in the order of a permutation drawn from
  numpy.random.default_rng((seed, e)), batch_size at a time, and the last
  R % batch_size sequences of that order sit the epoch out. So batch k is
  rows order_e[j * B:(j + 1) * B] with e, j = divmod(k, R // B), and training
  resumed at step k (`start_step=k`) sees exactly the batches it would have.

  Args:
    packed: int32[R, L] sequences (see `pack`).
    batch_size: B, sequences per batch, <= R.
    seed: non-negative int.
    start_step: index of the first batch yielded.

  Returns:
    An iterator of int32[B, L] arrays (fresh copies).

  Raises:
    ValueError: packed is not 2-D, or batch_size, seed or start_step out of
      range (raised by this call, not by the first `next`).
  """
  _check_batching(packed, batch_size, seed, start_step)
  num = packed.shape[0]

  def generate() -> Iterator[np.ndarray]:
    step = start_step
    while True:
      yield packed[_batch_indices(num, batch_size, seed, step)].astype(
          np.int32, copy=False)
      step += 1

  return generate()


def process_batches(packed: np.ndarray, batch_size: int, seed: int,
                    shard: grain.sharding.ShardOptions,
                    start_step: int = 0) -> Iterator[np.ndarray]:
  """This process's share of every batch of `batches`, read with grain.

  For multi-host training (`lm_decoding.parallel.multihost`): with
  `shard.shard_count` = n_c shares, share c of batch k is rows
  [c * B / n_c, (c + 1) * B / n_c) of `batches(packed, batch_size, seed)`'s
  batch k, so the n_c shares of a step, concatenated in share order, are the
  one-process batch exactly, and a run on any number of processes sees the
  same global batches (and resumes at any step) as one process. Built as a
  lazy grain `MapDataset`: one record per row of the global order (row
  k * B + i is row i of batch k), `batch`ed into shares of B / n_c rows, of
  which this process keeps every n_c-th from `shard.shard_index` (grain
  slicing), starting at `start_step`; only this process's rows are read.

  Args:
    packed: int32[R, L] sequences (see `pack`).
    batch_size: B, the global batch size, <= R and divisible by n_c.
    seed: non-negative int.
    shard: grain ShardOptions (shard_index, shard_count); n_c = 1 gives
      `batches` itself. `multihost.process_shard` derives it from the batch
      sharding; `grain.sharding.ShardByJaxProcess()` is the same when the
      processes' devices follow the batch axis in process order.
    start_step: index of the first batch.

  Returns:
    An iterator of int32[B / n_c, L] arrays.

  Raises:
    ValueError: as `batches`, or batch_size not divisible by
      shard.shard_count.
  """
  _check_batching(packed, batch_size, seed, start_step)
  count, index = shard.shard_count, shard.shard_index
  if batch_size % count:
    raise ValueError(
        f"batch_size={batch_size} must divide into shard.shard_count={count}"
        " equal per-process shares")
  num = packed.shape[0]

  def row(r: int) -> np.ndarray:
    step, i = divmod(r, batch_size)
    return packed[_batch_indices(num, batch_size, seed, step)[i]]

  rows = grain.MapDataset.range(0, _UNBOUNDED).map(row)
  shares = rows.batch(batch_size // count, drop_remainder=True)
  mine = shares[index::count][start_step:]
  return (mine[k].astype(np.int32, copy=False) for k in range(len(mine)))


def prompts(corpus: Corpus, split: str, num: int, prompt_len: int,
            min_continuation: int) -> tuple[np.ndarray, list[str]]:
  """Prompts and reference continuations from the documents of a split.

  Takes the first `num` documents of `split`, in corpus order, with at least
  prompt_len + min_continuation tokens (EOS not counted); a prompt is the
  first prompt_len tokens of one (no BOS), its reference the decoded text of
  the next min_continuation tokens (what omission rate compares against).

  Returns:
    (prompt_tokens int32[num, prompt_len], reference_texts: num strings).

  Raises:
    ValueError: unknown split, num / prompt_len / min_continuation < 1, or
      fewer than `num` documents long enough (`check_corpus_size` tells
      earlier, naming the config keys).
  """
  if split not in corpus.tokens:
    raise ValueError(f"split={split!r}; allowed: {tuple(corpus.tokens)}")
  for name, value in (("num", num), ("prompt_len", prompt_len),
                      ("min_continuation", min_continuation)):
    if value < 1:
      raise ValueError(f"{name}={value} must be >= 1")
  stream = corpus.tokens[split]
  starts, lengths = document_spans(stream)
  long_enough = np.flatnonzero(lengths >= prompt_len + min_continuation)
  if long_enough.size < num:
    raise ValueError(
        f"num={num}: only {long_enough.size} documents of split {split!r} "
        f"have >= prompt_len + min_continuation = "
        f"{prompt_len + min_continuation} tokens")
  chosen = starts[long_enough[:num]]
  prompt_tokens = np.stack([stream[s:s + prompt_len] for s in chosen])
  references = [
      corpus.tokenizer.decode(
          stream[s + prompt_len:s + prompt_len + min_continuation])
      for s in chosen]
  return prompt_tokens.astype(np.int32), references
