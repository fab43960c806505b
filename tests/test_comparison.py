"""The comparison harness: entries as data, resolution, validation, modes, report."""

import contextlib
import csv
import io
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import _loading
from lm_decoding.data import corpus
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import base
from lm_decoding.evaluation import (
    comparison, cost_model, crossover, entries, frontier, report)
from lm_decoding.evaluation.comparison_rows import SPREAD_FLAG
from lm_decoding.models import TransformerConfig, init_params, make_logits_fn
from lm_decoding.models import Model
from lm_decoding.parallel import sharding
from lm_decoding.special_tokens import EOS_ID
import stubs
from stubs import TableLogitsFn


ROOT = pathlib.Path(__file__).resolve().parent.parent
VOCAB = 400
MEMBERS = ("ar", "mdlm", "evaluator")


def _load(name, path):
  return _loading.load(name, path)


@pytest.fixture(scope="module")
def job():
  return _load("compare_decoding", ROOT / "experiments" / "compare_decoding.py")


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer.train(corpus.load_paragraphs("")[:400], VOCAB)


def entry(text, index=0):
  return entries.parse_entry(text, index)


# ---- entries: parsing, resolution, labels, merging --------------------------


def test_parse_entry_reads_roles_and_literal_options():
  e = entry("LLaDA K={steps} {remasking} | llada | model=mdlm | steps=32 "
            "remasking=margin", index=3)
  assert (e.name, e.roles, e.index) == ("llada", (("model", "mdlm"),), 3)
  assert e.options == (("steps", 32), ("remasking", "margin"))
  assert e.series == "LLaDA K=32 margin"
  assert entry("t {threshold} | threshold | model=mdlm | threshold=0.9"
               ).options == (("threshold", 0.9),)
  assert entry("AR | ar | model=ar").options == ()


@pytest.mark.parametrize("text, message", [
    ("AR | ar", "3 or 4 fields"),
    ("AR | ar | model=ar | steps=1 | x", "3 or 4 fields"),
    (" | ar | model=ar", "must not be empty"),
    ("AR | ar | ", "bind the decoder's roles"),
    ("AR | ar | model", "'model' must be key=value"),
    ("M {steps} | mdlm | model=mdlm | steps=8 steps=9", "given twice"),
    ("M | mdlm | model=mdlm | steps=8", r"missing \['steps'\]"),
    ("M {steps} {block_length} | mdlm | model=mdlm | steps=8",
     r"not set \['block_length'\]"),
    ("M {output_length} | mdlm | model=mdlm | output_length=8", "set by the harness"),
    ("M {sampling} | mdlm | model=mdlm | sampling=0", "set by the harness"),
    ("M {} | mdlm | model=mdlm", r"not set \[''\]"),
    ("M {steps | mdlm | model=mdlm | steps=8", "not a template"),
])
def test_parse_entry_errors_name_the_entry(text, message):
  with pytest.raises(ValueError, match=message) as info:
    entry(text, index=5)
  assert "compare.decoders[5]" in str(info.value)


def test_parse_entries_refuses_one_label_for_two_entries():
  with pytest.raises(ValueError, match=r"decoders\[1\].*decoders\[0\].*same"):
    entries.parse_entries(["AR | ar | model=ar", "AR | ar_uncached | "
                              "model=ar"])
  with pytest.raises(ValueError, match="non-empty list"):
    entries.parse_entries([])


def test_resolve_replaces_t_and_clamps_steps_and_block_length():
  e = entry("LLaDA K={steps} block={block_length} | llada | model=mdlm | "
            "steps=32 block_length=32")
  assert entries.resolve(e, 64) == {"steps": 32, "block_length": 32}
  assert entries.resolve(e, 16) == {"steps": 16, "block_length": 16}
  mdlm = entry("MDLM K={steps} | mdlm | model=mdlm | steps=T")
  assert entries.resolve(mdlm, 48) == {"steps": 48}
  assert mdlm.series == "MDLM K=T"


def test_plan_labels_show_settings_used_and_merge_equal_decoders():
  parsed = entries.parse_entries([
      "AR cached | ar | model=ar",
      "MDLM K={steps} | mdlm | model=mdlm | steps=32",
      "MDLM K={steps} | mdlm | model=mdlm | steps=T",
      "LLaDA K={steps} | llada | model=mdlm | steps=32",
      "LLaDA K={steps} block={block_length} | llada | model=mdlm | steps=32 "
      "block_length=32"])
  planned = entries.plan(parsed, (16, 32, 64), 1.0, MEMBERS)
  labels = {t: [p.label for p in planned if p.output_length == t]
            for t in (16, 32, 64)}
  # T=16: steps and blocks clamped to 16; every MDLM and LLaDA entry merges.
  assert labels[16] == ["AR cached", "MDLM K=16", "LLaDA K=16"]
  assert labels[32] == ["AR cached", "MDLM K=32", "LLaDA K=32"]
  assert labels[64] == ["AR cached", "MDLM K=32", "MDLM K=64", "LLaDA K=32",
                        "LLaDA K=32 block=32"]
  by_label = {(p.label, p.output_length): p for p in planned}
  llada = by_label["LLaDA K=32", 32]
  assert llada.series == ("LLaDA K=32", "LLaDA K=32 block=32")
  assert llada.decoder.block_length is None  # a block of T is one block
  assert llada.decoder.steps == 32 and llada.decoder.output_length == 32
  assert by_label["MDLM K=16", 16].series == ("MDLM K=32", "MDLM K=T")
  assert by_label["LLaDA K=32 block=32", 64].decoder.block_length == 32
  # Fixed length ignores EOS; EOS mode ends rows at EOS; one temperature.
  for p in planned:
    assert p.decoder.eos_ids == () and p.eos_decoder.eos_ids == (EOS_ID,)
    assert p.decoder.sampling.temperature == 1.0


