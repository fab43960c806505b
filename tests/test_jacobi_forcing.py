"""Jacobi Forcing (CLLM, arXiv:2403.00835): the trajectory states
(`jacobi_trajectories`), the loss (`objectives.jacobi_forcing`), its config
and data checks, one training step, and the `jacobi` decoder's losslessness
on the trained model."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.config_reference import load_config, load_sized
from lm_decoding.data import pipeline
from lm_decoding.decoding.base import make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.models import Model, TransformerConfig
from lm_decoding.models import make_logits_fn
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import data_sources
from lm_decoding.training import jacobi_trajectories as jt
from lm_decoding.training import self_distillation as sd
from lm_decoding.training import train
from lm_decoding.training.objectives import jacobi_forcing as jf
from lm_decoding.training.objectives import registry
from lm_decoding.training.pretrained import member_recipes
from lm_decoding.training.pretrained import store
import stubs

JACOBI = pathlib.Path(__file__).parents[1] / "configs" / "jacobi.py"
V = 16
GARBAGE = 1  # the successor stub's prediction after PAD (and after itself)


@dataclasses.dataclass(frozen=True)
class SuccessorLogitsFn:
  """A causal stub: at each position the argmax is the token + 1 (ids 5..14;
  15 -> 5), GARBAGE after PAD or GARBAGE; logits 10 x one-hot."""

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params, positions, attention_mask
    following = jnp.where(tokens >= 5, (tokens - 5 + 1) % 11 + 5, GARBAGE)
    return ModelOutput(10.0 * jax.nn.one_hot(following, V), cache, None)


SUCCESSOR = SuccessorLogitsFn()


def successor_row(first: int, length: int) -> np.ndarray:
  return ((np.arange(length) + first - 5) % 11 + 5).astype(np.int32)


def test_states_on_a_stub_are_exact():
  """g^0 = PAD; g^j = y*[:j] then GARBAGE: one token fixed an iteration,
  so n states; the trajectory then reaches y*."""
  rows = successor_row(5, 12)[None]  # P = 4, blocks of 4 at 4 and 8
  out = jt.jacobi_states(SUCCESSOR, None, jnp.asarray(rows), prompt_length=4,
                         block_length=4, num_blocks=2)
  assert out.states.shape == (1, 2, 4, 4)
  for k, start in enumerate((4, 8)):
    target = rows[0, start:start + 4]
    expected = [[PAD_ID] * 4] + [list(target[:j]) + [GARBAGE] * (4 - j)
                                 for j in range(1, 4)]
    np.testing.assert_array_equal(out.states[0, k], expected)
  assert out.live.all() and out.converged.all()
  np.testing.assert_array_equal(out.starts, [4, 8])


@dataclasses.dataclass(frozen=True)
class PositionLogitsFn:
  """A stub whose argmax at position i is ids[i + 1], whatever the tokens:
  one iteration reaches the fixed point."""

  ids: tuple

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params, tokens, cache, attention_mask
    ids = jnp.asarray(self.ids + (5,))
    return ModelOutput(10.0 * jax.nn.one_hot(ids[positions + 1], V), None,
                       None)


def test_states_stop_at_the_fixed_point_and_at_n():
  row = successor_row(7, 12)
  fast = jt.jacobi_states(PositionLogitsFn(tuple(int(t) for t in row)), None,
                          jnp.asarray(row[None]), prompt_length=4,
                          block_length=4, num_blocks=2)
  np.testing.assert_array_equal(fast.live[0], [[True, False, False, False]] * 2)
  assert fast.converged.all()
  # Rows that are not the model's greedy output: never reached, n states.
  other = jt.jacobi_states(PositionLogitsFn((9,) * 12), None,
                           jnp.asarray(row[None]), prompt_length=4,
                           block_length=4, num_blocks=2)
  assert other.live.all() and not other.converged.any()


def test_blocks_after_the_end_are_not_live_and_pad_targets_not_compared():
  row = successor_row(5, 16)
  row[9], row[10:] = EOS_ID, PAD_ID  # ends inside block 1 (8..11)
  row[2] = EOS_ID  # an EOS in the prefix ends nothing
  out = jt.jacobi_states(SUCCESSOR, None, jnp.asarray(row[None]),
                         prompt_length=4, block_length=4, num_blocks=3)
  np.testing.assert_array_equal(out.live[0, :, 0], [True, True, False])
  # Block 1's y* = (row[8], EOS, PAD, PAD): the stub writes row[8] + 1, not
  # EOS, so it never gets there.
  assert not out.converged[0, 1] and out.converged[0, 0]
  # y* = (row[8], row[9], PAD, PAD): the PAD positions are not compared, so
  # g^2 = (row[8], row[9], GARBAGE, GARBAGE) is the fixed point.
  row[9] = successor_row(5, 16)[9]
  out = jt.jacobi_states(SUCCESSOR, None, jnp.asarray(row[None]),
                         prompt_length=4, block_length=4, num_blocks=2)
  np.testing.assert_array_equal(out.live[0, 1], [True, True, False, False])
  assert out.converged[0, 1]


def tiny_model(vocab: int = 32, max_len: int = 24):
  config = TransformerConfig(vocab_size=vocab, d_model=32, num_layers=1,
                             num_heads=2, num_kv_heads=2, head_dim=16,
                             mlp_dim=64, max_len=max_len, attention="causal")
  return make_logits_fn(config), stubs.random_params(config)


def greedy_rows(logits_fn, params, prefixes, length):
  """int32[R, length]: the causal model's greedy continuations of
  `prefixes`, uncached, one token a forward (one compile: the rows are
  PAD-extended, and nothing after a position changes its prediction)."""
  prefixes = np.asarray(prefixes, np.int32)
  rows = np.zeros((len(prefixes), length), np.int32)
  rows[:, :prefixes.shape[1]] = prefixes
  forward = jax.jit(lambda tokens: jnp.argmax(logits_fn(
      params, tokens, jnp.broadcast_to(jnp.arange(length), tokens.shape)
  ).logits, -1))
  for t in range(prefixes.shape[1], length):
    rows[:, t] = np.asarray(forward(jnp.asarray(rows)))[:, t - 1]
  return rows


def test_a_transformer_reaches_its_greedy_rows_jitted_eager_and_batched():
  logits_fn, params = tiny_model()
  prefixes = np.asarray(jax.random.randint(jax.random.key(1), (3, 4), 5, 32))
  rows = greedy_rows(logits_fn, params, prefixes, 16)
  options = dict(prompt_length=4, block_length=4, num_blocks=3)
  eager = jt.jacobi_states(logits_fn, params, jnp.asarray(rows), **options)
  jitted = jt.jitted_states(logits_fn, params, jnp.asarray(rows), **options)
  for name in ("states", "live", "converged"):
    np.testing.assert_array_equal(getattr(eager, name), getattr(jitted, name))
  assert np.asarray(eager.converged).all()
  assert (np.asarray(eager.states)[..., 0, :] == PAD_ID).all()
  for r in range(3):
    alone = jt.jitted_states(logits_fn, params, jnp.asarray(rows[r:r + 1]),
                             **options)
    np.testing.assert_array_equal(alone.states[0], eager.states[r])
    np.testing.assert_array_equal(alone.live[0], eager.live[r])


def test_state_rows_and_pairs_lay_out_the_state_and_the_fixed_point():
  rows = successor_row(5, 12)[None]
  out = jt.jacobi_states(SUCCESSOR, None, jnp.asarray(rows), prompt_length=4,
                         block_length=4, num_blocks=2)
  picked = jt.sample_states(out.live, 2, seed=0)
  assert len(picked[0]) == 4 and set(picked[1]) == {0, 1}
  np.testing.assert_array_equal(picked, jt.sample_states(out.live, 2, 0))
  assert not np.array_equal(picked, jt.sample_states(out.live, 2, 1))
  assert len(jt.sample_states(out.live, 9, seed=0)[0]) == 8  # all 4 + 4
  one = (np.array([0]), np.array([1]), np.array([2]))  # block at 8, g^2
  state = jt.state_rows(rows, out, *one)
  np.testing.assert_array_equal(
      state[0], list(rows[0, :10]) + [GARBAGE, GARBAGE])
  pairs = jt.forcing_pairs(state, rows, [8], 4, seq_len=14)
  np.testing.assert_array_equal(
      pairs[0], list(state[0]) + [PAD_ID] * 2 + [PAD_ID] * 8
      + list(rows[0, 8:12]) + [PAD_ID] * 2)
  assert jt.forcing_pairs(state, rows, [8], 4, seq_len=11).shape == (0, 22)


@dataclasses.dataclass(frozen=True)
class FixedLogitsFn:
  """Stub logits: the same table float32[L, V] at every row."""

  table: np.ndarray

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    del params, positions, cache, attention_mask
    return ModelOutput(jnp.broadcast_to(
        jnp.asarray(self.table[:tokens.shape[1]]),
        tokens.shape + (self.table.shape[1],)), None, None)


@pytest.mark.parametrize("weight", [1.0, 0.25, 0.0])
def test_loss_scores_the_prefix_by_ar_and_the_block_against_the_fixed_point(
    weight):
  """Inputs [a0 a1 a2 | g0 g1 g2 | PAD], block targets at 3..5 = (y0, y1,
  PAD after an end): targets 1, 2 weigh 1 (inputs), 3, 4 weigh w (y*),
  5 and later nothing."""
  table = np.random.default_rng(0).normal(size=(8, V)).astype(np.float32)
  inputs = [5, 6, 7, 8, 9, 10, PAD_ID, PAD_ID]
  block = [PAD_ID] * 3 + [11, 12, PAD_ID, PAD_ID, PAD_ID]
  loss, metrics = jf.jacobi_forcing_loss(
      FixedLogitsFn(table), None, jnp.asarray([inputs + block]),
      jax.random.key(0), consistency_weight=weight)
  log_p = table - np.log(np.exp(table).sum(-1, keepdims=True))
  ar = [-log_p[0, 6], -log_p[1, 7]]  # targets 1, 2 at positions 0, 1
  consistency = [-log_p[2, 11], -log_p[3, 12]]  # targets 3, 4
  expected = (sum(ar) + weight * sum(consistency)) / (2 + 2 * weight)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(metrics["tokens"], 2 + 2 * weight)
  np.testing.assert_allclose(metrics["ce"], np.mean(consistency), rtol=1e-5)
  np.testing.assert_allclose(metrics["ar_ce"], np.mean(ar), rtol=1e-5)
  # A row without a block is scored as ar_eval scores its inputs.
  bound = jf.jacobi_forcing_bound(FixedLogitsFn(table), None,
                                  jnp.asarray([inputs + [PAD_ID] * 8]), 1)
  plain = [-log_p[i, inputs[i + 1]] for i in range(5)]
  np.testing.assert_allclose(bound["nll"], sum(plain), rtol=1e-5)
  assert float(bound["tokens"]) == 5


def test_loss_refuses_bad_rows_models_and_weights():
  logits_fn, params = tiny_model()
  rows = jnp.full((1, 7), 5, jnp.int32)
  with pytest.raises(ValueError, match="2 L tokens; got 7"):
    jf.jacobi_forcing_loss(logits_fn, params, rows, None)
  with pytest.raises(ValueError, match="needs|causal"):
    jf.jacobi_forcing_loss(
        make_logits_fn(logits_fn.config.replace(attention="bidirectional")),
        params, jnp.full((1, 8), 5, jnp.int32), None)
  with pytest.raises(ValueError, match=r"consistency_weight=-1.0 must be a "
                     r"number in \[0, inf\)"):
    jf.jacobi_forcing_loss(logits_fn, params, jnp.full((1, 8), 5, jnp.int32),
                           None, consistency_weight=-1.0)


def test_trajectory_inputs_are_refused_with_their_ranges():
  rows = jnp.asarray(successor_row(5, 12)[None])
  with pytest.raises(ValueError, match=r"3 blocks of 4 after a prefix of 4 "
                     r"end at 16; the rows hold 12 tokens \(num_blocks <= 2"):
    jt.jacobi_states(SUCCESSOR, None, rows, prompt_length=4, block_length=4,
                     num_blocks=3)
  with pytest.raises(ValueError, match="prompt_length=0 must be"):
    jt.jacobi_states(SUCCESSOR, None, rows, prompt_length=0, block_length=4,
                     num_blocks=1)
  with pytest.raises(ValueError, match=r"rows must be int\[R, L\]"):
    jt.jacobi_states(SUCCESSOR, None, rows[0], prompt_length=4,
                     block_length=4, num_blocks=1)
  with pytest.raises(ValueError, match="states_per_block=0 must be"):
    jt.sample_states(np.ones((1, 1, 4), bool), 0, seed=0)


def test_greedy_rows_and_sets_are_read_or_refused(tmp_path):
  tokens = np.arange(4 * 6, dtype=np.int32).reshape(4, 6) + 5
  manifest = {"decoders": ["ar temperature=1", "ar temperature=0"],
              "prefixes": {"count": 2}}
  np.testing.assert_array_equal(sd.greedy_rows(tokens, manifest), tokens[2:])
  with pytest.raises(ValueError, match="hold no greedy one"):
    sd.greedy_rows(tokens, dict(manifest, decoders=["ar temperature=1"] * 2))
  with pytest.raises(ValueError, match="holds 3 rows; its manifest says 2"):
    sd.greedy_rows(tokens[:3], manifest)
  with pytest.raises(ValueError, match=r"data.jacobi_set='.*' holds no "
                     r"manifest.json and tokens.npy.*jacobi_data.py"):
    jt.read_forcing_pairs(tmp_path, 16)


def tiny_jacobi_config():
  """configs/jacobi.py at a 1-layer d32 model, rows of 16, one step."""
  config = load_config(JACOBI)
  config.model.update(dict(d_model=32, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=16, mlp_dim=64,
                           max_len=16))
  config.data.update(dict(vocab_size=512, seq_len=16, jacobi_set="unused"))
  config.train.update(dict(num_steps=1, batch_size=2, eval_batch_size=2,
                           eval_every=1, checkpoint_every=1, warmup_steps=0,
                           eval_batches=1, init_from=""))
  return config


@pytest.mark.parametrize("key, value, match", [
    ("train.consistency_weight", -0.5,
     r"train.consistency_weight=-0.5 must be a number in \[0, inf\)"),
    ("train.consistency_weight", float("inf"),
     r"train.consistency_weight=inf must be a number in \[0, inf\)"),
    ("data.jacobi_set", "", r"data.jacobi_set='' must name the folder"),
])
def test_bad_config_values_are_refused_before_compiling(key, value, match):
  config = tiny_jacobi_config()
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=match):
    train.check_config(config)


def test_jacobi_keys_are_refused_for_other_objectives():
  config = tiny_jacobi_config()
  config.train.objective = "ar"
  with pytest.raises(ValueError, match="data.jacobi_set='unused' is read by "
                     "train.objective 'jacobi_forcing' only"):
    train.check_config(config)
  config.data.jacobi_set = ""
  with pytest.raises(ValueError, match=r"train.consistency_weight=1.0 applies "
                     r"to train.objective in \('certainty_forcing', "
                     r"'jacobi_forcing'\) on text or distillation rows; got "
                     r"'ar'"):
    train.check_config(config)
  assert registry.get("jacobi_forcing").attention == "causal"


def test_one_step_trains_and_jacobi_stays_lossless(tmp_path):
  """State set of a random model's greedy rows -> pairs -> one step through
  `train.train`; then `jacobi` on the trained model gives its AR greedy."""
  config = tiny_jacobi_config()
  model_cfg = train.model_config(config)
  logits_fn = make_logits_fn(model_cfg)
  params = stubs.random_params(model_cfg)
  prefixes = np.asarray(jax.random.randint(jax.random.key(4), (3, 4), 5, 512))
  rows = greedy_rows(logits_fn, params, prefixes, 16)
  arrays, counts = jt.state_set(logits_fn, params, rows, prompt_length=4,
                                block_length=4, num_blocks=3, per_block=2,
                                seed=0, batch_size=2)
  assert counts["live_blocks"] == 9 and counts["blocks_off_fixed_point"] == 0
  sd.write_set(tmp_path / "states", arrays, {"block_length": 4})
  pairs = jt.read_forcing_pairs(tmp_path / "states", 16)
  assert pairs.shape == (counts["states"], 32)
  valid = np.concatenate([rows, np.zeros_like(rows)], 1)
  data = (types.SimpleNamespace(describe=lambda: "pairs"), pairs, valid)
  with pytest.raises(ValueError, match=r"16 tokens wide; data.seq_len=16: "
                     r"its objective's rows hold 2 x 16"):
    train.train(config, str(tmp_path / "bad"), progress=False,
                data=(data[0], rows, rows))
  summary = train.train(config, str(tmp_path / "run"), progress=False,
                        data=data)
  assert summary["steps"] == 1 and np.isfinite(summary["valid_loss"])
  trained = store.load_trained_params(config, str(tmp_path / "run"))
  model = Model(logits_fn, trained)
  greedy = SamplingConfig(temperature=0.0)
  prompts, lengths = jnp.asarray(prefixes), jnp.full((3,), 4, jnp.int32)
  ar = make_decoder("ar", output_length=8, sampling=greedy, eos_ids=())
  jacobi = make_decoder("jacobi", output_length=8, gamma=4, sampling=greedy,
                        eos_ids=())
  reference = ar.decode({"model": model}, prompts, lengths, jax.random.key(0))
  drafted = jacobi.decode({"target": model}, prompts, lengths,
                          jax.random.key(0))
  np.testing.assert_array_equal(drafted.tokens, reference.tokens)
  assert data_sources.given_rows(data, 16, 2) is data


# Inputs refused before any work, sets of another model, and sets written
# so that a stopped write is never read.


class RefusingLogitsFn:
  """A model that must not run (identity-hashed: each instance traces anew)."""

  def __call__(self, *args, **kwargs):
    raise AssertionError("the model ran before the options were checked")


@pytest.mark.parametrize("per_block, seed, match", [
    (0, 0, r"states_per_block=0 must be an integer >= 1"),
    (-2, 0, r"states_per_block=-2 must be an integer >= 1"),
    (1.5, 0, r"states_per_block=1.5 must be an integer >= 1"),
    (1, -1, r"seed=-1 must be an integer >= 0"),
    (1, 0.5, r"seed=0.5 must be an integer >= 0"),
    (1, True, r"seed=True must be an integer >= 0"),
])
def test_state_set_refuses_its_options_before_running_the_model(
    per_block, seed, match):
  rows = successor_row(5, 12)[None]
  with pytest.raises(ValueError, match=match):
    jt.state_set(RefusingLogitsFn(), None, rows, prompt_length=4,
                 block_length=4, num_blocks=2, per_block=per_block,
                 seed=seed, batch_size=1)


def fake_distillation_set(path, teacher="ar"):
  """A distillation set of 2 greedy rows [prefix (4) | 8 tokens]."""
  tokens = np.tile(successor_row(5, 12), (4, 1))
  sd.write_distillation_set(path, tokens, {
      "teacher": teacher, "decoders": ["ar temperature=1",
                                       "ar temperature=0"],
      "prompt_length": 4, "prefixes": {"count": 2}})
  return path


def run_jacobi_data(flags):
  script = pathlib.Path(__file__).parents[1] / "experiments" / "jacobi_data.py"
  proc = subprocess.run([sys.executable, str(script), *flags],
                        capture_output=True, text=True, timeout=120,
                        cwd=script.parents[1])
  return proc.returncode, [line for line in (proc.stdout + proc.stderr
                                             ).splitlines() if line.strip()]


@pytest.mark.parametrize("flags, message", [
    (["--states_per_block=0"], r"states_per_block=0 must be an integer >= 1"),
    (["--seed=-3"], r"seed=-3 must be an integer >= 0"),
    (["--batch_size=0"], r"batch_size=0 must be an integer >= 1"),
    (["--num_blocks=3"], r"3 blocks of 4 after a prefix of 4 end at 16; the "
                         r"rows hold 12 tokens \(num_blocks <= 2\)"),
    (["--model=draft_small"], r"--model='draft_small' is not the teacher of "
                              r"--distillation_set .*'ar'"),
], ids=["states-per-block", "seed", "batch-size", "num-blocks", "teacher"])
def test_jacobi_data_refuses_flags_before_loading_and_writes_nothing(
    flags, message, tmp_path):
  """One line naming the flag, exit != 0, before the model is loaded (the
  --set_dir does not exist), and no --out folder."""
  greedy = fake_distillation_set(tmp_path / "greedy")
  out = tmp_path / "out"
  code, lines = run_jacobi_data([
      f"--set_dir={tmp_path / 'no_such_set'}", f"--distillation_set={greedy}",
      "--num_rows=2", "--num_blocks=2", "--block_length=4", f"--out={out}",
      *flags])
  assert code != 0 and len(lines) == 1, lines
  assert re.search(message, lines[0]), lines[0]
  assert not out.exists()


def test_state_set_of_another_model_is_refused(tmp_path):
  """A distillation set another member wrote: refused by its manifest."""
  greedy = fake_distillation_set(tmp_path / "greedy", teacher="draft_small")
  code, lines = run_jacobi_data([
      f"--set_dir={tmp_path / 'no_such_set'}", f"--distillation_set={greedy}",
      "--model=ar", "--num_rows=2", "--num_blocks=2", "--block_length=4",
      f"--out={tmp_path / 'out'}"])
  assert code != 0 and len(lines) == 1, lines
  assert "--model='ar' is not the teacher of --distillation_set" in lines[0]


@pytest.mark.parametrize("failing", ["block_starts", "clean", "manifest"])
def test_a_stopped_rewrite_of_a_set_is_never_read(failing, tmp_path,
                                                  monkeypatch):
  """Writing a set over an older one and stopping part way (a full disk,
  ^C) leaves a folder that reading refuses, never the old manifest beside
  some new arrays."""
  rows = successor_row(5, 12)[None]
  out = jt.jacobi_states(SUCCESSOR, None, jnp.asarray(rows), prompt_length=4,
                         block_length=4, num_blocks=2)
  picked = jt.sample_states(out.live, 2, seed=0)
  old = {"tokens": jt.state_rows(rows, out, *picked),
         "block_starts": np.asarray(out.starts)[picked[1]].astype(np.int32),
         "row_index": picked[0].astype(np.int32), "clean": rows}
  path = tmp_path / "states"
  sd.write_set(path, old, {"block_length": 4})
  new = dict(old, tokens=old["tokens"][:1], block_starts=old["block_starts"][
      :1] + 1, row_index=old["row_index"][:1])
  real_atomic = pipeline.write_atomic

  def write_atomic(path, data):  # every file of a set is written so
    if failing in pathlib.Path(path).name:
      raise OSError("No space left on device")
    return real_atomic(path, data)

  monkeypatch.setattr(pipeline, "write_atomic", write_atomic)
  with pytest.raises(OSError):
    sd.write_set(path, new, {"block_length": 4})
  monkeypatch.undo()
  with pytest.raises(ValueError, match="holds no manifest.json"):
    jt.read_forcing_pairs(path, 12)
  sd.write_set(path, new, {"block_length": 4})  # a rewrite then succeeds
  assert len(jt.read_forcing_pairs(path, 12)) == 1


def reference_states(logits_fn, params, row, prompt_length, n, num_blocks):
  """Per block, the list of its states g^0 .. g^{J-1}: one row, one forward
  per iteration, loops only (the module docstring, read literally)."""
  eos = [t for t in range(prompt_length, len(row)) if row[t] == EOS_ID]
  first_eos = eos[0] if eos else len(row)
  blocks = []
  for k in range(num_blocks):
    s = prompt_length + k * n
    target, guess, states = row[s:s + n], np.zeros(n, np.int32), []
    while (row[s] != PAD_ID and s <= first_eos and len(states) < n
           and not all(g == y or y == PAD_ID for g, y in zip(guess, target))):
      states.append(guess)
      inputs = np.concatenate([row[:s], guess])[None]
      logits = np.asarray(logits_fn(params, jnp.asarray(inputs), jnp.arange(
          inputs.shape[1])[None]).logits)[0]
      guess = np.array([logits[s + i - 1].argmax() for i in range(n)])
    blocks.append(states)
  return blocks


@pytest.mark.parametrize("vocab, geometry", [
    (32, (3, 4, 3)), (8, (3, 2, 6)), (8, (4, 5, 2)), (32, (3, 1, 12)),
    (8, (3, 12, 1))])
def test_states_equal_a_slow_reference_with_ends_and_foreign_rows(vocab,
                                                                  geometry):
  """Random 1-layer models (vocab 8 emits EOS and PAD by itself); rows: the
  model's greedy ones, one ended early by an EOS, one with an EOS in the
  prefix, one of another model."""
  prompt_length, n, num_blocks = geometry
  logits_fn, params = tiny_model(vocab=vocab, max_len=24)
  prefixes = np.asarray(jax.random.randint(jax.random.key(vocab), (4, 3), 1,
                                           vocab))
  rows = greedy_rows(logits_fn, params, prefixes, 15)
  rows[1, 7], rows[1, 8:] = EOS_ID, PAD_ID
  rows[2, 1] = EOS_ID
  rows[3, 3:] = np.arange(12) % (vocab - 5) + 5
  out = jt.jacobi_states(logits_fn, params, jnp.asarray(rows),
                         prompt_length=prompt_length, block_length=n,
                         num_blocks=num_blocks)
  live, states = np.asarray(out.live), np.asarray(out.states)
  for r, row in enumerate(rows):
    expected = reference_states(logits_fn, params, row, prompt_length, n,
                                num_blocks)
    for k, block in enumerate(expected):
      assert live[r, k].sum() == len(block) and live[r, k, :len(block)].all()
      np.testing.assert_array_equal(states[r, k, :len(block)],
                                    np.reshape(block, (-1, n)))


@pytest.mark.parametrize("size", ["tiny", "base"])
def test_config_validates_on_ars_own_rows(size):
  """configs/jacobi.py keeps `ar`'s data and its validation batches."""
  jacobi = load_config(JACOBI, size)
  parent = member_recipes.member_configs(load_sized(JACOBI, size))["ar"]
  assert jacobi.train.eval_batch_size == (
      parent.train.get("eval_batch_size") or parent.train.batch_size)
  assert jacobi.train.eval_batches == parent.train.eval_batches
  assert jacobi.data.to_dict() == dict(parent.data.to_dict(), jacobi_set="")
  assert jacobi.model.to_dict() == parent.model.to_dict()


