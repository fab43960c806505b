"""Quality metrics and cost measurement of decoders."""

from lm_decoding.evaluation.cost import (
    CostAnalysis, DecodeCost, Timing, ar_decode_roofline_s, cost_analysis,
    decode_cost, decode_record, measure_bandwidth, measure_peak_flops,
    measure_step_overhead, roofline_ratio, roofline_s, time_fn, tree_bytes)
from lm_decoding.evaluation.quality import (
    ENGLISH_STOPWORDS, GenPPL, content_words, distinct_n, gen_ppl,
    omission_rate, perplexity, repetition_rate, unigram_entropy)

__all__ = [
    "CostAnalysis", "DecodeCost", "Timing", "ar_decode_roofline_s",
    "cost_analysis", "decode_cost", "decode_record", "measure_bandwidth",
    "measure_peak_flops", "measure_step_overhead",
    "roofline_ratio", "roofline_s", "time_fn", "tree_bytes",
    "ENGLISH_STOPWORDS", "GenPPL", "content_words", "distinct_n", "gen_ppl",
    "omission_rate", "perplexity", "repetition_rate", "unigram_entropy",
]