def test_plan_keeps_different_bindings_apart():
  parsed = entries.parse_entries([
      "MDLM K={steps} | mdlm | model=mdlm | steps=8",
      "MDLM on AR K={steps} | mdlm | model=ar | steps=8"])
  assert len(entries.plan(parsed, (16,), 1.0, MEMBERS)) == 2


@pytest.mark.parametrize("text, message", [
    ("X | no_such_decoder | model=mdlm", "unknown decoder name"),
    ("X {block_length} | llada | model=mdlm | block_length=3",
     "block_length=3"),
    ("X {colour} | mdlm | model=mdlm | colour=red", "takes no options"),
    ("X | ar | draft=ar", "roles"),
    ("X | ar | model=gpt", "must name a decoded model"),
    ("X | ar | model=evaluator", "must name a decoded model"),
])
def test_plan_errors_name_the_entry_and_the_length(text, message):
  parsed = entries.parse_entries(["AR cached | ar | model=ar", text])
  with pytest.raises(ValueError, match=message) as info:
    entries.plan(parsed, (8,), 1.0, MEMBERS)
  assert f"compare.decoders[1] ({text.split(' |')[0]!r})" in str(info.value)


def test_plan_refuses_one_label_for_two_decoders_at_some_length():
  parsed = entries.parse_entries([
      "MDLM K={steps} | mdlm | model=mdlm | steps=8",
      "MDLM K={steps} | mdlm | model=ar | steps=T"])
  entries.plan(parsed, (16,), 1.0, MEMBERS)  # 'MDLM K=8', 'MDLM K=16'
  with pytest.raises(ValueError, match="'MDLM K=8' is also"):
    entries.plan(parsed, (8,), 1.0, MEMBERS)


def test_cached_threshold_entries_get_their_uncached_reference():
  text = "thr {kv_cache} | threshold | model=mdlm | kv_cache="
  parsed = entries.parse_entries([text + "none", text + "dual"])
  none, dual = entries.plan(parsed, (16,), 1.0, MEMBERS)
  assert not none.cached and dual.cached
  assert dual.reference == none.decoder and dual.reference_label == "thr none"


# ---- option checks before any work -------------------------------------------


def load_config(name):
  return _load(name, ROOT / "configs" / f"{name}.py").get_config()


# The default grid: each family at its strongest setting plus the naive
# uncached AR loop, T = 256 only (configs/tiny.py).
DEFAULT_GRID = [
    "AR cached", "AR uncached", "MDLM K=8", "uniform EB K=32",
    "LLaDA margin K=32 block=32",
    "threshold tau=0.9 block=32 cache=dual", "MaskGIT K=32", "ReMDM K=32",
    "BD3-LM block=16 K=256", "speculative small draft gamma=4",
    "prompt lookup gamma=4", "MDLM K=32 skeleton + AR polish p>=0.01 gamma=8",
    "AR greedy temp=0", "threshold tau=0.9 block=32 cache=dual temp=0"]


def test_default_grid_is_pinned(job, tmp_path):
  config = load_config("tiny")
  planned, members = job.plan(config, str(tmp_path))
  assert set(members) >= {"ar", "mdlm", "bd3lm", "uniform", "draft_small",
                          "evaluator"}
  assert [p.label for p in planned] == DEFAULT_GRID
  assert {p.output_length for p in planned} == {256}
  assert [p.judged_against for p in planned] == ["AR cached"] * 12 + [
      "AR greedy temp=0"] * 2
  cmp = config.compare
  assert (cmp.batch_sizes, cmp.timed_runs, cmp.baseline,
          cmp.greedy_baseline) == ((1, 8), 3, "AR cached", "AR greedy temp=0")
  assert (cmp.tolerance_gen_ppl, cmp.tolerance_entropy) == (0.10, 0.10)


def test_full_grid_holds_every_default_entry_at_three_lengths(job,
                                                              tmp_path):
  tiny, full = load_config("tiny"), load_config("full")
  assert set(tiny.compare.decoders) < set(full.compare.decoders)
  assert len(full.compare.decoders) == 24
  planned, _ = job.plan(full, str(tmp_path))
  assert full.compare.output_lengths == (32, 128, 256)
  assert {p.output_length for p in planned} == {32, 128, 256}
  assert full.compare.timed_runs == 5
  assert full.model.to_dict() == tiny.model.to_dict()


