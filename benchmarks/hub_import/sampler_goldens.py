"""Writes tests/goldens/{dream,sdar,fast_dllm_v2}_sampler.npz: the tokens
each family's own generate draws from a stub denoiser, the goldens of
tests/test_hub_samplers.py (our decoders on the same stub, in JAX).

The reference samplers are not part of this repository; pass the files:

  python benchmarks/hub_import/sampler_goldens.py tests/goldens \
      --dream /path/to/dream/model/generation_utils.py \
      --sdar /path/to/SDAR/generate.py \
      --fast_dllm_v2 /path/to/Fast_dLLM_v2_7B/modeling.py

  dream         `DreamGenerationMixin.diffusion_generate` (Dream's
                generation_utils.py; read here in github:NVlabs/Fast-dLLM
                dream/model/generation_utils.py at 24cc59e, whose 'entropy',
                'maskgit_plus' and 'topk_margin' branches are Dream's).
  sdar          `block_diffusion_generate` (github:JetAstra/SDAR
                generate.py at c2041a8).
  fast_dllm_v2  `Fast_dLLM_QwenForCausalLM.generate` and
                `sample_with_top_p` of the hub checkpoint's modeling.py
                (Efficient-Large-Model/Fast_dLLM_v2_7B; read here in
                github:Satgoy152/DualDiffusion FastDLLM_inferencing/
                Fast_dLLM_v2_7B/modeling.py at d3a3470), the two methods
                taken from the file by name.

The stub (`stub_weights`, stored in each golden as float32 `stub_A`, ...,
which the test reads) is a bag-of-tokens
denoiser, float64 here: logits[i] = A[p_i] + E[x_i] C + mean_{j visible
from i} E[x_j] B, with MASK's logit lowered by 30 (the references may draw
MASK, ours never does); "visible" is the attention pattern of the family
(bidirectional for Dream, block-causal over absolute blocks for SDAR and
Fast-dLLM v2, whose caches here hold the committed tokens themselves).
SDAR's generate only samples (`torch.multinomial`, NaN at temperature 0):
its greedy limit is taken at temperature 1 with `torch.multinomial`
replaced by the argmax while it runs, so p(x0) is the softmax probability.
"""

import argparse
import ast
import importlib.util
import pathlib
import types

import numpy as np
import torch
from torch.nn import functional as F

VOCAB, MASK_ID, DIM, MAX_LEN = 24, 23, 8, 136
GEN_LENGTH = 64


def stub_weights(seed):
  """{A [MAX_LEN, V], E [V, D], B [D, V], C [D, V]} from RandomState(seed);
  MASK's column of A lowered by 30."""
  rng = np.random.RandomState(seed)
  w = dict(A=rng.standard_normal((MAX_LEN, VOCAB)) * 4.0,
           E=rng.standard_normal((VOCAB, DIM)),
           B=rng.standard_normal((DIM, VOCAB)) * 2.0,
           C=rng.standard_normal((DIM, VOCAB)) * 2.0)
  w["A"][:, MASK_ID] -= 30.0
  return w


def prompts(seed, rows, width):
  return np.random.RandomState(seed + 1).randint(0, 22, (rows, width))


class Stub:
  """The stub's logits for query tokens at positions over visible keys."""

  def __init__(self, seed):
    self.w = {k: torch.tensor(v) for k, v in stub_weights(seed).items()}

  def logits(self, queries, positions, keys, visible):
    """queries [B, Q], positions [Q], keys [B, K], visible bool [Q, K]."""
    e_q, e_k = self.w["E"][queries], self.w["E"][keys]
    vis = visible.to(torch.float64)
    context = (vis @ e_k) / vis.sum(-1, keepdim=True)
    return (self.w["A"][positions] + e_q @ self.w["C"]
            + context @ self.w["B"])


