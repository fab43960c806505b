"""Self-conditioning (issue 27): the model's optional input of its previous
prediction (`TransformerConfig.self_conditioning`), the two-pass training
objectives, and `uniform_eb` feeding its last step back."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import stubs
from lm_decoding.decoding import base, make_decoder
from lm_decoding.decoding.rules import temperature
from lm_decoding.models import TransformerConfig, make_logits_fn
from lm_decoding.models.transformer import init_params
from lm_decoding.training import objectives

V = 16
CONFIG = TransformerConfig(vocab_size=V, d_model=32, num_layers=1,
                           num_heads=2, num_kv_heads=2, head_dim=16,
                           mlp_dim=64, max_len=16, attention="bidirectional",
                           self_conditioning=True)
TOKENS = jax.random.randint(jax.random.key(1), (3, 8), 1, V)
POSITIONS = jnp.broadcast_to(jnp.arange(8), (3, 8))
PROBS = jax.nn.softmax(3 * jax.random.normal(jax.random.key(2), (3, 8, V)))


def test_off_adds_no_parameter_and_refuses_the_input():
  """Off, the parameters are exactly those of the model with the input
  minus its `self_conditioning` block (same init key), and passing the
  input is an error rather than ignored."""
  on = init_params(CONFIG, jax.random.key(0))
  off = init_params(CONFIG.replace(self_conditioning=False),
                    jax.random.key(0))
  assert set(on) - set(off) == {"self_conditioning"}
  chex.assert_trees_all_equal(
      off, {k: v for k, v in on.items() if k != "self_conditioning"},
      strict=True)
  with pytest.raises(ValueError, match="self_conditioning"):
    make_logits_fn(CONFIG.replace(self_conditioning=False))(
        off, TOKENS, POSITIONS, self_conditioning=PROBS)
  with pytest.raises(ValueError, match=r"\[B, L, V\]"):
    make_logits_fn(CONFIG)(on, TOKENS, POSITIONS,
                           self_conditioning=PROBS[:, :4])


def test_the_input_changes_the_output_and_zeros_are_no_input():
  params = stubs.random_params(CONFIG)
  model = make_logits_fn(CONFIG)
  none = model(params, TOKENS, POSITIONS).logits
  zeros = model(params, TOKENS, POSITIONS,
                self_conditioning=jnp.zeros_like(PROBS)).logits
  given = model(params, TOKENS, POSITIONS, self_conditioning=PROBS).logits
  np.testing.assert_array_equal(none, zeros)
  assert float(jnp.abs(given - none).min(-1).max()) > 1e-3
  # the input enters through the soft embedding: a one-hot input is the
  # token's own embedding, so it differs from a one-hot of another token
  one_hot = jax.nn.one_hot(TOKENS, V)
  other = jax.nn.one_hot((TOKENS + 1) % V, V)
  assert not np.allclose(
      model(params, TOKENS, POSITIONS, self_conditioning=one_hot).logits,
      model(params, TOKENS, POSITIONS, self_conditioning=other).logits)


def _recording():
  return stubs.SelfConditionedLogitsFn(stubs.HashDenoiser(vocab=V),
                                       weight=3.0)


def test_training_feeds_the_first_pass_to_half_the_rows():
  """uniform_loss on a self-conditioned stub, eagerly: the first pass has
  no input; the second gets that pass's probabilities in exactly the rows
  of `self_conditioning_rows` (about half) and zeros in the others; times
  and noise are those of the model without the input (weight 0 gives the
  plain model's loss)."""
  batch = 64
  tokens = jax.random.randint(jax.random.key(3), (batch, 8), 1, V)
  key = jax.random.key(4)
  stub = _recording()
  loss, _ = objectives.uniform_loss(stub, jnp.uint32(7), tokens, key)
  (first_in, first_logits), (second_in, _) = stub.seen
  np.testing.assert_array_equal(first_in, 0.0)
  rows = np.asarray(objectives.self_conditioning_rows(
      jax.random.fold_in(key, objectives.common.SELF_CONDITIONING_KEY), batch))
  assert 0.3 * batch < rows.sum() < 0.7 * batch
  np.testing.assert_allclose(second_in[rows],
                             jax.nn.softmax(first_logits[rows]), rtol=1e-6)
  np.testing.assert_array_equal(second_in[~rows], 0.0)
  zero_weight = stubs.SelfConditionedLogitsFn(stub.inner, weight=0.0)
  plain, _ = objectives.uniform_loss(stub.inner, jnp.uint32(7), tokens, key)
  np.testing.assert_array_equal(
      objectives.uniform_loss(zero_weight, jnp.uint32(7), tokens, key)[0],
      plain)
  assert float(loss) != float(plain)


@pytest.mark.parametrize("bound", ["uniform", "mdlm"])
def test_bounds_condition_every_row_on_the_first_pass(bound):
  stub = _recording()
  tokens = TOKENS
  if bound == "uniform":
    objectives.uniform_bound(stub, jnp.uint32(7), tokens, jax.random.key(5),
                             num_timesteps=1)
  else:
    objectives.mdlm_bound(stub, jnp.uint32(7), tokens, jax.random.key(5),
                          num_timesteps=1)
  (first_in, first_logits), (second_in, _) = stub.seen[:2]
  np.testing.assert_array_equal(first_in, 0.0)
  np.testing.assert_allclose(second_in, jax.nn.softmax(first_logits),
                             rtol=1e-6)


def test_the_first_pass_gets_no_gradient():
  """The loss's gradient is that of the second pass alone: the same as
  feeding the first pass's probabilities as a constant."""
  params = stubs.random_params(CONFIG)
  model = make_logits_fn(CONFIG)
  key = jax.random.key(6)
  grad = jax.grad(lambda p: objectives.uniform_loss(model, p, TOKENS,
                                                    key)[0])(params)

  def constant_input(p):
    def logits_fn(p_, tokens, positions, cache=None, attention_mask=None,
                  self_conditioning=None):
      del p_  # the first pass (no input) reads constant parameters
      use = params if self_conditioning is None else p
      return model(use, tokens, positions, attention_mask=attention_mask,
                   self_conditioning=self_conditioning)
    logits_fn.config = CONFIG
    return objectives.uniform_loss(logits_fn, p, TOKENS, key)[0]

  for got, want in zip(jax.tree.leaves(jax.grad(constant_input)(params)),
                       jax.tree.leaves(grad)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


class JitOrNotTest(chex.TestCase):
  """The two-pass loss and a self-conditioned forward are the same jitted
  or op by op."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("uniform", "mdlm")
  def test_two_pass_loss(self, objective):
    params = stubs.random_params(CONFIG)
    loss_fn = functools.partial(
        getattr(objectives, f"{objective}_loss"), make_logits_fn(CONFIG))
    out = self.variant(loss_fn)(params, TOKENS, jax.random.key(7))
    with jax.disable_jit():
      eager = loss_fn(params, TOKENS, jax.random.key(7))
    chex.assert_trees_all_close(out, eager, rtol=1e-5)


def test_sampler_feeds_the_last_step_back():
  """kv_cache='prefix', two blocks: each block's first (full) pass gets
  zeros; each later (canvas) pass gets softmax(processed) of the step
  before, processed = logits with MASK at -inf over tau of that step."""
  inner = stubs.TableLogitsFn.random(2, V, 16, masked_ids=(4,), scale=3.0)
  stub = stubs.SelfConditionedLogitsFn(inner, weight=5.0)
  steps, t_min, t_max = 8, 0.3, 0.9
  decoder = make_decoder("uniform_eb", output_length=8, block_length=4,
                         steps=steps, kv_cache="prefix", eos_ids=(),
                         mask_id=4, t_min=t_min, t_max=t_max,
                         early_stop=False)
  prompts = jnp.array([[5, 6, 7], [7, 9, 0]], jnp.int32)
  lengths = jnp.array([3, 2], jnp.int32)
  decoder.decode(base.bind(stub, None), prompts, lengths, jax.random.key(8))
  per_block = steps // 2
  assert len(stub.seen) == 2 * per_block
  for n in range(2):
    calls = stub.seen[n * per_block:(n + 1) * per_block]
    np.testing.assert_array_equal(calls[0][0], 0.0)  # full pass: zeros
    start = np.asarray(lengths) + 4 * n
    previous = np.stack([calls[0][1][b, start[b]:start[b] + 4]
                         for b in range(2)])
    for k in range(1, per_block):
      tau = float(temperature(t_min, t_max, k - 1, per_block))
      want = jax.nn.softmax(jnp.asarray(previous).at[..., 4].set(-jnp.inf)
                            / tau)
      np.testing.assert_allclose(calls[k][0], want, rtol=1e-5, atol=1e-7)
      previous = calls[k][1]


def test_prefix_cache_is_exact_with_a_self_conditioned_transformer():
  models = base.bind(make_logits_fn(CONFIG), stubs.random_params(CONFIG))
  prompts = jnp.array([[5, 6, 7], [7, 0, 0]], jnp.int32)
  lengths = jnp.array([3, 1], jnp.int32)
  outs = [make_decoder("uniform_eb", output_length=8, steps=8, block_length=4,
                       kv_cache=kv, entropy_bound=0.3, eos_ids=(), t_min=0.2,
                       t_max=0.3, confidence_threshold=1.0).decode(
                           models, prompts, lengths, jax.random.key(9))
          for kv in ("none", "prefix")]
  np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
  plain = base.bind(make_logits_fn(CONFIG.replace(self_conditioning=False)),
                    {k: v for k, v in models["model"].params.items()
                     if k != "self_conditioning"})
  other = make_decoder("uniform_eb", output_length=8, steps=8, block_length=4,
                       entropy_bound=0.3, eos_ids=(), t_min=0.2, t_max=0.3,
                       confidence_threshold=1.0).decode(
                           plain, prompts, lengths, jax.random.key(9))
  assert not np.array_equal(other.tokens, outs[0].tokens)


@pytest.mark.parametrize("objective, value, match", [
    ("uniform", "yes", "must be True or False"),
    ("ar", True, "applies to train.objective"),
    ("bd3lm", True, "applies to train.objective")])
def test_model_key_is_checked(objective, value, match):
  from configs import tiny  # pylint: disable=import-outside-toplevel
  from lm_decoding.training import train  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.train.objective = objective
  config.model.self_conditioning = value
  with pytest.raises(ValueError, match=f"model.self_conditioning.*{match}"):
    train.check_config(config)
  config = tiny.get_config()
  config.train.objective = "uniform"
  assert not train.check_config(config).self_conditioning  # absent: off
  config.model.self_conditioning = True
  assert train.check_config(config).self_conditioning


@pytest.mark.parametrize("options", [
    {}, {"norm": "layernorm", "mlp_activation": "gelu", "use_bias": True}])
def test_cost_model_counts_the_block_and_int8_keeps_it(options):
  from lm_decoding.evaluation.cost_model import param_count  # pylint: disable=import-outside-toplevel
  from lm_decoding.models.quantization import quantize_params  # pylint: disable=import-outside-toplevel
  from lm_decoding.models.transformer import count_params  # pylint: disable=import-outside-toplevel
  config = CONFIG.replace(**options)
  params = stubs.random_params(config)
  assert param_count(config) == count_params(params)
  assert param_count(config) > param_count(
      config.replace(self_conditioning=False))
  int8 = config.replace(quantization="int8_weights")
  got = make_logits_fn(int8)(quantize_params(params, config), TOKENS,
                             POSITIONS, self_conditioning=PROBS).logits
  want = make_logits_fn(config)(params, TOKENS, POSITIONS,
                                self_conditioning=PROBS).logits
  np.testing.assert_allclose(got, want, atol=0.1 * float(jnp.abs(want).max()))


def test_cost_model_counts_the_first_pass_of_a_training_step():
  from lm_decoding.evaluation import cost_model  # pylint: disable=import-outside-toplevel
  off = CONFIG.replace(self_conditioning=False)
  step = lambda c, backward=True: cost_model.objective_flops(
      c, "uniform", 4, 8, backward=backward)
  forward = step(CONFIG, backward=False)
  assert step(CONFIG) == 4 * forward
  assert step(off) == 3 * step(off, backward=False)
  assert forward - step(off, backward=False) == 2 * 4 * 8 * (
      V * CONFIG.d_model + 3 * CONFIG.d_model * CONFIG.mlp_dim)