def test_job_exits_with_one_line_before_preparing_data(tmp_path):
  workdir = tmp_path / "work"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "compare_decoding.py"),
       f"--workdir={workdir}", "--config.compare.batch_sizes=(0,4)"],
      capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert proc.returncode != 0
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert lines == ["compare_decoding: error: compare.batch_sizes=(0, 4) must "
                   "be a non-empty tuple of distinct integers >= 1"]
  assert not workdir.exists()


# The main job's flags and config keys (compare_decoding.plan), tabled: every
# row a (call(tmp_path), exception class, regex) whose message names the key
# and its allowed range, before anything is prepared, trained or written.

def compare(tmp_path, setting=None, value=None, workdir=None):
  """compare_decoding.plan on the tiny config with config[setting] = value."""
  config = load_config("tiny")
  if setting is not None:
    section, key = setting.split(".", 1)
    config[section][key] = value
  _load("compare_decoding", ROOT / "experiments" / "compare_decoding.py").plan(
      config, str(workdir or tmp_path / "work"))


def compare_row(setting, value, match):
  return pytest.param(lambda tmp_path: compare(tmp_path, setting, value),
                      ValueError, match, id=f"compare-{setting}={value!r}")


ONE = "AR cached | ar | model=ar"
BAD_INPUTS = [
    compare_row("compare.batch_sizes", (0, 4),
                r"compare.batch_sizes=\(0, 4\) must be a non-empty tuple of "
                r"distinct integers >= 1"),
    compare_row("compare.batch_sizes", (-1, 4),
                r"compare.batch_sizes=\(-1, 4\) must be .* >= 1"),
    compare_row("compare.batch_sizes", (True, 4),
                r"compare.batch_sizes=\(True, 4\) must be .* >= 1"),
    compare_row("compare.output_lengths", (), r"compare.output_lengths=\(\) "
                r"must be a non-empty tuple"),
    compare_row("compare.timed_runs", 0,
                r"compare.timed_runs=0 must be an integer >= 1"),
    compare_row("compare.prompt_len", 0,
                r"compare.prompt_len=0 must be an integer >= 1"),
    compare_row("compare.reference_len", -3,
                r"compare.reference_len=-3 must be an integer >= 1"),
    compare_row("compare.temperature", float("inf"),
                r"compare.temperature=inf must be a finite number >= 0"),
    compare_row("compare.temperature", float("nan"),
                r"compare.temperature=nan must be a finite number >= 0"),
    compare_row("compare.tolerance_gen_ppl", -0.1,
                r"compare.tolerance_gen_ppl=-0.1 must be a finite number > 0"),
    compare_row("compare.tolerance_entropy", float("nan"),
                r"compare.tolerance_entropy=nan must be a finite number > 0"),
    compare_row("compare.output_lengths", (32, 400),
                r"prompt_len \+ max\(compare.output_lengths\) = 416 must be "
                r"<= the ar model's max_len=320"),
    compare_row("compare.pretrained_set", "bass",
                r"compare.pretrained_set='bass' must be '' \(the shipped set\) "
                r"or one of the sets in .*'base'"),
    compare_row("compare.pretrained_set", "../pretrained",
                r"compare.pretrained_set='../pretrained' must be ''"),
    compare_row("compare.stored_members", ("nobody",),
                r"compare.stored_members: no member 'nobody' in .*shipped "
                r"there: \['ar', "),
    compare_row("compare.stored_members", ("mdlm",),
                r"compare.stored_members: 'mdlm' is a member of the config"),
    compare_row("compare.baseline", "AR fast",
                r"compare.baseline='AR fast' must be the label of an entry"),
    compare_row("compare.decoders", (ONE, "X | greedy | model=ar"),
                r"compare.decoders\[1\].*unknown decoder name='greedy'"),
    compare_row("compare.decoders", (ONE, "X ar model=ar"),
                r"compare.decoders\[1\].* must have 3 or 4 fields"),
    compare_row("compare.decoders", (ONE, "X {steps} | mdlm | model=mdlm | "
                                     "steps"),
                r"compare.decoders\[1\].*option 'steps' must be key=value"),
    compare_row("compare.decoders", (ONE, "X {threshold} | threshold | "
                                     "model=mdlm | threshold=True"),
                r"compare.decoders\[1\].*threshold=True must be in \(0, 1\]"),
    compare_row("compare.decoders", (ONE, "X | ar | model=gpt"),
                r"role model='gpt' must name a decoded model, one of"),
    compare_row("compare.decoders", (),
                r"compare.decoders must be a non-empty list"),
    # A member that cannot serve its row's decoder, refused at plan time
    # (conventions.serves on the members' configs), not at the row's turn.
    compare_row("compare.decoders", (ONE, "X | self_speculative | model=ar"),
                r"compare.decoders row 'X': decoder 'self_speculative' \(role "
                r"'model'\) needs non-causal attention; the model's is "
                r"'causal'"),
    compare_row("compare.decoders", (ONE, "X | ar | model=mdlm"),
                r"row 'X': decoder 'ar' \(role 'model'\) needs 'causal' "
                r"attention; the model's is 'bidirectional'"),
    compare_row("compare.decoders", (ONE, "X | speculative | target=mdlm "
                                     "draft=draft_small"),
                r"row 'X': decoder 'speculative' \(role 'target'\) needs "
                r"'causal' attention"),
    compare_row("data.path", "/no/such/corpus.txt",
                r"data.path='/no/such/corpus.txt' does not exist"),
    compare_row("data.format", "csv",
                r"data.format='csv' must be one of \('auto', 'paragraphs', "
                r"'lines'\)"),
    compare_row("data.vocab_size", 100, r"data.vocab_size=100 must be an "
                r"integer >= 325"),
    compare_row("model.max_len", 128,
                r"data.seq_len=256 must be <= model.max_len=128"),
    pytest.param(lambda tmp_path: compare(
        tmp_path, workdir=_file(tmp_path)), ValueError,
                 r"--workdir=.* is a file; give a directory",
                 id="compare-workdir-is-a-file"),
    pytest.param(lambda tmp_path: compare(
        tmp_path, workdir=_file(tmp_path) / "sub"), ValueError,
                 r"--workdir=.*sub cannot be created", id="compare-workdir-"
                 "under-a-file"),
    pytest.param(lambda tmp_path: compare(
        tmp_path, workdir="/proc/lm_decoding_work"), ValueError,
                 r"--workdir=/proc/lm_decoding_work cannot be created",
                 id="compare-workdir-unwritable"),
]


