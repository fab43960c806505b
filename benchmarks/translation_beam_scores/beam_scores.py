"""Penalised scores (GNMT, alpha 0.6) of AR beam 4's and greedy's outputs on the first 8
test verses, under the shipped translation_ar model. Run from the repository root:
  python benchmarks/translation_beam_scores/beam_scores.py
(output: beam_scores.txt)."""
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.data import parallel_text as pt
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding.autoregressive import AutoregressiveDecoder, prompt_mask
from lm_decoding.decoding.beam_search import BeamSearchDecoder, gnmt_length_penalty
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import distillation, train
from lm_decoding.training.pretrained import member_recipes, recipes, store

_spec = importlib.util.spec_from_file_location(
    "translation_config", pathlib.Path(__file__).resolve().parents[2] / "configs" / "translation.py")
_config_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_config_module)
CONFIG = _config_module.get_config()
SET = member_recipes.TRANSLATION_DIR
member = member_recipes.translation_member_configs(CONFIG)["translation_ar"]
tok = Tokenizer.load(str(SET / recipes.TOKENIZER_FILE))
pairs = pt.encode_pairs(tok, pt.split_pairs(pt.read_pairs())["test"][:40], 48, 48)
params, _ = store.find(member, "translation_ar", tok, SET)
fn = make_logits_fn(train.model_config(member))
model = Model(fn, params)
prompts, lengths = pt.prompts(pairs)
n = 8
ar = dict(output_length=49, eos_ids=(EOS_ID,), pad_id=PAD_ID, prompt_attention="bidirectional")
greedy = AutoregressiveDecoder(sampling=SamplingConfig(temperature=0.0),
                               output_length=CONFIG.data.max_target_tokens + 1, eos_ids=(EOS_ID,),
                               pad_id=PAD_ID, prompt_attention="bidirectional")
g, _ = distillation.translate_all(greedy, model, prompts[:n], lengths[:n], n)
b, _ = distillation.translate_all(BeamSearchDecoder(num_beams=4, **ar), model, prompts[:n], lengths[:n], n)


def score(row, out):
  out = [int(x) for x in out]
  out = out[:out.index(EOS_ID) + 1] if EOS_ID in out else out
  p = [int(x) for x in np.asarray(prompts[row])[:int(lengths[row])]]
  seq = p + out
  toks = jnp.asarray([seq])
  pos = jnp.arange(len(seq))[None]
  mask = prompt_mask("bidirectional", jnp.asarray([len(p)]), len(seq), len(seq))
  lp = jax.nn.log_softmax(fn(params, toks, pos, attention_mask=mask).logits[0], -1)
  total = sum(float(lp[len(p) - 1 + i, tkn]) for i, tkn in enumerate(out))
  return total / float(gnmt_length_penalty(len(out), 0.6)), len(out)

for r in range(n):
  (sb, lb), (sg, lg) = score(r, np.asarray(b)[r]), score(r, np.asarray(g)[r])
  print(f"row {r}: beam {lb} tokens score {sb:.2f} | greedy {lg} tokens score {sg:.2f}")
