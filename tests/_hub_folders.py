"""Tiny hub-layout checkpoint folders written by the tests themselves: a
byte-level BPE tokenizer.json trained here (with Qwen's special tokens and
a ChatML chat template) and random weights saved as config.json +
model.safetensors. Nothing is downloaded."""

from __future__ import annotations

import json
import os

import jax

from lm_decoding.checkpoints import config_from_hf, hub
from lm_decoding.models import init_params

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] "
          "+ '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = ("Question: Tom has 3 apples and buys 4 more. How many apples? "
        "Answer: 3 + 4 = 7. #### 7\n"
        "def add(a, b):\n    return a + b\n") * 20


def perturbed(model):
  """A transformers model with every parameter moved by 0.1 N(0, 1) (seed
  1), so biases and norm weights are not their zero / one init; eval mode."""
  import torch
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn(p.shape, generator=generator))
  return model.eval()


def write_tokenizer(folder: str, vocab_size: int = 300,
                    chat_template: str | None = CHATML) -> dict[str, int]:
  """A byte-level BPE tokenizer.json (+ tokenizer_config.json) in folder;
  returns the special tokens' ids."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from tokenizers import trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator([TEXT], trainer)
  os.makedirs(folder, exist_ok=True)
  tok.save(os.path.join(folder, "tokenizer.json"))
  config = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>",
                bos_token=None)
  if chat_template is not None:
    config["chat_template"] = chat_template
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump(config, f)
  return {t: tok.token_to_id(t) for t in SPECIAL}


def write_checkpoint(folder: str, hf_config: dict, seed: int = 0,
                     tokenizer_vocab: int = 300) -> dict:
  """Tokenizer (of `tokenizer_vocab` ids), config.json and random
  model.safetensors in folder.

  hf_config's vocab_size, eos/pad/mask ids are filled in from the
  tokenizer (keys set to None are left out). Returns the config written.
  """
  ids = write_tokenizer(folder, tokenizer_vocab)
  fields = dict(hf_config)
  fields.setdefault("eos_token_id", ids["<|endoftext|>"])
  if fields.get("model_type") in ("Dream", "sdar", "Fast_dLLM_Qwen",
                                  "llada"):
    fields.setdefault("mask_token_id", ids["<|mask|>"])
  fields = {k: v for k, v in fields.items() if v is not None}
  config = config_from_hf(fields)
  params = jax.tree.map(lambda x: x * 4.0, init_params(
      config, jax.random.key(seed)))  # sharper than lecun init: varied text
  hub.save(folder, params, config, fields)
  return fields
