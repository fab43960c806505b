"""Text data: bundled corpus, paragraph splits, SentencePiece tokenizer, LM batches."""

from lm_decoding.data.corpus import SPLITS, load_paragraphs, load_splits
from lm_decoding.data.pipeline import (
    Corpus, batches, encode_paragraphs, pack, prepare, prompts)
from lm_decoding.data.tokenizer import (
    BOS_ID, EOS_ID, MASK_ID, MIN_VOCAB_SIZE, PAD_ID, UNK_ID, Tokenizer)

__all__ = ["SPLITS", "load_paragraphs", "load_splits", "Corpus", "batches",
           "encode_paragraphs", "pack", "prepare", "prompts", "BOS_ID",
           "EOS_ID", "MASK_ID", "MIN_VOCAB_SIZE", "PAD_ID", "UNK_ID",
           "Tokenizer"]
