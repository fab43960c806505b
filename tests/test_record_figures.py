"""The figures of README.md and docs/*.md against the records they cite.

- Every table under a `<!-- record: ... -->` marker equals its rendering from
  the record (`lm_decoding.record_figures`), as docs/config_reference.md
  equals its rendering from the configs.
- The renderer reads what it should and refuses what it cannot read.
- The figures quoted in the prose (the README's verdict, run times, known
  limits; metrics.md's defaults; adaptation.md's ranges) are rebuilt here
  from the record or config they come from and must appear in the page.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import re
import statistics

import pytest

from lm_decoding import config_reference
from lm_decoding import record_figures
from lm_decoding.evaluation import frontier
from lm_decoding.evaluation import records

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"


def text(page: str) -> str:
  """The page with its whitespace runs made single spaces (quotes wrap)."""
  return " ".join((ROOT / page).read_text().split())


def rows(name: str) -> list[dict]:
  return record_figures.read_rows(RESULTS / name / "results.csv")


def run_json(name: str) -> dict:
  return json.loads((RESULTS / name / "run.json").read_text())


def ms(name: str, decoder: str, batch_size: int, output_length: int = 256
       ) -> float:
  return record_figures.find(rows(name), decoder, batch_size,
                             output_length)["ms_min"]


def config(name: str, preset: str = ""):
  return config_reference.load_config(ROOT / "configs" / f"{name}.py", preset)


def fronts(verdict: list[str]) -> dict[int, list[tuple[str, str, str]]]:
  """{B: [(label, ms, gen-PPL) of each front point]} from verdict lines."""
  out = {}
  for line in verdict:
    match = re.match(r"T=\d+ B=(\d+): Pareto front: (.*)", line)
    if match:
      out[int(match.group(1))] = re.findall(
          r"(?:; )?(.+?) \(([\d.]+) ms, gen-PPL (\d+), TPF [\d.]+\)",
          match.group(2))
  return out


# --- the rendered tables ----------------------------------------------------


@pytest.mark.parametrize("page", record_figures.pages(), ids=lambda p: p.name)
def test_record_tables_equal_their_rendering(page):
  committed = page.read_text()
  assert record_figures.render_page(committed) == committed, (
      f"{page.name} differs from its records: python -m "
      "lm_decoding.record_figures")


def test_the_main_tables_are_rendered():
  counts = {p.name: sum(bool(record_figures.MARKER.match(line))
                        for line in p.read_text().splitlines())
            for p in record_figures.pages()}
  assert counts["README.md"] == 1 and counts["results.md"] == 3
  assert counts["adaptation.md"] == 2  # the adapted grid, and with the student


# --- the renderer -------------------------------------------------------------


@pytest.fixture
def record(tmp_path) -> pathlib.Path:
  """A results.csv as the main job writes it (records.write_csv)."""
  def row(decoder, b, nfe, ms_min, tokens, gen_ppl=None, entropy=None):
    return {"decoder": decoder, "batch_size": b, "output_length": 16,
            "nfe": nfe, "forward_tokens": tokens, "ms_min": ms_min,
            "ms_median": ms_min * 1.25, "spread": 0.125,
            "gen_ppl": gen_ppl, "entropy": entropy}
  records.write_csv([
      row("AR cached", 1, 16, 10.0, {"model": 31}),
      row("spec g=4", 1, 24, 12.5, {"draft": 1200, "target": 40}),
      row("AR cached", 8, 16, 20.0, {"model": 248}, 100.04, 3.456),
      row("spec g=4", 8, 30, 40.0, {"draft": 9600, "target": 320}, 110.0,
          3.5)], tmp_path / "results.csv")
  return tmp_path


def test_render_fills_known_columns_and_keeps_written_ones(record):
  page = "\n".join([
      "Intro.", "<!-- record: results.csv B=8 -->",
      "| note | decoder | NFE | fwd tokens | ms min | x row 1 | gen-PPL / entropy |",
      "|---|---|---|---|---|---|---|",
      "| mine | stale | 1 | 1 | 1 | 1 | 1 |", "| also mine |", "", "After."])
  assert record_figures.render_page(page, record).split("\n") == [
      "Intro.", "<!-- record: results.csv B=8 -->",
      "| note | decoder | NFE | fwd tokens | ms min | x row 1 | gen-PPL / entropy |",
      "|---|---|---|---|---|---|---|",
      "| mine | AR cached | 16 | model 248 | 20.0 | 1.00 | 100.0 / 3.46 |",
      "| also mine | spec g=4 | 30 | draft 9,600, target 320 | 40.0 | 0.500 "
      "| 110.0 / 3.50 |", "", "After."]


def test_render_joins_batch_sizes_in_the_order_asked(record):
  page = "\n".join([
      '<!-- record: results.csv T=16 B=1/8 decoders="spec g=4; AR cached" -->',
      "| decoder (T = 16) | B | NFE | TPF | ms median | spread | gen-PPL (B = 8) | entropy |",
      "|---|---|---|---|---|---|---|---|"])
  assert record_figures.render_page(page, record).split("\n")[3:] == [
      "| spec g=4 | 1 / 8 | 24 / 30 | 0.67 / 0.53 | 15.6 / 50.0 | 0.12 / 0.12 "
      "| 110.0 | 3.50 |",
      "| AR cached | 1 / 8 | 16 / 16 | 1.00 / 1.00 | 12.5 / 25.0 | 0.12 / "
      "0.12 | 100.0 | 3.46 |"]


@pytest.mark.parametrize("marker, header, match", [
    ("results.csv colour=red", "| decoder |", "options"),
    ("results.csv B", "| decoder |", "options"),
    ('results.csv B=8 decoders="no such"', "| decoder |", "'no such'"),
    ('results.csv decoders="AR cached"', "| decoder |", "2 rows"),  # two B
    ("results.csv B=8", "| only prose |", "no column of the record"),
    ("missing.csv B=8", "| decoder |", "no such file"),
])
def test_render_refuses_what_it_cannot_read(record, marker, header, match):
  with pytest.raises(ValueError, match=match):
    record_figures.render_page(f"<!-- record: {marker} -->\n{header}\n|---|\n",
                               record)


def test_render_refuses_a_marker_without_a_table(record):
  with pytest.raises(ValueError, match="no table"):
    record_figures.render_page("<!-- record: results.csv -->\ntext", record)


# --- the figures quoted in the prose --------------------------------------


@pytest.mark.parametrize("name", ["tiny_cpu_2core", "base_cpu_2core",
                                  "base_cpu_2core_view_student"])
def test_record_verdicts_are_what_the_code_says_of_their_rows(name):
  """The verdicts the README and results.md quote follow from the CSV."""
  table = [{**r, **{k: int(r[k]) for k in
                    ("batch_size", "output_length", "nfe")}}
           for r in rows(name)]
  compare = run_json(name)["config"]["compare"]
  tolerance = frontier.Tolerance(compare["tolerance_gen_ppl"],
                                 compare["tolerance_entropy"])
  assert frontier.summarize(table, compare["baseline"], tolerance).lines == (
      run_json(name)["verdict"])


def test_readme_verdict_quotes_the_tiny_record():
  readme = text("README.md")
  verdict = run_json("tiny_cpu_2core")["verdict"]
  front = fronts(verdict)
  assert [p[0] for p in front[1]] == [p[0] for p in front[8]] == [
      "AR cached", "MDLM K=32 skeleton + AR polish p>=0.01 gamma=8"]
  (ar1, polish1), (ar8, polish8) = front[1], front[8]
  assert (f"cached AR ({ar1[1]} / {ar8[1]} ms, gen-PPL {ar8[2]}) and MDLM "
          f"K=32 skeleton + AR polish ({polish1[1]} / {polish8[1]} ms, "
          f"gen-PPL {polish8[2]})") in readme
  assert all("fastest within tolerance: none" in line
             for line in verdict if "fastest" in line)
  assert "and faster: none" in readme
  compare = config("tiny").compare
  assert (f"gen-PPL at most {compare.tolerance_gen_ppl:.0%} above, entropy at "
          f"most {compare.tolerance_entropy:.1f} nats below") in readme
  uniform = record_figures.find(rows("tiny_cpu_2core"), "uniform EB K=32", 8,
                                256)
  assert (f"(entropy {uniform['entropy']:.2f}) and revises "
          f"{uniform['self_correction']:.0%} of its acceptances") in readme
  load = run_json("tiny_cpu_2core")["hardware"]["load_average_1min"]
  assert (f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the "
          f"end; {compare.timed_runs} timed runs per row") in readme


def test_readme_base_verdict_quotes_the_view_student_record():
  name = "base_cpu_2core_view_student"
  verdict = run_json(name)["verdict"]
  spec = "view-distilled self-speculative gamma=8 temp=0"
  fastest = [line for line in verdict
             if line.startswith("T=256 B=1, greedy vs AR greedy temp=0: "
                                f"fastest within tolerance: {spec}, ")]
  match = re.search(r", ([\d.]+)x faster than AR greedy temp=0 \((\d+) vs "
                    r"(\d+) ms; gen-PPL ([+-]\d+%), entropy (-?[\d.]+) nats",
                    fastest[0])
  speedup, spec_ms, ar_ms, ppl, entropy = match.groups()
  slow = ms(name, "AR greedy temp=0", 8) / ms(name, spec, 8)
  b1 = record_figures.find(rows(name), spec, 1, 256)
  assert (f"self-speculation of the view-distilled student ({b1['nfe']:.0f} "
          f"calls for 256 tokens) is on the greedy front, {speedup}x AR "
          f"greedy's speed within tolerance ({spec_ms} vs {ar_ms} ms, gen-PPL "
          f"{ppl}, entropy {entropy} nats), {slow:.2f}x at B = 8"
          ) in text("README.md")


def test_readme_adapted_front_is_cached_ar_alone():
  front = fronts(run_json("adapted_base_cpu_2core")["verdict"])
  assert {b: [p[0] for p in points] for b, points in front.items()} == {
      1: ["AR cached"], 8: ["AR cached"]}
  assert "cached AR alone on the front at B = 1 and 8" in text("README.md")


def test_run_times_quote_the_records():
  readme, results = text("README.md"), text("docs/results.md")
  fresh = (ROOT / "benchmarks" / "fresh_clone" / "README.md").read_text()
  install_s, main_job_s = map(int, re.search(
      r"install_s=(\d+) main_job_s=(\d+)", fresh).groups())
  tiny_s = run_json("tiny_cpu_2core")["wall_s"]
  shortest, longest = sorted([main_job_s, tiny_s])
  assert (f"install {install_s} s with pip's wheel cache warm, tests about 20 "
          f"min, the main job {math.floor(shortest / 60)}-"
          f"{math.ceil(longest / 60)} min") in readme
  assert f"took {tiny_s:.0f} s on 2 cores" in results
  assert f"main job {main_job_s} s" in results
  full_s = (RESULTS / "full_grid_cpu_2core" / "report.md").read_text()
  minutes = re.search(r"of the job's ([\d.]+) min", full_s).group(1)
  assert f"256 in {minutes} minutes, idle" in results
  base = run_json("base_cpu_2core")
  start, end = base["hardware"]["load_average_1min"]
  assert (f"(load {start:.1f} at the start, {end:.1f} at the end, "
          f"{base['wall_s'] / 60:.1f} min)") in results


def test_cached_ar_quotes_name_their_runs():
  readme = text("README.md")
  full = ms("full_grid_cpu_2core", "AR cached", 8)
  ar8 = fronts(run_json("tiny_cpu_2core")["verdict"])[8][0][1]
  fresh = fronts((ROOT / "benchmarks" / "fresh_clone" / "README.md"
                  ).read_text().splitlines())[8][0][1]
  load = run_json("tiny_cpu_2core")["hardware"]["load_average_1min"]
  assert (f"cached AR takes {full:.1f} ms here, {ar8} ms there (load "
          f"{load[0]:.1f}-{load[1]:.1f}, "
          f"{config('tiny').compare.timed_runs} timed runs) and {fresh} in an "
          "idle fresh-clone run") in readme
  assert f"idle 2-core CPU, {config('full').compare.timed_runs} timed runs" in (
      readme)
  assert f"took {full:.1f} ms in this record and {ar8} ms" in text(
      "docs/fast_dllm.md")


def test_readme_grid_sizes_quote_the_configs_and_the_record():
  tiny, full = config("tiny").compare, config("full").compare
  recorded = json.loads((RESULTS / "full_grid_cpu_2core" / "run.json"
                         ).read_text())["config"]["compare"]
  lengths = " and ".join(
      [", ".join(map(str, full.output_lengths[:-1])), str(
          full.output_lengths[-1])])
  recorded_lengths = " and ".join(map(str, recorded["output_lengths"]))
  assert (f"the {len(tiny.decoders)} decoders of `configs/tiny.py`; "
          f"`configs/full.py` holds {len(full.decoders)} at T = {lengths}, and "
          f"its one record ran the {len(recorded['decoders'])} of its day at "
          f"T = {recorded_lengths}") in text("README.md")


def test_results_and_docstrings_count_the_grids():
  tiny, full, base = (config(n).compare for n in ("tiny", "full", "base"))
  recorded = {n: len(run_json(n)["config"]["compare"]["decoders"])
              for n in ("tiny_cpu_2core", "base_cpu_2core")}
  results = text("docs/results.md")
  assert (f"default grid ({recorded['tiny_cpu_2core']} decoders in its record, "
          f"{len(tiny.decoders)} in `configs/tiny.py` today") in results
  assert f"(`configs/full.py`: {len(full.decoders)} decoders at T" in results
  assert (f"{recorded['base_cpu_2core']} decoders `configs/base.py` held then "
          f"({len(base.decoders)} today)") in results
  assert f"main job: {len(full.decoders)} decoders x" in (
      ROOT / "configs" / "full.py").read_text()
  main = (ROOT / "experiments" / "compare_decoding.py").read_text()
  assert (f"({len(tiny.decoders)} decoders, each decoding family" in main
          and f"{recorded['tiny_cpu_2core']} in its record" in main
          and f"grid ({len(full.decoders)} decoders at T" in main)


def test_cost_model_quotes_its_validation_record():
  report = (RESULTS / "cost_model" / "report.md").read_text()
  median, saved = re.search(r"Median \|error\| (\d+)%.+?with the saved profile "
                            r"(\d+)%", report).groups()
  points = [line.split("|")[1:-1] for line in report.splitlines()
            if re.match(r"\| (small|medium|large) \|", line)
            and line.count("|") == 15]
  ratios = [float(p[9]) / float(p[8]) for p in points
            if p[4].strip() == "ar" and p[3].strip() in ("8", "32")]
  b1 = sorted(-int(p[11].strip().rstrip("%")) for p in points
              if p[4].strip() == "ar" and p[3].strip() == "1")
  page = text("docs/cost_model.md")
  assert (f"|error| of {median}% with the profile re-measured right after each "
          f"point's runs ({saved}% with the saved profile") in page
  assert f"predicted {b1[0]}-{b1[-1]}% below their measured time" in page
  spread = f"{min(ratios):.1f}-{max(ratios):.1f}x"
  assert f"B = 8 and 32 are {spread} slower than predicted" in page
  assert f"(median error {median}%, one-sided; few-row AR GEMMs {spread})" in (
      text("README.md"))


def test_dual_cache_quotes_the_main_job_records():
  threshold = "threshold tau=0.9 block=32 cache={}"
  tiny, base = (record_figures.find(rows(n), "threshold tau=0.9 block=32 "
                                    "cache=dual", 8, 256)
                for n in ("tiny_cpu_2core", "base_cpu_2core"))
  none, dual = (record_figures.find(rows("full_grid_cpu_2core"),
                                    threshold.format(c), 8, 256)
                for c in ("none", "dual"))
  assert (f"max logit error {tiny['max_logit_error']:.4f} and "
          f"{tiny['agreement']:.1%} token agreement with the uncached decoder on "
          f"the tiny set, {base['max_logit_error']:.1f} and "
          f"{base['agreement']:.0%} on the base set") in text("docs/fast_dllm.md")
  assert (f"max logit error {base['max_logit_error']:.1f} and "
          f"{base['agreement']:.0%} token agreement "
          f"({tiny['max_logit_error']:.4f} and {tiny['agreement']:.1%} on the "
          "tiny set)") in text("docs/results.md")
  cut = none["forward_tokens_model"] / dual["forward_tokens_model"]
  assert f"the dual cache cuts forward tokens {cut:.0f}x" in text(
      "docs/fast_dllm.md")


def test_scale_out_quotes_the_parity_record():
  parity = (ROOT / "benchmarks" / "hub_import" / "parity.md").read_text()
  diffs = [float(d) for d in re.findall(
      r"^\.?(?:gpt2|llama|mistral|qwen)[\w-]*: max \|logit difference\| "
      r"([\d.e+-]+)$", parity, re.M)]
  assert len(diffs) == 15

  def short(x):
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"

  assert (f"(measured {short(min(diffs))} to {short(max(diffs))} with every "
          "parameter perturbed") in text("docs/scale_out.md")


@pytest.mark.parametrize("task, record", [
    ("sudoku4", "tasks"), ("permutation", "tasks"),
    ("countdown", "tasks_countdown")])
def test_task_tables_quote_the_task_records(task, record):
  """Every row of tasks.md's table of `task` is a row of its record."""
  section = (ROOT / "docs" / "tasks.md").read_text().split(f"### {task}\n")[1]
  block = section.split("\n| model |", 1)[1].split("\n\n", 1)[0]
  table = [[c.strip() for c in line.strip("|").split("|")]
           for line in block.splitlines()[2:]]  # less the header and rule
  recorded = {(r["model"], r["decoder"], "—" if r["steps"] is None
               else f"{int(r['steps'])}"): r
              for r in rows(record) if r["task"] == task}
  assert len(table) >= 10
  for model, decoder, k, exact, valid, accuracy, nfe, ms_problem in table:
    r = recorded[model, decoder, k]
    assert [exact, valid, accuracy, nfe, ms_problem] == [
        f"{r['exact']:.3f}", f"{r['valid']:.3f}", f"{r['token_accuracy']:.3f}",
        f"{int(r['nfe'])}", f"{r['ms_per_problem']:.1f}"], (model, decoder, k)


