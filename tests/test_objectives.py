"""Tests of lm_decoding.training.objectives (AR cross-entropy, MDLM NELBO)."""

from __future__ import annotations

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.models import TransformerConfig, abstract_params, make_logits_fn
from lm_decoding.models.diffusion import EPS, subs_log_probs
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import BOS_ID, MASK_ID, PAD_ID
from lm_decoding.training import objectives

VOCAB = 8
SYMBOLS = np.array([5, 6, 7])  # the toy alphabet (ids past the reserved ones)
LENGTH = 3


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ----------------------------------------------------------------------------
# A toy joint distribution over LENGTH tokens whose likelihood is exact.

ALL_SEQS = np.array(list(itertools.product(SYMBOLS, repeat=LENGTH)), np.int32)


def _joint(seed):
  """A random full-support distribution over ALL_SEQS (float64[N])."""
  return np.random.default_rng(seed).dirichlet(np.full(len(ALL_SEQS), 0.7))


def _log_prob(joint, seqs):
  """Exact log p(x) of rows of `seqs` (int[B, LENGTH])."""
  index = {tuple(s): i for i, s in enumerate(ALL_SEQS)}
  return np.log(joint[[index[tuple(s)] for s in np.asarray(seqs)]])


def _masked_conditional_logits(joint, x_t_BxL):
  """Optimal denoiser for `joint`: log p(x_l = v | unmasked tokens of x_t)."""
  seqs, p = jnp.asarray(ALL_SEQS), jnp.asarray(joint, jnp.float32)
  consistent_BxN = jnp.all((x_t_BxL[:, None] == MASK_ID) | (x_t_BxL[:, None] == seqs),
                           axis=-1)
  prob_BxLxV = jnp.einsum("bn,nlv->blv", consistent_BxN * p,
                          jax.nn.one_hot(seqs, VOCAB))
  return jnp.log(prob_BxLxV + 1e-30)


def _prefix_conditional_logits(joint, inputs_BxT):
  """Exact AR conditional: logits[:, i] = log p(x_i | x_<i), inputs [BOS, x...]."""
  seqs, p = jnp.asarray(ALL_SEQS), jnp.asarray(joint, jnp.float32)
  out = []
  for i in range(inputs_BxT.shape[1]):
    prefix_BxN = jnp.all(inputs_BxT[:, None, 1:i + 1] == seqs[None, :, :i], -1)
    out.append(jnp.einsum("bn,nv->bv", prefix_BxN * p,
                          jax.nn.one_hot(seqs[:, i], VOCAB)))
  return jnp.log(jnp.stack(out, axis=1) + 1e-30)


def _stub(logits_of_tokens):
  """A logits_fn whose logits depend on the input tokens only."""
  def logits_fn(params, tokens, positions, cache=None, attention_mask=None):
    del params, positions, attention_mask
    return ModelOutput(logits_of_tokens(tokens), cache)
  return logits_fn


def _exact_nelbo(logits_of_x_t, x0_NxL, eps=0.0, nodes=6):
  """Continuous-time NELBO of each row of x0, exactly.

  Enumerates every mask S (probability m^|S| (1-m)^(L-|S|), m = 1 - alpha_t)
  and integrates over t in [0, 1] with Gauss-Legendre quadrature; the
  integrand is a polynomial in t of degree < L, so `nodes` >= L/2 is exact.
  """
  x0_NxL = np.asarray(x0_NxL)
  n = len(x0_NxL)
  masks_SxL = np.array(list(itertools.product([False, True], repeat=LENGTH)))
  t_T, w_T = np.polynomial.legendre.leggauss(nodes)
  t_T, w_T = (t_T + 1) / 2, w_T / 2
  x0 = np.broadcast_to(x0_NxL[:, None, None], (n, len(masks_SxL), len(t_T), LENGTH))
  masks = np.broadcast_to(masks_SxL[None, :, None], x0.shape)
  t = np.broadcast_to(t_T[None, None, :], x0.shape[:3])
  x_t = np.where(masks, MASK_ID, x0)
  flat = lambda a: jnp.asarray(a.reshape(-1, *a.shape[3:]))
  terms = jax.jit(lambda x0, x_t, t: objectives.mdlm_nelbo_terms(
      logits_of_x_t(x_t), x0, x_t, t, MASK_ID, eps))(
          flat(x0), flat(x_t), jnp.asarray(t.reshape(-1), jnp.float32))
  terms_NxSxT = np.asarray(terms, np.float64).sum(-1).reshape(x0.shape[:3])
  m = (1 - eps) * t_T
  k_S = masks_SxL.sum(-1)
  prob_SxT = m[None] ** k_S[:, None] * (1 - m[None]) ** (LENGTH - k_S[:, None])
  return np.einsum("nst,st,t->n", terms_NxSxT, prob_SxT, w_T)


