"""What every reproduction script shares: its flags, the config loader,
interleaved timing, and the one record it writes.

Each script in experiments/reproduce/ checks one claim of the source articles
(issue 10, item 3) and writes its record under `--out` (default
experiments/results/reproduce/<claim>/); what a script trains or caches
(models, the corpus) goes under `--workdir`, the run's folder (default
/tmp/lm_decoding_reproduce/<claim>/; the scripts that train and cache nothing
do not use it):

  claim.md      claim, source, our number, hardware, exact command, verdict,
                method
  numbers.json  the summary numbers and every measured row
  results.csv   the measured rows
  figure.png    the figure

It is the reproduction study's room, in the studies layer (it reads the
configs and trains): every script imports it (`from lm_decoding.studies
import claims`) and calls `claims.define_flags()` at its top, which defines
the shared flags once per process however many scripts a test loads;
importing this module defines no flag and sets no matplotlib backend. No
script imports another experiment script: what they share lives in the
library (`lm_decoding.studies.speculative_cost`,
`lm_decoding.training.translation_members`, ...). The command line and the
files are written by `lm_decoding.evaluation.records`.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import platform
from collections.abc import Callable, Sequence
from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np

from lm_decoding.decoding import base, bind
from lm_decoding.evaluation import cost, records
from lm_decoding.models import TransformerConfig
from lm_decoding.training import train

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results" / "reproduce"
VERDICTS = ("supported", "contradicted", "mixed")


_FLAGS: dict[str, flags.FlagHolder] = {}  # filled by define_flags


def define_flags() -> None:
  """Defines --out, --workdir and --smoke, once a process (a later call does
  nothing): each reproduction script calls it at its top, as it defines
  its own flags. allow_override: the tests load several scripts into one
  process, some of which (experiments/compare_decoding.py) define
  --workdir too."""
  if _FLAGS:
    return
  _FLAGS.update(
      out=flags.DEFINE_string(
          "out", "", "The record's folder; '' = experiments/results/"
          "reproduce/<claim>.", allow_override=True),
      workdir=flags.DEFINE_string(
          "workdir", "", "The run's folder: the models it trains and the "
          "corpus cache; '' = /tmp/lm_decoding_reproduce/<claim>.",
          allow_override=True),
      smoke=flags.DEFINE_boolean(
          "smoke", False, "Tiny sizes that run in seconds (the tests' mode); "
          "not a measurement.", allow_override=True))


def _flag(name: str):
  """The value of shared flag `name`.

  Raises:
    RuntimeError: `define_flags` was not called.
  """
  if name not in _FLAGS:
    raise RuntimeError(f"--{name} is not defined: call claims.define_flags() "
                       "at the top of the script")
  return _FLAGS[name].value


def out(claim: str) -> str:
  """--out, or the claim's folder under experiments/results/reproduce."""
  return _flag("out") or str(RESULTS / claim)


def workdir(claim: str) -> str:
  """--workdir, or the claim's folder under /tmp/lm_decoding_reproduce."""
  return _flag("workdir") or os.path.join("/tmp", "lm_decoding_reproduce",
                                          claim)


def smoke() -> bool:
  """--smoke: tiny sizes that run in seconds, not a measurement."""
  return _flag("smoke")


def main(claim: str, run: Callable[[str, bool, str], Any]) -> None:
  """Runs `run(out, smoke, command)` from the command line (absl app):
  the whole main of a script that takes no flags of its own."""

  def app_main(argv):
    del argv
    run(out(claim), smoke(), records.command())

  app.run(app_main)


