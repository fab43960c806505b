"""The closed forms of speculative_cost (Leviathan et al. 2023) and the
router workload's budgets, exactly."""

import numpy as np
import pytest

from lm_decoding.evaluation import router
from lm_decoding.studies import router_workload
from lm_decoding.studies import speculative_cost as sc


@pytest.mark.parametrize("alpha,gamma,expected", [
    (0.0, 4, 1.0), (1.0, 3, 4.0), (0.5, 2, 1.75), (0.25, 1, 1.25)])
def test_expected_tokens_is_the_geometric_sum(alpha, gamma, expected):
  assert sc.expected_tokens(alpha, gamma) == expected
  if alpha < 1:
    closed = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert sc.expected_tokens(alpha, gamma) == pytest.approx(closed, 1e-12)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.62, 0.9])
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_fitted_alpha_inverts_expected_tokens(alpha, gamma):
  tokens = sc.expected_tokens(alpha, gamma)
  assert sc.fitted_alpha(tokens, gamma) == pytest.approx(alpha, abs=1e-12)


def test_fitted_alpha_clips_to_the_range():
  assert sc.fitted_alpha(0.5, 4) == pytest.approx(0.0, abs=1e-12)
  assert sc.fitted_alpha(9.0, 4) == pytest.approx(1.0, abs=1e-12)


def test_alpha_per_position_from_the_histogram():
  # 4 rounds: 2 accepted nothing, 1 accepted one token, 1 accepted two.
  np.testing.assert_array_equal(sc.alpha_per_position(np.array([2, 1, 1])),
                                [0.5, 0.5])
  alphas = sc.alpha_per_position(np.array([3, 0, 0]))
  assert alphas[0] == 0.0 and np.isnan(alphas[1])


def test_predicted_speedup_counts_draft_calls():
  assert sc.predicted_speedup(0.5, 2, 0.25) == 1.75 / 1.5
  assert sc.predicted_speedup(0.5, 2, 0.25, draft_calls=1) == 1.75 / 1.25
  assert sc.predicted_speedup(0.9, 4, 0.0) == pytest.approx(
      (1 - 0.9 ** 5) / 0.1)


@pytest.mark.parametrize("counts,t,expected", [
    ([0, 0, 5], 7, 3),  # always 3 tokens a round: ceil(7 / 3)
    ([5, 0, 0], 7, 7),  # never accepts: one token a round
    ([0, 4], 8, 4)])
def test_predicted_rounds_exact_for_deterministic_histograms(counts, t,
                                                             expected):
  assert sc.predicted_rounds(np.array(counts), t, batch=3, sims=16) == expected


def test_predicted_rounds_waits_for_the_slowest_row():
  counts = np.array([1, 1])  # one or two tokens a round, equally likely
  one = sc.predicted_rounds(counts, 32, batch=1, sims=4000, seed=1)
  eight = sc.predicted_rounds(counts, 32, batch=8, sims=4000, seed=1)
  assert one == pytest.approx(32 / 1.5 + 1 / 3, abs=0.3)  # renewal mean
  assert eight > one + 1.0


def test_spread():
  assert sc.spread([1.0, 2.0, 3.0]) == 1.0
  assert sc.spread([2.0, 2.0]) == 0.0


def test_group_lines_names_every_system():
  lines = sc.group_lines("ar", ["d1"], [1, 4], extras=True)
  assert list(lines) == ["AR ar", "AR d1", "spec d1 g=1", "spec d1 g=4",
                         f"jacobi g={sc.EXTRA_GAMMA}",
                         f"prompt_lookup g={sc.EXTRA_GAMMA}",
                         f"diffusion_draft g={sc.EXTRA_GAMMA}"]
  assert lines["spec d1 g=4"].endswith("target=ar draft=d1 | gamma=4")
  assert "draft=mdlm" in lines[f"diffusion_draft g={sc.EXTRA_GAMMA}"]
  assert list(sc.group_lines("evaluator", ["ar"], [2], extras=False)) == [
      "AR evaluator", "AR ar", "spec ar g=2"]


def test_timed_systems_times_every_system_in_turns():
  calls = []
  systems = {name: (lambda n=name: calls.append(n) or n, ())
             for name in ("a", "b")}
  times, outputs = sc.timed_systems(systems, runs=3)
  assert calls == ["a", "b"] * 4  # one warm-up round, then three in turns
  assert outputs == {"a": "a", "b": "b"}
  assert [len(t) for t in times.values()] == [3, 3]
  with pytest.raises(ValueError, match="runs"):
    sc.timed_systems(systems, runs=0)


def test_router_budgets():
  curve = router.CostCurve("AR", "ar", (32, 128), (4.0, 16.0), gen_ppl=10.0)
  assert router_workload.budgets(curve) == {"tight": 8.0, "loose": 24.0}
