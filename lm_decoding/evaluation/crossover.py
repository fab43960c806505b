"""The crossover, read off the measured rows of a comparison.

Where a decoder's median latency is below the baseline's minimum
(`compare.baseline`, cached AR by default) at the same B and T, and the
break-even step count K* = (baseline ms per sequence) / (ms per full forward
pass over prompt + T positions, from the full-pass row with the most NFE at
that B and T): a decoder making fewer than K* full passes beats the baseline
there. `report.write` puts both in report.md.
"""

from __future__ import annotations

from collections.abc import Sequence


def _baseline_rows(rows, baseline):
  return {(r["batch_size"], r["output_length"]): r for r in rows
          if baseline in r["series"]}


def faster(rows: Sequence[dict], baseline: str
           ) -> dict[tuple[str, int], list[int]]:
  """{(decoder, B): output lengths T where it is faster than the baseline},
  for every row that is not the baseline's.

  Faster means its median time is below the baseline's minimum: a margin
  that noise between two decoders doing the same work rarely crosses.
  """
  base = _baseline_rows(rows, baseline)
  out = {}
  for r in rows:
    ref = base.get((r["batch_size"], r["output_length"]))
    if ref is None or ref is r:
      continue
    wins = out.setdefault((r["series"][0], r["batch_size"]), [])
    if r["ms_median"] < ref["ms_min"]:
      wins.append(r["output_length"])
  return out


def sentence(rows: Sequence[dict], baseline: str) -> str:
  """The crossover in one sentence."""
  wins = {k: ts for k, ts in faster(rows, baseline).items() if ts}
  lengths = sorted({r["output_length"] for r in rows})
  batches = sorted({r["batch_size"] for r in rows})
  if not wins:
    return (f"No decoder was faster than {baseline} (its median time below "
            f"{baseline}'s minimum) at any "
            f"measured output length T in {lengths} and batch size B in "
            f"{batches}.")
  parts = [f"{label} at B={b} for T = {', '.join(map(str, ts))}"
           for (label, b), ts in wins.items()]
  return (f"Faster than {baseline} (median time below {baseline}'s "
          "minimum): " + "; ".join(parts)
          + f"; every other decoder, B in {batches} and T in {lengths}: "
          "never.")


def break_even_steps(rows: Sequence[dict], baseline: str
                     ) -> dict[tuple[int, int], float]:
  """{(B, T): K*}: full forward passes costing one baseline decode of T.

  K* = baseline ms min / (ms min / NFE) of the full-pass row (`full_pass`:
  every call over B x (P + T) positions) with the most NFE at that B, T.
  """
  base = _baseline_rows(rows, baseline)
  out = {}
  for (b, t), ref in base.items():
    full = [r for r in rows if r.get("full_pass") and r["batch_size"] == b
            and r["output_length"] == t and r is not ref]
    if full:
      most = max(full, key=lambda r: r["nfe"])
      out[b, t] = ref["ms_min"] / (most["ms_min"] / most["nfe"])
  return out