def test_sort_rules_table_quotes_its_record():
  """Every 'setting: TPF / exact' point and every held TPF and AUP of
  tasks.md's sort table is its record's (experiments/results/tasks_sort)."""
  section = (ROOT / "docs" / "tasks.md").read_text().split(
      "## The sort task", 1)[1]
  block = section.split("\n| model | rule |", 1)[1].split("\n\n", 1)[0]
  with open(RESULTS / "tasks_sort" / "rules.csv") as f:
    points = list(csv.DictReader(f))
  with open(RESULTS / "tasks_sort" / "rules_summary.csv") as f:
    summary = {(r["model"], r["rule"]): r for r in csv.DictReader(f)}
  names = {"one cell a step": "one_a_step", "threshold": "threshold",
           "factor": "factor", "entropy bound": "entropy_bound"}
  lines = block.splitlines()[2:]
  assert len(lines) == 6
  for line in lines:
    model, rule, cells, held, aup = [c.strip().replace("*", "")
                                     for c in line.strip("|").split("|")]
    rule = names[rule]
    key = lambda setting: (setting if rule == "one_a_step"
                           else float(setting))
    mine = {key(r["setting"]): r for r in points
            if (r["model"], r["rule"]) == (model, rule)}
    quoted = re.findall(r"([\w.-]+): ([\d.]+) / ([\d.]+)", cells)
    assert quoted, line
    for setting, tpf, exact in quoted:
      r = mine[key(setting.replace("low-confidence", "low_confidence"))]
      assert (tpf, exact) == (f"{float(r['tpf']):.2f}",
                              f"{float(r['exact']):.3f}"), line
    row = summary[model, rule]
    assert held == f"{float(row['max_tpf_within_1se']):.2f}", line
    assert aup == f"{float(row['aup']):.0f}", line


