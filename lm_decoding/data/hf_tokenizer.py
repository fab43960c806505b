"""Hugging Face tokenizers (`tokenizer.json`) behind the project's tokenizer
interface, with the checkpoint's chat template.

Published checkpoints (LLaDA, Dream, SDAR, Fast-dLLM v2, Qwen) ship a
`tokenizer.json` (byte-level BPE for the Qwen family) read here by the
`tokenizers` library (the Rust one `transformers` uses; no hand-written
BPE), a `tokenizer_config.json` with the special tokens and usually a chat
template (Jinja; or a separate `chat_template.jinja`), rendered as
`transformers.apply_chat_template` renders it: a sandboxed Jinja
environment with trim_blocks and lstrip_blocks, `raise_exception` and
`strftime_now` available, the special tokens as variables.

`HFTokenizer` has the methods of the sentencepiece `Tokenizer`
(`vocab_size`, `encode`, `decode`, `id_to_piece`, `eos_id`), so the
harness, the benchmarks and the quality metrics take either;
`load_tokenizer(path)` picks by what the path holds.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from lm_decoding.data.tokenizer import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# Tokens that end a turn or a text in the published chat models (LLaMA-3
# style '<|eot_id|>' as LLaDA-Instruct uses it, Qwen's '<|im_end|>' and
# '<|endoftext|>'): `end_ids` reports those the vocabulary has.
END_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>",
              "</s>", "<eos>")


def _content(token: Any) -> str | None:
  """A special token as tokenizer_config.json writes it (a string or an
  AddedToken dict with 'content')."""
  if isinstance(token, Mapping):
    return token.get("content")
  return token


class HFTokenizer:
  """A `tokenizers.Tokenizer` with the project tokenizer's methods.

  Build it with `HFTokenizer.load(folder_or_tokenizer_json)`.
  """

  def __init__(self, tokenizer: Any, config: Mapping[str, Any] | None = None,
               chat_template: str | None = None):
    """Args: a `tokenizers.Tokenizer`; the tokenizer_config.json fields;
    the Jinja chat template (None: the checkpoint has none)."""
    self._tok = tokenizer
    self.config = dict(config or {})
    self.chat_template = chat_template
    self._special = {
        name: _content(self.config.get(name)) for name in (
            "bos_token", "eos_token", "pad_token", "unk_token", "mask_token")}

  @classmethod
  def load(cls, path: str | os.PathLike) -> HFTokenizer:
    """From a folder (tokenizer.json, tokenizer_config.json, optional
    chat_template.jinja) or a tokenizer.json path.

    Raises:
      ValueError: no tokenizer.json there; a chat_template list without a
        'default' entry.
    """
    from tokenizers import Tokenizer as RustTokenizer  # a core dependency
    path = os.fspath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise ValueError(f"tokenizer path {path!r} holds no {TOKENIZER_FILE}")
    config = {}
    if os.path.isfile(os.path.join(folder, CONFIG_FILE)):
      with open(os.path.join(folder, CONFIG_FILE)) as f:
        config = json.load(f)
    template = config.get("chat_template")
    if isinstance(template, list):  # [{'name': ..., 'template': ...}, ...]
      named = {t["name"]: t["template"] for t in template}
      if "default" not in named:
        raise ValueError(f"{CONFIG_FILE} chat_template lists {sorted(named)}"
                         f"; no 'default' template")
      template = named["default"]
    if os.path.isfile(os.path.join(folder, TEMPLATE_FILE)):
      with open(os.path.join(folder, TEMPLATE_FILE)) as f:
        template = f.read()
    return cls(RustTokenizer.from_file(file), config, template)

  @property
  def vocab_size(self) -> int:
    """Ids the tokenizer can produce, added tokens included."""
    return self._tok.get_vocab_size(with_added_tokens=True)

  def token_id(self, token: str) -> int | None:
    """The id of a token string ('<|im_end|>'), None if absent."""
    return self._tok.token_to_id(token)

  def _special_id(self, name: str) -> int | None:
    token = self._special.get(name)
    return None if token is None else self.token_id(token)

  @property
  def eos_id(self) -> int | None:
    """The id of tokenizer_config.json's eos_token (None: none)."""
    return self._special_id("eos_token")

  @property
  def bos_id(self) -> int | None:
    return self._special_id("bos_token")

  @property
  def mask_id(self) -> int | None:
    """The id of mask_token, if the config names one."""
    return self._special_id("mask_token")

  def end_ids(self) -> tuple[int, ...]:
    """eos_id, then the ids of `END_TOKENS` the vocabulary has."""
    ids = [self.eos_id] + [self.token_id(t) for t in END_TOKENS]
    return tuple(dict.fromkeys(i for i in ids if i is not None))

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` with no special tokens added (no BOS/EOS:
    `add_special_tokens=False`); special-token strings in the text are
    read as those tokens, as transformers does."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def id_to_piece(self, token_id: int) -> str:
    """The token string of one id ('Ġthe' for byte-level BPE)."""
    return self._tok.id_to_token(int(token_id))

  def decode(self, ids: Sequence[int]) -> str:
    """Text of token ids (a list or an int array[T]), special tokens
    dropped (`skip_special_tokens=True`). Ids past the tokenizer's
    vocabulary, the padding rows of a model's embedding (Qwen2.5's
    151665..151935), have no text and are dropped too.

    Raises:
      ValueError: a negative id.
    """
    ids = [int(i) for i in ids]
    if any(i < 0 for i in ids):
      raise ValueError(f"ids {[i for i in ids if i < 0][:5]} are negative")
    return self._tok.decode([i for i in ids if i < self.vocab_size],
                            skip_special_tokens=True)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                          add_generation_prompt: bool = True,
                          **variables) -> str:
    """The prompt text of a conversation, as the checkpoint formats it.

    Args:
      messages: [{'role': 'system' | 'user' | 'assistant', 'content': str}].
      add_generation_prompt: end with the assistant turn's opening.
      **variables: more template variables (e.g. enable_thinking).
    Raises:
      ValueError: the checkpoint has no chat template, or the template
        raised (its message).
    """
    if self.chat_template is None:
      raise ValueError("this tokenizer has no chat template "
                       f"({CONFIG_FILE} chat_template, {TEMPLATE_FILE})")
    return render_chat_template(
        self.chat_template, messages=list(messages),
        add_generation_prompt=add_generation_prompt,
        **{k: v for k, v in self._special.items() if v is not None},
        **variables)


def render_chat_template(template: str, **variables) -> str:
  """A Jinja chat template rendered as transformers renders it (module
  docstring).

  Raises:
    ValueError: the template's `raise_exception` message, or a Jinja error.
  """
  import jinja2
  from jinja2 import sandbox

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=["jinja2.ext.loopcontrols"])
  def tojson(x, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception,
                     strftime_now=strftime_now)
  try:
    return env.from_string(template).render(**variables)
  except jinja2.exceptions.TemplateError as e:
    raise ValueError(f"chat template: {e}") from e


def load_tokenizer(path: str | os.PathLike) -> Tokenizer | HFTokenizer:
  """The tokenizer at `path`: a sentencepiece `.model` file (the project's
  `Tokenizer`), or a folder / file with a Hugging Face `tokenizer.json`
  (`HFTokenizer`).

  Raises:
    ValueError: neither.
  """
  path = os.fspath(path)
  if path.endswith(".model") and os.path.isfile(path):
    return Tokenizer.load(path)
  if (os.path.isdir(path) and os.path.isfile(
      os.path.join(path, TOKENIZER_FILE))) or (
          path.endswith(".json") and os.path.isfile(path)):
    return HFTokenizer.load(path)
  raise ValueError(f"tokenizer path {path!r} is neither a sentencepiece "
                   f".model file nor a folder with {TOKENIZER_FILE}")
