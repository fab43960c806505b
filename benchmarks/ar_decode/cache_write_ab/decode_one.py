import sys, time, os
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, os.environ["PYTHONPATH"] + "/experiments")
import benchmark_ar as bar
from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models.transformer import make_logits_fn
import transformers; transformers.logging.set_verbosity_error()
size = os.environ.get("SIZE", "110m"); T = int(os.environ.get("T", 128)); P = 16
fam = bar.FAMILIES["gpt2"]
model = bar._hf_model("gpt2", bar.SIZES[size], P + T)
config = fam.config_from_hf(model.config)
params = jax.tree.map(jnp.asarray, fam.params_from_hf(model.state_dict(), config))
lf = make_logits_fn(config)
out = {}
for B in map(int, sys.argv[1:]):
  decoder = base.make_decoder("ar", output_length=T, eos_ids=(), sampling=SamplingConfig(temperature=0.0))
  f = jax.jit(lambda p, x, n: decoder.decode(base.bind(lf, p), x, n, None).tokens)
  x = jnp.asarray(np.random.RandomState(B).randint(5, config.vocab_size, (B, P)))
  n = jnp.full((B,), P, jnp.int32)
  c = f.lower(params, x, n).compile()
  toks = np.asarray(c(params, x, n))
  ts = []
  for _ in range(3):
    t = time.perf_counter(); c(params, x, n).block_until_ready(); ts.append(time.perf_counter() - t)
  out[B] = (float(np.median(ts) / T * 1e3), int(toks.sum()))
print("RESULT", out)