def test_nelbo_of_optimal_denoiser_is_the_exact_nll():
  joint = _joint(0)
  nelbo = _exact_nelbo(functools.partial(_masked_conditional_logits, joint),
                       ALL_SEQS)
  np.testing.assert_allclose(nelbo, -_log_prob(joint, ALL_SEQS), rtol=2e-5)


def test_nelbo_of_a_wrong_joints_denoiser_is_its_nll_and_bounds_entropy():
  p, q = _joint(0), _joint(1)
  nelbo = _exact_nelbo(functools.partial(_masked_conditional_logits, q),
                       ALL_SEQS)
  np.testing.assert_allclose(nelbo, -_log_prob(q, ALL_SEQS), rtol=2e-5)
  entropy = -(p * np.log(p)).sum()
  assert (p * nelbo).sum() > entropy + 0.05


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nelbo_of_an_arbitrary_denoiser_bounds_the_nll(seed):
  p = _joint(0)
  w = jax.random.normal(jax.random.key(seed), (LENGTH, VOCAB, LENGTH, VOCAB))
  linear = lambda x_t: jnp.einsum("blu,mvlu->bmv", jax.nn.one_hot(x_t, VOCAB), w)
  nelbo = _exact_nelbo(linear, ALL_SEQS)
  assert (p * nelbo).sum() >= -(p * np.log(p)).sum()


def test_training_eps_lowers_the_nelbo_by_order_eps():
  joint = _joint(0)
  denoiser = functools.partial(_masked_conditional_logits, joint)
  nll = -_log_prob(joint, ALL_SEQS)
  nelbo_eps = _exact_nelbo(denoiser, ALL_SEQS, eps=EPS)
  assert np.all(nelbo_eps <= nll + 1e-5)
  np.testing.assert_allclose(nelbo_eps, nll, rtol=3 * EPS)


def _toy_batch(joint, batch, seed=0):
  rows = np.random.default_rng(seed).choice(len(ALL_SEQS), batch, p=joint)
  return jnp.asarray(ALL_SEQS[rows])


def test_mdlm_loss_and_bound_estimate_the_nll_of_the_optimal_denoiser():
  # Standard deviations measured over 100 keys: 0.026 for one mdlm_loss draw,
  # 0.0045 for mdlm_bound; the tolerances are about 5 of them.
  joint = _joint(0)
  tokens = _toy_batch(joint, 4096)
  nll_per_token = -_log_prob(joint, tokens).mean() / LENGTH
  logits_fn = _stub(functools.partial(_masked_conditional_logits, joint))
  loss_fn = functools.partial(objectives.mdlm_loss, logits_fn, None, tokens)
  loss_K, metrics = jax.jit(jax.vmap(loss_fn))(
      jax.random.split(jax.random.key(0), 32))
  np.testing.assert_array_equal(metrics["tokens"], tokens.size)
  np.testing.assert_allclose(metrics["nll"] / tokens.size, loss_K, rtol=1e-6)
  assert abs(float(loss_K.mean()) - nll_per_token) < 0.025
  bound, _ = objectives.mdlm_bound(logits_fn, None, tokens, jax.random.key(1),
                                   num_timesteps=16)
  assert abs(float(bound) - nll_per_token) < 0.02


def test_mdlm_bound_is_deterministic_in_its_key():
  joint = _joint(0)
  tokens = _toy_batch(joint, 64)
  logits_fn = _stub(functools.partial(_masked_conditional_logits, _joint(1)))
  bound = jax.jit(functools.partial(objectives.mdlm_bound, logits_fn, None,
                                    tokens, num_timesteps=4))
  a, b, c = (float(bound(jax.random.key(k))[0]) for k in (3, 3, 4))
  assert a == b
  assert a != c


