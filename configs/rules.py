"""The commit rules measured on every shipped parallel model (issue 36 item 3).

Every diffusion member of a set (its own MDLM and BD3-LM, and the members
adapted from its AR model), decoded greedily (temperature 0, as Fast-dLLM,
dParallel and d3LLM do) with each self-paced commit rule:
  - threshold tau in THRESHOLDS: commit every masked position whose
    confidence exceeds tau (at least one a step); `threshold` with blocks of
    32 and the dual cache on MDLM members, `bd3lm` remasking=threshold on
    BD3-LM members (their own block length, the exact block cache);
  - the factor rule (Fast-dLLM's, `factor` f = FACTOR) and the entropy bound
    (the EB-sampler's, `entropy_bound` gamma in ENTROPY_BOUNDS) on MDLM
    members.
Each row is judged against AR greedy on the same prompts
(compare.greedy_baseline): its tokens per forward (TPF = T / NFE) against
its agreement with AR greedy's tokens, gen-PPL and entropy.
`experiments/commit_rules.py` turns the comparison's results.csv into one
curve per (model, rule) and d3LLM's AUP per curve.

`configs/rules.py` (the default, `:tiny`) decodes the tiny set;
`configs/rules.py:base` the base set, its distilled student included.
T = 256, B = 8 (quality is scored there), one timed run: the point is TPF
and quality, not time.

Usage:
  python experiments/compare_decoding.py --config=configs/rules.py \
      --workdir=/tmp/rules
  python experiments/commit_rules.py --results=/tmp/rules/results.csv \
      --workdir=/tmp/rules
"""


import ml_collections

from lm_decoding.config_reference import load_sized

THRESHOLDS = (0.3, 0.5, 0.7, 0.9)  # tau
FACTOR = 1.0  # f of Fast-dLLM's factor rule
ENTROPY_BOUNDS = (0.1, 1.0)  # gamma, nats, of the entropy bound
MDLM_MEMBERS = ("mdlm", "mdlm_from_ar")
BD3LM_MEMBERS = {"bd3lm": 16, "bd3lm4_from_ar": 4, "bd3lm16_from_ar": 16}
# The base set's stored distilled students (configs/base.py), BD3-LMs too.
STUDENTS = {"bd3lm16_distilled": 16, "bd3lm16_distilled_view": 16}


def rule_decoders(bd3lm_members: dict[str, int]) -> tuple[str, ...]:
  """One entry per (member, rule), all at temperature 0; `bd3lm_members`
  maps each BD3-LM member to its block length."""
  greedy = " temperature=0"
  rows = []
  for m in MDLM_MEMBERS:
    mdlm = (f" | model={m} | block_length=32 kv_cache=dual"
            f"{greedy}")
    rows += [f"{m} threshold tau={{threshold}} temp={{temperature}}"
             f" block={{block_length}} cache={{kv_cache}} | threshold{mdlm}"
             f" threshold={tau}" for tau in THRESHOLDS]
    rows.append(f"{m} factor f={{factor}} temp={{temperature}}"
                f" block={{block_length}} cache={{kv_cache}} | factor{mdlm}"
                f" factor={FACTOR}")
    rows += [f"{m} entropy bound={{entropy_bound}} temp={{temperature}}"
             f" block={{block_length}} cache={{kv_cache}} | entropy_bound"
             f"{mdlm} entropy_bound={g}" for g in ENTROPY_BOUNDS]
  for m, block in bd3lm_members.items():
    rows += [f"{m} threshold tau={{threshold}} temp={{temperature}}"
             f" block={{block_length}} K={{steps}} {{remasking}} | bd3lm"
             f" | model={m} | block_length={block} steps=T"
             f" remasking=threshold threshold={tau}{greedy}"
             for tau in THRESHOLDS]
  return tuple(rows)


def get_config(size: str = "tiny") -> ml_collections.ConfigDict:
  config = load_sized(__file__, size)
  config.compare.output_lengths = (256,)
  config.compare.batch_sizes = (8,)
  config.compare.timed_runs = 1
  students = {m: STUDENTS[m] for m in config.compare.stored_members}
  config.compare.decoders = (
      "AR cached | ar | model=ar",
      "AR greedy temp={temperature} | ar | model=ar | temperature=0",
      *rule_decoders({**BD3LM_MEMBERS, **students}),
  )
  return config
