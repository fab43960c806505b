"""Tests of the verdict: Pareto front, tolerance rule, fastest within it."""

from __future__ import annotations

import math

import pytest
from matplotlib.figure import Figure

from lm_decoding.evaluation import frontier, report_plots
from lm_decoding.evaluation.frontier import Point, Tolerance

TOL = Tolerance(gen_ppl=0.10, entropy=0.10)


def pt(label, ms, ppl, entropy=3.5, b=1, t=256, tpf=1.0):
  return Point(label=label, batch_size=b, output_length=t, ms=ms,
               gen_ppl=ppl, entropy=entropy, tpf=tpf)


AR = pt("AR", 100.0, 400.0)


def labels(points):
  return [p.label for p in points]


def test_front_excludes_dominated_points_and_keeps_ties():
  points = [AR, pt("fast bad", 20.0, 900.0), pt("dominated", 150.0, 450.0),
            pt("slow good", 300.0, 300.0), pt("twin", 300.0, 300.0),
            pt("same ms worse", 20.0, 950.0)]
  assert labels(frontier.pareto_front(points)) == [
      "fast bad", "AR", "slow good", "twin"]


def test_front_of_one_point_and_of_none():
  assert frontier.pareto_front([AR]) == [AR]
  assert frontier.pareto_front([]) == []


@pytest.mark.parametrize("point, within", [
    (pt("ppl +10%", 50.0, 440.0), True),
    (pt("ppl +11%", 50.0, 444.0), False),
    (pt("ppl lower", 50.0, 100.0), True),          # one-sided
    (pt("entropy -0.1", 50.0, 400.0, 3.4), True),
    (pt("entropy -0.2", 50.0, 400.0, 3.3), False),
    (pt("entropy higher", 50.0, 400.0, 5.0), True),  # one-sided
])
def test_tolerance_rule(point, within):
  assert TOL.within(point, AR) is within


def test_verdict_fastest_within_tolerance_and_speedup():
  points = [AR, pt("fast bad", 10.0, 900.0), pt("fast ok", 40.0, 420.0),
            pt("faster ok", 25.0, 430.0, 3.45), pt("slow ok", 200.0, 400.0),
            pt("AR", 300.0, 400.0, b=8), pt("x", 100.0, 400.0, b=8)]
  v1, v8 = frontier.verdicts(points, "AR", TOL)
  assert (v1.reference.batch_size, v8.reference.batch_size) == (1, 8)
  assert v1.fastest.label == "faster ok" and v1.nearest_miss is None
  assert v1.speedup(v1.fastest) == pytest.approx(4.0)
  assert labels(v1.front) == ["fast bad", "faster ok", "fast ok", "AR"]
  assert v8.fastest.label == "x" and v8.speedup(v8.fastest) == 3.0


def test_low_entropy_point_is_off_the_front_and_not_accepted():
  repeats = pt("repeats itself", 30.0, 150.0, entropy=2.0)
  v, = frontier.verdicts([AR, repeats], "AR", TOL)
  assert labels(v.front) == ["AR"] and v.fastest is None
  assert v.nearest_miss is repeats  # faster, outside the tolerance


def test_none_on_this_hardware_and_the_nearest_miss():
  # Faster ones all outside the tolerance: the least outside is the miss.
  points = [AR, pt("far", 10.0, 1000.0), pt("near", 50.0, 460.0),
            pt("slow ok", 200.0, 400.0)]
  v, = frontier.verdicts(points, "AR", TOL)
  assert v.fastest is None and v.nearest_miss.label == "near"
  lines = frontier.verdict_lines([v], "AR", TOL)
  assert lines[-1] == (
      "T=256 B=1: fastest within tolerance: none on this hardware; nearest "
      "miss: near, 2.00x the speed of AR (50 vs 100 ms; gen-PPL +15%, "
      "entropy +0.00 nats)")
  # None faster: the least slow decoder within the tolerance.
  v, = frontier.verdicts([AR, pt("slow ok", 200.0, 400.0),
                          pt("slower ok", 400.0, 400.0)], "AR", TOL)
  assert v.fastest is None and v.nearest_miss.label == "slow ok"
  # None faster, none within: the least outside, not "none measured".
  v, = frontier.verdicts([AR, pt("slow far", 200.0, 1000.0),
                          pt("slow near", 400.0, 460.0)], "AR", TOL)
  assert v.fastest is None and v.nearest_miss.label == "slow near"
  assert "nearest miss: slow near, 0.25x the speed of AR" in (
      frontier.verdict_lines([v], "AR", TOL)[-1])
  v, = frontier.verdicts([AR], "AR", TOL)
  assert v.fastest is None and v.nearest_miss is None
  # A predicted section leaves uncosted decoders out: not "none measured".
  assert frontier.verdict_lines([v], "AR", TOL)[-1] == (
      "T=256 B=1: fastest within tolerance: none on this hardware (no other "
      "decoder in this comparison)")


def test_verdict_lines_state_tolerance_front_and_speedup():
  points = [AR, pt("spec", 80.0, 410.0, tpf=1.6)]
  lines = frontier.verdict_lines(frontier.verdicts(points, "AR", TOL), "AR",
                                 TOL)
  assert "gen-PPL at most 10% above AR's and entropy at most 0.10 nats " \
         "below" in lines[0]
  assert lines[1:] == [
      "T=256 B=1: Pareto front: spec (80 ms, gen-PPL 410, TPF 1.60); AR "
      "(100 ms, gen-PPL 400, TPF 1.00)",
      "T=256 B=1: fastest within tolerance: spec, 1.25x faster than AR (80 "
      "vs 100 ms; gen-PPL +2%, entropy +0.00 nats)"]