def test_ar_loss_of_exact_conditional_is_the_exact_nll():
  joint = _joint(0)
  tokens = jnp.concatenate(
      [jnp.full((len(ALL_SEQS), 1), BOS_ID, jnp.int32), jnp.asarray(ALL_SEQS)], 1)
  logits_fn = _stub(functools.partial(_prefix_conditional_logits, joint))
  loss, metrics = objectives.ar_loss(logits_fn, None, tokens, jax.random.key(0))
  np.testing.assert_allclose(float(metrics["nll"]),
                             -_log_prob(joint, ALL_SEQS).sum(), rtol=1e-5)
  assert float(metrics["tokens"]) == ALL_SEQS.size
  np.testing.assert_allclose(float(loss), float(metrics["nll"]) / ALL_SEQS.size)


# ----------------------------------------------------------------------------
# Hand-computed values with stub logits.

def test_mdlm_terms_hand_computed():
  logits = np.random.default_rng(0).normal(size=(1, 3, 6)).astype(np.float32)
  x0, x_t = np.array([[2, 3, 5]]), np.array([[MASK_ID, 3, MASK_ID]])
  keep = [0, 1, 2, 3, 5]  # MASK excluded from the softmax
  ce = [-_log_softmax(logits[0, l, keep])[keep.index(x0[0, l])] for l in (0, 2)]
  for eps in (0.0, EPS):  # log-linear: weight -alpha'/(1 - alpha) = 1/t
    terms = objectives.mdlm_nelbo_terms(
        jnp.asarray(logits), jnp.asarray(x0), jnp.asarray(x_t),
        jnp.array([0.25]), MASK_ID, eps)
    np.testing.assert_allclose(np.asarray(terms)[0], [4 * ce[0], 0.0, 4 * ce[1]],
                               rtol=1e-5)


def test_mdlm_terms_never_score_pad():
  logits = jnp.zeros((1, 3, 6))
  terms = objectives.mdlm_nelbo_terms(
      logits, jnp.array([[5, PAD_ID, PAD_ID]]), jnp.array([[MASK_ID, MASK_ID, PAD_ID]]),
      jnp.array([0.5]), MASK_ID)
  np.testing.assert_allclose(np.asarray(terms)[0], [2 * np.log(5), 0.0, 0.0],
                             rtol=1e-6)


def test_ar_loss_hand_computed_and_ignores_pad_targets():
  logits = np.random.default_rng(0).normal(size=(1, 3, 8)).astype(np.float32)
  logits_fn = _stub(lambda tokens: jnp.asarray(logits))
  tokens = jnp.array([[BOS_ID, 5, 6, PAD_ID]])
  loss, metrics = objectives.ar_eval(logits_fn, None, tokens)
  nll = -_log_softmax(logits[0, 0])[5] - _log_softmax(logits[0, 1])[6]
  np.testing.assert_allclose(float(metrics["nll"]), nll, rtol=1e-6)
  np.testing.assert_allclose(float(loss), nll / 2, rtol=1e-6)
  assert float(metrics["tokens"]) == 2
  changed = logits.copy()
  changed[0, 2] += np.arange(8)  # the logits predicting the PAD target
  other, _ = objectives.ar_eval(_stub(lambda tokens: jnp.asarray(changed)),
                                None, tokens)
  assert float(other) == float(loss)


def test_mdlm_loss_hides_pad_keys_and_counts_real_tokens():
  logits_fn = stubs.RecordingLogitsFn(VOCAB)
  tokens = jnp.array([[5, 6, PAD_ID, PAD_ID], [7, 5, 6, PAD_ID]])
  _, metrics = objectives.mdlm_loss(logits_fn, None, tokens, jax.random.key(0))
  valid = np.asarray(tokens) != PAD_ID  # every query sees exactly the real keys
  np.testing.assert_array_equal(logits_fn.seen[0][2], np.broadcast_to(valid[:, None],
                                                         (2, 4, 4)))
  assert float(metrics["tokens"]) == 5


# ----------------------------------------------------------------------------
# Forward process and time sampling.

