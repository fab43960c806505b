"""Text data: corpora and their splits, SentencePiece tokenizer, LM batches."""

from lm_decoding.data.corpus import (
    FORMATS, SPLITS, load_documents, load_paragraphs, load_splits,
    read_corpus)
from lm_decoding.data.pipeline import (
    Corpus, batches, check_corpus_size, encode_documents, pack, prepare,
    prompts)
from lm_decoding.data.tokenizer import (
    BOS_ID, EOS_ID, MASK_ID, MIN_VOCAB_SIZE, PAD_ID, UNK_ID, Tokenizer)

__all__ = ["FORMATS", "SPLITS", "load_documents", "load_paragraphs",
           "load_splits", "read_corpus", "Corpus", "batches",
           "check_corpus_size", "encode_documents", "pack", "prepare",
           "prompts", "BOS_ID", "EOS_ID", "MASK_ID", "MIN_VOCAB_SIZE",
           "PAD_ID", "UNK_ID", "Tokenizer"]
