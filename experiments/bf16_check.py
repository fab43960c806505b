r"""bf16 numerics at full length: every decoder on a bf16 cast of the shipped models.

  python experiments/bf16_check.py --config=configs/tiny.py \
      --out=experiments/results/bf16_check.md

Casts the shipped parameters (`lm_decoding/pretrained/`) to bfloat16, runs
the models with bfloat16 activations (`model.dtype=param_dtype='bfloat16'`),
and decodes with every registered decoder from prompts of P tokens of Austen
text to P + T = model.max_len (the KV cache or the denoised sequence is
full at the end), with the debug switch on (`lm_decoding.debug`): every
model call inside the compiled steps checks that no logit is NaN or +inf.
Roles bind the shipped members: a denoiser's model or draft the 'mdlm'
model (BD3-LM its own 'bd3lm' model), every other role (targets, AR models
and drafts) the 'ar' model. Prints and writes a table:
decoder, the length reached, finite yes/no, seconds.
"""

import dataclasses
import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from jax.experimental import checkify
from ml_collections import config_flags

from lm_decoding import debug
from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import base, make_decoder, registered
from lm_decoding.decoding.denoising import ScheduledDecoder
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.training import train
from lm_decoding.training.pretrained import member_recipes, recipes, store

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"),
    "Experiment configuration file (its model shape is the shipped one).")
_OUT = flags.DEFINE_string("out", "experiments/results/bf16_check.md",
                           "Markdown table written here.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "P, prompt tokens.")
_BATCH = flags.DEFINE_integer("batch_size", 2, "B, prompts decoded together.")
_STEPS = flags.DEFINE_integer(
    "steps", 32, "K of the scheduled decoders (BD3-LM: one step per token).")

BF16 = "bfloat16"


def bf16_member(config, name: str) -> Model:
  """Shipped member `name`, parameters cast to bf16, bf16 activations.

  Raises:
    ValueError: the shipped set has no member `name` matching `config`.
  """
  member = member_recipes.member_configs(config)[name]
  tokenizer = Tokenizer.load(
      str(recipes.DEFAULT_DIR / recipes.TOKENIZER_FILE))
  params, reason = store.find(member, name, tokenizer)
  if params is None:
    raise ValueError(reason)
  cfg = train.model_config(member)
  params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
  return Model(make_logits_fn(cfg.replace(dtype=BF16, param_dtype=BF16)),
                    params)


def build(name: str, room: int):
  """Decoder `name` filling `room` = max_len - P cache slots; returns
  (decoder, member per role).

  T = room, except for draft-and-verify decoders, whose verification call
  needs gamma - 1 slots past the output: T = room - (gamma - 1).
  """
  cls = base.decoder_class(name)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  output_length = room - (fields["gamma"].default - 1 if "gamma" in fields
                          else 0)
  options = {"output_length": output_length, "eos_ids": ()}
  if name == "bd3lm":
    options.update(block_length=16, steps=output_length)
  elif issubclass(cls, ScheduledDecoder):
    options["steps"] = _STEPS.value
  decoder = make_decoder(name, **options)
  denoiser = "bd3lm" if name == "bd3lm" else "mdlm"
  return decoder, {role: denoiser if role != "target" and "mask_id" in fields
                   else "ar" for role in decoder.roles}


def main(argv):
  del argv
  config = _CONFIG.value
  tokenizer = Tokenizer.load(str(recipes.DEFAULT_DIR
                                 / recipes.TOKENIZER_FILE))
  texts = [t for t in corpus.load_paragraphs("")
           if len(tokenizer.encode(t)) >= _PROMPT_LEN.value][:_BATCH.value]
  prompts = jnp.asarray([tokenizer.encode(t)[:_PROMPT_LEN.value]
                         for t in texts], jnp.int32)
  lengths = jnp.full((len(texts),), _PROMPT_LEN.value, jnp.int32)
  max_len = config.model.max_len
  output_length = max_len - _PROMPT_LEN.value
  members = {name: bf16_member(config, name) for name in ("ar", "mdlm",
                                                          "bd3lm")}
  debug.enable()
  rows = []
  for name in registered():
    start, binding = time.time(), {}
    try:
      decoder, binding = build(name, output_length)
      out = decoder.decode({r: members[m] for r, m in binding.items()},
                           prompts, lengths, jax.random.key(config.seed))
      reached = _PROMPT_LEN.value + int(out.tokens.shape[1])
      if "gamma" in {f.name for f in dataclasses.fields(decoder)}:
        reached = f"{reached} (+ gamma - 1 = {decoder.gamma - 1} verified)"
      finite = "yes"
    except checkify.JaxRuntimeError as e:
      reached, finite = "—", f"no: {str(e).splitlines()[0]}"
    except ValueError as e:  # a decoder this generic setup cannot build
      reached, finite = "—", f"not run: {str(e).splitlines()[0]}"
    used = ", ".join(sorted(set(binding.values()))) or "—"
    rows.append(f"| {name} | {used} | {reached} | {finite} | "
                f"{time.time() - start:.1f} |")
    print(rows[-1], flush=True)
  table = "\n".join([
      "# bf16 decoding at full length",
      "",
      f"Shipped models cast to bfloat16 (parameters and activations), "
      f"B = {len(texts)} Austen prompts of P = {_PROMPT_LEN.value} tokens, "
      f"T = {output_length} new tokens: P + T = model.max_len = {max_len} "
      "(draft-and-verify decoders: P + T + gamma - 1, their verification "
      "window). "
      f"Scheduled decoders K = {_STEPS.value} (BD3-LM block 16, K = T); "
      "fixed length (no EOS). Finite: no model call of the compiled steps "
      "produced a NaN or +inf logit (`lm_decoding.debug` checks on). "
      f"Device: {jax.devices()[0].device_kind}.",
      "",
      "| decoder | models | length reached (P + T) | finite | seconds |",
      "|---|---|---|---|---|",
      *rows, ""])
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    f.write(table)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