def test_mask_tokens_rate_and_pad():
  x0 = jnp.tile(jnp.array([[5, 6, 7, 5, PAD_ID]]), (4000, 1))
  t = jnp.tile(jnp.array([0.2, 0.7]), 2000)
  x_t = np.asarray(objectives.mask_at_time(jax.random.key(0), x0, t, MASK_ID, EPS))
  assert np.all(x_t[:, 4] == PAD_ID)
  assert np.all((x_t[:, :4] == MASK_ID) | (x_t[:, :4] == np.asarray(x0)[:, :4]))
  for row, tt in ((slice(0, None, 2), 0.2), (slice(1, None, 2), 0.7)):
    rate = (x_t[row, :4] == MASK_ID).mean()
    p = (1 - EPS) * tt
    assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / 8000)
  full = objectives.mask_at_time(jax.random.key(1), x0, jnp.ones(4000), MASK_ID, 0.0)
  assert np.all(np.asarray(full)[:, :4] == MASK_ID)


def test_sample_times_are_antithetic():
  t = np.asarray(objectives.sample_times(jax.random.key(0), 16, t_min=0.1))
  assert np.all((t >= 0.1) & (t < 1.0))
  strata = np.floor((t - 0.1) / 0.9 * 16 + 1e-4).astype(int)
  np.testing.assert_array_equal(np.sort(strata), np.arange(16))
  np.testing.assert_allclose(np.diff(np.sort(t)), 0.9 / 16, atol=1e-5)


# ----------------------------------------------------------------------------
# F4: the SUBS parameterisation stays finite and never emits MASK.

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("extreme", [False, True])
def test_f4_subs_finite_and_never_mask(dtype, extreme):
  mask_id = 7
  logits = 3 * jax.random.normal(jax.random.key(0), (1, 3, 8))
  if extreme:  # MASK at the dtype's largest finite logit
    logits = logits.at[..., mask_id].set(float(jnp.finfo(dtype).max))
  logits = logits.astype(dtype)
  x_t, x0 = jnp.array([[7, 5, 7]]), jnp.array([[2, 5, 6]])
  probs = np.asarray(jnp.exp(subs_log_probs(logits, x_t, mask_id)))
  assert not np.isnan(probs).any()
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-2)
  assert np.all(probs[..., mask_id] == 0)
  np.testing.assert_array_equal(probs[0, 1], np.eye(8)[5])
  for eps in (EPS, 0.0):
    for t in (1e-3, 0.5, 1.0):
      loss_fn = lambda lg: objectives.mdlm_nelbo_terms(
          lg, x0, x_t, jnp.array([t]), mask_id, eps).sum()
      loss, grad = jax.value_and_grad(loss_fn)(logits)
      assert np.isfinite(float(loss)) and float(loss) > 0
      assert np.all(np.isfinite(np.asarray(grad, np.float32)))


# ----------------------------------------------------------------------------
# With the Transformer.

TINY = TransformerConfig(vocab_size=16, d_model=32, num_layers=1, num_heads=2,
                         num_kv_heads=2, head_dim=16, mlp_dim=64, max_len=16)


@pytest.mark.parametrize("name,attention", [("ar_loss", "causal"),
                                            ("mdlm_loss", "bidirectional"),
                                            ("uniform_loss", "bidirectional")])
def test_losses_jit_and_differentiate_with_the_transformer(name, attention):
  config = TINY.replace(attention=attention)
  rng = np.random.default_rng(0)  # random weights without compiling an init
  params = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype),
                        nn.meta.unbox(abstract_params(config)))
  loss_fn = functools.partial(getattr(objectives, name), make_logits_fn(config))
  tokens = jax.random.randint(jax.random.key(1), (4, 8), 5, 16).at[1, 6:].set(PAD_ID)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      params, tokens, jax.random.key(2))
  assert np.isfinite(float(loss)) and float(loss) > 0
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert float(metrics["tokens"]) == (26 if name == "ar_loss" else 30)


def test_bad_inputs_raise():
  causal = make_logits_fn(TINY)
  bidirectional = make_logits_fn(TINY.replace(attention="bidirectional"))
  tokens, key = jnp.ones((2, 4), jnp.int32), jax.random.key(0)
  with pytest.raises(ValueError, match="attention"):
    objectives.ar_loss(bidirectional, None, tokens, key)
  with pytest.raises(ValueError, match="attention"):
    objectives.mdlm_loss(causal, None, tokens, key)
  with pytest.raises(ValueError, match="attention"):
    objectives.mdlm_bound(causal, None, tokens, key, 4)
  with pytest.raises(ValueError, match="num_timesteps"):
    objectives.mdlm_bound(bidirectional, None, tokens, key, 0)
  with pytest.raises(ValueError, match="eps"):
    objectives.mdlm_loss(bidirectional, None, tokens, key, eps=0.0)
  with pytest.raises(ValueError, match="length"):
    objectives.ar_eval(causal, None, tokens[:, :1])
  with pytest.raises(ValueError, match="tokens"):
    objectives.ar_eval(causal, None, tokens[0])
  with pytest.raises(ValueError, match="tokens"):
    objectives.mdlm_loss(bidirectional, None, tokens.astype(jnp.float32), key)