@pytest.mark.parametrize("lineage", ["tiny", "base"])
def test_adaptation_tables_quote_the_lineage_records(lineage):
  """adaptation.md's adapted-against-scratch table of each set is its
  lineage record's rows: compute, bound and ratio to `ar`."""
  record = (RESULTS / "adaptation" / lineage / "lineage.md").read_text()
  members = {}
  for line in record.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("| ") and len(cells) == 11 and cells[0] != "member":
      members[cells[0]] = cells
  page = text("docs/adaptation.md")
  for name, recipe in [("bd3lm4", "block diffusion, blocks of 4, shift, "
                        "complementary masks"),
                       ("bd3lm16", "block diffusion, blocks of 16, shift, "
                        "complementary masks"),
                       ("mdlm", "full-sequence MDLM, shift, mask annealing")]:
    adapted, scratch = members[f"{name}_from_ar"], members[f"{name}_scratch"]
    assert adapted[8] == scratch[8]
    assert (f"| {recipe} | {adapted[8]} | {float(adapted[9]):.1f} "
            f"({adapted[10]}x) | {float(scratch[9]):.1f} ({scratch[10]}x) |"
            ) in page, (lineage, name)


def shows(cell: str, value: float) -> bool:
  """`cell` is `value` rounded to the digits the cell shows."""
  digits = len(cell.split(".")[1]) if "." in cell else 0
  return abs(float(cell) - value) <= 0.5 * 10**-digits + 1e-12


