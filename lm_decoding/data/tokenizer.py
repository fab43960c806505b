"""SentencePiece unigram tokenizer with byte fallback and the project's reserved ids.

Reserved ids (the same everywhere in the project): PAD=0, UNK=1, BOS=2, EOS=3,
MASK=4 ('<mask>', the absorbing state of masked diffusion). PAD, BOS, EOS and
MASK are SentencePiece control symbols: encoding text never produces them
(not even the literal strings '<pad>', '<s>', '</s>', '<mask>') and decoding
drops them. Ids 5..260 are the 256 byte pieces '<0x00>'..'<0xFF>', so any
character missing from the vocabulary is spelled as its UTF-8 bytes and UNK
never appears.

Round trip: decode(encode(s)) == s for every string s without U+2581 ('▁',
SentencePiece's whitespace marker, which decodes to a space). The tokenizer
normalises nothing: the normalisation rule is 'identity' (no NFKC), extra
whitespace is kept (remove_extra_whitespaces=False) and no dummy prefix space
is added (add_dummy_prefix=False). The last choice also makes decoding
compositional: decode(a + b) == decode(a) + decode(b) whenever the cut does
not fall inside a character's byte pieces, so a continuation decodes the same
alone as after its prompt. Its price: a word at the start of a text is a
different piece from the same word after a space ('It' vs '▁It').

Training (Kudo 2018, unigram LM; Kudo & Richardson 2018, SentencePiece) is
deterministic: no sampling of input sentences inside SentencePiece (inputs
beyond MAX_TRAIN_CHARS are thinned by a fixed stride here instead) and a
fixed thread count, on which the EM result depends.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Protocol

import sentencepiece as spm

from lm_decoding.special_tokens import (  # noqa: F401  (re-exported)
    BOS_ID, EOS_ID, MASK_ID, PAD_ID, UNK_ID)

MASK_PIECE = "<mask>"
NUM_BYTE_PIECES = 256
# Reserved ids, byte pieces and room for the characters of the text and a few
# multi-character pieces; smaller vocabularies cannot be trained.
MIN_VOCAB_SIZE = MASK_ID + 1 + NUM_BYTE_PIECES + 64
MAX_TRAIN_CHARS = 4_000_000  # bounds training time (3-6 s for 3.6M chars)
MAX_SENTENCE_BYTES = 1 << 16  # SentencePiece skips longer training sentences
MAX_PIECE_CHARS = MAX_SENTENCE_BYTES // 4  # UTF-8: at most 4 bytes a character
NUM_THREADS = 2  # the trained model depends on it: keep it fixed
_DROPPED_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID, MASK_ID))

_TRAINER_OPTIONS = dict(
    model_type="unigram",
    byte_fallback=True,
    pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
    control_symbols=[MASK_PIECE],
    normalization_rule_name="identity",
    add_dummy_prefix=False,
    remove_extra_whitespaces=False,
    character_coverage=0.9995,
    shuffle_input_sentence=False,
    max_sentence_length=MAX_SENTENCE_BYTES,
    num_threads=NUM_THREADS,
    minloglevel=2,
)


class TextTokenizer(Protocol):
  """What the harness, the benchmarks and the metrics use of a tokenizer:
  this module's sentencepiece `Tokenizer`, or a Hugging Face tokenizer.json
  (`lm_decoding.data.hf_tokenizer.HFTokenizer`)."""

  @property
  def vocab_size(self) -> int: ...

  @property
  def eos_id(self) -> int | None: ...

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def id_to_piece(self, token_id: int) -> str: ...


def training_sample(texts: Sequence[str], max_chars: int = MAX_TRAIN_CHARS,
                    piece_chars: int = MAX_PIECE_CHARS) -> list[str]:
  """Texts used to train: all of them, or every k-th if they exceed max_chars.

  k = ceil(total characters / max_chars): a deterministic, evenly spread
  subset of about max_chars characters. A chosen text longer than
  piece_chars is cut into consecutive pieces of at most piece_chars
  characters, each ending after the last space that fits (or at piece_chars
  if none does): SentencePiece skips longer sentences, and a corpus of a few
  huge documents would otherwise leave it none ('!sentences_.empty()').
  """
  total = sum(len(t) for t in texts)
  stride = max(1, math.ceil(total / max_chars))
  sample = []
  for text in texts[::stride]:
    while len(text) > piece_chars:
      cut = text.rfind(" ", 1, piece_chars) + 1 or piece_chars
      sample.append(text[:cut])
      text = text[cut:]
    if text:
      sample.append(text)
  return sample


class Tokenizer:
  """A SentencePiece model with the reserved ids of the module docstring.

  Build it with `Tokenizer.train` or `Tokenizer.load`.
  """

  pad_id, unk_id, bos_id, eos_id, mask_id = (PAD_ID, UNK_ID, BOS_ID, EOS_ID,
                                              MASK_ID)

  def __init__(self, processor: spm.SentencePieceProcessor):
    """Wraps a loaded processor.

    Raises:
      ValueError: the model's reserved ids differ from PAD/UNK/BOS/EOS/MASK =
        0/1/2/3/4 or it has no byte fallback pieces.
    """
    found = (processor.pad_id(), processor.unk_id(), processor.bos_id(),
             processor.eos_id(), processor.piece_to_id(MASK_PIECE))
    expected = (PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID)
    if found != expected or not processor.is_control(MASK_ID):
      raise ValueError(
          f"model has PAD/UNK/BOS/EOS/{MASK_PIECE} ids {found}; expected "
          f"{expected} with {MASK_PIECE} a control symbol")
    if not all(processor.is_byte(MASK_ID + 1 + b)
               for b in range(NUM_BYTE_PIECES)):
      raise ValueError("model has no byte fallback pieces at ids 5..260")
    self._sp = processor

  @classmethod
  def train(cls, texts: Sequence[str], vocab_size: int,
            model_prefix: str | None = None) -> Tokenizer:
    """Trains a unigram model on `texts` (see `training_sample`).

    Args:
      texts: training texts, one sentence/paragraph each; any newline inside
        a text is kept (it becomes byte piece <0x0A>).
      vocab_size: number of ids, reserved ids and byte pieces included; the
        trained model has exactly this many.
      model_prefix: if given, the model is also written to
        `{model_prefix}.model` (not atomically; see `pipeline.prepare`).

    Raises:
      ValueError: vocab_size < MIN_VOCAB_SIZE, or too large for `texts`
        (SentencePiece's message gives the largest possible size), or no
        non-empty text.
    """
    if vocab_size < MIN_VOCAB_SIZE:
      raise ValueError(
          f"vocab_size={vocab_size} must be >= {MIN_VOCAB_SIZE} (5 reserved "
          f"ids + {NUM_BYTE_PIECES} byte pieces + 64)")
    sample = training_sample(texts)
    if not sample:
      raise ValueError("texts must hold at least one non-empty text")
    model = io.BytesIO()
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sample), model_writer=model,
          vocab_size=vocab_size, **_TRAINER_OPTIONS)
    except RuntimeError as e:
      raise ValueError(f"vocab_size={vocab_size} does not fit the texts: {e}"
                       ) from e
    tokenizer = cls.from_proto(model.getvalue())
    if model_prefix:
      with open(f"{model_prefix}.model", "wb") as f:
        f.write(tokenizer.model_proto)
    return tokenizer

  @classmethod
  def from_proto(cls, model_proto: bytes) -> Tokenizer:
    """The tokenizer of a serialized SentencePiece model."""
    return cls(spm.SentencePieceProcessor(model_proto=model_proto))

  @classmethod
  def load(cls, path: str) -> Tokenizer:
    """The tokenizer saved at `path` (a SentencePiece .model file).

    Raises:
      ValueError: `path` does not exist, is not a SentencePiece model, or
        has other reserved ids.
    """
    try:
      with open(path, "rb") as f:
        return cls.from_proto(f.read())
    except FileNotFoundError as e:
      raise ValueError(f"path={path!r}: no tokenizer model there") from e
    except RuntimeError as e:  # SentencePiece cannot parse the file
      raise ValueError(f"path={path!r} is not a SentencePiece tokenizer "
                       f"model: {e}") from e

  @property
  def model_proto(self) -> bytes:
    """The serialized SentencePiece model (what `load` reads)."""
    return self._sp.serialized_model_proto()

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without BOS/EOS; never PAD, BOS, EOS or MASK."""
    return self._sp.encode(text)

  def pieces(self, text: str) -> list[str]:
    """The pieces `encode` produces, as strings (for inspection)."""
    return self._sp.encode(text, out_type=str)

  def id_to_piece(self, token_id: int) -> str:
    """The piece of one id ('<0x41>' for a byte piece, '▁the', '<mask>')."""
    return self._sp.id_to_piece(int(token_id))

  def decode(self, ids: Sequence[int]) -> str:
    """Text of token ids (a list or an int array[T]) by SentencePiece's decoder.

    PAD, BOS, EOS and MASK ids decode to nothing; runs of byte pieces decode to
    their UTF-8 characters (an invalid byte sequence decodes to U+FFFD).

    Raises:
      ValueError: an id outside [0, vocab_size).
    """
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(
          f"ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
    return self._sp.decode([i for i in ids if i not in _DROPPED_IDS])