def test_points_take_quality_from_the_scored_batch_and_tpf_from_nfe():
  rows = [dict(decoder="AR", batch_size=8, output_length=32, ms_min=20.0,
               nfe=32, gen_ppl=400.0, entropy=3.5),
          dict(decoder="AR", batch_size=1, output_length=32, ms_min=5.0,
               nfe=32),
          dict(decoder="MDLM", batch_size=1, output_length=32, ms_min=9.0,
               nfe=8),
          dict(decoder="unscored", batch_size=1, output_length=32,
               ms_min=1.0, nfe=1)]
  points = frontier.points(rows)
  assert points == [pt("AR", 20.0, 400.0, b=8, t=32),
                    pt("AR", 5.0, 400.0, b=1, t=32)]
  rows[2].update(gen_ppl=500.0, entropy=3.0)
  assert frontier.points(rows)[2] == pt("MDLM", 9.0, 500.0, 3.0, t=32,
                                        tpf=4.0)


def test_missing_baseline_and_bad_tolerances_raise():
  with pytest.raises(ValueError, match="baseline='AR cached' has no scored"):
    frontier.verdicts([AR], "AR cached", TOL)
  with pytest.raises(ValueError, match=r"compare.tolerance_gen_ppl=0 must "
                     r"be a finite number > 0"):
    Tolerance(gen_ppl=0)
  with pytest.raises(ValueError, match="compare.tolerance_entropy=True"):
    Tolerance(entropy=True)


# ---- two references: samplers against AR sampling, greedy against AR greedy --


def gpt(label, ms, ppl, entropy=2.5, b=1):
  """A greedy row: judged against 'AR greedy'."""
  return Point(label=label, batch_size=b, output_length=256, ms=ms,
               gen_ppl=ppl, entropy=entropy, tpf=1.0, reference="AR greedy")


def test_greedy_rows_are_judged_against_ar_greedy_only():
  """A threshold row at AR greedy's quality is within tolerance of AR greedy
  although it fails AR sampling's entropy; AR sampling's verdict does not
  see it, nor does AR greedy's see a sampler."""
  greedy_ar = gpt("AR greedy", 90.0, 20.0)
  points = [AR, pt("sampler ok", 50.0, 410.0), greedy_ar,
            gpt("threshold", 30.0, 21.0, 2.45), gpt("worse", 10.0, 40.0)]
  sampling, greedy = frontier.verdicts(points, "AR", TOL)
  assert sampling.judged_against == "AR" and greedy.judged_against == (
      "AR greedy")
  assert sampling.fastest.label == "sampler ok"
  assert labels(sampling.front) == ["sampler ok", "AR"]
  assert greedy.fastest.label == "threshold"
  assert greedy.speedup(greedy.fastest) == pytest.approx(3.0)
  assert labels(greedy.front) == ["worse", "threshold", "AR greedy"]
  lines = frontier.verdict_lines([sampling, greedy], "AR", TOL)
  assert "held to AR greedy (AR greedy)" in lines[0]
  assert lines[3] == "T=256 B=1, greedy vs AR greedy: Pareto front: worse " \
      "(10 ms, gen-PPL 40, TPF 1.00); threshold (30 ms, gen-PPL 21, " \
      "TPF 1.00); AR greedy (90 ms, gen-PPL 20, TPF 1.00)"
  assert lines[4].startswith("T=256 B=1, greedy vs AR greedy: fastest "
                             "within tolerance: threshold, 3.00x faster "
                             "than AR greedy")


def test_greedy_rows_without_their_reference_get_no_verdict():
  """Greedy rows whose reference row is absent are not judged at all (never
  silently against AR sampling)."""
  found = frontier.verdicts([AR, gpt("threshold", 30.0, 21.0)], "AR", TOL)
  assert [v.judged_against for v in found] == ["AR"]
  assert labels(found[0].front) == ["AR"]


def test_points_read_the_reference_column():
  rows = [dict(decoder="AR", batch_size=1, output_length=8, ms_min=1.0,
               nfe=8, gen_ppl=10.0, entropy=2.0),
          dict(decoder="g", batch_size=1, output_length=8, ms_min=1.0,
               nfe=4, gen_ppl=10.0, entropy=2.0, judged_against="AR greedy")]
  assert [p.reference for p in frontier.points(rows)] == ["", "AR greedy"]


@pytest.mark.parametrize("bad", [math.inf, math.nan, 0.0])
def test_frontier_plot_labels_every_drawn_point_beside_one_it_cannot_draw(
    bad, tmp_path, monkeypatch):
  # A point at a value log axes cannot show must not carry the panel's
  # other labels (adjustText) off to NaN; one point, identical points and
  # a panel of the grid with no verdict still plot.
  drawn = []
  monkeypatch.setattr(Figure, "savefig",
                      lambda fig, *args, **kwargs: drawn.append(fig))
  points = [pt("AR", 100.0, 400.0), pt("twin", 100.0, 400.0),
            pt("bad ppl", 50.0, bad), pt("bad ms", bad, 300.0),
            pt("AR", 80.0, 350.0, b=4, t=128)]
  found = frontier.verdicts(points, "AR", TOL)
  report_plots.plot_frontier(found, points, "AR", TOL,
                             str(tmp_path / "frontier.png"))
  texts = {t.get_text().split("\n")[0]: t.get_position()
           for ax in drawn[0].axes for t in ax.texts}
  assert set(texts) == {"AR", "twin"}
  assert all(math.isfinite(x) for xy in texts.values() for x in xy)