def test_translation_table_quotes_its_record():
  """Every row of translation.md's main table is its record's row, to the
  digits each cell shows."""
  recorded = {r["decoder"]: r for r in rows("translation")}
  page = (ROOT / "docs" / "translation.md").read_text()
  block = page.split("\n| decoder | BLEU |", 1)[1].split("\n\n", 1)[0]
  table = [[c.strip() for c in line.strip("|").split("|")]
           for line in block.splitlines()[2:]]
  assert len(table) == 11
  keys = ("bleu", "chrf", "repetition", "omission", "length_mean_signed",
          "nfe", "ms_per_sentence", "speedup_vs_ar_greedy")
  for decoder, *cells in table:
    r = recorded[decoder.replace(" = ", "=").replace(", ", " ")
                 .replace("(upsample 2)", "x2")]
    assert all(shows(c, r[k]) for c, k in zip(cells, keys, strict=True)), (
        decoder, cells, [r[k] for k in keys])


def test_ar_and_bd3lm_pages_quote_the_main_job_records():
  full, tiny, base = "full_grid_cpu_2core", "tiny_cpu_2core", "base_cpu_2core"
  ar = {b: ms(full, "AR cached", b) for b in (1, 8)}
  uncached = {b: ms(full, "AR uncached", b) for b in (1, 8)}
  page = text("docs/autoregressive.md")
  assert (f"(`full_grid_cpu_2core`: {ar[1]:.0f} ms for 256 tokens at B = 1, "
          f"{ar[8]:.0f} ms at B = 8; in the default grid's record, "
          f"`tiny_cpu_2core`, MDLM K = 8 takes {ms(tiny, 'MDLM K=8', 1):.1f} "
          f"against {ms(tiny, 'AR cached', 1):.1f} ms at B = 1)") in page
  assert (f"AR cached {ar[1]:.1f} / {ar[8]:.1f} ms at B = 1 / 8, AR uncached "
          f"{uncached[1]:.1f} / {uncached[8]:.1f} ms") in page
  assert (f"it is {ms(tiny, 'AR uncached', 1) / ms(tiny, 'AR cached', 1):.0f}x "
          "slower at B = 1 on the tiny set (`tiny_cpu_2core`") in page
  bd3 = "BD3-LM block=16 K=256"
  nfe = [record_figures.find(rows(full), bd3, b, 256)["nfe"] for b in (1, 8)]
  assert (f"tiny set {ms(full, bd3, 1):.1f} / {ms(full, bd3, 8):.1f} ms at B = 1 "
          f"/ 8 (NFE {nfe[0]:.0f} / {nfe[1]:.0f}; `full_grid_cpu_2core`), base "
          f"set {ms(base, bd3, 1):.1f} / {ms(base, bd3, 8):.1f} ms "
          "(`base_cpu_2core`") in text("docs/block_diffusion.md")


