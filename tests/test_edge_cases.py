"""Adversarial edge cases across decoders, metrics and checkpoints.

Regression tests for faults found by review (bad input that slipped through
or failed late, silent garbage out), and invariants of `DecodeResult` pinned
for every registered decoder on stub models.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import stubs
from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import pipeline
from lm_decoding.data.tokenizer import Tokenizer
from lm_decoding.decoding import autoregressive as ar
from lm_decoding.decoding import (base, make_decoder, registered, sampling,
                                  speculative)
from lm_decoding.decoding.base import bind
from lm_decoding.decoding.iterative import ScheduledDecoder
from lm_decoding.evaluation import quality
from lm_decoding.models import (TransformerConfig, abstract_params,
                                init_params, make_logits_fn)
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID
from lm_decoding.training import pretrained
from lm_decoding.training import train as train_lib
from lm_decoding.training.checkpoints import CheckpointError, Checkpoints

V = 8
KEY = jax.random.key(0)
ALL = registered()
SEQUENTIAL = tuple(n for n in ALL
                   if issubclass(base.decoder_class(n), ar.SequenceConfig))
PARALLEL = tuple(n for n in ALL if n not in SEQUENTIAL)
DRAFT_VERIFY = tuple(n for n in ALL if issubclass(
    base.decoder_class(n), speculative.DraftVerifyDecoder))
SHIPPED_TOKENIZER = (pathlib.Path(pretrained.DEFAULT_DIR)
                     / pretrained.TOKENIZER_FILE)


def build(name: str, length: int, **options):
  """Decoder `name` generating `length` tokens per row (K = T steps; draft
  and verify with gamma 1, so the caches fit in P + T slots)."""
  if name in DRAFT_VERIFY:
    options.setdefault("gamma", 1)
  if name in SEQUENTIAL:
    return make_decoder(name, output_length=length, **options)
  if issubclass(base.decoder_class(name), ScheduledDecoder):
    options.setdefault("steps", length)
  return make_decoder(name, output_length=length, **options)


def eos_first_stub() -> stubs.TableLogitsFn:
  """Random trigram logits (PAD never drawn) with max_len 8, except that the
  row with prompt [5, 6, 7] is all but certain to start with EOS.

  AR decoders draw that token from the logits after (6, 7) at position 2; a
  masked denoiser predicts it from MASK at position 3 after 7, a
  uniform-noise one (uniform_eb) from any token there.
  """
  stub = stubs.TableLogitsFn.random(3, V, 8, masked_ids=(PAD_ID,))
  for position, previous, token in ((2, 6, 7), *((3, 7, t) for t in range(V))):
    stub.table[0, position, previous, token] = -20.0
    stub.table[0, position, previous, token, EOS_ID] = 20.0
    stub.table[0, position, previous, token, PAD_ID] = -np.inf
  return stub


# Shared by several tests so that each decoder compiles once for them. Row 0
# starts with EOS, row 2's prompt holds an EOS; P + T = 3 + 5 = max_len: the
# prompt fills the cache exactly.
STUB = eos_first_stub()
PROMPTS = jnp.asarray([[5, 6, 7], [7, 0, 0], [EOS_ID, 5, 0]])
PROMPT_LENGTHS = jnp.asarray([3, 1, 2])
TWO_EOS = (EOS_ID, 6)


# --- Input types: lists and numpy arrays decode like jax int32 arrays. ------

@pytest.mark.parametrize("name", ALL)
def test_python_lists_and_numpy_int64_decode_like_jax_arrays(name):
  """Bug: the AR family raised TypeError for prompt_lengths given as a list.

  Fix: in the prompt check (`autoregressive.check_prompts` then, now
  `rows.check_prompts`) convert first (`prompts = jnp.asarray(prompts);
  prompt_lengths = jnp.asarray(prompt_lengths)`) and return them; `checked_cache_length`, `prefill` and
  the three `decode` methods pass the converted arrays on to the jitted loop.
  """
  decoder = build(name, 5, eos_ids=TWO_EOS)
  reference = decoder.decode(stubs.bind_roles(decoder, STUB), PROMPTS,
                             PROMPT_LENGTHS, KEY)
  rows = np.asarray(PROMPTS).tolist()
  for prompts, lengths in ((np.asarray(rows, np.int64), np.asarray([3, 1, 2])),
                           (rows, [3, 1, 2]),
                           (np.asarray(rows), (3, 1, 2))):
    out = decoder.decode(stubs.bind_roles(decoder, STUB), prompts, lengths,
                         KEY)
    np.testing.assert_array_equal(out.tokens, reference.tokens)
    np.testing.assert_array_equal(out.lengths, reference.lengths)


def test_prefill_accepts_python_lists():
  """Bug: as above, `prefill` raised TypeError for list inputs."""
  stub = stubs.TableLogitsFn.random(1, V, 10)
  logits, cache = ar.prefill(stub, None, [[5, 6, 7], [5, 6, 0]], [3, 2])
  expected, _ = ar.prefill(stub, None, jnp.asarray([[5, 6, 7], [5, 6, 0]]),
                           jnp.asarray([3, 2]))
  np.testing.assert_array_equal(logits, expected)
  np.testing.assert_array_equal(cache.index, [3, 2])


@pytest.mark.parametrize("name", PARALLEL)
def test_masked_diffusion_rejects_fractional_prompt_lengths(name):
  """Bug: MDLM/LLaDA cast prompt_lengths to int32 silently (2.5 -> 2) while
  the AR decoders refuse non-integers.

  Fix: in `IterativeDecoder._check`, before the cast, raise
  ValueError unless `jnp.issubdtype(jnp.result_type(prompt_lengths),
  jnp.integer)` (after `jnp.asarray`), naming prompt_lengths.
  """
  with pytest.raises(ValueError, match="prompt_lengths"):
    build(name, 4).decode(bind(stubs.RaisingLogitsFn(), None),
                          jnp.ones((2, 3), jnp.int32),
                          jnp.asarray([3.0, 2.5]), KEY)


# --- Options: every bad value raises ValueError naming it, at construction.

@pytest.mark.parametrize("name", PARALLEL)
@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_masked_diffusion_temperature_must_be_finite(name, temperature):
  """Bug: `temperature < 0` lets NaN and inf through; decoding then returns
  garbage silently (MDLM all PAD, LLaDA all MASK).

  Fix: the parallel decoders draw through `SamplingConfig`, whose
  `__post_init__` raises unless 0 <= temperature < inf.
  """
  with pytest.raises(ValueError, match="temperature=(nan|inf)"):
    make_decoder(name, output_length=4, steps=4,
                 sampling=sampling.SamplingConfig(temperature=temperature))


def test_sampling_temperature_must_be_finite():
  """Bug: SamplingConfig(temperature=inf) is accepted; logits / inf turns
  -inf logits into NaN and the decoders then emit a token whose logit was
  -inf (token 0 of a stub that masks it).

  Fix: in `SamplingConfig.__post_init__` check
  `0 <= self.temperature < math.inf`, "in [0, inf) (0 = greedy)".
  """
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingConfig(temperature=float("inf"))


def test_sample_rejects_nan_row_temperature():
  """Bug: `np.any(temperature_B < 0)` is False for NaN, so a NaN row
  temperature silently draws token 0.

  Fix: in `sampling.sample` raise when
  `not np.all(np.isfinite(t) & (t >= 0))` for a concrete temperature_B.
  """
  with pytest.raises(ValueError, match="temperature_B"):
    sampling.sample(KEY, jnp.zeros((2, V)), sampling.SamplingConfig(),
                    temperature_B=jnp.asarray([jnp.nan, 1.0]))


@pytest.mark.parametrize("name, options, match", [
    ("ar", dict(output_length=2.5), "output_length"),
    ("ar_uncached", dict(output_length=float("nan")), "output_length"),
    ("ar_beam", dict(output_length=2, num_beams=2.5), "num_beams"),
    ("mdlm", dict(output_length=4, steps=2.5), "steps"),
    ("mdlm", dict(output_length=2.5, steps=2), "output_length"),
    ("llada", dict(output_length=2.5, steps=2), "output_length"),
])
def test_integer_options_reject_non_integers(name, options, match):
  """Bug: `x < 1` checks accept 2.5 and NaN; decoding then fails late with a
  TypeError from inside the trace (after init_cache / the model ran).

  Fix: check integer options like `SamplingConfig.top_k` does:
  `isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1`
  for output_length, cache_length, num_beams, output_length, steps and
  block_length.
  """
  with pytest.raises(ValueError, match=match):
    make_decoder(name, **options)


@pytest.mark.parametrize("name", SEQUENTIAL + PARALLEL)
def test_eos_ids_given_as_one_int(name):
  """Bug: eos_ids=3 raises TypeError ('int' object is not iterable).

  Fix (either): accept one id (`eos_ids = (eos_ids,) if isinstance(eos_ids,
  (int, np.integer)) else eos_ids` before the tuple conversion in
  `SequenceConfig` and `_MaskedDiffusionDecoder`), or raise ValueError naming
  eos_ids.
  """
  try:
    decoder = build(name, 2, eos_ids=EOS_ID)
  except ValueError as e:
    assert "eos_ids" in str(e)
  else:
    assert decoder.eos_ids == (3,)


def test_beam_search_never_emits_an_eos_id_outside_the_vocabulary():
  """Bug: with eos_ids=(V + 2,) beam search gathers log p(EOS) out of bounds
  (clamped to token V - 1) and returns token id V + 2 in its output.

  Fix: in `_beam_decode` (trace time, V = first_logits_BxV.shape[-1]) raise
  ValueError when any eos id or pad_id is >= V, naming eos_ids / pad_id.
  """
  stub = stubs.TableLogitsFn.random(0, V, 10, masked_ids=(PAD_ID,))
  decoder = make_decoder("ar_beam", output_length=4, num_beams=2,
                         eos_ids=(V + 2,))
  try:
    out = decoder.decode(bind(stub, None), jnp.asarray([[5, 6, 7], [5, 6, 0]]),
                         jnp.asarray([3, 2]), KEY)
  except ValueError as e:
    assert "eos_ids" in str(e)
  else:
    assert int(jnp.max(out.tokens)) < V


# --- Bad input raises ValueError naming it before the model is touched. ----

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("prompts, lengths, match", [
    (np.ones((1, 14), np.int32), [14], "max_len"),  # P + 4 > max_len 16
    (np.ones((2, 3), np.int32), [3, 4], "prompt_lengths"),
    (np.ones((2, 3), np.int32), [3], "prompt_lengths"),
    (np.ones((3,), np.int32), [3], "prompts"),
    (np.ones((1, 3), np.float32), [3], "prompts"),
])
def test_bad_prompts_raise_before_the_model_runs(name, prompts, lengths,
                                                 match):
  with pytest.raises(ValueError, match=match):
    decoder = build(name, 4)
    raising = stubs.RaisingLogitsFn(max_len=16)
    decoder.decode(stubs.bind_roles(decoder, raising), jnp.asarray(prompts),
                   jnp.asarray(lengths), KEY)


def test_bad_decoder_names_and_options_name_the_allowed_range():
  with pytest.raises(ValueError, match=r"registered: \('ar', 'ar_beam'"):
    make_decoder("greedy")
  with pytest.raises(ValueError, match="allowed:"):
    make_decoder("mdlm", output_length=4, steps=4, top_p=0.9)
  for top_p in (0.0, 1.5, float("nan")):
    with pytest.raises(ValueError, match=r"top_p=.* must be in \(0, 1\]"):
      make_decoder("ar", sampling=sampling.SamplingConfig(top_p=top_p))
  with pytest.raises(ValueError, match="temperature=-0.5 must be"):
    sampling.SamplingConfig(temperature=-0.5)
  for name, options in (("mdlm", dict(steps=0, output_length=4)),
                        ("llada", dict(steps=0, output_length=4)),
                        ("ar_beam", dict(num_beams=0))):
    field = next(iter(options))  # K < 1
    with pytest.raises(ValueError, match=f"{field}=0 .*>= 1"):
      make_decoder(name, **options)
  with pytest.raises(ValueError, match=r"block_length=3 must be in \[1, 8\]"):
    make_decoder("llada", output_length=8, steps=8, block_length=3)
  with pytest.raises(ValueError, match="steps=3 must be a multiple"):
    make_decoder("llada", output_length=8, steps=3, block_length=4)


# --- DecodeResult invariants, for every registered decoder. ----------------

def check_result(name, out, batch, length, steps, eos_ids, executed):
  """`executed`: B * L of every call the stub actually ran for `out`."""
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  committed, nfe = np.asarray(out.committed), int(out.nfe)
  assert tokens.shape == (batch, length) and tokens.dtype == np.int32
  assert lengths.shape == (batch,) and lengths.dtype == np.int32
  assert committed.shape == (steps, batch) and committed.dtype == np.int32
  assert out.nfe.shape == () and out.nfe.dtype == np.int32
  assert ((tokens >= 0) & (tokens < V)).all()
  for row, n in zip(tokens, lengths):
    is_eos = np.isin(row, eos_ids)
    expected = int(np.argmax(is_eos)) + 1 if is_eos.any() else length
    assert n == expected
    assert (row[n:] == PAD_ID).all() and (row[:n] != PAD_ID).all()
  if name in DRAFT_VERIFY:  # 1 to gamma + 1 tokens per round
    np.testing.assert_array_equal(committed.sum(0), lengths)
    gamma = out.stats["accept_counts"].shape[1] - 1
    assert ((committed >= 0) & (committed <= gamma + 1)).all()
  elif name in SEQUENTIAL:
    prefix = np.arange(length)[:, None] < lengths[None, :]
    np.testing.assert_array_equal(committed, prefix.astype(np.int32))
    assert nfe == (lengths.max() if name == "ar_early_exit" else length)
  else:
    assert not (tokens == MASK_ID).any()
    np.testing.assert_array_equal(committed.sum(0), [length] * batch)
    assert nfe >= 1
  # The cost the decoder reports is the cost the stub counted.
  assert nfe == len(executed) == sum(map(int, out.calls.values()))
  assert int(sum(map(int, out.forward_tokens.values()))) == sum(executed)


def run_counted(decoder, prompts, prompt_lengths):
  """decoder.decode on STUB; returns (result, the calls STUB executed)."""
  first = len(STUB.executed)
  out = decoder.decode(stubs.bind_roles(decoder, STUB), prompts,
                       prompt_lengths, KEY)
  jax.effects_barrier()
  return out, STUB.executed[first:]


@pytest.mark.parametrize("name", ALL)
def test_decode_result_is_consistent(name):
  """A ragged batch with two EOS ids, EOS at the first step, an EOS inside a
  prompt (a decoder that read it as an end would emit PAD first) and a
  prompt filling the cache; then T = 1, B = 1 and no EOS id."""
  for length, batch, eos_ids in ((5, 3, TWO_EOS), (1, 1, ())):
    decoder = build(name, length, eos_ids=eos_ids)
    out, executed = run_counted(decoder, PROMPTS[:batch],
                                PROMPT_LENGTHS[:batch])
    check_result(name, out, batch, length, length, eos_ids, executed)
    np.testing.assert_array_equal(out.tokens[0], [EOS_ID] + [PAD_ID] * (length - 1))
  with pytest.raises(ValueError, match="max_len"):
    decoder = build(name, 6)
    decoder.decode(stubs.bind_roles(decoder, STUB), PROMPTS, PROMPT_LENGTHS,
                   KEY)


@pytest.mark.parametrize("name, options", [
    ("mdlm", dict(output_length=4, steps=9)),
    ("llada", dict(output_length=4, steps=8, block_length=1)),
    ("llada", dict(output_length=4, steps=4, block_length=4)),  # == output_length
])
def test_parallel_decoders_with_more_steps_than_tokens(name, options):
  out, executed = run_counted(make_decoder(name, **options), PROMPTS[1:],
                              PROMPT_LENGTHS[1:])
  check_result(name, out, 2, 4, options["steps"], (EOS_ID,), executed)
  if options.get("block_length") == 1:  # one position per block, 2 steps each
    np.testing.assert_array_equal(out.committed,
                                  np.asarray([[1, 1], [0, 0]] * 4, np.int32))


@pytest.mark.parametrize("vocab", [256, 257])
def test_categorical_with_one_finite_logit_always_draws_it(vocab):
  """Two levels (256 = 16 groups of 16) and one level (257 is prime)."""
  tokens = np.asarray([0, vocab // 2 + 1, vocab - 1] * 8)
  logits = np.full((tokens.size, vocab), -np.inf, np.float32)
  logits[np.arange(tokens.size), tokens] = 0.5
  drawn = jax.jit(sampling.categorical)(jax.random.key(vocab),
                                        jnp.asarray(logits, jnp.bfloat16))
  np.testing.assert_array_equal(drawn, tokens)


def test_bfloat16_model_with_a_bfloat16_kv_cache():
  """A bfloat16 GQA Transformer decodes through its bfloat16 KV cache."""
  cfg = TransformerConfig(vocab_size=32, d_model=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=16, mlp_dim=64, max_len=8,
                          dtype="bfloat16", param_dtype="bfloat16")
  logits_fn = make_logits_fn(cfg)
  assert logits_fn.init_cache(1, 1).k[0].dtype == jnp.bfloat16
  out = build("ar", 4, eos_ids=(EOS_ID,)).decode(
      bind(logits_fn, init_params(cfg, jax.random.key(0))),
      jnp.asarray([[5, 6, 7], [8, 9, 0]]), jnp.asarray([3, 2]), KEY)
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (2, 4) and ((tokens >= 0) & (tokens < 32)).all()
  assert int(out.nfe) == 4


# --- Quality metrics on empty and all-PAD rows. ----------------------------

def test_metrics_on_empty_and_all_pad_rows():
  tokens = np.asarray([[0, 0, 0, 0], [5, 6, 0, 0], [7, 7, 7, 0]])
  lengths = np.asarray([4, 0, 3])  # row 0: four real PAD-id tokens
  np.testing.assert_allclose(quality.unigram_entropy(tokens, lengths),
                             [0.0, np.nan, 0.0])
  np.testing.assert_allclose(quality.repetition_rate(tokens, lengths, 1),
                             [0.75, np.nan, 2 / 3])
  assert quality.distinct_n(tokens, lengths, 1) == 2 / 7
  assert np.isnan(quality.distinct_n(tokens, lengths * 0, 2))
  assert np.isnan(quality.repetition_rate(np.zeros((2, 0), int),
                                          np.zeros(2, int), 1)).all()
  np.testing.assert_allclose(quality.omission_rate(["x", ""],
                                                   ["", "the cat"]), [np.nan, 1.0])


def test_gen_ppl_skips_empty_rows_and_refuses_no_tokens():
  evaluator = stubs.TableLogitsFn.random(6, V, 12)
  tokens = np.asarray([[5, 6, 7], [0, 0, 0], [6, 0, 5]])
  full = quality.gen_ppl(evaluator, None, tokens, [3, 0, 2])
  alone = quality.gen_ppl(evaluator, None, tokens[[0, 2]], [3, 2])
  assert full.ppl == pytest.approx(alone.ppl, rel=1e-6)
  assert full.num_tokens == 5
  np.testing.assert_array_equal(full.row_counts, [3, 0, 2])
  assert np.isnan(full.row_nll[1]) and np.isnan(full.row_entropy[1])
  with pytest.raises(ValueError, match="no token"):
    quality.gen_ppl(evaluator, None, tokens, [0, 0, 0])


def test_gen_ppl_of_no_rows_names_the_problem():
  """Bug: B = 0 rows fails in np.concatenate ("need at least one array to
  concatenate"), naming neither argument.

  Fix: in `gen_ppl`, after `_rows`: `if b == 0: raise ValueError(
  "tokens must have B >= 1 rows")`.
  """
  evaluator = stubs.TableLogitsFn.random(6, V, 12)
  with pytest.raises(ValueError, match="no token|tokens"):
    quality.gen_ppl(evaluator, None, np.zeros((0, 3), np.int32),
                    np.zeros((0,), np.int32))


# --- Checkpoints and tokenizers that do not fit. ---------------------------

def small_config(corpus_path: str) -> ml_collections.ConfigDict:
  """A tiny experiment config reading `corpus_path`."""
  return ml_collections.ConfigDict(dict(
      seed=0,
      data=dict(path=corpus_path, vocab_size=512, seq_len=16),
      model=dict(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2,
                 head_dim=16, mlp_dim=64, max_len=16, norm="rmsnorm",
                 positional="rope", mlp_activation="swiglu",
                 tie_embeddings=True, dtype="float32", param_dtype="float32"),
      train=dict(objective="ar", batch_size=2, num_steps=2,
                 learning_rate=1e-3, warmup_steps=1, weight_decay=0.0,
                 grad_clip_norm=1.0, eval_every=2, eval_batches=1,
                 mdlm_eval_timesteps=2, checkpoint_every=2,
                 keep_checkpoints=1)))


@pytest.fixture()
def corpus_file(tmp_path):
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(200)]
  path = tmp_path / "corpus.txt"
  path.write_text("\n\n".join(" ".join(rng.choice(words, 8))
                              for _ in range(40)))
  return path


def test_train_refuses_a_cached_tokenizer_of_another_vocab(
    corpus_file, tmp_path, monkeypatch):
  config = small_config(str(corpus_file))
  key = pipeline.cache_key(corpus_lib.load_splits(str(corpus_file)), 512)
  cache = tmp_path / "work" / "data" / key
  cache.mkdir(parents=True)
  shutil.copy(SHIPPED_TOKENIZER, cache / pipeline.TOKENIZER_FILE)  # 4096 ids

  def no_compile(*args, **kwargs):
    raise AssertionError("compiled before validating")

  monkeypatch.setattr(jax, "jit", no_compile)
  with pytest.raises(ValueError,
                     match="tokenizer vocab_size=4096 does not match"):
    train_lib.train(config, str(tmp_path / "work"), progress=False)


@pytest.fixture()
def pretrained_set(corpus_file, tmp_path):
  """A one-member set whose manifest matches `small_config`."""
  config = small_config(str(corpus_file))
  tokenizer = Tokenizer.load(str(SHIPPED_TOKENIZER))
  member = tmp_path / "set" / "ar"
  member.mkdir(parents=True)
  manifest = {"name": "ar", "commit": "0" * 40,
              "recipe": pretrained.recipe(config),
              "tokenizer_sha256": pretrained.tokenizer_sha256(tokenizer)}
  (member / pretrained.MANIFEST_FILE).write_text(json.dumps(manifest))
  return config, tokenizer, member


def test_find_refuses_parameters_of_another_vocab(pretrained_set):
  config, tokenizer, member = pretrained_set
  other_vocab = train_lib.model_config(config).replace(vocab_size=64)
  params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                        train_lib.unbox(abstract_params(other_vocab)))
  checkpoints = Checkpoints(str(member / "params"), keep=1)
  checkpoints.save(0, params, {})
  checkpoints.close()
  with pytest.raises(CheckpointError, match="stored shape: \\(64, 32\\)"):
    pretrained.find(config, "ar", tokenizer, member.parent)


def test_restore_refuses_a_numpy_checkpoint_of_another_shape(tmp_path):
  """Bug: orbax restores a leaf saved from a numpy array at its stored shape
  whatever the requested one, so `Checkpoints.restore` returns a [64, 32]
  embedding for a [512, 32] model without a word (a checkpoint written from
  numpy, e.g. converted weights, of another vocab).

  Fix: at the end of `Checkpoints.restore`, compare every restored leaf with
  `abstract_state` (`jax.tree_util.tree_flatten_with_path` of both) and raise
  CheckpointError naming the path, both shapes/dtypes, directory and step on
  the first mismatch.
  """
  checkpoints = Checkpoints(str(tmp_path / "ckpt"))
  checkpoints.save(0, {"embedding": np.zeros((64, 32), np.float32)}, {})
  with pytest.raises(CheckpointError, match="embedding"):
    checkpoints.restore(
        {"embedding": jax.ShapeDtypeStruct((512, 32), jnp.float32)})
  checkpoints.close()


def test_find_with_a_corrupt_manifest_names_it(pretrained_set):
  """Bug: a truncated manifest.json raises a bare json.JSONDecodeError that
  names no file.

  Fix: in `pretrained.find` (and `read_manifest`) wrap `json.loads` in
  `try/except json.JSONDecodeError as e: raise CheckpointError(
  f"manifest {manifest_path} is corrupt: {e}") from e`.
  """
  config, tokenizer, member = pretrained_set
  (member / pretrained.MANIFEST_FILE).write_text('{"name": "ar", "reci')
  with pytest.raises(CheckpointError, match="manifest"):
    pretrained.find(config, "ar", tokenizer, member.parent)