def load(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def dream(path, seed):
  """Dream's diffusion_generate, greedy, one block of 64, 32 steps, per alg."""
  generation = load(path, "dream_generation_utils")
  # transformers 5 calls validate(user_set_attributes=...); Dream's takes none
  generation.DreamGenerationConfig.validate = lambda self, **kwargs: None

  class Model(torch.nn.Module, generation.DreamGenerationMixin):

    def __init__(self):
      super().__init__()
      self.stub = Stub(seed)
      self.generation_config = generation.DreamGenerationConfig(
          mask_token_id=MASK_ID)

    @property
    def device(self):
      return torch.device("cpu")

    def forward(self, x, attention_mask=None, tok_idx=None):
      assert attention_mask == "full" and tok_idx is None
      length = x.shape[1]
      return types.SimpleNamespace(logits=self.stub.logits(
          x, torch.arange(length), x, torch.ones(length, length, dtype=bool)))

  rows = prompts(seed, 2, 4)
  out = {"prompts": rows}
  for alg in ("entropy", "maskgit_plus", "topk_margin"):
    settings = dict(temperature=0.0, alg=alg, alg_temp=0.0, steps=32,
                    max_new_tokens=GEN_LENGTH)
    tokens = Model().diffusion_generate(
        torch.tensor(rows), generation_config=generation.DreamGenerationConfig(
            mask_token_id=MASK_ID, pad_token_id=22, **settings), **settings)
    out[alg] = tokens[:, rows.shape[1]:].numpy()
  return out


def sdar(path, seed):
  """SDAR's block_diffusion_generate, one row at a time (its batch is 1)."""
  reference = load(path, "sdar_generate")
  stub = Stub(seed)
  stored = {}

  class Model:
    device = torch.device("cpu")

    def eval(self):
      pass

    def __call__(self, x, attention_mask, position_ids, past_key_values,
                 use_cache, store_kv):
      del use_cache
      keys = torch.cat([stored.get(id(past_key_values),
                                   x[:, :0]), x], 1)
      logits = stub.logits(x, position_ids[0], keys,
                           attention_mask[0].bool())
      if store_kv:
        stored[id(past_key_values)] = keys
      return types.SimpleNamespace(logits=logits)

  rows = prompts(seed, 2, 8)
  out = {"prompts": rows}
  settings = {"static_w4": (4, 4, "low_confidence_static"),
              "static_w8": (8, 4, "low_confidence_static"),
              "dynamic_w4": (4, 4, "low_confidence_dynamic")}
  greedy = lambda probs, num_samples: probs.argmax(-1, keepdim=True)
  for name, (block, steps, strategy) in settings.items():
    tokens = []
    for row in rows:
      stored.clear()
      multinomial, torch.multinomial = torch.multinomial, greedy
      try:
        x = reference.block_diffusion_generate(
            Model(), {"input_ids": torch.tensor(row[None])}, MASK_ID,
            gen_length=GEN_LENGTH, block_length=block,
            denoising_steps=steps, temperature=1.0,
            remasking_strategy=strategy, confidence_threshold=0.85)
      finally:
        torch.multinomial = multinomial
      tokens.append(x[0, len(row):len(row) + GEN_LENGTH].numpy())
    out[name] = np.stack(tokens)
  return out


def fast_dllm_v2(path, seed):
  """Fast-dLLM v2's generate: blocks of 32, sub-blocks of 8, threshold 0.9."""
  tree = ast.parse(pathlib.Path(path).read_text())
  methods = [node for cls in tree.body if isinstance(cls, ast.ClassDef)
             for node in cls.body if isinstance(node, ast.FunctionDef)
             and node.name in ("generate", "sample_with_top_p")]
  namespace = {"torch": torch, "F": F}
  for method in methods:
    method.decorator_list = []
    exec(compile(ast.Module([method], []), path, "exec"), namespace)
  stub, block = Stub(seed), 32

  class Model:
    device = torch.device("cpu")
    generate = namespace["generate"]
    sample_with_top_p = namespace["sample_with_top_p"]

    def forward(self, input_ids, use_cache, update_past_key_values,
                past_key_values=None, block_size=None, **kwargs):
      del use_cache, block_size, kwargs
      cached = (input_ids[:, :0] if past_key_values is None
                else past_key_values)
      keys = torch.cat([cached, input_ids], 1)
      positions = torch.arange(cached.shape[1], keys.shape[1])
      visible = (torch.arange(keys.shape[1])[None] // block
                 <= positions[:, None] // block)
      logits = stub.logits(input_ids, positions, keys, visible)
      return types.SimpleNamespace(
          logits=logits,
          past_key_values=keys if update_past_key_values else cached)

  rows = prompts(seed, 2, 64)
  x = Model().generate(torch.tensor(rows), max_new_tokens=GEN_LENGTH,
                       mask_id=MASK_ID, threshold=0.9, small_block_size=8,
                       block_size=block, stop_token=-1, temperature=0)[0]
  return {"prompts": rows,
          "tokens": x[:, rows.shape[1]:rows.shape[1] + GEN_LENGTH].numpy()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("folder")
  parser.add_argument("--dream")
  parser.add_argument("--sdar")
  parser.add_argument("--fast_dllm_v2")
  args = parser.parse_args()
  for name, writer, seed in (("dream", dream, 0), ("sdar", sdar, 1),
                             ("fast_dllm_v2", fast_dllm_v2, 2)):
    if getattr(args, name):
      arrays = writer(getattr(args, name), seed)
      arrays.update({f"stub_{k}": v.astype(np.float32)
                     for k, v in stub_weights(seed).items()})
      np.savez(pathlib.Path(args.folder) / f"{name}_sampler.npz", **arrays)
      print(name, {k: v.shape for k, v in arrays.items()})


if __name__ == "__main__":
  main()