def _file(tmp_path) -> pathlib.Path:
  path = tmp_path / "a_file"
  path.write_text("x")
  return path


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_entry_point_bad_input(call, error, match, tmp_path, monkeypatch):
  stubs.refused_before_work(call, error, match, tmp_path, monkeypatch)


@pytest.mark.parametrize("script, flags, message", [
    ("compare_decoding.py", ["--config.compare.decoders=('X | ar | "
                             "model=ar | steps=3',)"],
     r"^compare_decoding: error: compare.decoders\[0\] \('X'\): the label "
     r"must show every option"),
    ("compare_decoding.py", ["--predict=h100_sxm,h300"],
     r"^compare_decoding: error: unknown profile name='h300'; allowed: "),
], ids=["compare-label", "compare-predict"])
def test_entry_points_exit_with_one_line(script, flags, message, tmp_path):
  """What a user sees: one line, non-zero exit, nothing left behind."""
  stubs.exits_with_one_line(script, flags, message, tmp_path)


# ---- the harness on tiny models -----------------------------------------------


def transformer(attention, seed, eos_boost=1.0):
  """A tiny Transformer; eos_boost scales EOS's (tied) embedding, so that
  EOS is likely at some positions and not at others."""
  cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=1,
                          num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64,
                          max_len=16, attention=attention)
  params = init_params(cfg, jax.random.key(seed))
  params["embedding"] = params["embedding"].at[EOS_ID].multiply(eos_boost)
  return Model(make_logits_fn(cfg), params)


T = 8


@pytest.fixture(scope="module")
def measured(tokenizer):
  """One run of the harness on tiny Transformers (compiling dominates)."""
  texts = ["AR cached | ar | model=ar",
           "MDLM K={steps} | mdlm | model=mdlm | steps=8",
           "MDLM K={steps} | mdlm | model=mdlm | steps=T",
           "thr {kv_cache} | threshold | model=mdlm | kv_cache=dual",
           "AR greedy temp={temperature} | ar | model=ar | temperature=0",
           "AR exit temp={temperature} | ar_early_exit | model=ar"
           " | temperature=0"]
  planned = entries.judged_against(
      entries.plan(entries.parse_entries(texts), (T,), 1.0, MEMBERS),
      "AR cached", "AR greedy temp=0")
  models = {"ar": transformer("causal", 0, eos_boost=40.0),
            "mdlm": transformer("bidirectional", 1, eos_boost=40.0)}
  prompts = np.random.default_rng(0).integers(5, VOCAB, (2, 4)).astype(
      np.int32)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    result = comparison.run(
        planned, models, transformer("causal", 2), tokenizer, prompts,
        ["a single man in possession", "a good wife"], batch_sizes=(1, 2),
        runs=2, progress=True)
  return planned, result, printed.getvalue()