def load_config(name: str):
  """configs/{name}.py's get_config(): a fresh ConfigDict."""
  spec = importlib.util.spec_from_file_location(
      f"reproduce_{name}_config", REPO / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


_LOAD_AT_START = os.getloadavg()[0]  # when the claim script imported this


def hardware() -> str:
  """The CPU, its cores and what the 1-minute load averages at the script's
  start and now say about sharing it; or the accelerator's kind and count."""
  device = jax.devices()[0]
  if device.platform == "cpu":
    load = (_LOAD_AT_START, os.getloadavg()[0])
    return f"CPU ({platform.machine()}); {cost.load_summary(load)}"
  return f"{jax.device_count()} x {device.device_kind}"


def interleaved(calls: dict[str, Callable[[], Any]], runs: int
                ) -> dict[str, float]:
  """Median wall seconds of each (compiled) call, timed in turns
  (`cost.interleaved`).

  Raises:
    ValueError: runs < 1 or no calls.
  """
  times, _ = cost.interleaved(calls, runs)
  return {name: float(np.median(t)) for name, t in times.items()}


def compiled_call(fn: Callable[..., Any], *args: Any
                  ) -> tuple[Callable[[], Any], Any, float]:
  """(call, output, compile_s): fn compiled for args by `cost.measure`
  (one warm-up run), `call()` runs it again on the same args."""
  timing, compiled, out = cost.measure(fn, args, warmup=0, runs=1)
  return (lambda: compiled(*args)), out, timing.compile_s


def fit_line(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
  """Least-squares y = slope x + intercept, with R^2 (1 if y is constant)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  slope, intercept = np.polyfit(x, y, 1)
  residual = y - (slope * x + intercept)
  total = float(np.sum((y - y.mean()) ** 2))
  r2 = 1.0 - float(np.sum(residual ** 2)) / total if total > 0 else 1.0
  return {"slope": float(slope), "intercept": float(intercept), "r2": r2}


def write(folder: str | os.PathLike, *, claim: str, title: str, source: str,
          statement: str, verdict: str, our_number: str, method: str,
          summary: dict, rows: Sequence[dict], figure: Any, cmd: str,
          smoke: bool = False) -> dict:
  """Writes claim.md, numbers.json, results.csv and figure.png to `folder`.

  Args:
    folder: output folder (created).
    claim: the script's short name (e.g. 'multimodality').
    title: one-line claim title for claim.md.
    source: the paper or article the claim comes from.
    statement: the claim as the source makes it.
    verdict: one of VERDICTS.
    our_number: the headline measurement, one or two sentences.
    method: Markdown: how it was measured, the derivations, the caveats,
      the tables.
    summary: JSON-able summary numbers (fits, crossovers, rates).
    rows: the measured rows (flat dicts with the same keys), the CSV's rows.
    figure: a matplotlib Figure (saved, then closed).
    cmd: the exact command that made the files (`records.command()`).
    smoke: a smoke run: marked in both files as not a measurement.
  Returns:
    The record written to numbers.json.
  Raises:
    ValueError: verdict not in VERDICTS or no rows.
  """
  if verdict not in VERDICTS:
    raise ValueError(f"verdict={verdict!r}; allowed: {VERDICTS}")
  if not rows:
    raise ValueError("rows must be non-empty")
  os.makedirs(folder, exist_ok=True)
  record = records.write_json(
      {"claim": claim, "title": title, "statement": statement,
       "source": source, "verdict": verdict, "our_number": our_number,
       "hardware": hardware(), "smoke": smoke, "summary": summary,
       "rows": list(rows)}, os.path.join(folder, "numbers.json"), cmd)
  records.write_csv(rows, os.path.join(folder, "results.csv"))
  figure.savefig(os.path.join(folder, "figure.png"), dpi=110,
                 bbox_inches="tight")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  plt.close(figure)  # the scripts draw with pyplot, which keeps figures
  banner = (["**SMOKE RUN: sizes shrunk to seconds; not a measurement.**", ""]
            if smoke else [])
  text = "\n".join([
      f"# {title}", "", *banner,
      f"**Claim.** {statement}", "",
      f"**Source.** {source}", "",
      f"**Our number.** {our_number}", "",
      f"**Verdict: {verdict}.**", "",
      f"**Hardware.** {record['hardware']}.", "",
      f"**Command.** `{cmd}`", "",
      "## Method and reading", "", method, "",
      "Numbers: `numbers.json` (summary and rows), `results.csv` (rows); "
      "figure: `figure.png`.", ""])
  with open(os.path.join(folder, "claim.md"), "w") as f:
    f.write(text)
  return record


SMOKE_MODEL = dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                   head_dim=16, mlp_dim=64, max_len=64)
SMOKE_VOCAB = 256


def model_config(objective: str, smoke: bool, max_len: int | None = None
                 ) -> TransformerConfig:
  """The tiny config's backbone for `objective` ('ar', 'mdlm', 'bd3lm'), or
  with `smoke` a much smaller one (d32, 1 layer, V 256, max_len 64);
  `max_len` overrides the model's."""
  config = load_config("tiny")
  config.train.objective = objective
  if smoke:
    config.model.update(SMOKE_MODEL)
    config.data.vocab_size = SMOKE_VOCAB
    config.data.seq_len = SMOKE_MODEL["max_len"]
  if max_len is not None:
    config.model.max_len = max_len
    config.data.seq_len = min(config.data.seq_len, max_len)
  return train.model_config(config)


def decode_fn(decoder: Any, logits_fn: Any) -> Callable[..., Any]:
  """(params, prompts, prompt_lengths, key) -> decoder's DecodeResult, the
  decode jitted by `base.jit_decode` with `logits_fn` bound under the
  decoder's one role 'model'."""
  jitted = base.jit_decode(decoder)
  return lambda params, prompts, lengths, key: jitted(
      bind(logits_fn, params), prompts, lengths, key)
