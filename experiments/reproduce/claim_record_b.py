"""What every reproduction script of part B shares: its flags, its record.

A reproduction script checks one claim of the source articles (issue 10,
item 3) and writes under its --workdir a figure, its numbers (CSV/JSON) and
`{claim}.md`: the claim, its source, our number, the hardware, the exact
command and a verdict (supported / contradicted / mixed). `write` makes the
Markdown and a JSON twin; `define_flags` gives the --workdir and --smoke
flags every script takes; `load_experiment` imports a sibling experiment
script (experiments/speculative.py, experiments/translate.py) to call its
functions.

The flags are defined with `allow_override`, so two scripts (or a script
and experiments/compare_decoding.py) loaded in one test process do not
clash; a script that loads an experiment defining --workdir must load it
before calling `define_flags`, so that its own --workdir wins.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import platform
import sys

from absl import flags
import jax

REPO = pathlib.Path(__file__).resolve().parents[2]
VERDICTS = ("supported", "contradicted", "mixed")


def define_flags(claim: str) -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """(--workdir, --smoke) flag holders; workdir defaults to
  experiments/results/reproduce/{claim}."""
  workdir = flags.DEFINE_string(
      "workdir", str(REPO / "experiments" / "results" / "reproduce" / claim),
      "Output folder (figure, CSV/JSON, Markdown).", allow_override=True)
  smoke = flags.DEFINE_bool("smoke", False, "Seconds-long end-to-end run "
                            "(tests); not a measurement.",
                            allow_override=True)
  return workdir, smoke


def load_experiment(name: str):
  """The module experiments/{name}.py, imported once (absl flags and all)."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        name, REPO / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
  return sys.modules[name]


def load_config(name: str):
  """configs/{name}.py's get_config(): a fresh ConfigDict."""
  spec = importlib.util.spec_from_file_location(
      f"{name}_config", REPO / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def hardware() -> str:
  """This machine in words, with the caveat of a shared host."""
  device = jax.devices()[0]
  return (f"{device.platform.upper()} {device.device_kind} x"
          f"{jax.device_count()} ({platform.processor() or platform.machine()}"
          f", {os.cpu_count()} cores, shared with other jobs)")


def command() -> str:
  """The command line of this process, as run."""
  return " ".join(["python", *sys.argv])


def write(workdir: str | os.PathLike, claim: str, *, title: str,
          statement: str, source: str, our_number: str, verdict: str,
          run_command: str, details: list[str], data: dict,
          figures: tuple[str, ...] = (), smoke: bool = False
          ) -> pathlib.Path:
  """Writes {workdir}/{claim}.md and {claim}.json; returns the Markdown path.

  Args:
    workdir: output folder (created).
    claim: file stem, e.g. 'exposure_bias'.
    title: the Markdown heading.
    statement: the claim as the source makes it.
    source: the paper or article, with the figure or table.
    our_number: the measured figure(s) that decide the verdict, one line.
    verdict: one of VERDICTS.
    run_command: the exact command that wrote the outputs.
    details: Markdown lines (setting, caveats, tables).
    data: JSON-serialisable numbers behind the verdict.
    figures: file names (in workdir) of figures to embed.
    smoke: a smoke run: marked as not a measurement.
  Raises:
    ValueError: verdict not in VERDICTS.
  """
  if verdict not in VERDICTS:
    raise ValueError(f"verdict={verdict!r} must be one of {VERDICTS}")
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  record = dict(claim=claim, statement=statement, source=source,
                our_number=our_number, hardware=hardware(),
                command=run_command, verdict=verdict, smoke=smoke, data=data)
  (out / f"{claim}.json").write_text(json.dumps(record, indent=2,
                                                default=float) + "\n")
  lines = [f"# {title}", ""]
  if smoke:
    lines += ["**SMOKE RUN: sizes shrunk to seconds; not a measurement.**",
              ""]
  lines += [
      "| | |", "|---|---|", f"| claim | {statement} |",
      f"| source | {source} |", f"| our number | {our_number} |",
      f"| hardware | {record['hardware']} |",
      f"| command | `{run_command}` |", f"| verdict | **{verdict}** |", "",
      *details, ""]
  lines += [f"![{name}]({name})" for name in figures]
  path = out / f"{claim}.md"
  path.write_text("\n".join(lines) + "\n")
  return path
