"""Training loop: loss falls for both objectives, checkpoints restore exactly,
interrupted runs resume bit-exactly, bad input fails before compiling (the
config keys, data paths and checkpoints of `BAD_INPUTS`, and what a user of
experiments/train.py sees)."""

import gzip
import importlib.util
import json
import shutil
import os
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import pipeline
from lm_decoding.models import abstract_params, count_params
from lm_decoding.training.pretrained import recipes, store
from lm_decoding.training import run_log
from lm_decoding.training import train as train_lib
from lm_decoding.training import train_step
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def load_config(name):
  spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def tiny_config(objective="ar", num_steps=40):
  """configs/tiny.py shrunk to train in seconds."""
  config = load_config("tiny")
  config.data.vocab_size = 512
  config.data.seq_len = 64
  config.model.update(dict(d_model=64, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=32, mlp_dim=128,
                           max_len=64))
  config.train.update(dict(objective=objective, batch_size=16,
                           num_steps=num_steps, learning_rate=1e-2,
                           warmup_steps=5, eval_every=num_steps,
                           eval_batches=2, mdlm_eval_timesteps=4,
                           checkpoint_every=10))
  return config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """A workdir whose data cache (tokenizer, encoded splits) tests share."""
  root = tmp_path_factory.mktemp("data")
  pipeline.prepare("", 512, str(root))
  return root


def fresh_workdir(data_dir, tmp_path, name):
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / "data").symlink_to(data_dir / "data")
  return str(workdir)


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("objective", ["ar", "mdlm"])
def test_short_run_lowers_validation_loss(objective, data_dir, tmp_path,
                                         capsys):
  workdir = fresh_workdir(data_dir, tmp_path, objective)
  summary = train_lib.train(tiny_config(objective), workdir, progress=True)
  records = read_metrics(workdir)
  assert [r["step"] for r in records] == list(range(41))  # every step, once
  evals = [r for r in records if "valid_loss" in r]
  assert evals[0]["step"] == 0 and evals[-1]["step"] == 40
  initial, final = evals[0]["valid_loss"], evals[-1]["valid_loss"]
  assert final < initial - 1.0, (initial, final)  # nats per token
  assert summary["valid_loss"] == pytest.approx(final)
  assert summary["steps"] == 40 and summary["num_params"] > 0
  # Issue 12 item 3: the run ends with one line giving its final perplexity.
  measure = "perplexity" if objective == "ar" else "perplexity bound"
  last = capsys.readouterr().out.strip().splitlines()[-1]
  assert last == (f"train {objective}: final validation {measure} "
                  f"{summary['valid_ppl']:.2f} at step 40 ({workdir})")


def test_interrupted_run_resumes_bit_exactly(data_dir, tmp_path, monkeypatch):
  config = tiny_config("mdlm", num_steps=30)
  straight = fresh_workdir(data_dir, tmp_path, "straight")
  train_lib.train(config, straight, progress=False)

  interrupted = fresh_workdir(data_dir, tmp_path, "interrupted")
  real_batches = pipeline.batches

  def failing_batches(*args, **kwargs):
    for i, batch in enumerate(real_batches(*args, **kwargs)):
      if i == 25:
        raise KeyboardInterrupt("simulated crash after step 25")
      yield batch

  monkeypatch.setattr(pipeline, "batches", failing_batches)
  with pytest.raises(KeyboardInterrupt):
    train_lib.train(config, interrupted, progress=False)
  monkeypatch.setattr(pipeline, "batches", real_batches)
  with Checkpoints(os.path.join(interrupted, "checkpoints")) as checkpoints:
    assert checkpoints.latest_step() == 20
  assert read_metrics(interrupted)[-1]["step"] == 25  # logged past step 20
  summary = train_lib.train(config, interrupted, progress=False)
  assert summary["steps"] == 30
  # Steps 21-25 were trained twice but are logged once.
  records = read_metrics(interrupted)
  assert [r["step"] for r in records] == list(range(31))
  # The training time is the logged steps' (both calls'), not the resume's.
  tokens_per_step = config.train.batch_size * config.data.seq_len
  seconds = [tokens_per_step / r["tokens_per_s"] for r in records[1:]]
  assert summary["train_s"] == pytest.approx(sum(seconds))
  assert summary["train_tokens_per_s"] == pytest.approx(
      tokens_per_step / np.median(seconds))
  again = train_lib.train(config, interrupted, progress=False)  # finished
  assert (again["train_s"], again["train_tokens_per_s"]) == (
      summary["train_s"], summary["train_tokens_per_s"])

  a = store.load_trained_params(config, straight)
  b = store.load_trained_params(config, interrupted)
  chex.assert_trees_all_equal(a, b)