def test_run_counts_times_and_scores_every_row(measured):
  planned, result, printed = measured
  rows = {(r["decoder"], r["batch_size"]): r for r in result.rows}
  assert len(result.rows) == 2 * len(planned) == len(rows)
  assert [p.label for p in planned][:2] == ["AR cached", "MDLM K=8"]
  assert result.merged == [(T, "MDLM K=8", ("MDLM K=8", "MDLM K=T"))]
  p = 4
  for (label, b), r in rows.items():
    fwd, calls = r["forward_tokens"]["model"], r["calls"]["model"]
    assert r["nfe"] == calls >= 1 and r["output_length"] == T
    if label.startswith("AR"):  # prefill, then T - 1 one-token steps
      assert (r["nfe"], fwd) == (T, b * p + b * (T - 1))  # EOS ignored
      assert not r["full_pass"]
    elif label.startswith("MDLM"):
      assert fwd == calls * b * (p + T) and r["full_pass"]
    assert 0 < r["ms_min"] <= r["ms_median"] and r["spread"] >= 0
    assert 0 < r["eos_tokens_per_row"] <= T
    assert ("gen_ppl" in r) == (b == 2)
    if b == 2:
      assert r["gen_ppl"] > 1 and r["entropy"] >= 0
  assert result.human["gen_ppl"] > 1
  assert set(result.samples) == {(p.label, T) for p in planned}
  # Greedy rows carry their reference and their agreement with its tokens:
  # the early-exit loop decodes AR greedy's tokens exactly.
  assert rows["AR exit temp=0", 2]["judged_against"] == "AR greedy temp=0"
  assert rows["AR exit temp=0", 2]["greedy_agreement"] == 1.0
  assert rows["MDLM K=8", 2]["judged_against"] == "AR cached"
  assert not any("greedy_agreement" in r for (label, b), r in rows.items()
                 if b == 1 or label in ("AR greedy temp=0", "MDLM K=8"))
  assert printed.count(f" | T={T} ") == len(rows)  # one line per row


def test_expected_forward_tokens_bound_the_measured_ones(measured):
  """Exact for cached AR; an upper bound for self-paced decoders."""
  planned, result, _ = measured
  by_label = {p.label: p for p in planned}
  for r in result.rows:
    expected = by_label[r["decoder"]].decoder.expected_work(
        r["batch_size"], 4).forward_tokens
    measured_tokens = sum(r["forward_tokens"].values())
    if r["decoder"] == "AR cached":
      assert expected == measured_tokens
    else:
      assert measured_tokens <= expected < 2 * measured_tokens


@pytest.mark.parametrize("name, options, batch, t, tokens", [
    # Forward tokens the full grid's run at P = 16 measured (committed in
    # experiments/results/tiny_cpu_2core before issue 30): exact here.
    ("ar", {}, 8, 32, 376),
    ("ar_uncached", {}, 8, 32, 12_288),
    ("llada", dict(steps=32), 8, 32, 12_288),
    ("threshold", dict(block_length=32, kv_cache="dual"), 8, 32, 8_320),
    ("threshold", dict(block_length=32, kv_cache="prefix"), 8, 32, 8_320),
    ("bd3lm", dict(block_length=16, steps=32), 8, 32, 4_352),
    ("bd3lm", dict(block_length=16, steps=256), 1, 256, 4_352),
    # Prefix cache, 2 blocks of 16: a full pass per block, then 15 steps
    # over the 32 and the 16 positions from the block on.
    ("threshold", dict(block_length=16, kv_cache="prefix"), 1, 32,
     2 * 48 + 15 * 32 + 15 * 16),
    # uniform_eb, 2 canvases of 16, 4 steps each: a full pass per canvas,
    # then 3 steps over the canvas alone; without a cache 8 full passes.
    ("uniform_eb", dict(block_length=16, steps=8, kv_cache="prefix"), 1, 32,
     2 * 48 + 2 * 3 * 16),
    ("uniform_eb", dict(steps=8), 2, 32, 8 * 2 * 48),
])
def test_expected_forward_tokens_exactly(name, options, batch, t, tokens):
  decoder = base.make_decoder(name, output_length=t, eos_ids=(), **options)
  assert decoder.expected_work(batch, 16).forward_tokens == tokens


def test_expected_drawn_positions():
  """Iterative decoders draw over their window at every step; AR and the
  verifier one position per row per token it scores."""
  def work(name, t, batch, **options):
    decoder = base.make_decoder(name, output_length=t, eos_ids=(), **options)
    return decoder.expected_work(batch, 16)
  assert work("mdlm", 256, 8, steps=8).drawn == 8 * 8 * 256
  assert work("llada", 256, 8, steps=32, block_length=32).drawn == 32 * 8 * 32
  assert work("ar", 256, 8).drawn == 8 * 256
  # 16 rounds of gamma = 4: 5 target and 4 draft positions each.
  spec = work("speculative", 32, 1, gamma=4)
  assert (spec.forward_tokens, spec.drawn) == (2 * 16 + 16 * 9, 16 * 9)
  assert spec.positions == spec.forward_tokens + spec.drawn


def test_eos_mode_real_tokens_and_timing(measured):
  _, result, _ = measured
  for r in result.rows:
    assert not r["eos_timed_apart"]  # the same work with or without EOS
    assert r["real_tokens_per_s"] == pytest.approx(
        r["eos_tokens_per_row"] * r["batch_size"] / (r["ms_min"] / 1e3))
  ended = [r["eos_tokens_per_row"] < T for r in result.rows]
  assert any(ended)  # the boosted EOS ends some rows early


def test_cached_rows_report_their_approximation(measured):
  _, result, _ = measured
  dual = next(r for r in result.rows
              if r["decoder"] == "thr dual" and r["batch_size"] == 2)
  assert dual["max_logit_error"] >= 0 and 0 <= dual["agreement"] <= 1
  assert dual["reference"] is None  # no kv_cache=none row in this run
  assert dual["forward_tokens"]["model"] < dual["nfe"] * 2 * (4 + T)


