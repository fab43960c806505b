"""Reproduction scripts, part A (experiments/reproduce/, claims 1, 2, 3, 9, 11).

Each script runs end to end in its smoke mode (tiny models, a few points)
and its written numbers are checked: the files exist, the values are finite
and the structure is the one claim.md describes. Claim 3's measured
"neither" rates must match their closed forms within 3 binomial standard
errors, and the closed forms themselves are checked against a brute-force
enumeration of the unmasking schedule.
"""

from __future__ import annotations

import itertools
import json
import math
import pathlib

import numpy as np
import pytest

import _loading
from lm_decoding.studies import claims
from lm_decoding.decoding.sampling import SamplingConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "experiments" / "reproduce"
CLAIMS = ("ar_vs_parallel_latency", "parallel_training", "multimodality",
          "gumbel_precision", "batch_and_length")


def script(name):
  return _loading.load(f"reproduce_{name}", SCRIPTS / f"{name}.py")


class _Records(dict):
  """{claim: (folder, numbers.json)}, each script's smoke run made when a
  test first asks for it: a pytest-xdist worker runs only the scripts of
  the tests it was given."""

  def __init__(self, tmp_path_factory):
    super().__init__()
    self._tmp = tmp_path_factory

  def __missing__(self, name):
    folder = self._tmp.mktemp(name)
    script(name).run(str(folder), smoke=True, cmd=f"smoke {name}")
    self[name] = (folder, json.loads((folder / "numbers.json").read_text()))
    return self[name]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  return _Records(tmp_path_factory)


def finite_numbers(value):
  """Every number in a JSON tree (None stands for a non-finite one)."""
  if isinstance(value, dict):
    for v in value.values():
      yield from finite_numbers(v)
  elif isinstance(value, list):
    for v in value:
      yield from finite_numbers(v)
  elif isinstance(value, (int, float)) and not isinstance(value, bool):
    yield value


@pytest.mark.parametrize("name", CLAIMS)
def test_script_writes_its_record(records, name):
  folder, record = records[name]
  for file in ("numbers.json", "results.csv", "claim.md", "figure.png"):
    assert (folder / file).stat().st_size > 0, file
  assert record["claim"] == name
  assert record["verdict"] in ("supported", "contradicted", "mixed")
  assert record["command"] == f"smoke {name}"
  assert record["smoke"]
  text = (folder / "claim.md").read_text()
  assert "SMOKE RUN" in text
  for field in ("**Claim.**", "**Source.**", "**Our number.**",
                "**Verdict: ", "**Hardware.**", "**Command.** `smoke"):
    assert field in text
  rows = record["rows"]
  assert rows and all(set(r) == set(rows[0]) for r in rows)
  csv_lines = (folder / "results.csv").read_text().strip().splitlines()
  assert len(csv_lines) == len(rows) + 1
  numbers = list(finite_numbers(rows))
  assert numbers and all(math.isfinite(x) for x in numbers)


def test_latency_rows(records):
  _, record = records["ar_vs_parallel_latency"]
  grid = script("ar_vs_parallel_latency").grid(True)
  assert len(record["rows"]) == (len(grid["batch_sizes"])
                                 * len(grid["lengths"]))
  for r in record["rows"]:
    assert r["ar_nfe"] == r["new_tokens"]  # T dependent steps
    assert r["mdlm_nfe"] == grid["steps"]  # K steps, whatever T
    assert r["ar_ms"] > 0 and r["mdlm_ms"] > 0
    assert r["break_even_steps"] == pytest.approx(
        r["ar_ms"] / r["mdlm_ms_per_step"])
  for fits in record["summary"]["by_batch"].values():
    assert 0 <= fits["ar_ms_vs_T"]["r2"] <= 1 + 1e-9


def test_fitted_crossover_only_where_ar_grows_faster():
  crossover = script("ar_vs_parallel_latency").fitted_crossover_length
  line = lambda slope, intercept: {"slope": slope, "intercept": intercept}
  # AR 2 ms/token from 0, MDLM 1 ms/token from 10 ms: equal at T = 10.
  assert crossover(line(2.0, 0.0), line(1.0, 10.0)) == pytest.approx(10.0)
  # MDLM grows faster: beyond the crossing it is the slower one.
  assert crossover(line(0.7, -3.49), line(4.0, -3.59)) is None
  assert crossover(line(1.0, 0.0), line(1.0, 5.0)) is None  # parallel
  assert crossover(line(2.0, 5.0), line(1.0, 1.0)) is None  # at T < 0


def test_training_rows(records):
  _, record = records["parallel_training"]
  rows = record["rows"]
  assert {r["objective"] for r in rows} == {"ar", "mdlm"}
  for r in rows:
    assert r["step_ms"] > 0
    assert r["sequential_ms"] == pytest.approx(
        r["length"] * next(s["step_ms"] for s in rows if s["length"] == 2
                           and s["objective"] == r["objective"]))