def test_masked_diffusion_page_quotes_the_main_job_records():
  page = text("docs/masked_diffusion.md")
  base = "base_cpu_2core"
  assert (f"at B = 8 MDLM K = 8 takes {ms(base, 'MDLM K=8', 8):.0f} ms against "
          f"AR's {ms(base, 'AR cached', 8):.0f} on the base set") in page
  assert (f"MDLM K = 8 takes {ms(base, 'MDLM K=8', 1):.0f} ms against AR's "
          f"{ms(base, 'AR cached', 1):.0f} ms for 256 tokens at B = 1") in page
  full = rows("full_grid_cpu_2core")
  for name, label in [("MDLM K = 8", "MDLM K=8"), ("MDLM K = 32", "MDLM K=32"),
                      ("LLaDA K = 32 block 32", "LLaDA K=32 block=32"),
                      ("MaskGIT K = 32", "MaskGIT K=32"),
                      ("AR cached", "AR cached")]:
    one, eight = (record_figures.find(full, label, b, 256) for b in (1, 8))
    first = name == "MDLM K = 8"
    assert (f"{name} {one['ms_min']:.1f} / {eight['ms_min']:.1f} ms, "
            f"{'gen-PPL ' * first}{eight['gen_ppl']:.1f} at "
            f"{'entropy ' * first}{eight['entropy']:.2f}") in page, name


def test_training_times_are_the_manifests_wall_times():
  def minutes(*members):
    return sum(json.loads((ROOT / "lm_decoding" / "pretrained" / m /
                           "manifest.json").read_text())["metrics"]["wall_s"]
               for m in members) / 60
  four = minutes("ar", "mdlm", "bd3lm", "evaluator")
  assert f"training all four took about {four:.0f} minutes" in text(
      "docs/models.md")
  bound = {m for entry in config("tiny").compare.decoders
           for m in re.findall(r"\b(?:model|target|draft)=(\w+)",
                               entry.split("|", 2)[2])}
  assert bound == {"ar", "mdlm", "bd3lm", "uniform", "draft_small"}
  six = minutes(*bound, "evaluator")
  assert (f"the default grid's six, `ar`, `mdlm`, `bd3lm`, `uniform`, "
          f"`draft_small` and the evaluator, took about {six:.0f} minutes") in (
              text("docs/corpus.md"))


def test_results_speculative_section_quotes_its_records():
  results = text("docs/results.md")
  spread = [record_figures.find(rows("base_cpu_2core"), d, 1, 256)["spread"]
            for d in ("AR cached", "MDLM K=8", "speculative small draft gamma=4")]
  assert (f"the B = 1 spread of these three rows (AR, MDLM K = 8, speculative) "
          f"is {min(spread):.0%}-{max(spread):.0%}").replace("%-", "-") in results
  measured = {}
  for name in ("speculative", "speculative_base"):
    with open(RESULTS / name / "speculative.csv") as f:
      measured[name] = [r for r in csv.DictReader(f) if r["decoder"] == "spec"]
  c = {n: [float(r["c"]) for r in rs] for n, rs in measured.items()}
  assert (f"(c = {min(c['speculative_base']):.3f}-"
          f"{max(c['speculative_base']):.3f}, against {min(c['speculative']):.2f}"
          f"-{max(c['speculative']):.2f} on the tiny set)") in results
  paper = [float(r["measured_over_predicted"]) for r in measured["speculative"]]
  assert (f"measured over predicted, is {min(paper):.2f}-{max(paper):.2f}"
          ) in results
  with open(RESULTS / "speculative" / "speculative.csv") as f:
    errors = [abs(float(r["model_error"])) for r in csv.DictReader(f)]
  assert (f"within 10% of the measured speed-up on "
          f"{sum(e <= 0.1 for e in errors)} of {len(errors)} points (median "
          f"|error| {statistics.median(errors):.1%}, largest {max(errors):.0%})"
          ) in results


