"""AUP and the rule curves (lm_decoding/evaluation/parallelism.py)."""

import math

import pytest

from lm_decoding.evaluation import parallelism


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