def test_save_restore_gives_identical_state_and_next_loss(tmp_path):
  config = tiny_config("ar")
  model_cfg = train_lib.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  state = train_step.init_state(model_cfg, optimizer, jax.random.key(3))
  step = train_step.make_train_step(model_cfg, "ar", optimizer)
  tokens = jax.random.randint(jax.random.key(4), (4, 16), 5, 512)
  state, _ = step(state, tokens, jax.random.key(5))
  with Checkpoints(str(tmp_path / "ckpt")) as checkpoints:
    checkpoints.save(1, state, {"note": "x"})
    restored, meta = checkpoints.restore(
        train_step.abstract_state(model_cfg, optimizer))
  assert meta == {"note": "x"}
  chex.assert_trees_all_equal(state, restored)
  _, m1 = step(state, tokens, jax.random.key(6))
  _, m2 = step(restored, tokens, jax.random.key(6))
  assert float(m1["loss"]) == float(m2["loss"])


def test_corrupt_checkpoint_raises_clear_error(tmp_path):
  state = {"w": jnp.arange(1000.0)}
  with Checkpoints(str(tmp_path / "ckpt")) as checkpoints:
    checkpoints.save(7, state, {})
  for path in (tmp_path / "ckpt" / "7").rglob("*"):
    if path.is_file() and path.stat().st_size > 0:
      path.write_bytes(b"garbage")
  with Checkpoints(str(tmp_path / "ckpt")) as checkpoints:
    with pytest.raises(CheckpointError, match="step 7"):
      checkpoints.restore(state)


def test_mismatched_checkpoint_is_refused(data_dir, tmp_path):
  workdir = fresh_workdir(data_dir, tmp_path, "w")
  train_lib.train(tiny_config("ar", num_steps=10), workdir, progress=False)
  other = tiny_config("ar", num_steps=10)
  other.model.d_model = 96
  with pytest.raises(CheckpointError, match="another workdir"):
    train_lib.train(other, workdir, progress=False)


@pytest.mark.parametrize("change, match", [
    (dict(objective="bert"), "train.objective"),
    (dict(seq_len=65), "data.seq_len=65"),
    (dict(path="/no/such/corpus.txt"), "data.path"),
    (dict(vocab_size=100), "vocab_size"),
])
def test_bad_input_raises_before_compiling(change, match, tmp_path,
                                           monkeypatch):
  config = tiny_config()
  for key, value in change.items():
    section = config.train if key == "objective" else config.data
    setattr(section, key, value)

  def no_compile(*args, **kwargs):
    raise AssertionError("compiled before validating")

  monkeypatch.setattr(jax, "jit", no_compile)
  with pytest.raises(ValueError, match=match):
    train_lib.train(config, str(tmp_path), progress=False)


def test_train_refuses_a_cached_tokenizer_of_another_vocab(tmp_path,
                                                            monkeypatch):
  corpus_file = stubs.write_corpus(tmp_path / "corpus.txt")
  config = stubs.small_config(str(corpus_file))
  key = pipeline.cache_key(corpus_lib.load_splits(str(corpus_file)), 512)
  cache = tmp_path / "work" / "data" / key
  cache.mkdir(parents=True)
  shutil.copy(pathlib.Path(recipes.DEFAULT_DIR) / recipes.TOKENIZER_FILE,
              cache / pipeline.TOKENIZER_FILE)  # 4096 ids

  def no_compile(*args, **kwargs):
    raise AssertionError("compiled before validating")

  monkeypatch.setattr(jax, "jit", no_compile)
  with pytest.raises(ValueError,
                     match="tokenizer vocab_size=4096 does not match"):
    train_lib.train(config, str(tmp_path / "work"), progress=False)


# --- Bad inputs, tabled: config keys, data paths, checkpoint fit. ------------

def bad_config(**changes):
  """configs/tiny.py with changes {"section__key": value} ("config__key": a
  top-level key)."""
  config = load_config("tiny")
  for setting, value in changes.items():
    section, key = setting.split("__")
    if section == "config":
      config[key] = value
    else:
      config[section][key] = value
  return config


def train_in(tmp_path, config):
  train_lib.train(config, str(tmp_path / "work"), progress=False,
                  data_dir=str(tmp_path / "work"))


