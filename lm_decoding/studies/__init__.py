"""The studies: one module per question the project answers on top of the
harness (`lm_decoding.evaluation`) and the trainer (`lm_decoding.training`).

  task_scores, task_report    the exact-answer tasks: every decoder scored,
                              the table and plots (experiments/tasks.py)
  translation_study           the NAR translation study: decoders, scores,
                              report (experiments/translate.py)
  speculative_cost            speculative decoding against its closed form
  router_workload             the router on a mixed workload
  speculative_report          speculative.md's tables and plots
                              (all three: experiments/speculative.py)
  cost_model_check            the cost model against measured decodes
                              (experiments/validate_cost_model.py)
  versus_transformers         our AR decoder against `transformers`
                              (experiments/benchmark_ar.py)
  quantization_cost           int8 weights and KV cache against float32
                              (experiments/quantization.py)
  claims                      what the reproduction scripts share
                              (experiments/reproduce/)

A study may import every layer below it, never an experiment script; the
harness never imports a study.
"""
