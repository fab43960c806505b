"""Exact-answer tasks (issue 26): AR, MDLM and BD3-LM per task, every decoder.

One backbone and one budget for every model: the sizes below, trained for
train.budget_s seconds of training steps (or train.num_steps, whichever
comes first) on a fresh random initialisation, unless the model shipped in
lm_decoding/pretrained/tasks has this recipe (it is loaded); then every applicable
decoder is scored on the test split (exact match, validity, token accuracy,
NFE, ms per problem).

Usage:
  python experiments/tasks.py --config=configs/tasks.py --workdir=/tmp/tasks
  python experiments/tasks.py --config=configs/tasks.py --workdir=/tmp/tasks \
      --config.tasks=sudoku4 --config.train.budget_s=60
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.tasks = "sudoku4,permutation"  # comma-separated names of data.tasks.TASKS, run in order
  config.kinds = "ar,mdlm,bd3lm"   # models per task (task_training.KINDS)
  # Adapted models (issue 25 on a task): 'kind:parent' pairs, comma-separated
  # (e.g. 'mdlm:ar'): a model of `kind` started from the parameters of the
  # task's `parent` model ({workdir}/{task}/{parent}: trained in this run or
  # before), trained for train.adapt_budget_s, scored as '{kind}_from_{parent}'.
  config.adapt = ""

  config.data = ml_collections.ConfigDict()
  config.data.train_size = 20000   # distinct puzzles per task in train (valid, test: below); no puzzle in two splits
  config.data.valid_size = 256
  config.data.test_size = 256
  config.data.puzzle_file = ""     # '' = generated test split; else Sudoku puzzles, one per line ('.' or 0 = empty), replacing sudoku*'s test split
  config.data.sudoku_min_givens = 4   # difficulty = givens, drawn uniformly in [min, max] (4x4: 16 cells)
  config.data.sudoku_max_givens = 10
  config.data.permutation_items = 8   # n: output any ordering of n distinct items
  config.data.permutation_alphabet = 16
  config.data.sort_items = 8          # n: output the n items (drawn with repetition) sorted
  config.data.sort_alphabet = 16

  config.model = ml_collections.ConfigDict()
  config.model.d_model = 128
  config.model.num_layers = 3
  config.model.num_heads = 4
  config.model.num_kv_heads = 4
  config.model.head_dim = 32
  config.model.mlp_dim = 512
  config.model.max_len = 32        # >= P + T of every task run (sudoku4: 32, permutation: 16, sort: 16, countdown: 16)
  config.model.norm = "rmsnorm"
  config.model.positional = "rope"
  config.model.mlp_activation = "swiglu"
  config.model.tie_embeddings = True

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 64
  config.train.learning_rate = 1e-3
  config.train.warmup_steps = 100
  config.train.num_steps = 100000  # the cosine schedule's length; budget_s ends the run first
  config.train.budget_s = 360.0    # seconds of training steps per model (the budget; 2 shared CPU cores)
  config.train.adapt_budget_s = 120.0  # seconds of training steps of each adapted model (config.adapt)
  config.train.weight_decay = 0.01
  config.train.grad_clip_norm = 1.0
  config.train.eval_every = 100    # valid loss, checkpoint (resumable)
  config.train.block_length = 4    # BD3-LM's W; divides every task's P and T

  config.eval = ml_collections.ConfigDict()
  config.eval.steps = "1,2,4,8,16"  # K of the parallel decoders (capped at T; BD3-LM: multiples of T / W)
  config.eval.num_beams = 4
  config.eval.threshold = 0.9      # Fast-dLLM threshold decoder
  config.eval.factor = 1.0         # Fast-dLLM factor decoder

  # The commit rules' curves (experiments/task_rules.py, issue 36): greedy,
  # each setting one point (cells per forward, exact match), against one
  # cell a step in the best adaptive ordering.
  config.rules = ml_collections.ConfigDict()
  config.rules.kinds = "mdlm,bd3lm"         # the shipped diffusion models measured
  config.rules.thresholds = "0.3,0.5,0.7,0.9"  # tau (threshold; BD3-LM's remasking='threshold')
  config.rules.factors = "0.5,1.0,2.0,4.0"     # f of Fast-dLLM's factor rule (MDLM)
  config.rules.entropy_bounds = "0.03,0.1,0.3,1.0"  # gamma, nats, of the EB-sampler (MDLM)

  # Certainty-forcing self-distillation of a shipped task MDLM
  # (experiments/task_distill.py, issue 36): the teacher answers the first
  # distill.puzzles training puzzles, the kept answers fine-tune the MDLM.
  config.distill = ml_collections.ConfigDict()
  config.distill.task = "sudoku4"
  config.distill.teacher = "mdlm:margin"  # "mdlm:<ordering>" (the MDLM one cell a step), "ar" (the AR model, greedy) or "reference" (the training answers)
  config.distill.keep = "exact"     # 'exact', 'valid' or 'all' teacher answers (task_distillation.KEEP)
  config.distill.puzzles = 8192     # training puzzles the teacher answers
  config.distill.num_steps = 300    # fine-tuning steps (the cosine's length)
  config.distill.learning_rate = 3e-4
  config.distill.warmup_steps = 20
  config.distill.weight = 2.0       # beta of the entropy term
  config.distill.temperature = 0.5  # of softmax(logits / temperature)
  return config
