r"""Claim 10: the MDLM bound / AR perplexity ratio against training budget.

  python experiments/reproduce/mdlm_ar_ratio.py
  # the shipped base set's curves (configs/base.py, 1500 steps):
  python experiments/reproduce/mdlm_ar_ratio.py --config=base --num_steps=1500 \
      --eval_every=250 --eval_batches=8 --curves_dir=/tmp/base

Trains 'ar' and 'mdlm' on configs/{--config}.py (tiny by default: same backbone,
data, tokenizer, seed and optimiser; causal vs bidirectional attention) for
--num_steps steps each with `train.train`, validating every --eval_every steps
(AR: teacher-forced perplexity; MDLM: its NELBO bound on a fixed grid of
`train.mdlm_eval_timesteps` times), and reads the learning curves that
`train` logs to {workdir}/{objective}/metrics.jsonl (a finished run is
reused, a killed one resumed). The ratio exp(MDLM bound) / exp(AR NLL) at
each validation step is plotted against the tokens seen (step x batch x
seq_len) beside the MDLM paper's ratios.

One run per objective at the largest budget: the points along it share one
learning-rate schedule (warmup, cosine decay to --num_steps), so an early point
is not the model a separate run of that budget would give (its rate has not
decayed); the last point is.

Writes claim.md, numbers.json, results.csv and figure.png under --out.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lm_decoding.studies import claims  # noqa: E402
from lm_decoding.evaluation import records  # noqa: E402
from lm_decoding.training.pretrained import member_recipes, store# noqa: E402
from lm_decoding.training import train as train_lib  # noqa: E402

claims.define_flags()

CLAIM = "mdlm_ar_ratio"
_CONFIG_NAME = flags.DEFINE_enum(
    "config", "tiny", ["tiny", "base"], "configs/{name}.py: the backbone, "
    "data and optimiser of both models.", allow_override=True)
_STEPS = flags.DEFINE_integer("num_steps", 300, "Training steps of each model.",
    allow_override=True)
_EVERY = flags.DEFINE_integer("eval_every", 50, "Steps between validations.",
    allow_override=True)
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", 4,
                                     "Validation batches per evaluation.",
    allow_override=True)
_CURVES = flags.DEFINE_string(
    "curves_dir", None, "Read the curves instead of training: a folder with "
    "ar/metrics.jsonl and mdlm/metrics.jsonl that `train` wrote with "
    "configs/{--config}.py at --num_steps steps (e.g. the workdirs the shipped 'ar' and "
    "'mdlm' were trained in, their manifests' commands); they are copied to "
    "{out}/curves/.", allow_override=True)
# Sahoo et al. 2024 (MDLM), as quoted by issue 10: test perplexity bound of
# MDLM over the AR Transformer's perplexity at equal training tokens.
PAPER = {"LM1B": 1.14, "OpenWebText": 1.31}


def config_of(objective: str, steps: int, eval_every: int,
              eval_batches: int, smoke: bool, config_name: str = "tiny"):
  """configs/{config_name}.py's member `objective` at `steps`, validating
  every `eval_every`; shrunk to seconds for `smoke`."""
  config = member_recipes.member_configs(claims.load_config(config_name))[
      objective]
  config.train.update(dict(num_steps=steps, eval_every=eval_every,
                           checkpoint_every=steps,
                           eval_batches=eval_batches))
  if smoke:
    config.data.seq_len = 32
    config.model.update(dict(d_model=32, num_layers=1, num_heads=2,
                             num_kv_heads=2, head_dim=16, mlp_dim=64,
                             max_len=32))
    config.train.update(dict(num_steps=4, eval_every=2, batch_size=4,
                             warmup_steps=1, checkpoint_every=4,
                             eval_batches=1, mdlm_eval_timesteps=2))
  return config


def curve(member_dir: str) -> dict[int, float]:
  """{step: validation loss (nats/token)} from `train`'s metrics.jsonl."""
  with open(os.path.join(member_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return {r["step"]: r["valid_loss"] for r in records if "valid_loss" in r}


def run(out_dir: str, smoke: bool, workdir: str, steps: int,
        eval_every: int, eval_batches: int, run_command: str,
        curves_dir: str | None = None, config_name: str = "tiny") -> dict:
  """Trains (or reuses) both models, or reads their curves from
  `curves_dir`; writes the record."""
  start = time.time()
  configs = {o: config_of(o, steps, eval_every, eval_batches, smoke,
                         config_name) for o in ("ar", "mdlm")}
  curves, origin = {}, {}
  if curves_dir is None:
    store.seed_data_cache(configs["ar"], workdir)
  for objective, config in configs.items():
    if curves_dir is None:
      member_dir = os.path.join(workdir, objective)
      summary = train_lib.train(config, member_dir, progress=not smoke,
                                data_dir=workdir)
      origin[objective] = (f"trained here in {member_dir}: "
                           f"{summary['num_params']:,} parameters, "
                           f"{summary['train_tokens_per_s']:.0f} tokens/s")
    else:
      member_dir = os.path.join(curves_dir, objective)
      os.makedirs(os.path.join(out_dir, "curves"), exist_ok=True)
      shutil.copyfile(os.path.join(member_dir, "metrics.jsonl"),
                      os.path.join(out_dir, "curves",
                                   f"{objective}.metrics.jsonl"))
      origin[objective] = f"read from {member_dir}/metrics.jsonl"
    curves[objective] = curve(member_dir)
  train_cfg = configs["ar"].train
  tokens_per_step = train_cfg.batch_size * configs["ar"].data.seq_len
  rows = []
  for step in sorted(set(curves["ar"]) & set(curves["mdlm"])):
    ar_ppl = float(np.exp(curves["ar"][step]))
    bound = float(np.exp(curves["mdlm"][step]))
    rows.append(dict(step=step, tokens=step * tokens_per_step,
                     ar_ppl=round(ar_ppl, 2), mdlm_bound=round(bound, 2),
                     ratio=round(bound / ar_ppl, 4)))

  trained = [r for r in rows if r["step"] > 0]
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  tokens = [r["tokens"] for r in trained]
  left.plot(tokens, [r["ar_ppl"] for r in trained], "o-", label="AR "
            "perplexity")
  left.plot(tokens, [r["mdlm_bound"] for r in trained], "s-",
            label="MDLM perplexity bound")
  left.set_yscale("log")
  left.set_xlabel("training tokens seen")
  left.set_ylabel("validation perplexity")
  left.legend()
  right.plot(tokens, [r["ratio"] for r in trained], "o-", color="C2",
             label=f"ours ({config_name} config, Austen)")
  for (name, value), style in zip(PAPER.items(), (":", "--")):
    right.axhline(value, color="gray", linestyle=style,
                  label=f"MDLM paper, {name}: {value}")
  right.set_xlabel("training tokens seen")
  right.set_ylabel("MDLM bound / AR perplexity")
  right.legend(fontsize=8)
  fig.suptitle("MDLM bound over AR perplexity against training budget")
  fig.tight_layout()

  first, last = trained[0], trained[-1]
  falling = last["ratio"] < first["ratio"]
  within = last["ratio"] <= max(PAPER.values()) * 1.1
  verdict = ("supported" if falling and within
             else "mixed" if falling else "contradicted")
  details = [
      f"- {origin['ar']}; {origin['mdlm']}",
      f"- configs/{config_name}.py, "
      f"d{configs['ar'].model.d_model}, {configs['ar'].model.num_layers} "
      f"layers, batch {train_cfg.batch_size} x "
      f"{configs['ar'].data.seq_len} "
      f"tokens, {configs['ar'].train.num_steps} steps each (warmup "
      f"{train_cfg.warmup_steps}, cosine decay), validation every "
      f"{configs['ar'].train.eval_every} steps on "
      f"{configs['ar'].train.eval_batches} fixed batches; the MDLM bound on "
      f"{configs['mdlm'].train.mdlm_eval_timesteps} fixed times (midpoint "
      "rule, one mask draw each: a noisy estimate of the bound)",
      "- the points of one curve share one learning-rate schedule: only the "
      "last is what a run of that budget gives (module docstring)",
      f"- final: AR perplexity {last['ar_ppl']}, MDLM bound "
      f"{last['mdlm_bound']}, ratio {last['ratio']} after "
      f"{last['tokens']:,} tokens; the paper's ratios come from ~10^10-10^11 "
      "training tokens and models of ~10^8 parameters, 5 orders of "
      "magnitude more data than here",
      *(["- issue 10 quotes a run at four times the steps (1200) of this "
         "config: AR 85, MDLM bound 454, a ratio of 5.3 (not rerun here)"]
        if config_name == "tiny" else []),
      f"- whole run {time.time() - start:.0f} s on this shared CPU",
      "- verdict: supported when the ratio falls with the budget and ends "
      "within 10% of the paper's largest ratio (1.31); mixed when it falls "
      "but stays above; contradicted when it does not fall",
      "", "| step | tokens | AR ppl | MDLM bound | ratio |",
      "|---|---|---|---|---|",
      *[f"| {r['step']} | {r['tokens']:,} | {r['ar_ppl']} | "
        f"{r['mdlm_bound']} | {r['ratio']} |" for r in rows],
  ]
  data = dict(rows=rows, paper=PAPER, origin=origin)
  claims.write(
      out_dir, claim=CLAIM,
      title="Claim 10: MDLM bound / AR perplexity against "
      "training budget",
      statement="masked diffusion's likelihood bound approaches AR "
      "perplexity (within 14-31%) given enough training",
      source="Sahoo et al. 2024, MDLM (LM1B and OpenWebText tables): ratios "
      "1.14 and 1.31 as quoted in issue 10",
      our_number=f"ratio {first['ratio']} after {first['tokens']:,} tokens "
      f"-> {last['ratio']} after {last['tokens']:,} tokens (AR "
      f"{last['ar_ppl']}, MDLM <= {last['mdlm_bound']})",
      verdict=verdict, cmd=run_command, method="\n".join(details),
      summary=dict(paper=PAPER, origin=origin), rows=rows, figure=fig,
      smoke=smoke)
  return data


def main(argv):
  del argv
  smoke = claims.smoke()
  logging.set_verbosity(logging.WARNING)  # orbax logs every save
  run(claims.out(CLAIM),
      smoke, claims.workdir(CLAIM), _STEPS.value,
      _EVERY.value, _EVAL_BATCHES.value, records.command(),
      _CURVES.value, _CONFIG_NAME.value)


if __name__ == "__main__":
  app.run(main)
