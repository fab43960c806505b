"""cost_model_check: the crossover table is the cost model's numbers."""

from lm_decoding.evaluation import cost_model
from lm_decoding.studies import cost_model_check as check
from lm_decoding.models import TransformerConfig


def test_crossover_lines_one_row_per_model_profile_and_batch():
  lines = check.crossover_lines(prompt_len=16)
  rows = [line.split(" | ") for line in lines[2:]]
  assert len(rows) == (len(check.CROSSOVER_MODELS)
                       * len(check.CROSSOVER_PROFILES) * 3)
  first = rows[0]
  assert first[0] == "| large" and first[2] == check.CROSSOVER_PROFILES[0]
  config = TransformerConfig(
      max_len=16 + check.CROSSOVER_MAX_T, attention="bidirectional",
      dtype="bfloat16", param_dtype="bfloat16",
      **check.CROSSOVER_MODELS["large"])
  k = cost_model.crossover_steps(config, 1, 16, check.CROSSOVER_T,
                                 cost_model.load_profile(first[2]))
  assert first[3:5] == ["1", f"{k:.0f}"]