def test_uniform_eb_rows_run_cached_and_uncached(tokenizer):
  """uniform_eb's cached row's error is measured by its own `cache_error`
  (exact cache: rounding only, same tokens as its kv_cache=none row), its
  row names the context that ran, and it reports like any other row."""
  texts = [f"uni {{steps}} {{block_length}} {{kv_cache}} | uniform_eb"
           f" | model=mdlm | steps=4 block_length=4 kv_cache={kv}"
           for kv in ("prefix", "none")]
  planned = entries.plan(entries.parse_entries(texts), (T,), 1.0, MEMBERS)
  model = transformer("bidirectional", 1)
  prompts = np.random.default_rng(0).integers(5, VOCAB, (2, 4)).astype(
      np.int32)
  result = comparison.run(planned, {"mdlm": model}, transformer("causal", 2),
                          tokenizer, prompts, ["a", "b"], batch_sizes=(2,),
                          runs=1, progress=False)
  rows = {r["decoder"]: r for r in result.rows}
  cached = rows["uni 4 4 prefix"]
  assert 0 <= cached["max_logit_error"] < 1e-4
  assert cached["agreement"] == 1.0 and cached["reference"] == "uni 4 4 none"
  assert (cached["context"], rows["uni 4 4 none"]["context"]) == (
      "canvas_prefix", "full")
  assert cached["gen_ppl"] > 1 and rows["uni 4 4 none"]["gen_ppl"] > 1
  assert (cached["forward_tokens"]["model"]
          < rows["uni 4 4 none"]["forward_tokens"]["model"])
  # The self-correction rate: the scored (EOS-mode) decode's revisions over
  # its acceptances, pooled over the rows.
  args = comparison._decode_args(planned[0], 2, {"mdlm": model}, prompts, 0,
                                 None, None)
  stats = planned[0].eos_decoder.decode(*args).stats
  assert stats["accepted"].sum() > 0
  assert cached["self_correction"] == pytest.approx(
      stats["revised"].sum() / stats["accepted"].sum())