def test_benchmarks_tables_quote_the_benchmark_ar_records():
  """benchmarks.md's two tables against `transformers`, row by row, to the
  digits each cell shows (T = 128 decodes)."""
  def decodes(name):
    return {(r["size"], int(r["batch"])): r for r in rows(name)
            if r["kind"] == "decode" and r["new_tokens"] == 128}
  page = (ROOT / "docs" / "benchmarks.md").read_text()
  first, second = (
      [[c.strip() for c in line.strip("|").split("|")]
       for line in block.split("\n\n", 1)[0].splitlines()[2:]]
      for block in page.split("\n| size (f32) |")[1:3])
  one, two = decodes("benchmark_ar"), decodes("benchmark_ar/machine_b")
  assert len(first) == len(second) == 3
  for size_cell, tok_s, *cells in first:
    size = size_cell.split()[0]
    ours, hf = tok_s.split(" / ")
    b1, b8 = one[size, 1], one[size, 8]
    assert shows(ours, b1["ours_tok_s"]) and shows(hf, b1["hf_tok_s"])
    assert all(shows(c, v) for c, v in zip(cells, [
        b1["speedup"], b1["ours_x_roofline"], b1["ours_x_floor"],
        b8["speedup"], b8["ours_x_roofline"]], strict=True)), size
  for size_cell, *cells in second:
    size = size_cell.split()[0]
    b1, b8, b32 = (two[size, b] for b in (1, 8, 32))
    assert all(shows(c, v) for c, v in zip(cells, [
        b1["speedup"], b1["ours_x_roofline"], b8["speedup"],
        b8["ours_x_roofline"], b32["speedup"]], strict=True)), size


def test_training_speed_tables_quote_the_benchmark_training_records():
  """training_speed.md's before/after and batch-shape tables, cell by cell."""
  def by_program(name):
    return {(r["objective"], r["program"]): r
            for r in rows(f"benchmark_training/{name}")}
  before, after = by_program("base_before"), by_program("base")
  page = (ROOT / "docs" / "training_speed.md").read_text()
  block = page.split("\n| objective | program |", 1)[1].split("\n\n", 1)[0]
  table = [[c.strip() for c in line.strip("|").split("|")]
           for line in block.splitlines()[2:]]
  assert len(table) == 6
  for objective, program, tok_before, tok_after, speedup, mfu_before, \
      mfu_after, _ in table:
    b, a = before[objective, program], after[objective, program]
    assert [tok_before.replace(",", ""), tok_after.replace(",", ""), speedup,
            mfu_before, mfu_after.strip("*")] == [
                f"{b['tokens_per_s']:.0f}", f"{a['tokens_per_s']:.0f}",
                f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}×",
                f"{b['mfu']:.3f}", f"{a['mfu']:.3f}"], (objective, program)
  shapes = [r for r in rows("benchmark_training/base_shapes")
            if r["program"] == "train step"]
  assert ("| B × L | " + " | ".join(
      f"{r['batch_size']:.0f} × {r['seq_len']:.0f}" for r in shapes) + " |"
          ) in page
  assert ("| train tokens/s | " + " | ".join(
      f"{r['tokens_per_s']:,.0f}" for r in shapes) + " |") in page
  assert ("| train MFU | " + " | ".join(f"{r['mfu']:.3f}" for r in shapes)
          + " |") in page


def test_self_speculation_page_quotes_its_records():
  folder = ROOT / "benchmarks" / "self_speculation" / "base"
  runs = [r for r in json.loads((folder / "record.json").read_text())["rows"]
          if r["decoder"] != "ar"]
  calls = json.loads((folder / "calls.json").read_text())["rows"]
  page = text("docs/self_speculation.md")
  assert all(r["identical_to_ar"] for r in runs)

  def tpf(member, batch):
    return sorted(r["tpf"] for r in runs
                  if r["member"] == member and r["batch"] == batch)
  four = next(r for r in runs if r["member"] == "bd3lm4_from_ar"
              and r["batch"] == 1 and r["gamma"] == 4)
  b8 = [r["tpf"] for r in runs if r["batch"] == 8]
  assert (f"TPF {four['tpf']:.2f} (`bd3lm4_from_ar`, B = 1, gamma 4; histogram "
          f"{four['accept_histogram']}) and "
          f"{max(tpf('bd3lm16_from_ar', 1)):.2f} (`bd3lm16_from_ar`") in page
  assert f"{min(b8):.2f}-{max(b8):.2f} at B = 8" in page
  n = [r["calls"] for r in runs]
  assert (f"{min(n)}-{max(n)} calls for 256 tokens (AR: 256), each of gamma + 1 "
          f"positions, so the time ratio cannot fall below {min(n) / 256:.2f}x"
          ) in page

  def predicted(batch, gamma):
    row = next(r for r in calls if r["member"] == "bd3lm4_from_ar"
               and r["batch"] == batch and r["gamma"] == gamma)
    t = next(r["tpf"] for r in runs if r["member"] == "bd3lm4_from_ar"
             and r["batch"] == batch and r["gamma"] == gamma)
    ms = {k: v["min"] for k, v in row["call_ms"].items()}
    return ms, (ms["draft"] + ms["verify"]) / ms["ar_step"] / t
  ms, ratio = predicted(1, 2)
  assert (f"costs {ms['draft']:.1f} ms against an AR step's {ms['ar_step']:.1f} "
          f"ms, so a round costs {(ms['draft'] + ms['verify']) / ms['ar_step']:.1f}"
          f" AR steps for {four['tpf']:.2f} tokens: predicted {ratio:.2f}x cached "
          f"AR's time (gamma 2), {predicted(1, 4)[1]:.2f}x at gamma 4, "
          f"{predicted(8, 2)[1]:.2f}x at B = 8") in page


