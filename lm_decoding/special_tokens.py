"""Reserved token ids, in one dependency-free place.

Every tokenizer of this project reserves the same five ids at the bottom of
its vocabulary, and every model, objective and decoder uses them through this
module (never as literals):

  PAD_ID  0  outside a sequence: never a target, never attended to by default
  UNK_ID  1  unknown piece (unused with byte fallback)
  BOS_ID  2  begin of sequence
  EOS_ID  3  end of sequence (a decoded row ends at its first EOS)
  MASK_ID 4  the absorbing state of masked diffusion (never a draw)
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID = 0, 1, 2, 3, 4
RESERVED_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID)
