r"""A/B of train steps from two versions of the code, interleaved in one process.

  PYTHONPATH=$PWD python benchmarks/training_speed/ab.py \
      --a=bd54893 --b=WORKTREE --objectives=ar,mdlm,bd3lm --rounds=5 \
      --out=benchmarks/training_speed/<topic>/ab.json

--a / --b: a git revision (its `lm_decoding/` is exported with `git archive`
into a temporary folder) or WORKTREE (this checkout), optionally followed by
`+name=value,...`: XLA debug options given to that side's compile (e.g.
`WORKTREE+xla_cpu_experimental_ynn_fusion_type=`). Each side's package is
imported in turn (sys.modules emptied of `lm_decoding` between them), its
`make_train_step` (`train_step`, or `train` before the split) built for the
config (configs/base.py by default)
and compiled ahead of time.

Loss check: both sides start from the same parameters (side A's fresh
state, seed 0) and take two steps on the same batch and key (the first at
learning rate 0, the warm-up's start); the record gives both sides' first
and second losses, the first's difference and gradient norms, and the
largest parameter difference after the two steps. The batch is seeded random tokens
with the last row's final 32 tokens PAD, so padding masks are exercised.

Timing: one warm-up step each, then --rounds rounds of (A step, B step)
(`cost.interleaved` of this checkout, imported before either side); each
side keeps stepping its own (donated) state. The record gives each
side's median step seconds and tokens/s, the median of the per-round
ratios A time / B time (> 1: B is faster), and the load averages.
"""

import importlib
import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

# This checkout's timer, bound before the sides' packages replace
# `lm_decoding` in sys.modules (the module object stays usable).
from lm_decoding.evaluation import cost, records

_A = flags.DEFINE_string("a", "bd54893", "Side A: revision or WORKTREE[+opts].")
_B = flags.DEFINE_string("b", "WORKTREE", "Side B: revision or WORKTREE[+opts].")
_OBJECTIVES = flags.DEFINE_list("objectives", ["ar", "mdlm", "bd3lm"],
                                "Objectives.")
_CONFIG = flags.DEFINE_string("config", "configs/base.py", "Config file.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed (A, B) rounds.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Override train.batch_size.")
_OUT = flags.DEFINE_string("out", None, "JSON record path.", required=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _source(spec: str, scratch: str) -> tuple[str, dict]:
  """(folder holding lm_decoding/, compile options) of a side's spec."""
  rev, _, opts = spec.partition("+")
  options = {}
  for item in filter(None, opts.split(",")):
    name, value = item.split("=", 1)
    options[name] = {"true": True, "false": False}.get(value.lower(), value)
  if rev == "WORKTREE":
    return ROOT, options
  folder = os.path.join(scratch, rev)
  os.makedirs(folder)
  archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "lm_decoding"],
                           check=True, capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
  return folder, options


def _import_train(folder: str):
  """(train module, the module of its train step): `train_step` since the
  loop and the step were split, `train` itself before."""
  for name in [m for m in sys.modules if m.split(".")[0] == "lm_decoding"]:
    del sys.modules[name]
  sys.path.insert(0, folder)
  try:
    train = importlib.import_module("lm_decoding.training.train")
    try:
      return train, importlib.import_module("lm_decoding.training.train_step")
    except ModuleNotFoundError:
      return train, train
  finally:
    sys.path.remove(folder)


def _config(objective: str):
  spec = importlib.util.spec_from_file_location("config", _CONFIG.value)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.train.objective = objective
  if _BATCH.value:
    config.train.batch_size = _BATCH.value
  return config


def _side(modules, config, options, params, tokens, key):
  """(compiled step, a state holding `params` or None, first-step record)."""
  import jax
  train, steps = modules
  model_cfg = train.model_config(config)
  optimizer = steps.make_optimizer(config.train)
  step = steps.make_train_step(model_cfg, config.train.objective, optimizer,
                               config.train.block_length)
  state = steps.init_state(model_cfg, optimizer, jax.random.key(0))
  if params is not None:
    state = state.replace(params=jax.tree.map(lambda x: x.copy(), params),
                          opt_state=optimizer.init(params))
  fresh = jax.tree.map(lambda x: x.copy(), state.params)
  compiled, compile_s = cost.compile_timed(step, (state, tokens, key),
                                           options)
  state, metrics = compiled(state, tokens, key)
  first = {"source": train.__file__, "compile_s": compile_s,
           "loss": float(metrics["loss"]),
           "grad_norm": float(metrics["grad_norm"])}
  state, metrics = compiled(state, tokens, key)  # step 1's rate is 0
  first["second_loss"] = float(metrics["loss"])
  return compiled, state, fresh, first


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  record = {"command": "PYTHONPATH=$PWD " + records.command(),
            "a": _A.value, "b": _B.value, "rounds": _ROUNDS.value,
            "load_start": os.getloadavg(), "objectives": {}}
  with tempfile.TemporaryDirectory() as scratch:
    sources = [_source(_A.value, scratch), _source(_B.value, scratch)]
    for objective in _OBJECTIVES.value:
      config = _config(objective)
      shape = (config.train.batch_size, config.data.seq_len)
      tokens = np.random.RandomState(0).randint(5, config.data.vocab_size,
                                                shape)
      tokens[-1, -32:] = 0  # PAD
      tokens = jnp.asarray(tokens, jnp.int32)
      key = jax.random.key(1)
      sides, params, stepped = [], None, []
      for folder, options in sources:
        compiled, state, fresh, first = _side(
            _import_train(folder), config, options, params, tokens, key)
        params = fresh if params is None else params
        sides.append([compiled, state, first])
        stepped.append(state.params)
      diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
          jax.tree.leaves(stepped[0]), jax.tree.leaves(stepped[1])))
      def stepper(side):
        def step():
          side[1], metrics = side[0](side[1], tokens, key)
          return metrics
        return step
      timed, _ = cost.interleaved({"a": stepper(sides[0]),
                                   "b": stepper(sides[1])}, _ROUNDS.value)
      times = [timed["a"], timed["b"]]
      ratios = [a / b for a, b in zip(*times)]
      tokens_per_step = shape[0] * shape[1]
      entry = {
          "batch": list(shape),
          "a": dict(sides[0][2], median_s=float(np.median(times[0])),
                    tokens_per_s=tokens_per_step / float(np.median(times[0])),
                    runs_s=times[0]),
          "b": dict(sides[1][2], median_s=float(np.median(times[1])),
                    tokens_per_s=tokens_per_step / float(np.median(times[1])),
                    runs_s=times[1]),
          "loss_difference": sides[1][2]["loss"] - sides[0][2]["loss"],
          "max_param_difference_after_two_steps": diff,
          "ratio_a_over_b_per_round": ratios,
          "median_ratio_a_over_b": float(np.median(ratios)),
          "load_after": os.getloadavg()}
      entry["peak_flops_after"] = cost.measure_peak_flops()
      record["objectives"][objective] = entry
      print(objective, json.dumps({k: v for k, v in entry.items()
                                   if k not in ("a", "b")}), flush=True)
      print("  a", json.dumps(entry["a"]), "\n  b", json.dumps(entry["b"]),
            flush=True)
  record["load_end"] = os.getloadavg()
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  records.write_json(record, _OUT.value, record["command"])


if __name__ == "__main__":
  app.run(main)