def test_multimodality_rates_match_closed_form(records):
  _, record = records["multimodality"]
  rows = record["rows"]
  assert {r["decoder"] for r in rows} == {"mdlm", "llada"}
  assert len({r["w"] for r in rows}) >= 2 and len({r["steps"] for r in rows}) >= 2
  for r in rows:
    p, n = r["closed_form"], r["rows"]
    if p == 0:
      assert r["rate"] == 0, r
    else:
      assert abs(r["rate"] - p) <= 3 * math.sqrt(p * (1 - p) / n), r
  one_step = [r for r in rows if r["steps"] == 1 and r["w"] == 0.5]
  assert all(r["closed_form"] == pytest.approx(0.5) for r in one_step)


def brute_force_mdlm(length, steps, w):
  """P(neither) by enumerating every assignment of unmasking steps."""
  total = 0.0
  for assignment in itertools.product(range(steps), repeat=length):
    first = min(assignment)
    m = assignment.count(first)
    total += 1 - w ** m - (1 - w) ** m
  return total / steps ** length


def brute_force_llada(length, steps, w):
  """P(neither) by enumerating LLaDA's first-step draws: the ceil(L / K)
  most confident (drawn token's probability; ties leftmost) are committed."""
  first = -(-length // steps)
  total = 0.0
  for modes in itertools.product((0, 1), repeat=length):
    p = math.prod(w if m == 0 else 1 - w for m in modes)
    confidence = [w if m == 0 else 1 - w for m in modes]
    order = sorted(range(length), key=lambda i: (-confidence[i], i))
    committed = {modes[i] for i in order[:first]}
    total += p * (len(committed) > 1)
  return total


@pytest.mark.parametrize("length,steps,w", [(2, 1, 0.5), (2, 3, 0.8),
                                            (3, 2, 0.5), (3, 2, 0.8),
                                            (3, 4, 0.7), (4, 3, 0.6),
                                            (5, 2, 0.3), (4, 1, 0.5)])
def test_closed_forms(length, steps, w):
  mm = script("multimodality")
  assert mm.mdlm_neither_rate(length, steps, w) == pytest.approx(
      brute_force_mdlm(length, steps, w))
  if length == 2:
    assert mm.mdlm_neither_rate(2, steps, w) == pytest.approx(
        2 * w * (1 - w) / steps)
  assert mm.llada_neither_rate(length, steps, w) == pytest.approx(
      brute_force_llada(length, steps, w))
  assert mm.llada_neither_rate(length, length, w) == 0


def test_two_mode_denoiser_is_exact():
  mm = script("multimodality")
  import jax.numpy as jnp  # noqa: PLC0415 (after the scripts set up jax)
  den = mm.TwoModeDenoiser(2)
  m = mm.MASK_ID
  a, b = mm.mode_token(0, 0), mm.mode_token(1, 0)
  c, d = mm.mode_token(0, 1), mm.mode_token(1, 1)
  tokens = jnp.asarray([[m, m], [a, m], [m, d], [a, d]], jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(2), tokens.shape)
  probs = np.exp(np.asarray(den(jnp.asarray([0.8, 0.2]), tokens,
                                positions).logits))
  np.testing.assert_allclose(probs[0, 0, [a, c]], [0.8, 0.2], rtol=1e-6)
  np.testing.assert_allclose(probs[1, 1, [b, d]], [1.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(probs[2, 0, [a, c]], [0.0, 1.0], atol=1e-6)
  np.testing.assert_allclose(probs[3, 0, [a, c]], [0.8, 0.2], rtol=1e-6)


def test_gumbel_record_and_mechanism(records):
  gp = script("gumbel_precision")
  _, record = records["gumbel_precision"]
  parts = {r["part"] for r in record["rows"]}
  assert parts == {"A", "B", "C"}
  for r in record["rows"]:
    if r["part"] == "C":  # Monte Carlo against the closed form
      assert abs(r["z"]) < 4, r
    if r["part"] == "B":  # truncation only ever removes entropy
      assert r["entropy_float32"] <= r["entropy_high"] + 1e-9
      assert r["entropy_high"] == pytest.approx(r["entropy_exact"], abs=1e-4)
  p = gp.zipf(1000)
  np.testing.assert_allclose(gp.joint_draw_distribution(p, 8, 1e-30), p,
                             rtol=1e-9)
  assert gp.win_weight(1e-3, 1e-12) == pytest.approx(1e-3, rel=1e-6)


def test_batch_and_length_rows(records):
  _, record = records["batch_and_length"]
  rows = record["rows"]
  assert {r["sweep"] for r in rows} == {"batch", "length"}
  for r in rows:
    assert r["speedup_over_ar"] == pytest.approx(r["ar_ms"] / r["ms"])
    assert r["ar_nfe"] == r["new_tokens"]


def test_bad_inputs():
  mm = script("multimodality")
  with pytest.raises(ValueError, match="steps=0"):
    mm.mdlm_neither_rate(2, 0, 0.5)
  with pytest.raises(ValueError, match="w=1.5"):
    mm.llada_neither_rate(2, 1, 1.5)
  with pytest.raises(ValueError, match="gumbel_noise='float64'"):
    SamplingConfig(gumbel_noise="float64")
  with pytest.raises(ValueError, match="verdict='maybe'"):
    claims.write(
        "/nonexistent", claim="x", title="x", source="x", statement="x",
        verdict="maybe", our_number="x", method="x", summary={}, rows=[{}],
        figure=None, cmd="x")