def shrunk(config, batch_size):
  config.model.update(dict(d_model=32, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=16, mlp_dim=64,
                           max_len=16))
  config.data.update(dict(vocab_size=512, seq_len=16))
  config.train.update(dict(num_steps=2, batch_size=batch_size, eval_every=1,
                           checkpoint_every=1, warmup_steps=0,
                           eval_batches=2, init_from=""))
  return config


def test_step_zero_validation_is_ars_own_and_a_run_resumes_exactly(tmp_path):
  """From the same parameters, step 0's validation loss of a jacobi_forcing
  run is the one an `ar` run logs (the same corpus rows, batches, measure);
  a run stopped after step 1 and resumed ends with the same parameters as
  one that was not."""
  data_dir = tmp_path / "data"
  ar_config = shrunk(
      member_recipes.member_configs(load_sized(JACOBI, "tiny"))["ar"], 4)
  params = stubs.random_params(train.model_config(ar_config))
  rows = np.tile(successor_row(5, 16), (2, 1))
  sd.write_set(tmp_path / "states", {
      "tokens": rows, "block_starts": np.array([4, 8], np.int32),
      "row_index": np.array([0, 1], np.int32), "clean": rows},
      {"block_length": 4})
  config = shrunk(load_config(JACOBI), 2)
  config.data.jacobi_set = str(tmp_path / "states")
  config.train.eval_batch_size = ar_config.train.batch_size
  step0 = []
  for c, name in ((ar_config, "ar"), (config, "jacobi")):
    train.train(c, str(tmp_path / name), progress=False,
                data_dir=str(data_dir), init_params=params)
    with open(tmp_path / name / "metrics.jsonl") as f:
      step0.append(json.loads(f.readline())["valid_loss"])
  assert step0[0] == step0[1]
  train.train(config, str(tmp_path / "resumed"), progress=False,
              data_dir=str(data_dir), init_params=params, stop_at=1)
  train.train(config, str(tmp_path / "resumed"), progress=False,
              data_dir=str(data_dir), init_params=params)
  straight = store.load_trained_params(config, str(tmp_path / "jacobi"))
  resumed = store.load_trained_params(config, str(tmp_path / "resumed"))
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)


def test_a_set_of_another_kind_in_the_same_folder_is_not_read(tmp_path):
  """A distillation set written over a Jacobi state set leaves the state
  set's other arrays behind: reading the folder as a state set is refused
  (its manifest lists the arrays it wrote), not a mix of the two."""
  rows = np.tile(successor_row(5, 16), (2, 1))
  path = tmp_path / "set"
  sd.write_set(path, {"tokens": rows, "block_starts": np.array([4, 8]),
                      "row_index": np.array([0, 1]), "clean": rows},
               {"block_length": 4})
  sd.write_distillation_set(path, rows[:1], {"teacher": "ar"})
  with pytest.raises(ValueError, match=r"data.jacobi_set=.* holds no "
                     r"block_starts.npy and row_index.npy and clean.npy"):
    jt.read_forcing_pairs(path, 16)