def test_report_opens_with_the_verdict_and_the_frontier(measured, tmp_path):
  """The smoke run of the main job's outputs: verdict lines, figures."""
  _, result, _ = measured
  paths = report.write(result, "- setup line", "AR cached", str(tmp_path))
  assert set(paths) == {"csv", "report", "frontier", "latency", "quality"}
  for path in paths.values():
    assert os.path.getsize(path) > 0
  with open(paths["frontier"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  lines = frontier.summarize(result.rows, "AR cached",
                             frontier.Tolerance()).lines
  assert len(lines) == 1 + 2 * 2 * 2  # the tolerance, 2 lines per B, ref
  assert lines[0].startswith("Verdict: 'within tolerance' of AR sampling")
  assert "held to AR greedy (AR greedy temp=0)" in lines[0]
  for b, greedy, line in zip((1, 1, 1, 1, 2, 2, 2, 2), (0, 0, 1, 1) * 2,
                             lines[1:]):
    where = f"T={T} B={b}" + (", greedy vs AR greedy temp=0" if greedy
                              else "")
    assert line.startswith(where + ": ")
  assert "Pareto front: " in lines[1]
  assert "fastest within tolerance: " in lines[2]
  text = open(paths["report"]).read()
  verdict = "\n".join(f"- {line}" for line in lines)
  assert text.startswith(f"# {report.TITLE}\n\n## Verdict\n\n{verdict}\n")
  assert text.index("![frontier](frontier.png)") < text.index("## Setup")
  assert "- setup line" in text


def test_report_defines_every_column(measured, tmp_path):
  _, result, _ = measured
  paths = report.write(result, "# test", "AR cached", str(tmp_path))
  with open(paths["csv"]) as f:
    table = list(csv.DictReader(f))
  assert len(table) == len(result.rows)
  assert {"forward_tokens_model", "calls_model", "ms_min"} <= set(table[0])
  text = open(paths["report"]).read()
  defined = set(re.findall(r"^- \*\*(.+?)\*\*:", text, re.M))
  tables = re.findall(r"^(\| .+ \|)\n\|(?:---\|)+$", text, re.M)
  assert len(tables) >= 5  # cost, K*, EOS mode, quality, cache
  headers = {h.strip() for t in tables for h in t.strip("|").split("|")}
  assert headers - {"K*"} <= defined, headers - defined
  assert "- **K\\***:" in text
  assert "## Crossover" in text and "| MDLM K=8 |" in text
  assert "row 'MDLM K=8' stands for 'MDLM K=8', 'MDLM K=T'" in text
  assert "**Prompt 1:**" in text and "- *AR cached*:" in text


def test_report_predicted_columns_from_the_cost_model(measured, tmp_path):
  _, result, _ = measured
  configs = {m: transformer(a, 0).logits_fn.config
             for m, a in (("ar", "causal"), ("mdlm", "bidirectional"))}
  profile = cost_model.HardwareProfile("unit", 1e9, 1e9, 1e-4, "test")

  predict_ms = cost_model.comparison_row_ms(configs, 4, profile)
  paths = report.write(result, "# test", "AR cached", str(tmp_path),
                       predict_ms=predict_ms, elsewhere={"unit": predict_ms})
  with open(paths["csv"]) as f:
    table = {(r["decoder"], r["batch_size"]): r for r in csv.DictReader(f)}
  for b in (1, 2):  # P = 4 (the prompts' width), T = 8
    assert float(table["AR cached", str(b)]["predicted_ms"]) == pytest.approx(
        1e3 * cost_model.ar_decode_s(configs["ar"], b, 4, T, profile))
    mdlm = table["MDLM K=8", str(b)]
    assert float(mdlm["predicted_ms"]) == pytest.approx(
        1e3 * int(mdlm["nfe"]) * cost_model.denoise_step_s(
            configs["mdlm"], b, 4, T, profile))
    # dual-cache block calls: not costed
    assert table["thr dual", str(b)]["predicted_ms"] == ""
  text = open(paths["report"]).read()
  assert "| pred ms | meas/pred |" in text and "- **pred ms**:" in text
  # The frontier on the profile: the predicted ms, the dual-cache rows left
  # out (not costed).
  assert os.path.getsize(paths["frontier_unit"]) > 0
  ar_ms = 1e3 * cost_model.ar_decode_s(configs["ar"], 1, 4, T, profile)
  assert f"- T={T} B=1: Pareto front: AR cached ({ar_ms:.3g} ms" in text
  assert "- not costed: thr dual" in text


def test_report_columns_come_from_the_data_file():
  """The tables' columns as report.md writes them (`report_columns.tsv`):
  the cost table's formatters bound by key, the spread flag filled in, a
  later table's repeated column the cost table's header and digits,
  defined "as above"; an unknown table refused."""
  cost = {c[1]: c for c in report.table_columns("cost")}
  assert cost["fwd tokens"][0]({"forward_tokens": {"model": 1200}}) == (
      "model 1,200")
  assert cost["spread"][0]({"spread": 0.25, "noisy": True}) == "25% !"
  assert f"'!' above {SPREAD_FLAG:.0%} (" in cost["spread"][3]
  assert cost["ms min"][:3] == ("ms_min", "ms min", 1)
  assert report.table_columns("cache")[:3] == (
      ("decoder", "decoder", 0, "as above"), ("batch_size", "B", 0,
                                              "as above"),
      ("output_length", "T", 0, "as above"))
  assert [c[1] for c in report.table_columns("predicted")] == [
      "pred ms", "meas/pred"]
  with pytest.raises(ValueError, match=r"table='costs'; allowed: \("):
    report.table_columns("costs")


def test_fixed_length_and_eos_modes_exactly(tokenizer):
  p, t = 3, 6
  # Row 0 predicts EOS from position P + 1 on, row 1 from P + 3 on.
  stub = TableLogitsFn.scripted(
      [[EOS_ID if i >= p + end else 7 for i in range(p + t + 1)]
       for end in (1, 3)], vocab_size=16)
  texts = ["AR early exit | ar_early_exit | model=ar",
           "MDLM K={steps} | mdlm | model=mdlm | steps=T"]
  planned = entries.plan(entries.parse_entries(texts), (t,), 1.0, MEMBERS)
  model = Model(stub, None)
  # The evaluator shares the tokenizer's vocabulary (the references are
  # real text); the stub's 16 ids are in it.
  result = comparison.run(planned, {"ar": model, "mdlm": model},
                          transformer("causal", 2), tokenizer,
                          np.full((2, p), 7, np.int32), ["x", "y"],
                          batch_sizes=(1, 2), runs=1, progress=False)
  rows = {(r["decoder"], r["batch_size"]): r for r in result.rows}
  early, mdlm = rows["AR early exit", 2], rows[f"MDLM K={t}", 2]
  assert early["nfe"] == t  # fixed length: EOS ignored
  # EOS mode, up to and including EOS: AR's token i comes from position
  # P - 1 + i (rows: 3 and 5 tokens), the denoiser's position P + i predicts
  # itself (2 and 4); B=1 decodes row 0 (its rows are those of B=2).
  assert (early["eos_tokens_per_row"], mdlm["eos_tokens_per_row"]) == (4, 3)
  assert (rows["AR early exit", 1]["eos_tokens_per_row"],
          rows[f"MDLM K={t}", 1]["eos_tokens_per_row"]) == (3, 2)
  assert early["eos_timed_apart"] and not mdlm["eos_timed_apart"]
  assert mdlm["real_tokens_per_s"] == pytest.approx(
      6 / (mdlm["ms_min"] / 1e3))
  assert early["all_eos"] == mdlm["empty"] == 0


def test_mesh_option_decodes_the_same_and_adds_per_device_columns(tokenizer):
  """The sharded path (`sharded.jit_decode`) on a one-device mesh: the same
  rows as without a mesh, plus devices and per-device GB/s and GFLOP/s.
  Equality on 8 devices: tests/test_sharded_execution.py."""
  planned = entries.plan(entries.parse_entries(["AR | ar | model=ar"]),
                         (4,), 1.0, MEMBERS)
  models = {"ar": transformer("causal", 0, eos_boost=40.0)}
  prompts = np.random.default_rng(0).integers(5, VOCAB, (2, 4)).astype(
      np.int32)
  args = (planned, models, transformer("causal", 2), tokenizer, prompts,
          ["a single man", "a good wife"])
  plain = comparison.run(*args, batch_sizes=(2,), runs=1, progress=False)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  meshed = comparison.run(*args, batch_sizes=(2,), runs=1, progress=False,
                          mesh=mesh)
  same = ("nfe", "forward_tokens", "eos_tokens_per_row", "gen_ppl",
          "entropy")
  for a, b in zip(plain.rows, meshed.rows):
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    assert "devices" not in a and b["devices"] == 1
    assert b["weight_GBps_per_device"] > 0 and b["GFLOPs_per_device"] > 0
  assert plain.samples == meshed.samples


def test_mesh_option_refuses_a_batch_it_cannot_split(tokenizer):
  mesh = jax.sharding.AbstractMesh((2, 1, 1), sharding.MESH_AXES)
  planned = entries.plan(entries.parse_entries(["AR | ar | model=ar"]), (4,),
                         1.0, MEMBERS)
  model = transformer("causal", 0)
  with pytest.raises(ValueError, match=r"batch.*dimension 0 \(1\) does "
                     r"not divide over mesh axes \{'data': 2, 'fsdp': 1\}"):
    comparison.run(planned, {"ar": model}, model, tokenizer,
                   np.full((2, 4), 7, np.int32), ["x", "y"],
                   batch_sizes=(1, 2), runs=1, progress=False, mesh=mesh)


# ---- crossover and K* from rows -----------------------------------------------


def _row(decoder, b, t, ms, nfe, full_pass=False):
  return dict(decoder=decoder, series=[decoder], batch_size=b,
              output_length=t, ms_min=ms, ms_median=ms * 1.05, nfe=nfe,
              full_pass=full_pass)


def test_crossover_sentence_and_break_even_steps():
  rows = [_row("AR cached", 1, 32, 10.0, 32),
          _row("AR cached", 1, 64, 20.0, 64),
          _row("MDLM K=8", 1, 32, 16.0, 8, True),
          _row("MDLM K=8", 1, 64, 16.0, 8, True),
          _row("MDLM K=T", 1, 32, 64.0, 32, True),
          _row("MDLM K=T", 1, 64, 128.0, 64, True),
          _row("thr dual", 1, 64, 1.0, 64),
          _row("AR early exit", 1, 64, 19.5, 64)]  # within noise: not faster
  assert crossover.faster(rows, "AR cached") == {
      ("MDLM K=8", 1): [64], ("MDLM K=T", 1): [], ("thr dual", 1): [64],
      ("AR early exit", 1): []}
  assert crossover.sentence(rows, "AR cached") == (
      "Faster than AR cached (median time below AR cached's minimum): MDLM "
      "K=8 at B=1 for T = 64; thr dual at B=1 for T = 64; every other "
      "decoder, B in [1] and T in [32, 64]: never.")
  slow = [r for r in rows if r["decoder"] != "thr dual"
          and not (r["decoder"] == "MDLM K=8" and r["output_length"] == 64)]
  assert crossover.sentence(slow, "AR cached").startswith(
      "No decoder was faster than AR cached")
  # K* from the full-pass row with the most NFE (not the cached one).
  assert crossover.break_even_steps(rows, "AR cached") == {
      (1, 32): pytest.approx(5.0), (1, 64): pytest.approx(10.0)}


def test_greedy_rows_are_judged_against_the_greedy_baseline():
  """Rows at temperature 0 (and decoders that do not sample) are judged
  against compare.greedy_baseline's row, samplers against the baseline; a
  greedy row without a greedy baseline entry is refused by name."""
  texts = ["AR cached | ar | model=ar",
           "AR greedy temp={temperature} | ar | model=ar | temperature=0",
           "beam {num_beams} | ar_beam | model=ar | num_beams=2",
           "MDLM K={steps} temp={temperature} | mdlm | model=mdlm | steps=4"
           " temperature=0"]
  parsed = entries.parse_entries(texts)
  planned = entries.judged_against(
      entries.plan(parsed, (8,), 1.0, MEMBERS), "AR cached",
      "AR greedy temp=0")
  assert [p.judged_against for p in planned] == [
      "AR cached", "AR greedy temp=0", "AR greedy temp=0", "AR greedy temp=0"]
  assert planned[3].decoder.sampling.temperature == 0
  assert [p.judged_against for p in entries.judged_against(
      entries.plan(parsed, (8,), 1.0, MEMBERS), "AR cached")] == [
          "AR cached"] * 4
  with pytest.raises(ValueError, match="compare.greedy_baseline='AR cached'"):
    entries.judged_against(entries.plan(parsed, (8,), 1.0, MEMBERS),
                           "AR cached", "AR cached")
  with pytest.raises(ValueError, match="'ar_beam' does not sample"):
    entries.plan(entries.parse_entries(
        ["b {num_beams} {temperature} | ar_beam | model=ar | num_beams=2"
         " temperature=0"]), (8,), 1.0, MEMBERS)