def train_row(match, exc=ValueError, **changes):
  name = ",".join(f"{k.replace('__', '.')}={v!r}" for k, v in changes.items())
  return pytest.param(lambda tmp_path: train_in(
      tmp_path, bad_config(**changes)), exc, match, id=f"train-{name}")


def corpus_row(content: bytes, match, name="corpus.txt"):
  def call(tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    train_in(tmp_path, bad_config(data__path=str(path)))
  return pytest.param(call, ValueError, match, id=f"data-{match[:24]}")


def fingerprint_mismatch(tmp_path):
  """A checkpoint written by another config: refused before anything
  compiles or the data is prepared."""
  with Checkpoints(str(tmp_path / "work" / "checkpoints")) as checkpoints:
    checkpoints.save(1, {"x": np.zeros(2, np.float32)},
                     {"fingerprint": {"objective": "mdlm"}})
  train_in(tmp_path, bad_config())


# Every row a (call(tmp_path), exception class, regex): the message names the
# key and its allowed range, and nothing is prepared, compiled or written.
BAD_INPUTS = [
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
    train_row(r"train.objective='gpt'; allowed: \('ar', 'mdlm', 'bd3lm', 'certainty_forcing', 'jacobi_forcing', 'uniform', 'translation_ar', 'cmlm', 'ctc'\)",
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
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_entry_point_bad_input(call, error, match, tmp_path, monkeypatch):
  stubs.refused_before_work(call, error, match, tmp_path, monkeypatch)


@pytest.mark.parametrize("script, flags, message", [
    ("train.py", ["--config.train.num_steps=0"],
     r"^error: train.num_steps=0 must be an integer >= 1$"),
    ("train.py", ["--member=draft_huge"],
     r"^error: --member='draft_huge'; the config's members: ar, mdlm, bd3lm, "
     r"uniform, evaluator, draft_medium, draft_small, uniform_sc, "
     r"bd3lm4_from_ar, bd3lm16_from_ar, mdlm_from_ar, bd3lm4_scratch, "
     r"bd3lm16_scratch, mdlm_scratch$"),
    ("train.py", ["--config.data.path=/no/such/file.txt"],
     r"^error: data.path='/no/such/file.txt' does not exist"),
    ("train.py", ["--export_pretrained=.", "--export_dir=/tmp/no_such_set"],
     r"^error: export name='\.' must be a plain folder name"),
    ("train.py", ["--member=draft_small", "--export_pretrained=ar",
                  "--export_dir={tmp}/out"],
     r"^error: --export_pretrained='ar' must equal --member='draft_small'"),
], ids=["train-num-steps", "train-unknown-member", "train-missing-data",
        "train-export-name", "train-export-member"])
def test_entry_points_exit_with_one_line(script, flags, message, tmp_path):
  """experiments/train.py: one line, non-zero exit, nothing left behind
  (`{tmp}` in a flag is this test's folder)."""
  stubs.exits_with_one_line(script, flags, message, tmp_path)


@pytest.mark.parametrize("objective", ["ar", "mdlm"])
def test_gpt2_small_config_is_about_125m_parameters(objective):
  """Shape-checked only (never materialised)."""
  config = load_config("gpt2_small")
  config.train.objective = objective
  model_cfg = train_lib.model_config(config)
  assert count_params(abstract_params(model_cfg)) == pytest.approx(125e6,
                                                                   rel=0.1)
  assert model_cfg.dtype == "bfloat16" and model_cfg.max_len == 1024


def test_tiny_config_fits_the_main_job():
  config = load_config("tiny")
  longest = config.compare.prompt_len + max(config.compare.output_lengths)
  assert longest <= config.model.max_len
  assert config.data.seq_len <= config.model.max_len


# Issue 10: the MDLM training itself, checked where the answer is known. A
# first-order Markov chain over 4 symbols (ids 5-8), started from its
# stationary distribution, has the exact entropy per sequence
# H(pi) + (L - 1) sum_i pi_i H(T_i); its per-token value is the floor that
# any model's expected NLL, and so the MDLM bound, can reach. Fresh samples
# every step (no overfitting), a tiny bidirectional model.
_CHAIN = np.array([[0.70, 0.10, 0.10, 0.10],
                   [0.05, 0.05, 0.85, 0.05],
                   [0.25, 0.25, 0.25, 0.25],
                   [0.40, 0.40, 0.10, 0.10]])


def _markov_samples(rng, batch, length):
  pi = _stationary(_CHAIN)
  x = np.empty((batch, length), np.int64)
  x[:, 0] = rng.choice(4, size=batch, p=pi)
  for i in range(1, length):
    u = rng.random(batch)[:, None]
    x[:, i] = (u > np.cumsum(_CHAIN[x[:, i - 1]], axis=1)).sum(1)
  return (x + 5).astype(np.int32)


def _stationary(chain):
  values, vectors = np.linalg.eig(chain.T)
  pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
  return pi / pi.sum()


def _entropy(p):
  return -float(np.sum(p * np.log(p)))


@pytest.mark.parametrize("objective, within", [
    # measured, 600 steps: MDLM 2.575 untrained, 1.0957 trained against the
    # exact 1.0647 (+2.9%; still falling by 0.2% per 100 steps); uniform-state
    # diffusion (issue 27) 2.891 -> 1.1453 (+7.6%), its bound looser than
    # MDLM's at equal training (Schiff et al. 2024).
    ("mdlm", 0.03), ("uniform", 0.10)])
def test_training_bound_approaches_the_exact_entropy(objective, within,
                                                    optimized):
  length, steps, batch = 8, 600, 64
  pi = _stationary(_CHAIN)
  exact = (_entropy(pi) + (length - 1) * sum(
      p * _entropy(row) for p, row in zip(pi, _CHAIN))) / length
  config = tiny_config(objective, num_steps=steps)
  config.data.vocab_size = 16  # ids 0-4 reserved, 5-8 used
  config.data.seq_len = length
  config.model.update(dict(max_len=length, d_model=64, mlp_dim=256))
  config.train.update(dict(batch_size=batch, learning_rate=3e-3,
                           warmup_steps=20, weight_decay=0.0))
  model_cfg = train_lib.model_config(config)
  optimizer = train_step.make_optimizer(config.train)
  state = train_step.init_state(model_cfg, optimizer, jax.random.key(0))
  rng = np.random.default_rng(0)
  held_out = np.stack([_markov_samples(rng, 256, length) for _ in range(4)])
  # 600 steps and 2 x 4 x 64 bound passes: compiled at XLA's default level.
  step = optimized(train_step.make_train_step(model_cfg, objective, optimizer),
                   state, held_out[0, :batch], jax.random.key(0))
  eval_fn = optimized(train_step.make_eval_fn(model_cfg, objective,
                                              num_timesteps=64),
                      state.params, held_out[0])
  before = train_step.evaluate(eval_fn, state.params, held_out)
  for i in range(steps):
    state, _ = step(state, _markov_samples(rng, batch, length),
                    jax.random.key(i + 1))
  after = train_step.evaluate(eval_fn, state.params, held_out)
  assert before > exact + 0.5  # untrained: far above (nats per token)
  # A bound: never below the entropy beyond the estimate's noise (1024
  # sequences x 64 draws: the standard deviation of the mean over the four
  # held-out batches measured 0.007), and trained to near it.
  assert after > exact - 0.02, (after, exact)
  assert after < exact * (1 + within), (after, exact)


def test_no_timed_step_holds_a_compile(data_dir, tmp_path, monkeypatch):
  """The train step is compiled before the first timed step, in a fresh run
  and in a resume: no XLA compile happens between a step's batch being drawn
  (inside its timed window) and its record, and the first record of each
  call holds that call's compile seconds (issue 37: step 1 held the whole
  compile, tokens/s 7 against 15,813 at step 2)."""
  compiles = []
  listener = lambda event, _, **kw: compiles.append(event) if (
      event == "/jax/core/compile/backend_compile_duration") else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  at_batch, at_record = [], []
  real_batches, real_record = pipeline.batches, run_log.step_record

  def batches(*args, **kwargs):
    for batch in real_batches(*args, **kwargs):
      at_batch.append(len(compiles))
      yield batch

  def record(*args, **kwargs):
    at_record.append(len(compiles))
    return real_record(*args, **kwargs)

  monkeypatch.setattr(pipeline, "batches", batches)
  monkeypatch.setattr(run_log, "step_record", record)
  config = tiny_config("ar", num_steps=4)
  config.train.checkpoint_every = 2
  config.peak_flops = 1e9
  workdir = fresh_workdir(data_dir, tmp_path, "run")
  try:
    train_lib.train(config, workdir, progress=False, stop_at=2)
    train_lib.train(config, workdir, progress=False)  # a resume
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert len(at_record) == 4
  assert at_batch[:4] == at_record, (at_batch, at_record)
  records = read_metrics(workdir)
  assert [r["step"] for r in records if "compile_s" in r] == [1, 3]
  assert all(r["compile_s"] > 0 and r["peak_flops"] == 1e9
             for r in records if "compile_s" in r)
