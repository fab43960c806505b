"""The GPU record (experiments/gpu_record.py, configs/gpu_record.py).

The script runs in a subprocess (its flags would collide with the other
experiment scripts' in one process): refused without a GPU, and its --smoke
run end to end on this CPU.
"""

import csv
import json
import os
import pathlib
import subprocess
import sys

import pytest

import _loading
from lm_decoding.evaluation import cost_model
from lm_decoding.training import train
from lm_decoding.training.pretrained import member_recipes

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "gpu_record.py"


def _config(preset=""):
  return _loading.load("gpu_record_config", ROOT / "configs" / "gpu_record.py"
                       ).get_config(preset)


def _run(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600,
                        check=False)


@pytest.mark.parametrize("device_kind, name", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("NVIDIA H100 PCIe", None), ("TPU v5 lite", "tpu_v5e"),
    ("TPU v4", "tpu_v4"), ("cpu", None), ("NVIDIA A100-SXM4-80GB", None)])
def test_published_profile_by_device_kind(device_kind, name):
  assert cost_model.published_profile(device_kind) == name


def test_config_keeps_the_cost_rows_at_a_size_above_the_caches():
  config = _config()
  assert [d.split("|")[0].strip() for d in config.compare.decoders] == [
      "AR cached", "MDLM K={steps}", "MDLM K={steps}", "MDLM K={steps}",
      "LLaDA K={steps} block={block_length}",
      "threshold tau={threshold} block={block_length} cache={kv_cache}",
      "BD3-LM block={block_length} K={steps}",
      "speculative small draft gamma={gamma}",
      "AR greedy temp={temperature}",
      "threshold tau={threshold} block={block_length} cache={kv_cache}"
      " temp={temperature}"]
  assert "kv_cache=dual" in config.compare.decoders[5]
  assert (config.compare.batch_sizes, config.compare.output_lengths) == (
      (1, 8, 32), (128, 256))
  members = member_recipes.member_configs(config)
  ar = train.model_config(members["ar"])
  assert ar.dtype == "bfloat16"
  assert cost_model.param_bytes(ar) > 60 * 2 ** 20  # an H200's L2: 60 MB
  evaluator = train.model_config(members["evaluator"])
  assert cost_model.param_count(evaluator) > cost_model.param_count(ar)


def test_config_plans_every_row(tmp_path):
  job = _loading.load("compare_decoding",
                      ROOT / "experiments" / "compare_decoding.py")
  planned, _ = job.plan(_config(), str(tmp_path / "full"))
  assert len(planned) == 20  # 10 rows x 2 output lengths, none merged
  planned, _ = job.plan(_config("smoke"), str(tmp_path / "smoke"))
  assert sorted({m for p in planned for _, m in p.roles}) == ["ar", "mdlm"]
  with pytest.raises(ValueError, match="preset='gpu'"):
    _config("gpu")


def test_refuses_without_an_accelerator(tmp_path):
  proc = _run(f"--out={tmp_path}")
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "gpu_record: error: no GPU or TPU: jax.devices() = [CpuDevice(id=0)]")
  assert not os.listdir(tmp_path)


def test_smoke_writes_the_record(tmp_path):
  out = tmp_path / "record"
  proc = _run("--smoke", "--published=h200", f"--out={out}",
              f"--workdir={tmp_path / 'work'}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  readme = (out / "README.md").read_text()
  assert readme.startswith("# GPU record: cpu\n")
  assert "- device: cpu x1 (platform cpu, runtime cpu)" in readme
  for stage in ("profile", "cost_model", "compare"):
    assert f"| {stage} | `python experiments/" in readme
    assert (out / "logs" / f"{stage}.log").stat().st_size > 0
  assert "failed" not in readme and "not run" not in readme
  assert "| published h200 | 989 | 4.8 | 20 |" in readme
  profile = json.loads((out / "profile.json").read_text())
  assert (profile["name"], profile["matmul_dtype"]) == ("cpu", "bfloat16")
  assert f"--profile_path={out / 'profile.json'}" in (
      out / "cost_model" / "report.md").read_text()
  assert "predicted ms (saved: h200)" in (
      out / "cost_model" / "report.md").read_text()
  with open(out / "compare" / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["decoder"] for r in rows] == ["AR cached", "MDLM K=8"]
  assert all(float(r["predicted_ms"]) > 0 for r in rows)
  assert "- device: cpu x1" in (out / "compare" / "report.md").read_text()
  # Only the report files come back: data and checkpoints stay in --workdir.
  assert sorted(p.name for p in (out / "compare").iterdir()) == [
      "frontier.png", "frontier_h100_sxm.png", "frontier_tpu_v5e.png",
      "latency.png", "quality.png", "report.md", "results.csv", "run.json"]
