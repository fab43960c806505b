"""Writes tests/goldens/llada_reference.npz: the logits of LLaDA's reference
modeling code on two tiny random configs, the golden of
tests/test_hub_import.py (LLaDA has no transformers class to compare with).

Run with the authors' modeling code importable as `llada_model` (its
`configuration_llada.py` and `modeling_llada.py`; here from Fast-dLLM's
copy, github:NVlabs/Fast-dLLM llada/model/, which keeps LLaDA's forward);
that code is not part of this repository:

  PYTHONPATH=/path/to/dir/with/llada_model python \
      benchmarks/hub_import/llada_golden.py tests/goldens/llada_reference.npz

The weights are `weights(names_and_shapes)` below, which the test repeats:
tensor k of the sorted names is RandomState(k).standard_normal * 0.2 (norm
weights 1 + that).
"""

import sys

import numpy as np
import torch

from llada_model.configuration_llada import LLaDAConfig  # not shipped here
from llada_model import modeling_llada
from llada_model.modeling_llada import LLaDAModelLM

# Fast-dLLM's copy passes its cache argument `replace_position` to every
# block; the 'sequential' block (unchanged from LLaDA's) does not take it.
# Dropped here, where it is None, so the block runs as LLaDA wrote it.
_sequential = modeling_llada.LLaDASequentialBlock.forward
modeling_llada.LLaDASequentialBlock.forward = (
    lambda self, x, replace_position=None, **kw: _sequential(self, x, **kw))

# The two configs of the golden (also in tests/test_hub_import.py).
CONFIGS = {
    "llama_block": dict(
        model_type="llada", block_type="llama", activation_type="silu",
        d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=48,
        vocab_size=61, embedding_size=64, weight_tying=False,
        rope=True, rope_theta=500.0, layer_norm_type="rms",
        rms_norm_eps=1e-5, include_bias=False, include_qkv_bias=False,
        max_sequence_length=64, mask_token_id=60, eos_token_id=59,
        pad_token_id=59, alibi=False, attention_dropout=0.0,
        residual_dropout=0.0, embedding_dropout=0.0),
    "sequential_block": dict(
        model_type="llada", block_type="sequential",
        activation_type="swiglu", d_model=32, n_heads=4, n_kv_heads=None,
        multi_query_attention=True, n_layers=2, mlp_hidden_size=64,
        vocab_size=61, embedding_size=61, weight_tying=True, rope=True,
        rope_theta=10000.0, layer_norm_type="rms", rms_norm_eps=1e-6,
        include_bias=False, include_qkv_bias=True, max_sequence_length=64,
        mask_token_id=60, eos_token_id=59, alibi=False,
        attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0),
}
TOKENS = np.array([[5, 17, 60, 60, 33, 2, 60, 41, 8, 60, 60, 59],
                   [60, 60, 60, 7, 7, 7, 19, 60, 54, 3, 60, 60]])


def weights(names_and_shapes):
  """{name: float32 array}: see the module docstring."""
  out = {}
  for k, (name, shape) in enumerate(sorted(names_and_shapes)):
    x = np.random.RandomState(k).standard_normal(shape) * 0.2
    out[name] = (x + ("norm" in name or "ln_f" in name)).astype(np.float32)
  return out


def main(path):
  torch.manual_seed(0)
  golden = {}
  for case, fields in CONFIGS.items():
    fields = {k: v for k, v in fields.items() if k != "model_type"}
    model = LLaDAModelLM(LLaDAConfig(**fields), init_params=True).eval()
    shapes = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    state = weights(shapes)
    model.load_state_dict({n: torch.tensor(v) for n, v in state.items()})
    with torch.no_grad():
      logits = model(torch.tensor(TOKENS), use_cache=False).logits.float().numpy()
    golden[case] = logits
    print(case, logits.shape, sorted(state)[:3])
  np.savez(path, tokens=TOKENS, **golden)


if __name__ == "__main__":
  main(sys.argv[1])
