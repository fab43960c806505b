"""English -> Spanish translation (KJV -> Reina-Valera 1909), tiny CPU models.

One backbone, three objectives (`train.objective`):
  translation_ar  prefix LM, teacher forcing (decoded greedy and by beam)
  cmlm            conditional masked LM + length head (one-shot, Mask-Predict)
  ctc             CTC non-autoregressive over the upsampled source

Usage:
  python experiments/train.py --config=configs/translation.py \
      --workdir=/tmp/nat/cmlm --config.train.objective=cmlm
  python experiments/translate.py --config=configs/translation.py \
      --workdir=/tmp/nat
  (loads the shipped models of lm_decoding/pretrained/translation; add
  --retrain --export to train them again and ship the result)

Budget of the shipped models: num_steps 2000 of batch 32 (64,000 verse
pairs, about 3.2 epochs of the 19,754 train pairs under the limits), 0.8M
parameters, limits 48 / 48 tokens, trained one at a time on 2 CPU cores:
14 min 8 s for translation_ar (2.4 steps/s), 19 min 31 s for ctc (its
upsampled rows are longer: 1.7 steps/s), 30 min 56 s for cmlm (a test
suite shared the machine) (lm_decoding/pretrained/translation/TRAINING.md). Validation: AR loss 3.20 nats per token
(perplexity 24), CTC 3.86, CMLM 5.15 (the masked tokens' loss, which
learns slowest). The distilled students (translate.distill: cmlm_distilled,
ctc_distilled, same budget on the AR model's greedy outputs) took 17 min 0 s
and 20 min 29 s; their validation losses (6.46, 6.15) are against the
references, which they were not trained on.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.path = ""            # '' = bundled KJV / RV1909 verse pairs; else a reference<TAB>source<TAB>target or source<TAB>target file (docs/import_and_data.md)
  config.data.vocab_size = 2048    # joint sentencepiece vocabulary (both languages), reserved ids included
  config.data.max_source_tokens = 48  # S: longer verses are left out of every split (and counted): 48 keeps 66% of train, 69% of test (40: 51%)
  config.data.max_target_tokens = 48  # T: the same for the Spanish side; also the length head's classes
  config.data.seq_len = 98         # S + T + 2, the translation rows' width (registry.Objective.sequence_length decides; kept for check_config)
  config.data.targets = "reference"  # 'distilled': train targets = the AR model's outputs (Kim & Rush 2016), see experiments/translate.py

  config.model = ml_collections.ConfigDict()
  config.model.d_model = 128
  config.model.num_layers = 2
  config.model.num_heads = 4
  config.model.num_kv_heads = 4
  config.model.head_dim = 32
  config.model.mlp_dim = 512
  config.model.max_len = 160       # >= S + 1 + ctc_upsample * S (CTC frames) and S + 1 + T + 1 (AR decoding)
  config.model.norm = "rmsnorm"
  config.model.positional = "rope"
  config.model.mlp_activation = "swiglu"
  config.model.tie_embeddings = True
  config.model.dtype = "float32"
  config.model.param_dtype = "float32"

  config.train = ml_collections.ConfigDict()
  config.train.objective = "translation_ar"  # translation_ar | cmlm | ctc
  config.train.batch_size = 32
  config.train.num_steps = 2000    # the shipped budget (see the module doc)
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 50
  config.train.weight_decay = 0.01
  config.train.grad_clip_norm = 1.0
  config.train.eval_every = 500
  config.train.eval_batches = 8    # the valid books hold ~330 pairs under the limits
  config.train.mdlm_eval_timesteps = 1  # unused by the translation objectives
  config.train.checkpoint_every = 250
  config.train.keep_checkpoints = 1
  config.train.length_weight = 0.1  # cmlm: weight of the length head's loss (nats per sentence)
  config.train.ctc_upsample = 2    # ctc: frames per source token (Libovicky & Helcl use 3; 2 fits max_len)

  # experiments/translate.py
  config.translate = ml_collections.ConfigDict()
  config.translate.test_pairs = 100  # the first N test pairs under the limits (file order), 0 = all
  config.translate.batch_size = 50   # sentences per decode call
  config.translate.num_beams = 4     # AR beam
  config.translate.mask_predict_steps = (1, 2, 4, 10)  # K; K = 1 is one-shot CMLM
  config.translate.length_beams = (1, 3, 5)  # l candidate lengths from the length head
  config.translate.timed_runs = 2    # timed runs of each decode; the median is reported
  config.translate.latency_sentences = 8  # per source-length bucket, batch-1 latency
  config.translate.distill = True    # also CMLM and CTC trained on the AR model's greedy outputs (Kim & Rush 2016)
  config.translate.distilled_length_beams = (1, 3)  # the distilled CMLM's l (K as above)
  config.translate.distill_batch_size = 100  # sentences per teacher decode call
  return config
