"""Bad inputs, tabled: every row raises one clear error before any work.

One parametrised table over the entry points' flags and config keys
(`experiments/compare_decoding.py`'s `plan`, `training.train.train`), data
paths, tokenizer and checkpoint mismatches, and every registered decoder's
options and inputs. Each row is (call, exception class, regex): the message
must name the argument and its allowed range. Decoder rows decode with
`stubs.RaisingLogitsFn`, so a check that comes after any trace or compile
fails the row; entry-point rows assert that their workdir was never created
(nothing prepared, trained or written). The subprocess rows at the end check
what a user sees: a non-zero exit, one line of output, no traceback, no
workdir left behind.
"""

from __future__ import annotations

import dataclasses
import gzip
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _loading
import stubs
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import base, make_decoder, registered, sampling
from lm_decoding.decoding.iterative import IterativeDecoder, ScheduledDecoder
from lm_decoding.decoding.speculative import DraftVerifyDecoder
from lm_decoding.models import Model, TransformerConfig
from lm_decoding.special_tokens import PAD_ID
from lm_decoding.training import train as train_lib
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEY = jax.random.key(0)
V = 16  # RaisingLogitsFn's vocabulary; its max_len is 16
T = 4


def _load(name, path):
  return _loading.load(name, path)


JOB = _load("compare_decoding",
            ROOT / "experiments" / "compare_decoding.py")
TINY = ROOT / "configs" / "tiny.py"


def tiny_config():
  return _load("tiny_config", TINY).get_config()


# --- Decoders: options at construction, inputs before any trace. ----------

def decoder(name: str, **options):
  """Decoder `name` with T = 4 (K = T steps for scheduled decoders)."""
  options.setdefault("output_length", T)
  if issubclass(base.decoder_class(name), ScheduledDecoder):
    options.setdefault("steps", T)
  return make_decoder(name, **options)


def decode(name: str, prompts=((5, 6),), lengths=(2,), key=KEY, roles=None,
           **options):
  """Builds decoder `name` and decodes on stubs that fail on any use:
  `roles` ({role: logits_fn}) binds some roles, `RaisingLogitsFn()` the
  others."""
  built = decoder(name, **options)
  models = stubs.bind_roles(built, stubs.RaisingLogitsFn(), None)
  models.update({r: Model(fn, None) for r, fn in (roles or {}).items()})
  built.decode(models, jnp.asarray(prompts), jnp.asarray(lengths), key)


def has_field(name, field):
  return field in {f.name for f in dataclasses.fields(base.decoder_class(name))}


ALL = registered()
PARALLEL = tuple(n for n in ALL
                 if issubclass(base.decoder_class(n), IterativeDecoder))
DRAFT_VERIFY = tuple(n for n in ALL
                     if issubclass(base.decoder_class(n), DraftVerifyDecoder))


def transformer(attention: str) -> TransformerConfig:
  """A tiny Transformer config of `attention` kind: read by the checks, its
  KV cache built abstractly at most; no model of it ever runs."""
  return TransformerConfig(vocab_size=V, d_model=8, num_layers=1, num_heads=1,
                           num_kv_heads=1, head_dim=8, mlp_dim=8, max_len=16,
                           attention=attention)


# Models without KV cache support (the draft-and-verify decoders keep one for
# the target, and for speculative's draft), and how the message shows each;
# the cache asked for has B = 1 rows, P + T + gamma - 1 = 2 + 4 + 4 - 1 slots.
NO_CACHE = [
    ("no-init-cache", stubs.NoInitCacheLogitsFn(),
     r"NoInitCacheLogitsFn has no init_cache$"),
    ("init-cache-none", stubs.NoneCacheLogitsFn(),
     r"NoneCacheLogitsFn\.init_cache returned NoneType$"),
    ("config-cannot-build-a-cache", stubs.ConfigCacheLogitsFn(),
     r"ConfigCacheLogitsFn\.init_cache\(1, 9\) raised AttributeError: "
     r"'NoneType' object has no attribute"),
]
NEEDS_CACHE = (r"must support a KV cache: its logits_fn needs "
               r"init_cache\(batch_size, length\) returning a cache with "
               r"at\(\) and rollback\(\) \(as models.KVCache\); ")
