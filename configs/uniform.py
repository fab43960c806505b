"""Few-step study of uniform-noise diffusion (issue 27), T = 64, B = 16.

Two questions, one run:
  1. The Duo few-step claim (Sahoo et al. 2025): at K <= 8 steps, uniform
     diffusion's samples (uniform_eb on the 'uniform' member) have a lower
     gen-PPL than MDLM's (mdlm on 'mdlm') at equal entropy. Both at
     K = 1, 2, 4, 8, 16 over one canvas of T; uniform_eb at its reference
     temperatures (0.8 annealed to 0.4) and at a constant 1.0 (the
     temperature MDLM samples at), two points of its entropy-quality curve.
     Each uniform_eb row reports its self-correction rate (accepted tokens
     later accepted again with another token). uniform_ancestral is the
     sampler of the claim itself (UDLM/Duo's reverse steps, temperature 1,
     the draws of the last step as output), at the same K. The tiny set
     adds the self-conditioned 'uniform_sc' under uniform_eb at the
     reference temperatures.
  2. Entropy-bounded acceptance on the masked model (the EB-sampler's own
     setting) against threshold decoding: NFE and gen-PPL at several bounds
     and thresholds on 'mdlm', no blocks, no cache.
AR cached is the quality reference. Every row is scored at B = 16 (the
prompts of the default grid's first 16), 2 timed runs each; quality is the
point, not time.

`configs/uniform.py` (the default, `:tiny`) uses configs/tiny.py's models;
`configs/uniform.py:base` configs/base.py's.

Usage:
  python experiments/compare_decoding.py --config=configs/uniform.py \
      --workdir=/tmp/uniform_few_step
"""


import ml_collections

from lm_decoding.config_reference import load_sized

STEPS = (1, 2, 4, 8, 16)  # K, the few-step axis
ENTROPY_BOUNDS = (0.1, 0.5, 2.0, 8.0)  # nats, entropy_bound on 'mdlm'
THRESHOLDS = (0.9, 0.7, 0.5)  # tau, threshold on 'mdlm'


def get_config(size: str = "tiny") -> ml_collections.ConfigDict:
  config = load_sized(__file__, size)
  config.compare.output_lengths = (64,)
  config.compare.batch_sizes = (16,)
  config.compare.timed_runs = 2
  self_conditioned = () if size == "base" else tuple(
      f"uniform SC EB K={{steps}} | uniform_eb | model=uniform_sc"
      f" | steps={k}" for k in STEPS)
  config.compare.greedy_baseline = ""  # no greedy row: all against AR sampling
  config.compare.decoders = (
      "AR cached | ar | model=ar",
      *(f"MDLM K={{steps}} | mdlm | model=mdlm | steps={k}" for k in STEPS),
      *(f"uniform EB K={{steps}} | uniform_eb | model=uniform | steps={k}"
        for k in STEPS),
      *("uniform EB K={steps} t={t_min}-{t_max} | uniform_eb | model=uniform"
        f" | steps={k} t_min=1.0 t_max=1.0" for k in STEPS),
      *(f"uniform ancestral K={{steps}} | uniform_ancestral | model=uniform"
        f" | steps={k}" for k in STEPS),
      *self_conditioned,
      *("EB masked bound={entropy_bound} | entropy_bound | model=mdlm"
        f" | entropy_bound={b}" for b in ENTROPY_BOUNDS),
      *("threshold tau={threshold} | threshold | model=mdlm"
        f" | threshold={tau}" for tau in THRESHOLDS),
  )
  return config
