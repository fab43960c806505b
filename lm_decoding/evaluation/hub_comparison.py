"""The main job's comparison on imported checkpoints (configs/hub.py,
experiments/compare_hub.py).

The models are local hub-layout folders (`checkpoints.hub`), named in the
config (`config.hub.models`: 'name=folder, ...'); the evaluator that scores
samples is one more folder, an AR model. What it takes from the main job:
the decoder entries (`entries`: `| model=<name>` binds a folder), the grid,
the frontier and the verdict (`comparison.run`, `report.write`). What it
adds: every folder is inspected (config, conventions, tokenizer) and every
decoder adopted to the ids of the models it binds (`decoding.conventions.
adopt`: MASK, EOS, PAD) and checked to serve them before any tensor is read;
prompts come from an exact-answer benchmark file (`exact_answer`), which is
also scored for every decoder.

The grid and its frontier need one tokenizer (prompts, the evaluator's
gen-PPL): a model whose tokenizer encodes text differently from the
evaluator's (added special tokens aside: Dream's MASK) is refused from the
grid by name; run it in the exact-answer benchmark alone
(`config.hub.grid=False`), where each model encodes its own prompts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from lm_decoding.checkpoints import hub
from lm_decoding.decoding import conventions
from lm_decoding.evaluation import entries
from lm_decoding.evaluation import exact_answer as ea
from lm_decoding.models.binding import Model
from lm_decoding.models.transformer import make_logits_fn


def parse_models(text: str) -> dict[str, str]:
  """{name: folder} of 'name=folder, name=folder'.

  Raises:
    ValueError: an empty list, a pair without '=', a repeated name, or the
      evaluator's reserved name (named).
  """
  pairs = [p.strip() for p in text.split(",") if p.strip()]
  if not pairs:
    raise ValueError("hub.models is empty; give 'name=folder, ...'")
  out = {}
  for pair in pairs:
    name, sep, folder = pair.partition("=")
    name, folder = name.strip(), folder.strip()
    if not sep or not name or not folder:
      raise ValueError(f"hub.models entry {pair!r} must be name=folder")
    if name in out or name == entries.EVALUATOR:
      raise ValueError(f"hub.models name {name!r} is repeated or reserved "
                       f"({entries.EVALUATOR!r} is the evaluator)")
    out[name] = folder
  return out


def inspect_all(folders: Mapping[str, str], evaluator: str,
                grid: bool, **overrides) -> dict[str, hub.Inspected]:
  """Every folder inspected (`hub.inspect`), the evaluator under
  `entries.EVALUATOR`; no tensor is read.

  Raises:
    ValueError: any refusal of `hub.inspect` (prefixed with the model's
      name); a folder without tokenizer.json; a causal-attention evaluator
      missing; with `grid`, a model whose tokenizer is not the evaluator's.
  """
  seen = {}
  for name, folder in {**folders, entries.EVALUATOR: evaluator}.items():
    try:
      seen[name] = hub.inspect(folder, **overrides)
    except ValueError as e:
      raise ValueError(f"model {name!r} ({folder}): {e}") from e
    if seen[name].tokenizer is None:
      raise ValueError(f"model {name!r} ({folder}) has no tokenizer.json")
  if seen[entries.EVALUATOR].config.attention != "causal":
    raise ValueError(f"hub.evaluator {evaluator} must be an AR (causal) "
                     f"model; it is {seen[entries.EVALUATOR].config.attention}")
  if grid:
    reference = seen[entries.EVALUATOR].tokenizer
    for name in folders:
      tok = seen[name].tokenizer
      if any(tok.encode(t) != reference.encode(t) for t in _PROBES):
        raise ValueError(
            f"model {name!r} has another tokenizer than the evaluator's "
            f"(it encodes text differently); the grid scores every model "
            f"with one tokenizer: drop it, or set hub.grid=False for the "
            f"exact-answer benchmark alone")
  return seen


# Texts two tokenizers must encode alike to share the grid (added special
# tokens, such as a diffusion LM's MASK, may differ).
_PROBES = ("Question: 1,234 apples cost $5.50 each; how much? Answer: 6787.\n",
           "def f(x):\n    return x ** 2  # déjà vu, 東京, 🙂",
           "  The  quick\tbrown fox.\n\n")


def adopt_all(planned: Sequence[entries.Planned],
              seen: Mapping[str, hub.Inspected]) -> list[entries.Planned]:
  """The planned decoders with their models' ids (`conventions.adopt` on
  the decoder, its EOS twin and its reference), each checked to serve.

  Raises:
    ValueError: a decoder a model cannot serve, named with its label.
  """
  out = []
  for p in planned:
    models = {role: Model(make_logits_fn(seen[m].config), None, seen[m].ids)
              for role, m in p.roles}
    try:
      out.append(dataclasses.replace(
          p, decoder=conventions.adopt(p.decoder, models),
          eos_decoder=conventions.adopt(p.eos_decoder, models),
          reference=None if p.reference is None else conventions.adopt(
              p.reference, models)))
    except ValueError as e:
      raise ValueError(f"decoder {p.label!r}: {e}") from e
  return out


def grid_prompts(tokenizer: Any, texts: Sequence[str], prompt_len: int,
                 chat: bool) -> np.ndarray:
  """int32[R, P]: the last `prompt_len` tokens of each prompt text (through
  the chat template when `chat`), which keeps the question's end and the
  assistant turn's opening; the grid decodes full-width rows.

  Raises:
    ValueError: a prompt shorter than prompt_len (named).
  """
  ids, lengths = ea.prompt_ids(tokenizer, texts, chat)
  short = np.flatnonzero(lengths < prompt_len)
  if short.size:
    raise ValueError(f"prompt {int(short[0])} has {int(lengths[short[0]])} "
                     f"tokens; compare.prompt_len={prompt_len} needs at least "
                     f"as many (lower it, or use more shots)")
  return np.stack([row[n - prompt_len:n] for row, n in zip(ids, lengths)])


def check_room(seen: Mapping[str, hub.Inspected], texts: Sequence[str],
               chat: bool, output_length: int) -> None:
  """Raises ValueError unless every model fits its longest benchmark
  prompt (its own tokenizer, chat template when `chat`) plus
  `output_length` new tokens in its max_len."""
  for name, s in seen.items():
    _, lengths = ea.prompt_ids(s.tokenizer, texts, chat)
    if int(lengths.max()) + output_length > s.config.max_len:
      raise ValueError(
          f"model {name!r}: the longest benchmark prompt ({int(lengths.max())}"
          f" tokens) plus T={output_length} exceeds its max_len="
          f"{s.config.max_len}; use fewer hub.num_shots or shorter outputs")


def score_benchmark(planned: Sequence[entries.Planned],
                    models: Mapping[str, Model],
                    seen: Mapping[str, hub.Inspected],
                    problems: Sequence[ea.Problem], texts: Sequence[str],
                    chat: bool, seed: int, timeout_s: float,
                    batch_size: int) -> list[dict]:
  """One exact-answer record (`exact_answer.score`) per planned decoder in
  EOS mode, `batch_size` rows at a time, each model encoding the prompts
  with its own tokenizer (the output role's: 'target', else 'model'); the
  record gains output_length and the model names."""
  rows = []
  for p in planned:
    roles = dict(p.roles)
    output = roles.get("target", roles.get("model"))
    tokenizer = seen[output].tokenizer
    prompts, lengths = ea.prompt_ids(tokenizer, texts, chat)
    record, _ = ea.score(p.label, p.eos_decoder,
                         {role: models[m] for role, m in p.roles}, tokenizer,
                         problems, prompts, lengths, seed, timeout_s,
                         batch_size)
    rows.append({**record, "output_length": p.output_length,
                 "models": " ".join(f"{r}={m}" for r, m in p.roles)})
  return rows


def describe(name: str, seen: hub.Inspected) -> str:
  """One line: the model's name, folder, family and conventions."""
  c = seen.config
  return (f"{name}: {os.path.basename(os.path.normpath(seen.folder))} "
          f"({seen.hf_config.get('model_type')}, {c.num_layers} layers, "
          f"d={c.d_model}, {c.attention}"
          f"{f' W={c.block_length}' if c.block_length else ''}"
          f"{', token shift' if c.token_shift else ''}; MASK "
          f"{seen.ids.mask_id}, EOS {list(seen.ids.eos_ids)})")