def test_speculative_known_limit_quotes_the_records():
  readme = text("README.md")
  spec = "speculative small draft gamma=4"
  base_ar, base_spec = ms("base_cpu_2core", "AR cached", 1), ms(
      "base_cpu_2core", spec, 1)
  base13 = (ms("base_cpu_2core_view_student", "AR cached", 1),
            ms("base_cpu_2core_view_student", spec, 1))
  adapted13 = (ms("adapted_base_cpu_2core", "AR cached", 1),
               ms("adapted_base_cpu_2core", spec, 1))
  with open(RESULTS / "speculative_base" / "speculative.csv") as f:
    measured = list(csv.DictReader(f))
  sampled = [float(r["measured_speedup"]) for r in measured
             if r["draft"] == "draft_small" and r["temperature"] == "1.0"]
  lookup = [float(r["measured_speedup"]) for r in measured
            if r["decoder"] == "prompt_lookup" and r["temperature"] == "0.0"
            and r["batch_size"] == "1"]
  assert (f"speculative sampling {min(sampled):.2f}-{max(sampled):.2f}x AR "
          f"and greedy prompt lookup {lookup[0]:.2f}x (`speculative_base`, "
          f"idle), but speculative sampling {base13[0] / base13[1]:.2f}x in "
          "the base main job "
          f"({base13[1]:.0f} vs {base13[0]:.0f} ms) and "
          f"{adapted13[0] / adapted13[1]:.2f}x in the adapted one "
          f"({adapted13[1]:.0f} vs {adapted13[0]:.0f} ms)") in readme
  assert (f"runs at {base_ar / base_spec:.2f}x AR's speed at B = 1 "
          f"({base_spec:.0f} against {base_ar:.0f} ms") in text(
              "docs/results.md")


def test_metrics_quotes_the_config_and_the_code():
  metrics = text("docs/metrics.md")
  tiny, full = config("tiny").compare, config("full").compare
  assert config("base").compare.timed_runs == tiny.timed_runs
  assert (f"runs ({tiny.timed_runs} by default, in `configs/tiny.py` and "
          f"`configs/base.py`; {full.timed_runs} in `configs/full.py`)") in (
              metrics)
  assert f'`compare.baseline` (default `"{tiny.baseline}"`)' in metrics
  default = frontier.Tolerance()
  assert (tiny.tolerance_gen_ppl, tiny.tolerance_entropy) == (
      default.gen_ppl, default.entropy)
  assert (f"(default {tiny.tolerance_gen_ppl:.2f}: "
          f"{tiny.tolerance_gen_ppl:.0%} above)") in metrics
  assert (f"`compare.tolerance_entropy` nats below the baseline's (default "
          f"{tiny.tolerance_entropy:.2f})") in metrics
  assert (f"`compare.tolerance_gen_ppl` (default {tiny.tolerance_gen_ppl:.2f}: "
          f"{tiny.tolerance_gen_ppl:.0%}) above the baseline's and entropy at "
          f"most `compare.tolerance_entropy` (default "
          f"{tiny.tolerance_entropy:.2f} nats)") in text("docs/glossary.md")
  spec = record_figures.find(rows("base_cpu_2core"),
                             "speculative small draft gamma=4", 1, 256)
  assert f"({256 / spec['nfe']:.2f} for speculative decoding" in metrics


def test_adaptation_quotes_the_adapted_record():
  page = text("docs/adaptation.md")
  table = rows("adapted_base_cpu_2core")
  threshold = {r["decoder"]: r for r in table
               if r["batch_size"] == 8 and "from AR threshold" in r["decoder"]
               and r["decoder"].startswith("BD3-LM")}
  exact = threshold.pop(
      "BD3-LM from AR threshold tau=0.9 block=16 sub=4 cache=prefix K=256")
  ppl = [r["gen_ppl"] for r in threshold.values()]
  entropy = [r["entropy"] for r in [*threshold.values(), exact]]
  assert (f"gen-PPL {min(ppl):.1f}-{max(ppl):.1f}, under AR sampling's "
          f"{record_figures.find(table, 'AR cached', 8, 256)['gen_ppl']:.1f}, "
          f"in three of their four settings ({exact['gen_ppl']:.1f} in "
          f"sub-blocks of 4 with the exact cache), all at entropy "
          f"{min(entropy):.2f}-{max(entropy):.2f} nats") in page
  load = run_json("adapted_base_cpu_2core")["hardware"]["load_average_1min"]
  assert (f"average {load[0]:.1f} at the start and {load[1]:.1f} at the "
          "end") in page
  sub = "BD3-LM from AR threshold tau=0.9 block=16 sub=4 cache={} K=256"
  dual = {b: ms("adapted_base_cpu_2core", sub.format("dual"), b)
          for b in (1, 8)}
  whole = {b: ms("adapted_base_cpu_2core", sub.format("prefix"), b)
           for b in (1, 8)}
  assert (f"{whole[8] / dual[8]:.2f}x faster at B = 8 ({dual[8]:.0f} against "
          f"{whole[8]:.0f} ms) and {whole[1] / dual[1]:.2f}x at B = 1 "
          f"({dual[1]:.0f} against {whole[1]:.0f})") in page
  miss = run_json("adapted_base_cpu_2core")["verdict"][2]
  speedup = re.search(r"nearest miss: speculative small draft gamma=4, "
                      r"([\d.]+)x", miss).group(1)
  assert f"small draft, {speedup}x AR's speed" in page


def test_results_quote_the_measured_machine():
  profile = json.loads((RESULTS / "cpu_profile.json").read_text())
  assert (f"float32 matmul {profile['peak_flops'] / 1e9:.1f} GFLOP/s "
          f"({profile['matmul_size']} x {profile['matmul_size']}), read "
          f"bandwidth {profile['bandwidth'] / 1e9:.1f} GB/s "
          f"({profile['bandwidth_bytes'] / 2**30:.0f} GiB)") in text(
              "docs/results.md")


@pytest.mark.parametrize("record, task, name", [
    ("tasks", "sudoku4", "Sudoku 4x4"), ("tasks", "permutation", "permutation of 8"),
    ("tasks_countdown", "countdown", "Countdown"),
    ("tasks_sudoku6", "sudoku6", "Sudoku 6x6")])
