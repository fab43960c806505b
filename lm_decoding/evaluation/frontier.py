"""The verdict of a comparison: which decoder is worth it, at what quality.

Pure functions over the rows `comparison.run` measures (dicts with
"decoder", "batch_size", "output_length", "ms_min", "nfe" and, at the
scored batch size, "gen_ppl" and "entropy").

- A `Point` is one decoder at one (B, T): its latency (ms min of the batch
  call: every row finishes with the batch, so each sequence's latency), its
  tokens per forward TPF = T / NFE, and its quality. Quality is scored at
  the largest batch only (EOS mode, `comparison.run`); a row decodes the
  same in any batch (per-row keys), so those scores stand for the decoder
  at every B.
- Two references: samplers are judged against AR sampling (the baseline,
  cached AR at the one temperature), greedy and deterministic decoders
  (temperature 0: AR greedy, threshold / confidence orderings at
  temperature 0, Jacobi, self-speculation) against AR greedy on the same
  prompts (`compare.greedy_baseline`), as Fast-dLLM, dParallel and d3LLM
  compare greedy with greedy. A row names its reference in
  "judged_against" (`entries.judged_against`); rows without one are held to
  the baseline. A decoder is within `Tolerance` when its gen-PPL under the
  evaluator is at most (1 + gen_ppl) times its reference's and its entropy
  at most `entropy` nats below. Both bounds are one-sided: a lower gen-PPL or a higher
  entropy is no fault. Entropy guards gen-PPL: repetitive text scores a
  flattering gen-PPL at a low entropy (Zheng et al. 2024).
- The Pareto front at one (B, T) and reference: among the decoders within the entropy
  tolerance, those no other beats on both latency and gen-PPL (lower both;
  a point equal on both to another is kept, as neither beats it).
- The verdict at one (B, T) and reference: the front, and the fastest
  decoder other than the reference that is within tolerance and faster than
  the reference, with its speed-up (reference ms / its ms); if there is
  none, the nearest miss: the faster-than-reference decoder with the
  smallest tolerance excess, else (none is faster) the least slow decoder
  within tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Tolerance:
  """How far from AR sampling's quality a decoder may be and still count.

  Attributes:
    gen_ppl: relative, > 0: gen-PPL at most (1 + gen_ppl) x the baseline's.
    entropy: nats, > 0: entropy at least the baseline's minus this.
  Raises:
    ValueError: a value that is not a finite number > 0 (the message names
      the `compare.tolerance_*` option it comes from).
  """

  gen_ppl: float = 0.10
  entropy: float = 0.10

  def __post_init__(self):
    for name in ("gen_ppl", "entropy"):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, float))
          or not 0 < value < math.inf):
        raise ValueError(f"compare.tolerance_{name}={value!r} must be a "
                         "finite number > 0")

  def excess(self, point: "Point", reference: "Point") -> float:
    """How far `point` is outside the tolerance, in units of it: the larger
    of (gen-PPL ratio - 1) / gen_ppl and entropy deficit / entropy (<= 1
    within, up to rounding; `within` decides)."""
    return max((point.gen_ppl / reference.gen_ppl - 1) / self.gen_ppl,
               (reference.entropy - point.entropy) / self.entropy)

  def within(self, point: "Point", reference: "Point") -> bool:
    return (point.gen_ppl <= reference.gen_ppl * (1 + self.gen_ppl)
            and self.keeps_entropy(point, reference))

  def keeps_entropy(self, point: "Point", reference: "Point") -> bool:
    return point.entropy >= reference.entropy - self.entropy

  def describe(self, baseline: str) -> str:
    return (f"gen-PPL at most {self.gen_ppl:.0%} above {baseline}'s and "
            f"entropy at most {self.entropy:.2f} nats below")


@dataclasses.dataclass(frozen=True)
class Point:
  """One decoder at one (B, T).

  Attributes:
    label: the row's decoder label.
    batch_size: B.
    output_length: T.
    ms: latency, ms min of the batch call.
    gen_ppl: gen-PPL of its samples under the evaluator.
    entropy: mean unigram entropy of its samples, nats.
    tpf: tokens per forward, T / NFE (generated tokens per row per call).
    reference: the label of the row it is judged against ('' = the
      comparison's baseline, AR sampling).
  """

  label: str
  batch_size: int
  output_length: int
  ms: float
  gen_ppl: float
  entropy: float
  tpf: float
  reference: str = ""


def points(rows: Sequence[dict]) -> list[Point]:
  """One `Point` per row whose decoder was scored at its T (in row order).

  Quality comes from the row of the same decoder and T that carries
  "gen_ppl" (the largest batch); rows of a decoder never scored are left
  out.
  """
  scored = {(r["decoder"], r["output_length"]): r for r in rows
            if r.get("gen_ppl") is not None}
  out = []
  for r in rows:
    q = scored.get((r["decoder"], r["output_length"]))
    if q is None:
      continue
    out.append(Point(label=r["decoder"], batch_size=r["batch_size"],
                     output_length=r["output_length"], ms=r["ms_min"],
                     gen_ppl=q["gen_ppl"], entropy=q["entropy"],
                     tpf=r["output_length"] / r["nfe"],
                     reference=r.get("judged_against") or ""))
  return out


def pareto_front(candidates: Sequence[Point]) -> list[Point]:
  """The points no other point beats on both ms and gen-PPL, by ms.

  A point is beaten (dominated) by one at most as slow and at most as
  perplexed, and strictly better on one of the two; points equal on both
  are all kept.
  """
  front = [p for p in candidates if not any(
      q.ms <= p.ms and q.gen_ppl <= p.gen_ppl
      and (q.ms < p.ms or q.gen_ppl < p.gen_ppl) for q in candidates)]
  return sorted(front, key=lambda p: (p.ms, p.gen_ppl))


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What one (B, T) says (see the module docstring).

  Attributes:
    reference: the reference's point (AR sampling, or AR greedy for the
      greedy decoders).
    front: the Pareto front, by ms.
    fastest: the fastest decoder within tolerance and faster than the
      baseline, or None.
    nearest_miss: when `fastest` is None, the nearest miss (or None when no
      other decoder was measured); else None.
    group: every point judged here (the reference's among them), in the
      order of `points`.
  """

  reference: Point
  front: tuple[Point, ...]
  fastest: Point | None
  nearest_miss: Point | None
  group: tuple[Point, ...] = ()

  def speedup(self, point: Point) -> float:
    """Reference ms / the point's ms (> 1: faster than the reference)."""
    return self.reference.ms / point.ms

  @property
  def judged_against(self) -> str:
    """The reference's label."""
    return self.reference.label


def verdicts(all_points: Sequence[Point], baseline: str,
             tolerance: Tolerance) -> list[Verdict]:
  """One `Verdict` per (B, T) and reference that has a point there, by (T,
  B), the baseline's first.

  Args:
    all_points: from `points`; a point's `reference` ('' = `baseline`)
      says which group it is judged in.
    baseline: the label of AR sampling's row.
    tolerance: the quality tolerance.
  Raises:
    ValueError: no point of the baseline (the label is named).
  """
  groups: dict[tuple[int, int, bool, str], list[Point]] = {}
  for p in all_points:
    ref = p.reference or baseline
    groups.setdefault((p.output_length, p.batch_size, ref != baseline, ref),
                      []).append(p)
  out = []
  for key in sorted(groups):
    group = groups[key]
    reference = next((p for p in group if p.label == key[3]), None)
    if reference is None:
      continue
    others = [p for p in group if p is not reference]
    front = pareto_front([p for p in group
                          if tolerance.keeps_entropy(p, reference)])
    faster = [p for p in others if p.ms < reference.ms]
    good = [p for p in faster if tolerance.within(p, reference)]
    fastest = min(good, key=lambda p: p.ms) if good else None
    miss = None
    if fastest is None and faster:
      miss = min(faster, key=lambda p: tolerance.excess(p, reference))
    elif fastest is None and others:
      # None faster: the least slow within tolerance, else the least outside.
      within = [p for p in others if tolerance.within(p, reference)]
      miss = (min(within, key=lambda p: p.ms) if within
              else min(others, key=lambda p: tolerance.excess(p, reference)))
    out.append(Verdict(reference=reference, front=tuple(front),
                       fastest=fastest, nearest_miss=miss, group=tuple(group)))
  if not any(v.judged_against == baseline for v in out):
    raise ValueError(f"baseline={baseline!r} has no scored row; labels: "
                     f"{sorted({p.label for p in all_points})}")
  return out


def _ms(ms: float) -> str:
  """Whole ms from 100 ms up, else 3 significant digits."""
  return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def _quality(point: Point, reference: Point) -> str:
  return (f"gen-PPL {point.gen_ppl / reference.gen_ppl - 1:+.0%}, entropy "
          f"{point.entropy - reference.entropy:+.2f} nats")


def verdict_lines(found: Sequence[Verdict], baseline: str,
                  tolerance: Tolerance) -> list[str]:
  """The verdict in a few lines of text (console and report.md).

  The first line states the tolerance and the references; then per (T, B)
  and reference one line for the front and one for the fastest decoder
  within tolerance (or "none on this hardware" and the nearest miss). Lines
  of the greedy reference say "greedy vs <its label>".
  """
  greedy = sorted({v.judged_against for v in found} - {baseline})
  lines = [f"Verdict: 'within tolerance' of AR sampling ({baseline}) means "
           f"{tolerance.describe(baseline)}; the Pareto front (ms per "
           "sequence, gen-PPL) is over the decoders within the entropy "
           "tolerance; quality is scored at the largest batch."
           + (f" Greedy and deterministic decoders (temperature 0) are held "
              f"to AR greedy ({', '.join(greedy)}) the same way, with their "
              f"agreement with its tokens reported." if greedy else "")]
  for v in found:
    ref = v.judged_against
    where = f"T={v.reference.output_length} B={v.reference.batch_size}"
    if ref != baseline:
      where += f", greedy vs {ref}"
    front = "; ".join(f"{p.label} ({_ms(p.ms)} ms, gen-PPL {p.gen_ppl:.0f}, "
                      f"TPF {p.tpf:.2f})" for p in v.front)
    lines.append(f"{where}: Pareto front: {front}")
    if v.fastest is not None:
      p = v.fastest
      lines.append(
          f"{where}: fastest within tolerance: {p.label}, "
          f"{v.speedup(p):.2f}x faster than {ref} ({_ms(p.ms)} vs "
          f"{_ms(v.reference.ms)} ms; {_quality(p, v.reference)})")
    elif v.nearest_miss is None:
      lines.append(f"{where}: fastest within tolerance: none on this "
                   "hardware (no other decoder in this comparison)")
    else:
      p = v.nearest_miss
      lines.append(
          f"{where}: fastest within tolerance: none on this hardware; "
          f"nearest miss: {p.label}, {v.speedup(p):.2f}x the speed of "
          f"{ref} ({_ms(p.ms)} vs {_ms(v.reference.ms)} ms; "
          f"{_quality(p, v.reference)})")
  return lines


@dataclasses.dataclass(frozen=True)
class Summary:
  """`points`, `verdicts` and `verdict_lines` of one comparison's rows."""

  points: list[Point]
  verdicts: list[Verdict]
  lines: list[str]


def summarize(rows: Sequence[dict], baseline: str,
              tolerance: Tolerance) -> Summary:
  """The verdict of `rows` (see the module docstring).

  Raises:
    ValueError: the baseline has no scored row.
  """
  all_points = points(rows)
  found = verdicts(all_points, baseline, tolerance)
  return Summary(all_points, found,
                 verdict_lines(found, baseline, tolerance))