# A target that supports a cache and fails on any call: speculative's draft
# cache is checked after the target's.
CACHED = stubs.ConfigCacheLogitsFn(config=transformer("causal"))

DECODER_ROWS = [
    *[pytest.param(lambda n=n: decode(n, prompts=((5, V),)), ValueError,
                   r"prompts must be token ids in \[0, V=16\)",
                   id=f"{n}-prompt-id-outside-vocab") for n in ALL],
    *[pytest.param(lambda n=n: decode(n, prompts=np.ones((1, 14), np.int32),
                                      lengths=(14,)), ValueError,
                   r"(?=.*P=14)(?=.*output_length=4).*max_len=16",
                   id=f"{n}-prompt-longer-than-the-cache") for n in ALL],
    *[pytest.param(lambda n=n: decoder(n, output_length=0), ValueError,
                   r"output_length=0 must be an integer >= 1",
                   id=f"{n}-output-length-0") for n in ALL],
    *[pytest.param(lambda n=n: decode(n, key=None), ValueError,
                   r"key=None.*jax.random.key\(seed\)",
                   id=f"{n}-key-none") for n in ALL
      if has_field(n, "sampling")],
    *[pytest.param(lambda n=n: decode(n, mask_id=V), ValueError,
                   r"mask_id and pad_id must be token ids in \[0, V=16\)", id=f"{n}-mask-id-is-V")
      for n in PARALLEL],
    *[pytest.param(lambda n=n: decoder(n, early_stop=1), ValueError,
                   r"early_stop=1 must be True or False",
                   id=f"{n}-early-stop-as-a-number") for n in PARALLEL],
    pytest.param(lambda: decoder("mdlm", reuse_logits="yes"), ValueError,
                 r"reuse_logits='yes' must be True or False",
                 id="mdlm-reuse-logits-as-a-string"),
    pytest.param(lambda: decoder("threshold", threshold=True), ValueError,
                 r"threshold=True must be in \(0, 1\] \(a number\)",
                 id="threshold-true"),
    pytest.param(lambda: decoder("threshold", threshold="high"), ValueError,
                 r"threshold='high' must be in \(0, 1\]",
                 id="threshold-a-word"),
    pytest.param(lambda: decoder("factor", factor=True), ValueError,
                 r"factor=True must be in \(0, inf\)", id="factor-true"),
    pytest.param(lambda: decoder("factor", factor=float("inf")), ValueError,
                 r"factor=inf must be in \(0, inf\)", id="factor-inf"),
    pytest.param(lambda: decoder("maskgit", choice_temperature=True),
                 ValueError, r"choice_temperature=True must be in \[0, inf\)",
                 id="maskgit-choice-temperature-true"),
    pytest.param(lambda: sampling.SamplingConfig(temperature=True),
                 ValueError, r"temperature=True must be in \[0, inf\)",
                 id="sampling-temperature-true"),
    pytest.param(lambda: sampling.SamplingConfig(top_p=True), ValueError,
                 r"top_p=True must be in \(0, 1\]", id="sampling-top-p-true"),
    pytest.param(lambda: sampling.SamplingConfig(top_k=2.5), ValueError,
                 r"top_k=2.5 must be an integer >= 0", id="sampling-top-k-2.5"),
    pytest.param(lambda: sampling.SamplingConfig(min_p=1.0), ValueError,
                 r"min_p=1.0 must be in \[0, 1\)", id="sampling-min-p-1"),
    pytest.param(lambda: sampling.SamplingConfig(repetition_penalty=0.0),
                 ValueError, r"repetition_penalty=0.0 must be in \(0, inf\)",
                 id="sampling-repetition-penalty-0"),
    pytest.param(lambda: decoder("mdlm", sampling=sampling.SamplingConfig(
        repetition_penalty=1.2)), ValueError,
                 r"repetition_penalty=1.2 must be 1",
                 id="mdlm-repetition-penalty"),
    pytest.param(lambda: decoder("ar_beam", num_beams=True), ValueError,
                 r"num_beams=True must be >= 1", id="beam-num-beams-true"),
    pytest.param(lambda: decoder("ar_beam", length_penalty=True), ValueError,
                 r"length_penalty=True must be in \[0, inf\)",
                 id="beam-length-penalty-true"),
    pytest.param(lambda: decoder("ar", cache_length=0), ValueError,
                 r"cache_length=0 must be >= 1", id="ar-cache-length-0"),
    pytest.param(lambda: decode("ar", cache_length=5), ValueError,
                 r"P=2 \+ output_length=4 must be <= cache_length=5",
                 id="ar-cache-shorter-than-prompt-plus-output"),
    pytest.param(lambda: decode("ar", eos_ids=(V,)), ValueError,
                 r"eos_ids and pad_id must be token ids in \[0, V=16\)",
                 id="ar-eos-id-outside-vocab"),
    pytest.param(lambda: decoder("ar", pad_id=-1), ValueError,
                 r"pad_id=-1 must be >= 0", id="ar-pad-id-negative"),
    pytest.param(lambda: decoder("mdlm", steps=True), ValueError,
                 r"steps=True must be an integer >= 1", id="mdlm-steps-true"),
    pytest.param(lambda: decoder("llada", block_length=3), ValueError,
                 r"block_length=3 must be in \[1, 4\] and divide",
                 id="llada-block-length-not-dividing"),
    pytest.param(lambda: decoder("mdlm", kv_cache="full"), ValueError,
                 r"kv_cache='full'; allowed: \('none', 'prefix', 'dual'\)",
                 id="mdlm-kv-cache-unknown"),
    pytest.param(lambda: decoder("mdlm", schedule="quadratic"), ValueError,
                 r"schedule='quadratic'; allowed", id="mdlm-schedule-unknown"),
    pytest.param(lambda: decoder("llada", remasking="highest"), ValueError,
                 r"remasking='highest'; allowed", id="llada-remasking-unknown"),
    pytest.param(lambda: decoder("remdm", remask_per_step=0), ValueError,
                 r"remask_per_step=0 must be an integer >= 1",
                 id="remdm-remask-per-step-0"),
    pytest.param(lambda: decoder("mdlm", mask_id=PAD_ID), ValueError,
                 r"mask_id=0 must differ from pad_id=0",
                 id="mdlm-mask-id-is-pad"),
    pytest.param(lambda: decode("mdlm", lengths=(2.5,)), ValueError,
                 r"prompt_lengths must be int\[B\]",
                 id="mdlm-fractional-prompt-length"),
    pytest.param(lambda: decode("ar", lengths=(3,)), ValueError,
                 r"prompt_lengths=\[3\] must be in \[1, P=2\]",
                 id="ar-prompt-length-above-width"),
    pytest.param(lambda: decode("ar", key=jax.random.PRNGKey(0)), ValueError,
                 r"key must be a typed PRNG key", id="ar-raw-prng-key"),
    pytest.param(lambda: make_decoder("greedy"), ValueError,
                 r"unknown decoder name='greedy'; registered: \(",
                 id="unknown-decoder-name"),
    *[pytest.param(lambda n=n, fn=fn: decode(n, roles={"target": fn}),
                   ValueError, rf"^the target model {NEEDS_CACHE}{got}",
                   id=f"{n}-target-{kind}")
      for n in DRAFT_VERIFY for kind, fn, got in NO_CACHE],
    *[pytest.param(lambda fn=fn: decode(
        "speculative", roles={"target": CACHED, "draft": fn}), ValueError,
                   rf"^the draft model {NEEDS_CACHE}{got}",
                   id=f"speculative-draft-{kind}")
      for kind, fn, got in NO_CACHE],
    *[pytest.param(lambda n=n: decode(n, roles={"target": stubs.RaisingLogitsFn(
        config=transformer("bidirectional"))}), ValueError,
                   r"^the target model of \w+Decoder needs 'causal' "
                   r"attention; logits_fn.config.attention='bidirectional'$",
                   id=f"{n}-bidirectional-target") for n in DRAFT_VERIFY],
    pytest.param(lambda: decode("speculative", roles={
        "draft": stubs.RaisingLogitsFn(config=transformer("bidirectional"))}),
                 ValueError, r"^the draft model of SpeculativeDecoder needs "
                 r"'causal' attention; logits_fn.config.attention="
                 r"'bidirectional'$", id="speculative-bidirectional-draft"),
    *[pytest.param(lambda n=n: decode(n, roles={
        "draft": stubs.RaisingLogitsFn(config=transformer("causal"))}),
                   ValueError, r"^the draft model of \w+Decoder needs "
                   r"non-causal \(e.g. 'bidirectional'\) attention; "
                   r"logits_fn.config.attention='causal'$",
                   id=f"{n}-causal-diffusion-draft")
      for n in ("diffusion_draft", "skeleton_polish")],
    # The boundary below the one that works (tests/test_speculative.py: a
    # skeleton draft of max_len P + T = 6, a target of P + T + gamma - 1 = 9).
    pytest.param(lambda: decode("skeleton_polish", roles={
        "draft": stubs.RaisingLogitsFn(max_len=5)}), ValueError,
                 r"^6 positions \(prompt width P=2 \+ output_length=4: the "
                 r"skeleton\) must be <= the draft model's max_len=5$",
                 id="skeleton_polish-draft-shorter-than-prompt-plus-output"),
    pytest.param(lambda: decode("skeleton_polish", roles={
        "target": stubs.RaisingLogitsFn(max_len=8)}), ValueError,
                 r"^9 positions \(prompt width P=2 \+ output_length=4 \+ "
                 r"gamma=4 - 1\) must be <= the target model's max_len=8$",
                 id="skeleton_polish-target-shorter-than-its-cache"),
]