def test_readme_task_scores_quote_the_task_records(record, task, name):
  """AR greedy / MDLM under its best LLaDA order / in random order, at the
  largest step count each ran."""
  table = [r for r in rows(record) if r["task"] == task]
  greedy = next(r["exact"] for r in table if r["decoder"] == "ar/greedy")
  llada = [r for r in table if r["decoder"].startswith("llada/")]
  most = max(r["steps"] for r in llada)
  best = max(r["exact"] for r in llada if r["steps"] == most)
  random = next(r["exact"] for r in llada
                if r["decoder"] == "llada/random" and r["steps"] == most)
  assert f"{name} {greedy:.3f} / {best:.3f} / {random:.3f}" in text(
      "README.md")


def test_metrics_quotes_the_tiny_records_quality():
  metrics = text("docs/metrics.md")
  human = re.search(r"score gen-PPL ([\d.]+) at entropy ([\d.]+)",
                    (RESULTS / "tiny_cpu_2core" / "report.md").read_text())
  assert (f"gen-PPL {human.group(1)} at entropy {human.group(2)} on the tiny "
          "record") in metrics
  table = rows("full_grid_cpu_2core")
  llada, remdm = (record_figures.find(table, d, 8, 256)
                  for d in ("LLaDA K=32", "ReMDM K=32"))
  assert (f"(LLaDA K = 32 without blocks {llada['gen_ppl']:.1f}, ReMDM "
          f"{remdm['gen_ppl']:.1f}) come with entropy "
          f"{llada['entropy']:.2f}-{remdm['entropy']:.2f} and "
          f"{llada['rep_4']:.0%}-{remdm['rep_4']:.0%} repeated 4-grams"
          ).replace("%-", "-") in metrics


def test_results_bullets_quote_the_main_job_records():
  results = text("docs/results.md")
  tiny = {(d, b): ms("full_grid_cpu_2core", d, b) for d in (
      "AR cached", "AR uncached", "MDLM K=256", "BD3-LM block=16 K=256",
      "speculative small draft gamma=4",
      *(f"threshold tau=0.9 block=32 cache={c}" for c in
        ("none", "prefix", "dual"))) for b in (1, 8)}
  ar1, ar8 = tiny["AR cached", 1], tiny["AR cached", 8]
  none, prefix, dual = (
      {b: tiny[f"threshold tau=0.9 block=32 cache={c}", b] for b in (1, 8)}
      for c in ("none", "prefix", "dual"))
  spec = {b: tiny["speculative small draft gamma=4", b] for b in (1, 8)}
  for quote in [
      f"{ar1:.0f} ms for 256 tokens at B = 1, {ar8:.0f} ms at B = 8",
      f"Uncached AR is {tiny['AR uncached', 1] / ar1:.0f}x slower than cached "
      "at B = 1",
      f"the time {none[8] / dual[8]:.1f}x ({none[8] / 1e3:.1f} s -> "
      f"{dual[8] / 1e3:.1f} s; {none[1] / dual[1]:.1f}x at B = 1)",
      f"the prefix cache gives {none[8] / prefix[8]:.1f}x "
      f"({none[1] / prefix[1]:.1f}x at B = 1)",
      f"MDLM K = T, {tiny['MDLM K=256', 8] / tiny['BD3-LM block=16 K=256', 8]:.1f}x"
      " faster",
      f"`draft_small` {spec[1]:.0f} / {spec[8]:.0f} ms ({ar1 / spec[1]:.2f}x / "
      f"{ar8 / spec[8]:.2f}x AR at B = 1 / 8)"]:
    assert quote in results
  base = {(d, b): ms("base_cpu_2core", d, b) for d in (
      "AR cached", "MDLM K=8", "speculative small draft gamma=4")
          for b in (1, 8)}
  assert (f"MDLM K = 8 takes {base['MDLM K=8', 1]:.0f} ms against AR's "
          f"{base['AR cached', 1]:.0f} ms for 256 tokens at B = 1, but "
          f"{base['MDLM K=8', 8]:.0f} against {base['AR cached', 8]:.0f} ms at "
          "B = 8") in results
  assert (f"and {base['AR cached', 8] / base['speculative small draft gamma=4', 8]:.2f}x"
          " at B = 8") in results


def test_adaptation_quotes_the_verdict_of_the_adapted_rows():
  """Today's code gives the adapted record's verdict from its rows, and the
  page quotes its nearest misses and its greedy front."""
  name = "adapted_base_cpu_2core"
  table = [{**r, **{k: int(r[k]) for k in
                    ("batch_size", "output_length", "nfe")}}
           for r in rows(name)]
  compare = run_json(name)["config"]["compare"]
  tolerance = frontier.Tolerance(compare["tolerance_gen_ppl"],
                                 compare["tolerance_entropy"])
  recorded = run_json(name)["verdict"]
  assert frontier.summarize(table, compare["baseline"], tolerance).lines == (
      recorded)
  page = text("docs/adaptation.md")
  miss8 = re.search(r"T=256 B=8: fastest .*nearest miss: prompt lookup "
                    r"gamma=4, ([\d.]+x) the speed of AR cached",
                    "\n".join(recorded)).group(1)
  assert f"prompt lookup, {miss8} the speed of AR cached" in page
  fastest = re.search(r"T=256 B=1, greedy vs AR greedy temp=0: fastest within "
                      r"tolerance: view-distilled self-speculative gamma=8 "
                      r"temp=0, ([\d.]+)x faster than AR greedy temp=0 "
                      r"\((\d+) vs (\d+) ms", "\n".join(recorded)).groups()
  assert (f"{fastest[0]}x AR greedy's speed ({fastest[1]} vs {fastest[2]} ms"
          ) in page


def test_speculative_page_names_both_base_records():
  page = text("docs/speculative.md")
  ratio = ms("base_cpu_2core", "AR cached", 1) / ms(
      "base_cpu_2core", "speculative small draft gamma=4", 1)
  assert f"speculative sampling at {ratio:.2f}x AR at B = 1" in page
  assert "against 0.61-0.85x here" in page and "0.61-0.85x" in text(
      "README.md")
