"""AUP and the rule curves (lm_decoding/evaluation/parallelism.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import base, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import parallelism
from lm_decoding.special_tokens import EOS_ID, PAD_ID


def test_aup_of_a_lossless_curve_is_its_area():
  """At y_max every point weighs 1: the trapezoid area plus rho_1 y_1."""
  assert parallelism.aup([1.0, 2.0, 4.0], [80.0] * 3, best=80.0) == (
      pytest.approx(80.0 + 80.0 * 3))


def test_aup_penalises_accuracy_below_the_best_and_drops_collapse():
  got = parallelism.aup([1.0, 3.0], [80.0, 76.0], best=80.0)
  w76 = math.exp(-3 * (1 - 76 / 80))
  assert got == pytest.approx(80 + 2 * (80 + w76 * 76) / 2)
  # A point more than 5 points below the first is left out entirely.
  assert parallelism.aup([1.0, 3.0, 6.0], [80.0, 76.0, 70.0], best=80.0) == (
      pytest.approx(got))


@pytest.mark.parametrize("tpf, acc, best, match", [
    ([], [], 1.0, "non-empty"), ([1.0], [1.0, 2.0], 1.0, "one length"),
    ([0.0], [1.0], 1.0, "tpf="), ([1.0], [101.0], 100.0, "percent"),
    ([1.0], [1.0], 0.0, "best=")])
def test_aup_refuses_bad_input(tpf, acc, best, match):
  with pytest.raises(ValueError, match=match):
    parallelism.aup(tpf, acc, best)


def test_curves_group_rows_by_member_and_rule():
  rows = [dict(decoder="mdlm threshold tau=0.5", output_length=256, nfe=128,
               greedy_agreement=0.5),
          dict(decoder="mdlm threshold tau=0.9", output_length=256, nfe=256,
               greedy_agreement="0.75"),
          dict(decoder="mdlm factor f=1.0", output_length=256, nfe=64,
               greedy_agreement=0.25),
          dict(decoder="AR cached", output_length=256, nfe=256)]
  got = parallelism.curves(rows, "greedy_agreement")
  assert sorted(got) == [("mdlm", "factor"), ("mdlm", "threshold")]
  assert [(t, a) for t, a, _ in got["mdlm", "threshold"]] == [
      (1.0, 75.0), (2.0, 50.0)]


def _result(committed, **stats):
  committed = jnp.asarray(committed, jnp.int32)[:, None]
  return base.DecodeResult(tokens=None, lengths=None, nfe=None,
                           committed=committed, stats=stats)


def test_per_call_histogram_counts_steps_by_tokens_committed():
  """Steps not run (0) are left out; rows add up; a draft-and-verify
  decoder's acceptance counts are summed instead."""
  rows = [_result([1, 3, 0, 3]), _result([2, 3, 1, 0])]
  assert parallelism.per_call_histogram(rows) == [0, 2, 1, 3]
  accepted = [_result([1], accept_counts=jnp.asarray([[2, 0, 1]])),
              _result([1], accept_counts=jnp.asarray([[0, 1, 4]]))]
  assert parallelism.per_call_histogram(accepted) == [2, 1, 5]


def test_per_call_histogram_refuses_net_re_masking_steps():
  """A step whose net commit is negative (a re-masking rule took back more
  than it committed) has no bin: refused, not dropped."""
  with pytest.raises(ValueError, match="step 1 of result 0 committed -2"):
    parallelism.per_call_histogram([_result([2, -2, 3])])


@pytest.mark.parametrize("name, options", [
    ("ar", {}),
    ("bd3lm", dict(steps=8, block_length=4, remasking="threshold",
                   threshold=0.3))])
def test_per_call_histogram_of_real_decodes_adds_up_to_their_tokens(
    name, options):
  """Each row decoded alone commits its T tokens (AR one a step, before any
  EOS: the stub draws none) over the histogram's steps."""
  stub = stubs.TableLogitsFn.random(3, 12, 24, masked_ids=(PAD_ID,))
  decoder = make_decoder(name, output_length=8, sampling=SamplingConfig(
      temperature=0.0, suppress_ids=(PAD_ID, EOS_ID)), **options)
  rows = [decoder.decode(base.bind(stub, None), jnp.asarray([[5, 6, 7]]),
                         jnp.asarray([3]), jax.random.key(0))
          for _ in range(2)]
  counts = parallelism.per_call_histogram(rows)
  assert sum(n * c for n, c in enumerate(counts)) == 2 * 8
  if name == "ar":
    assert counts == [0, 16]
  else:
    assert len(counts) > 2  # the threshold commits several at once
