r"""The GPU record: cost model and main job measured on one accelerator.

  python experiments/gpu_record.py            # on a machine with a GPU or TPU
  python experiments/gpu_record.py --smoke --out=/tmp/gpu_smoke  # CPU check

Refuses to run without a GPU or TPU (unless --smoke), names the device
(`jax.devices()[0].device_kind`, platform, runtime and, where nvidia-smi
answers, driver and memory), then runs three existing scripts, each in its
own process (their flags collide), with its wall time:

  profile     experiments/measure_cpu_profile.py on the device: bfloat16
              matmul peak (8192^3), bandwidth (a 4 GiB sum), per-step
              overhead -> profile.json;
  cost_model  experiments/validate_cost_model.py, bfloat16 models of three
              sizes at B = 1, 8, 32, predicted by the published profile of
              the device (`cost_model.published_profile`: h200,
              h100_sxm, tpu_v5e, tpu_v4; the measured one when none
              matches) and by the
              measured one re-measured at each point -> cost_model/;
  compare     experiments/compare_decoding.py --config=configs/gpu_record.py
              --retrain (every member trained here, on the device), with
              the published profile's predicted ms -> compare/ (the report
              files; data and checkpoints stay in --workdir).

All under --out (default experiments/results/gpu_<device slug>/), with a
README.md naming the device, the exact commands and the wall times,
rewritten after each stage, so that a run cut short keeps what finished. A
stage that fails is recorded (exit status, its log in logs/) and the next
one still runs; the script then exits 1. --smoke: tiny models, T = 8,
B = 1, two training steps: the whole pipeline on a CPU in about a minute.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax

from lm_decoding.evaluation import cost_model
from lm_decoding.evaluation import records

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOUR_GIB = 4 << 30

_OUT = flags.DEFINE_string(
    "out", "", "Output folder; '' = experiments/results/gpu_<device slug>.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "", "The run's folder: the main job's data cache and "
    "checkpoints; '' = a temporary folder, removed at the end.")
_PUBLISHED = flags.DEFINE_enum(
    "published", "", ("",) + tuple(cost_model.PROFILES),
    "The published profile to validate against; '' = the one matching the "
    "device kind, if any.")
_SMOKE = flags.DEFINE_bool(
    "smoke", False, "Tiny models, T 8, B 1, two training steps: runs on a "
    "CPU in about a minute.")


def slug(device_kind: str) -> str:
  """'NVIDIA H200' -> 'nvidia_h200': lower case, runs of other characters
  than letters and digits replaced by one '_'."""
  return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_")


def device_info() -> dict:
  """The default device and the software that drives it, as a dict."""
  devices = jax.devices()
  # The PJRT client's version string (CUDA / TPU runtime); not a documented
  # attribute of every jax version, hence the fallbacks.
  runtime = getattr(getattr(devices[0], "client", None), "platform_version",
                    "unknown")
  info = {"device_kind": devices[0].device_kind,
          "platform": devices[0].platform, "device_count": len(devices),
          "runtime": " ".join(str(runtime).split()),
          "jax": jax.__version__, "host": platform.node(),
          "cpu_count": os.cpu_count(), "python": platform.python_version()}
  if shutil.which("nvidia-smi"):
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
         "--format=csv,noheader"], capture_output=True, text=True,
        check=False)
    info["nvidia_smi"] = (proc.stdout.strip().splitlines() or [""])[0]
  return info


@dataclasses.dataclass(frozen=True)
class Stage:
  """One script run: its name, argument list, output and outcome."""

  name: str
  args: tuple[str, ...]  # after `python`: the script and its flags
  output: str  # what it leaves under --out
  wall_s: float = 0.0
  returncode: int | None = None  # None: not run yet


def stage_args(out: str, workdir: str, published: str | None,
               smoke: bool) -> dict[str, tuple[str, ...]]:
  """{stage name: script and flags} for the three stages, `out` absolute or
  relative to the repository root."""
  profile_path = os.path.join(out, "profile.json")
  size = (dict(matmul=128, bytes=1 << 22, scan=100, runs=2) if smoke else
          dict(matmul=8192, bytes=FOUR_GIB, scan=10000, runs=10))
  return {
      "profile": (
          "experiments/measure_cpu_profile.py", f"--out={profile_path}",
          f"--name={slug(jax.devices()[0].device_kind)}", "--dtype=bfloat16",
          f"--matmul_size={size['matmul']}",
          f"--bandwidth_bytes={size['bytes']}",
          f"--scan_steps={size['scan']}", f"--runs={size['runs']}"),
      "cost_model": (
          "experiments/validate_cost_model.py",
          f"--workdir={os.path.join(out, 'cost_model')}",
          f"--profile={published or 'cpu'}", f"--profile_path={profile_path}",
          "--dtype=bfloat16", "--batch_sizes=1,8,32",
          "--point_matmul_size=8192", f"--point_bandwidth_bytes={FOUR_GIB}",
          *(["--smoke"] if smoke else [])),
      "compare": (
          "experiments/compare_decoding.py",
          "--config=configs/gpu_record.py" + (":smoke" if smoke else ""),
          f"--workdir={os.path.join(workdir, 'compare')}", "--retrain",
          *([f"--profile={published}"] if published else [])),
  }


def run_stage(stage: Stage, out: str) -> Stage:
  """Runs `stage` from the repository root, its output shown and kept in
  {out}/logs/{name}.log; returns it with its wall time and exit status."""
  os.makedirs(os.path.join(out, "logs"), exist_ok=True)
  env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
      p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
  print(f"== {stage.name}: {records.command(stage.args)}", flush=True)
  start = time.time()
  with open(os.path.join(out, "logs", f"{stage.name}.log"), "w") as log:
    proc = subprocess.Popen([sys.executable, *stage.args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    for line in proc.stdout:
      sys.stdout.write(line)
      log.write(line)
    proc.wait()
  return dataclasses.replace(stage, wall_s=time.time() - start,
                             returncode=proc.returncode)


def copy_reports(workdir: str, dest: str) -> None:
  """Copies the files at the top of `workdir` (the main job's report, not
  its data or checkpoints) into `dest`."""
  os.makedirs(dest, exist_ok=True)
  for entry in os.scandir(workdir):
    if entry.is_file():
      shutil.copy2(entry.path, dest)


def _profile_lines(out: str, published: str | None) -> list[str]:
  path = os.path.join(out, "profile.json")
  if not os.path.exists(path):
    return []
  measured = cost_model.profile_from_json(path)
  profiles = [("measured", measured)]
  if published:
    profiles.append((f"published {published}", cost_model.PROFILES[published]))
  lines = ["## Measured against published figures", "",
           "| profile | peak TFLOP/s (bf16 matmul) | bandwidth TB/s | "
           "overhead us/step | source |", "|---|---|---|---|---|"]
  for label, p in profiles:
    lines.append(f"| {label} | {p.peak_flops / 1e12:.4g} | "
                 f"{p.bandwidth / 1e12:.4g} | {p.step_overhead_s * 1e6:.3g} "
                 f"| {p.source} |")
  return lines + [""]


def write_readme(out: str, info: dict, command: str, published: str | None,
                 stages: list[Stage], smoke: bool) -> None:
  """{out}/README.md: the device, the command, each stage's command, wall
  time and outcome, the measured profile beside the published one."""
  lines = [
      f"# GPU record: {info['device_kind']}", "",
      *(["**Smoke run**: tiny models, T = 8, B = 1; checks the pipeline "
         "only, measures nothing.", ""] if smoke else []),
      f"- device: {info['device_kind']} x{info['device_count']} "
      f"(platform {info['platform']}, runtime {info['runtime']})",
      *([f"- nvidia-smi: {info['nvidia_smi']}"] if "nvidia_smi" in info
        else []),
      f"- host: {info['host']}, {info['cpu_count']} cores; Python "
      f"{info['python']}, jax {info['jax']}",
      f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} (UTC)",
      "- published profile: " + (
          f"{published} ({cost_model.PROFILES[published].source})"
          if published else "none matches this device; the measured one "
          "stands in"), "",
      "Command (from the repository root):", "", "```", command, "```", "",
      "## Stages", "",
      "Each a script of experiments/ in its own process; its log in logs/.",
      "", "| stage | command | wall s | exit status | output |",
      "|---|---|---|---|---|"]
  for s in stages:
    if s.returncode is None:
      wall, status, output = "—", "not run", "—"
    else:
      wall, output = f"{s.wall_s:.0f}", s.output
      status = "ok" if s.returncode == 0 else f"failed ({s.returncode})"
    lines.append(f"| {s.name} | `python {shlex.join(s.args)}` | {wall} | "
                 f"{status} | {output} |")
  lines += ["", *_profile_lines(out, published),
            "Reports: [cost model](cost_model/report.md), "
            "[main job](compare/report.md).", ""]
  with open(os.path.join(out, "README.md"), "w") as f:
    f.write("\n".join(lines))


def main(argv):
  del argv
  info = device_info()
  if info["platform"] == "cpu" and not _SMOKE.value:
    sys.exit(f"gpu_record: error: no GPU or TPU: jax.devices() = "
             f"{jax.devices()}; run it where jax sees one (its CUDA or TPU "
             "plugin installed), or give --smoke to check the pipeline on "
             "this CPU")
  out = _OUT.value or str(ROOT / "experiments" / "results"
                          / f"gpu_{slug(info['device_kind'])}")
  out = os.path.abspath(out)
  os.makedirs(out, exist_ok=True)
  published = (_PUBLISHED.value
               or cost_model.published_profile(info["device_kind"]))
  workdir = _WORKDIR.value or tempfile.mkdtemp(prefix="gpu_record_")
  command = records.command()
  outputs = {"profile": "profile.json", "cost_model": "cost_model/",
             "compare": "compare/"}
  # Paths in the stages' commands relative to the repository root (their
  # working folder) when --out is inside it, so that the record reads the
  # same on any machine.
  shown = os.path.relpath(out, ROOT)
  shown = out if shown.startswith("..") else shown
  stages = [Stage(name, args, outputs[name]) for name, args in stage_args(
      shown, workdir, published, _SMOKE.value).items()]
  print(json.dumps(info), flush=True)
  write_readme(out, info, command, published, stages, _SMOKE.value)
  for i, stage in enumerate(stages):
    stages[i] = run_stage(stage, out)
    if stage.name == "compare" and stages[i].returncode == 0:
      copy_reports(os.path.join(workdir, "compare"),
                   os.path.join(out, "compare"))
    write_readme(out, info, command, published, stages, _SMOKE.value)
  if not _WORKDIR.value:
    shutil.rmtree(workdir, ignore_errors=True)
  failed = [s.name for s in stages if s.returncode]
  print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