# --- The main job's flags and config keys (compare_decoding.plan). ---------

def compare(tmp_path, setting=None, value=None, workdir=None):
  """compare_decoding.plan on the tiny config with config[setting] = value."""
  config = tiny_config()
  if setting is not None:
    section, key = setting.split(".", 1)
    config[section][key] = value
  JOB.plan(config, str(workdir or tmp_path / "work"))


def compare_row(setting, value, match):
  return pytest.param(lambda tmp_path: compare(tmp_path, setting, value),
                      ValueError, match, id=f"compare-{setting}={value!r}")


ONE = "AR cached | ar | model=ar"
COMPARE_ROWS = [
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


# --- Training: config keys, data paths, checkpoint and tokenizer fit. -------

def small_train_config(**changes):
  config = tiny_config()
  for setting, value in changes.items():
    section, key = setting.split("__")
    if section == "config":
      config[key] = value
    else:
      config[section][key] = value
  return config


def train(tmp_path, config):
  train_lib.train(config, str(tmp_path / "work"), progress=False,
                  data_dir=str(tmp_path / "work"))


def train_row(match, exc=ValueError, **changes):
  name = ",".join(f"{k.replace('__', '.')}={v!r}" for k, v in changes.items())
  return pytest.param(lambda tmp_path: train(
      tmp_path, small_train_config(**changes)), exc, match, id=f"train-{name}")


def corpus_row(content: bytes, match, name="corpus.txt"):
  def call(tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    train(tmp_path, small_train_config(data__path=str(path)))
  return pytest.param(call, ValueError, match, id=f"data-{match[:24]}")


def fingerprint_mismatch(tmp_path):
  """A checkpoint written by another config: refused before anything
  compiles or the data is prepared."""
  with Checkpoints(str(tmp_path / "work" / "checkpoints")) as checkpoints:
    checkpoints.save(1, {"x": np.zeros(2, np.float32)},
                     {"fingerprint": {"objective": "mdlm"}})
  train(tmp_path, small_train_config())


def foreign_tokenizer(tmp_path):
  path = tmp_path / "not_a_tokenizer.model"
  path.write_bytes(b"\x00\x01 not a sentencepiece model")
  Tokenizer.load(str(path))


TRAIN_ROWS = [
    train_row(r"train.num_steps=0 must be an integer >= 1",
              train__num_steps=0),
    train_row(r"train.batch_size=True must be an integer >= 1",
              train__batch_size=True),
    train_row(r"train.warmup_steps=-1 must be an integer >= 0",
              train__warmup_steps=-1),
    train_row(r"train.eval_every=0 must be an integer >= 1",
              train__eval_every=0),
    train_row(r"train.checkpoint_every=0 must be an integer >= 1",
              train__checkpoint_every=0),
    train_row(r"train.keep_checkpoints=0 must be an integer >= 1",
              train__keep_checkpoints=0),
    train_row(r"train.learning_rate=-0.001 must be a number in \(0.0, inf\)",
              train__learning_rate=-1e-3),
    train_row(r"train.learning_rate=nan must be a number in \(0.0, inf\)",
              train__learning_rate=float("nan")),
    train_row(r"train.weight_decay=-0.1 must be a number in \[0.0, inf\)",
              train__weight_decay=-0.1),
    train_row(r"train.grad_clip_norm=0.0 must be a number in \(0.0, inf\)",
              train__grad_clip_norm=0.0),
    train_row(r"train.objective='gpt'; allowed: \('ar', 'mdlm', 'bd3lm', 'uniform', 'translation_ar', 'cmlm', 'ctc'\)",
              train__objective="gpt"),
    train_row(r"train.block_length=5 must be an integer in \[1, 256\] "
              r"dividing data.seq_len=256", train__objective="bd3lm",
              train__block_length=5),
    train_row(r"data.seq_len=1 must be an integer >= 2", data__seq_len=1),
    train_row(r"data.seq_len=400 must be <= model.max_len=320",
              data__seq_len=400),
    train_row(r"model.dtype='float8'; allowed: \(", model__dtype="float8"),
    train_row(r"model.num_heads=3 must be a multiple of num_kv_heads=4",
              model__num_heads=3),
    train_row(r"seed=-1 must be an integer >= 0", config__seed=-1),
    corpus_row(b"", r"is empty \(no text\)"),
    corpus_row(b"\x00\x01\x02binary\x00", r"is binary \(it holds NUL bytes\)"),
    corpus_row("caf\u00e9 latin-1 text\n".encode("latin-1"), r"is not UTF-8"),
    # (bytes FF FE at the start would be a UTF-16 mark: corpus.py)
    corpus_row(gzip.compress(b"broken \xff\xfe", mtime=0), r"is not UTF-8",
               name="corpus.txt.gz"),
    corpus_row(b"One short paragraph.\n\nAnother one.\n",
               r"vocab_size=4096 does not fit the texts|too small"),
    pytest.param(fingerprint_mismatch, CheckpointError,
                 r"checkpoint in .* was trained with .*mdlm.*; use another "
                 r"workdir", id="checkpoint-fingerprint-mismatch"),
    pytest.param(foreign_tokenizer, ValueError,
                 r"path=.*not_a_tokenizer.model.* is not a SentencePiece tokenizer model",
                 id="tokenizer-file-not-a-model"),
]


def _no_compile(monkeypatch):
  """Fails the row if training compiles its first program (`init_state`)."""
  def refuse(*args, **kwargs):
    raise AssertionError("compiled before the check")
  monkeypatch.setattr(train_lib, "init_state", refuse)


@pytest.mark.parametrize("call, error, match", DECODER_ROWS)
def test_decoder_bad_input(call, error, match):
  with pytest.raises(error, match=match):
    call()


@pytest.mark.parametrize("call, error, match", COMPARE_ROWS + TRAIN_ROWS)
def test_entry_point_bad_input(call, error, match, tmp_path, monkeypatch):
  _no_compile(monkeypatch)
  with pytest.raises(error, match=match):
    call(tmp_path)
  work = tmp_path / "work"  # absent, or (a data error) created and empty
  if error is not CheckpointError:  # that row wrote the checkpoint itself
    assert not work.exists() or not any(work.iterdir()), sorted(
        p.name for p in work.iterdir())


def test_the_table_is_large():
  assert len(DECODER_ROWS) + len(COMPARE_ROWS) + len(TRAIN_ROWS) >= 40


# --- What a user sees: one line, non-zero exit, nothing left behind. --------

_OUT = "--out={tmp}/out"  # speculative.py's record folder: must stay absent

@pytest.mark.parametrize("script, flags, message", [
    ("compare_decoding.py", ["--config.compare.decoders=('X | ar | "
                             "model=ar | steps=3',)"],
     r"^compare_decoding: error: compare.decoders\[0\] \('X'\): the label "
     r"must show every option"),
    ("compare_decoding.py", ["--predict=h100_sxm,h300"],
     r"^compare_decoding: error: unknown profile name='h300'; allowed: "),
    ("train.py", ["--config.train.num_steps=0"],
     r"^error: train.num_steps=0 must be an integer >= 1$"),
    ("train.py", ["--member=draft_huge"],
     r"^error: --member='draft_huge'; the config's members: ar, mdlm, bd3lm, "
     r"uniform, evaluator, draft_medium, draft_small, bd3lm4_from_ar, bd3lm16_from_ar, "
     r"mdlm_from_ar, bd3lm4_scratch, bd3lm16_scratch, mdlm_scratch$"),
    ("train.py", ["--config.data.path=/no/such/file.txt"],
     r"^error: data.path='/no/such/file.txt' does not exist"),
    ("train.py", ["--export_pretrained=.", "--export_dir=/tmp/no_such_set"],
     r"^error: export name='\.' must be a plain folder name"),
    ("train.py", ["--member=draft_small", "--export_pretrained=ar",
                  "--export_dir={tmp}/out"],
     r"^error: --export_pretrained='ar' must equal --member='draft_small'"),
    ("speculative.py", ["--config.compare.pretrained_set=nope", _OUT],
     r"^speculative: error: compare.pretrained_set='nope' must be '' "),
    ("speculative.py", ["--drafts=draft_huge", _OUT],
     r"^speculative: error: --drafts=draft_huge must be among the drafts "
     r"shipped in .*pretrained: \['draft_medium', 'draft_small'\]$"),
    ("speculative.py", ["--targets=mdlm", _OUT],
     r"^speculative: error: --targets=mdlm must be 'ar' and/or 'evaluator'$"),
    ("speculative.py", ["--targets=evaluator", _OUT],
     r"^speculative: error: the router \(part 2\) uses the fastest "
     r"speculative configuration of target 'ar' .* or pass --norouter$"),
], ids=["compare-label", "compare-predict", "train-num-steps",
        "train-unknown-member",
        "train-missing-data", "train-export-name", "train-export-member",
        "speculative-set",
        "speculative-drafts", "speculative-targets", "speculative-router"])
def test_entry_points_exit_with_one_line(script, flags, message, tmp_path):
  """`{tmp}` in a flag is this test's folder; neither the workdir nor an
  --out under it may be created."""
  workdir = tmp_path / "work"
  flags = [f.format(tmp=tmp_path) for f in flags]
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / script),
       f"--workdir={workdir}", *flags],
      capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert proc.returncode != 0
  lines = [line for line in (proc.stdout + proc.stderr).splitlines()
           if line.strip()]
  assert len(lines) == 1, lines
  assert "Traceback" not in lines[0]
  assert re.search(message, lines[0]), lines[0]
  assert not workdir.exists() and not (tmp_path / "out").exists()
