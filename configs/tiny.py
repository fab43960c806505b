"""Tiny CPU default: trains in minutes on 2 cores, decodes 256 new tokens.

Usage:
  python experiments/train.py --config=configs/tiny.py --workdir=/tmp/run \
      --config.train.objective=mdlm --config.model.num_layers=2
"""

import ml_collections

from lm_decoding.parallel import sharding


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  # FLOP/s the training log's MFU is measured against; 0 measures a float32
  # matmul at the start of each run (not part of a model's recipe).
  config.peak_flops = 0.0

  # Device mesh (lm_decoding.parallel.sharding.mesh_from_config). (1, 1, 1) is
  # one device, the unsharded path; -1 (or 0) in one axis takes the devices
  # left over, e.g. --config.mesh.shape="(-1, 1, 1)" is data parallel on all.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.shape = (1, 1, 1)    # (data, fsdp, tensor) within a slice
  config.mesh.num_slices = 1       # > 1: hybrid ICI/DCN mesh over slices
  config.mesh.dcn_shape = (1, 1, 1)  # (data, fsdp, tensor) across slices, product num_slices
  config.mesh.preset = ""          # the preset the shape came from (larger configs)
  config.mesh.rules = sharding.DEFAULT_RULES  # logical axis -> mesh axes

  config.data = ml_collections.ConfigDict()
  config.data.path = ""            # '' = bundled Austen corpus; else a UTF-8 file (.gz too) or folder
  config.data.vocab_size = 4096    # sentencepiece vocabulary, reserved ids included
  config.data.seq_len = 256        # training sequence length (tokens)
  config.data.format = "auto"      # auto | paragraphs (blank-line separated) | lines (one per line)

  config.model = ml_collections.ConfigDict()
  config.model.d_model = 128
  config.model.num_layers = 2
  config.model.num_heads = 4
  config.model.num_kv_heads = 4    # 4 = MHA, 1 = MQA, in between = GQA
  config.model.head_dim = 32
  config.model.mlp_dim = 512
  config.model.max_len = 320       # KV cache / denoiser length: prompt + 256 new tokens fits
  config.model.norm = "rmsnorm"    # rmsnorm | layernorm
  config.model.positional = "rope"  # rope | learned
  config.model.mlp_activation = "swiglu"  # swiglu | gelu
  config.model.tie_embeddings = True
  config.model.dtype = "float32"
  config.model.param_dtype = "float32"

  config.train = ml_collections.ConfigDict()
  config.train.objective = "ar"    # ar (causal attention) | mdlm (bidirectional) | bd3lm (blocks)
  config.train.batch_size = 16
  config.train.num_steps = 300
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 100
  config.train.weight_decay = 0.01
  config.train.grad_clip_norm = 1.0
  config.train.eval_every = 100    # steps between validation passes
  config.train.eval_batches = 8    # validation batches (fixed, deterministic)
  config.train.mdlm_eval_timesteps = 8  # fixed t grid for the MDLM bound (BD3-LM: strata)
  config.train.block_length = 16   # bd3lm: block length W, divides seq_len (1 = AR, seq_len = MDLM)
  config.train.checkpoint_every = 100
  config.train.keep_checkpoints = 2

  # The evaluator scores samples (gen-PPL): a larger causal model, other seed.
  config.evaluator = ml_collections.ConfigDict()
  config.evaluator.seed = 1
  config.evaluator.model = ml_collections.ConfigDict(
      dict(d_model=192, num_heads=6, num_kv_heads=6, mlp_dim=768))
  config.evaluator.train = ml_collections.ConfigDict(dict(num_steps=300))

  # AR drafts for speculative decoding ("draft=draft_small"): member name ->
  # model overrides; same data, tokenizer, seed, objective (ar) and training
  # as 'ar' (d128, 2 layers, 4 heads, mlp 512), only smaller.
  config.drafts = ml_collections.ConfigDict()
  config.drafts.draft_small = ml_collections.ConfigDict(
      dict(d_model=64, num_layers=1, num_heads=2, num_kv_heads=2, mlp_dim=256))
  config.drafts.draft_medium = ml_collections.ConfigDict(
      dict(num_layers=1))  # the target's width, one layer of two

  # Training overrides of one member (member name -> train keys), applied
  # after every member is derived, so the adapted members and the controls
  # keep the shared recipe above. Empty here; configs/base.py trains 'mdlm'
  # longer.
  config.member_train = ml_collections.ConfigDict()

  # The main job (experiments/compare_decoding.py): the default grid answers
  # the question (is a parallel decoder worth it here, at what quality, at
  # which batch size) in at most 10 minutes on 2 CPU cores, cold: each family
  # at its strongest setting on configs/full.py's grid at T = 256 (the
  # setting with the best quality for its cost there), the naive uncached
  # AR loop, one output length, B = 1 and 8. configs/full.py is the full grid.
  config.compare = ml_collections.ConfigDict()
  config.compare.output_lengths = (256,)  # T, tokens generated per row
  config.compare.batch_sizes = (1, 8)   # B; quality is scored at the largest
  config.compare.prompt_len = 16        # P, tokens of held-out text per prompt
  config.compare.reference_len = 64     # human continuation scored beside the samples
  config.compare.temperature = 1.0      # one sampling temperature for every decoder
  config.compare.timed_runs = 3         # timed runs per row: minimum, median and spread
  config.compare.baseline = "AR cached"  # the entry the verdict, crossover and K* compare against
  # The entry greedy rows (temperature 0, or no sampling) are judged against
  # instead ('' = none: every row against the baseline); it sets temperature=0.
  config.compare.greedy_baseline = "AR greedy temp=0"
  # The verdict's quality tolerance against the row's reference (AR sampling,
  # or AR greedy for greedy rows): a decoder counts when its gen-PPL is at
  # most this fraction above the reference's and its entropy at most this
  # many nats below.
  config.compare.tolerance_gen_ppl = 0.10
  config.compare.tolerance_entropy = 0.10
  config.compare.pretrained_set = ""    # '' = lm_decoding/pretrained; 'base' its subfolder
  # Members of that set loaded by their own manifest's recipe and never
  # trained (a distilled student: docs/self_distillation.md); entries bind
  # them by name like the config's own members.
  config.compare.stored_members = ()
  # One decoder per line: "label | decoder | role=member ... | option=value ...".
  # The label is a template showing every option it sets; the value T means the
  # output length; steps, block_length and draft_steps above T are clamped to
  # T. Roles bind models by member name (member_recipes.member_configs). See
  # entries.py.
  config.compare.decoders = (
      "AR cached | ar | model=ar",
      "AR uncached | ar_uncached | model=ar",  # the naive baseline
      # MDLM: K = 8's gen-PPL is within 15% of K = 32's and K = T's (entropy
      # 3.3 against 3.6-3.7 nats) at a quarter of K = 32's cost.
      "MDLM K={steps} | mdlm | model=mdlm | steps=8",
      # Uniform-noise diffusion (DiffusionGemma's sampler, issue 27) on its
      # own member at the same budget: 32 full passes, as cheap as MaskGIT.
      "uniform EB K={steps} | uniform_eb | model=uniform | steps=32",
      # LLaDA: the margin ordering keeps entropy near AR's where the
      # confidence ordering repeats itself (2.3 against 3.3 nats).
      "LLaDA {remasking} K={steps} block={block_length} | llada | model=mdlm"
      " | remasking=margin steps=32 block_length=32",
      # Fast-dLLM threshold decoding: the dual cache gives the uncached
      # decoder's tokens in a fourth to a fifth of its time.
      "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm"
      " | threshold=0.9 block_length=32 kv_cache=dual",
      "MaskGIT K={steps} | maskgit | model=mdlm | steps=32",
      "ReMDM K={steps} | remdm | model=mdlm | steps=32",
      "BD3-LM block={block_length} K={steps} | bd3lm | model=bd3lm | block_length=16 steps=T",
      "speculative small draft gamma={gamma} | speculative"
      " | target=ar draft=draft_small | gamma=4",
      "prompt lookup gamma={gamma} | prompt_lookup | target=ar | gamma=4",
      "MDLM K={draft_steps} skeleton + AR polish p>={threshold} gamma={gamma}"
      " | skeleton_polish | target=ar draft=mdlm | draft_steps=32 threshold=0.01"
      " gamma=8",
      # Greedy rows, judged against AR greedy (compare.greedy_baseline) as
      # Fast-dLLM compares greedy with greedy; last, so the grids that
      # derive from this one keep them at the end.
      "AR greedy temp={temperature} | ar | model=ar | temperature=0",
      "threshold tau={threshold} block={block_length} cache={kv_cache}"
      " temp={temperature} | threshold | model=mdlm | threshold=0.9"
      " block_length=32 kv_cache=dual temperature=0",
  )
  return config
