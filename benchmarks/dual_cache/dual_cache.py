"""Is the base MDLM's dual-cache disagreement (report.md: logit error 2.5,
31% token agreement) the cache's approximation or a bug?

Threshold decoding (tau 0.9, blocks of 32, 256 tokens, greedy) of the base
`mdlm` on 8 test prompts, as in configs/base.py's grid, with
  none          one full pass per step (the reference);
  dual, step    dual cache refilled by a full pass before every step: the
                cached code path on an exact cache, so any difference from
                `none` is a bug (test_iterative checks this on a 2-layer toy);
  dual, block   Fast-dLLM's dual cache, refilled at each block start only;
  prefix, block the prefix cache, for comparison;
and for each: the largest |logit| difference of the decoded window from an
uncached pass on the same tokens (`measure_error`), token agreement with
`none`, and the first generated position that differs in each row.

  python benchmarks/dual_cache/dual_cache.py \
      --workdir=/tmp/dual_cache
"""

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from lm_decoding.data import pipeline
from lm_decoding.decoding import base
from lm_decoding.training.pretrained import loading, member_recipes, recipes

_CONFIG = config_flags.DEFINE_config_file("config", "configs/base.py",
                                          "The base set's config.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/dual_cache",
                               "The run's folder: the data cache and the "
                               "mdlm member, if none shipped matches.")


def main(_):
  config = _CONFIG.value
  cmp = config.compare
  set_dir = recipes.set_dir(cmp.pretrained_set)
  corpus = pipeline.prepare(config.data.path, config.data.vocab_size,
                            _WORKDIR.value, data_format=config.data.format)
  members = member_recipes.member_configs(config)
  model = loading.load_models({"mdlm": members["mdlm"]}, _WORKDIR.value,
                                 corpus.tokenizer, progress=False,
                                 out_dir=set_dir)["mdlm"].model
  prompts, _ = pipeline.prompts(corpus, "test", 8, cmp.prompt_len,
                                cmp.reference_len)
  tokens = jnp.asarray(prompts)
  lengths = jnp.full((tokens.shape[0],), cmp.prompt_len, jnp.int32)
  models = {"model": model}
  options = dict(output_length=256, block_length=32, threshold=0.9)
  runs = {"none": dict(kv_cache="none"),
          "dual, step": dict(kv_cache="dual", cache_refresh="step"),
          "dual, block": dict(kv_cache="dual"),
          "prefix, block": dict(kv_cache="prefix")}
  out = {}
  for name, extra in runs.items():
    decoder = base.make_decoder("threshold", **options, **extra)
    result = decoder.denoise(models, tokens, lengths, jax.random.key(0),
                             measure_error=name != "none")
    out[name] = result
  ref = np.asarray(out["none"].tokens)
  print("| context | max logit error | agreement with none | first differing "
        "position per row | NFE |")
  print("|---|---|---|---|---|")
  for name, result in out.items():
    toks = np.asarray(result.tokens)
    differ = toks != ref
    first = [int(np.argmax(row)) if row.any() else "-" for row in differ]
    error = ("-" if result.max_logit_error is None
             else f"{float(result.max_logit_error):.3g}")
    nfe = int(result.cost.calls["model"])
    print(f"| {name} | {error} | {1 - differ.mean():.3f} | {first} | {nfe} |")


if __name__ == "__main__":
  app.run(main)
