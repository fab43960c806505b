"""Penalised scores (GNMT, alpha 0.6) of AR beam 4's and greedy's outputs on the first 8
test verses, under the shipped translation_ar model. Run from the repository root:
  PYTHONPATH=$PWD python benchmarks/translation_beam_scores/beam_scores.py
(output: beam_scores.txt)."""
import sys
sys.path.insert(0, "tests")
import numpy as np, jax, jax.numpy as jnp
import test_translation_pretrained as t
from lm_decoding.decoding.beam_search import BeamSearchDecoder, gnmt_length_penalty
from lm_decoding.decoding.autoregressive import prompt_mask
tok = t.Tokenizer.load(str(t.SET / t.pretrained.TOKENIZER_FILE))
pairs = t.pt.encode_pairs(tok, t.pt.split_pairs(t.pt.read_pairs())["test"][:40], 48, 48)
member = t.MEMBERS["translation_ar"]
params, _ = t.pretrained.find(member, "translation_ar", tok, t.SET)
fn = t.make_logits_fn(t.train.model_config(member))
model = t.Model(fn, params)
prompts, lengths = t.pt.prompts(pairs)
n = 8
ar = dict(output_length=49, eos_ids=(t.EOS_ID,), pad_id=t.PAD_ID, prompt_attention="bidirectional")
g, _ = t.distillation.translate_all(t._decoder("translation_ar"), model, prompts[:n], lengths[:n], n)
b, _ = t.distillation.translate_all(BeamSearchDecoder(num_beams=4, **ar), model, prompts[:n], lengths[:n], n)

def score(row, out):
  out = [int(x) for x in out]
  out = out[:out.index(t.EOS_ID) + 1] if t.EOS_ID in out else out
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