# ----------------------------------------------------------------------------
# Uniform-state diffusion (issue 27).


def _udlm_closed_form(logits, x0, z, alpha, alpha_prime):
  """UDLM's integrand, term by term in float64 (Schiff et al. 2024)."""
  vocab = logits.shape[-1]
  out = np.zeros(x0.shape)
  for b, l in np.ndindex(*x0.shape):
    p = np.exp(_log_softmax(logits[b, l]))
    a = alpha[b]
    x_bar = (1 - a) + vocab * a * (np.arange(vocab) == x0[b, l])
    x_theta = (1 - a) + vocab * a * p
    i = z[b, l]
    total = vocab / x_theta[i] - vocab / x_bar[i]
    for y in range(vocab):
      if y != i:
        r, s = x_bar[y] / x_bar[i], x_theta[y] / x_theta[i]
        total += r * np.log(r / s)
    out[b, l] = -alpha_prime[b] / (vocab * a) * total
  return out


def test_uniform_nelbo_terms_equal_the_closed_form():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, VOCAB)) * 2
  x0 = rng.integers(0, VOCAB, (3, 4))
  z = np.where(rng.random((3, 4)) < 0.5, x0, rng.integers(0, VOCAB, (3, 4)))
  alpha = np.array([0.9, 0.5, 0.02])
  alpha_prime = np.array([-1.0, -0.7, -0.3])
  scored = rng.random((3, 4)) < 0.8
  terms = objectives.uniform_nelbo_terms(
      jnp.asarray(logits, jnp.float32), jnp.asarray(x0), jnp.asarray(z),
      jnp.asarray(alpha, jnp.float32), jnp.asarray(alpha_prime, jnp.float32),
      jnp.asarray(scored))
  expected = np.where(scored, _udlm_closed_form(logits, x0, z, alpha,
                                                alpha_prime), 0.0)
  np.testing.assert_allclose(terms, expected, rtol=2e-4, atol=1e-6)
  assert np.all(np.asarray(terms) >= 0)


def test_uniform_noise_rate_and_kept_tokens():
  x0 = jnp.full((4, 4096), 5, jnp.int32)
  keep = jnp.arange(4096)[None, :] < 4000
  z = objectives.uniform_noise(jax.random.key(0), x0,
                               jnp.array([1.0, 0.75, 0.25, 0.0]), keep,
                               vocab=VOCAB)
  changed = np.asarray(z != x0)
  assert not changed[:, 4000:].any()
  # replaced with probability 1 - alpha, by one of V tokens (itself 1/V)
  rate = changed[:, :4000].mean(1)
  np.testing.assert_allclose(rate, [0.0, 0.25 * 7 / 8, 0.75 * 7 / 8, 7 / 8],
                             atol=0.02)
  assert set(np.unique(np.asarray(z))) == set(range(VOCAB))


def test_uniform_bound_bounds_the_entropy_and_ranks_denoisers():
  # i.i.d. tokens from p: any denoiser's bound is >= H(p) per token; one that
  # predicts p is far better than a uniform one.
  p = np.array([0, 0, 0, 0, 0, 0.6, 0.3, 0.1])
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.choice(VOCAB, (512, LENGTH), p=p), jnp.int32)
  entropy = -np.sum(p[5:] * np.log(p[5:]))
  right = _stub(lambda z: jnp.broadcast_to(jnp.log(jnp.asarray(p + 1e-12,
                                                               jnp.float32)),
                                           (*z.shape, VOCAB)))
  wrong = _stub(lambda z: jnp.zeros((*z.shape, VOCAB)))
  bound_right, _ = objectives.uniform_bound(right, None, tokens,
                                            jax.random.key(0), 64)
  bound_wrong, _ = objectives.uniform_bound(wrong, None, tokens,
                                            jax.random.key(0), 64)
  assert float(bound_right) > entropy - 0.02
  assert float(bound_wrong) > float(bound_right) + 0.5
