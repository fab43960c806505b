"""configs/hub.py end to end on CPU: tiny random hub-layout checkpoints
written by the test (an AR Qwen3 that is also the evaluator, a Dream
diffusion LM; config.json, model.safetensors, tokenizer.json), a synthetic
GSM8K file, the grid / frontier / verdict and the exact-answer records;
and the refusals the job makes before reading a tensor."""

import csv
import json
import os
import subprocess
import sys

import pytest

import _hub_folders
import _loading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=256, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=False, vocab_size=320)
QUESTIONS = [("Tom has 3 apples and buys 4 more. How many apples?", 7),
             ("A box holds 12 pens; 5 are taken. How many are left?", 7),
             ("Sam reads 10 pages a day for 3 days. How many pages?", 30),
             ("Ann has 1,000 dollars and spends 250. How much is left?", 750)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("hub")
  _hub_folders.write_checkpoint(str(root / "ar"), dict(
      _TINY, model_type="qwen3", head_dim=16))
  _hub_folders.write_checkpoint(str(root / "dllm"), dict(
      _TINY, model_type="Dream"), seed=1)
  _hub_folders.write_checkpoint(str(root / "other"), dict(
      _TINY, model_type="Dream"), tokenizer_vocab=270)
  with open(root / "gsm8k.jsonl", "w") as f:
    for q, a in QUESTIONS:
      f.write(json.dumps({"question": q, "answer": f"So {a}.\n#### {a}"})
              + "\n")
  return root


def _run(folders, workdir, *overrides):
  command = [
      sys.executable, os.path.join(REPO, "experiments", "compare_hub.py"),
      f"--config={os.path.join(REPO, 'configs', 'hub.py')}",
      f"--workdir={workdir}",
      f"--config.hub.models=ar={folders / 'ar'}, dllm={folders / 'dllm'}",
      f"--config.hub.evaluator={folders / 'ar'}",
      f"--config.hub.benchmark={folders / 'gsm8k.jsonl'}",
      f"--config.hub.shots={folders / 'gsm8k.jsonl'}",
      "--config.hub.num_shots=1", "--config.hub.num_problems=4",
      "--config.compare.output_lengths=(8,)",
      "--config.compare.batch_sizes=(2,)",
      "--config.compare.prompt_len=16", "--config.compare.timed_runs=1",
      "--config.compare.decoders=('AR | ar | model=ar', "
      "'MDLM K={steps} | mdlm | model=dllm | steps=4')", *overrides]
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  return subprocess.run(command, capture_output=True, text=True, env=env,
                        timeout=300)


def test_the_main_job_runs_on_hub_folders(folders, tmp_path):
  done = _run(folders, tmp_path)
  assert done.returncode == 0, done.stderr[-3000:]
  for name in ("results.csv", "report.md", "exact_answer.csv", "run.json"):
    assert (tmp_path / name).is_file(), name
  with open(tmp_path / "exact_answer.csv") as f:
    scores = list(csv.DictReader(f))
  assert [r["decoder"] for r in scores] == ["AR", "MDLM K=4"]
  for row in scores:
    assert 0 <= float(row["exact"]) <= 1 and row["problems"] == "4"
    assert float(row["nfe"]) >= 1 and float(row["tokens_per_forward"]) > 0
  # AR: one call per token (EOS not drawn), in both batches of 2.
  assert float(scores[0]["nfe"]) == 8
  run = json.loads((tmp_path / "run.json").read_text())
  assert any("Dream" in line and "token shift" in line
             for line in run["models"])
  report = (tmp_path / "report.md").read_text()
  assert "MDLM K=4" in report and "verdict" in report.lower()


def _job_config(folders, **changes):
  config = _loading.load("hub_config", os.path.join(
      REPO, "configs", "hub.py")).get_config()
  config.hub.models = f"ar={folders / 'ar'}, dllm={folders / 'dllm'}"
  config.hub.evaluator = str(folders / "ar")
  config.hub.benchmark = str(folders / "gsm8k.jsonl")
  config.hub.shots = str(folders / "gsm8k.jsonl")
  config.hub.num_shots = 1
  config.compare.output_lengths = (8,)
  config.compare.batch_sizes = (2,)
  config.compare.prompt_len = 16
  config.compare.decoders = ("AR | ar | model=ar",
                             "MDLM K={steps} | mdlm | model=dllm | steps=4")
  for key, value in changes.items():
    block, name = key.split("__")
    config[block][name] = value
  return config


@pytest.mark.parametrize("changes, message", [
    (dict(compare__decoders=("AR | ar | model=dllm",)),
     "decoder 'AR': decoder 'ar' \\(role 'model'\\) needs 'causal' "
     "attention; the model's is 'bidirectional'"),
    (dict(compare__decoders=(
        "AR | ar | model=ar",
        "BD3 W={block_length} K={steps} | bd3lm | model=ar"
        " | block_length=4 steps=2",)),
     "decoder 'BD3 W=4 K=2': decoder 'bd3lm' \\(role 'model'\\) needs "
     "non-causal attention; the model's is 'causal'"),
    (dict(hub__evaluator="MISSING"), "has no config.json"),
    (dict(hub__num_shots=4), "the longest benchmark prompt"),
    (dict(hub__models="ar=FOLDER/ar, moe=FOLDER/moe"),
     "Qwen3-MoE, a mixture-of-experts model"),
    (dict(hub__models="ar=FOLDER/ar, dllm=FOLDER/other"),
     "model 'dllm' has another tokenizer than the evaluator's"),
])
def test_bad_jobs_are_refused_by_name_before_loading(folders, tmp_path,
                                                     monkeypatch, changes,
                                                     message):
  from lm_decoding.checkpoints import layout
  job = _loading.load("compare_hub", os.path.join(REPO, "experiments",
                                                  "compare_hub.py"))
  (folders / "moe").mkdir(exist_ok=True)
  (folders / "moe" / "config.json").write_text(json.dumps(dict(
      _TINY, model_type="qwen3_moe")))
  changes = {k: v.replace("MISSING", str(tmp_path / "none")).replace(
      "FOLDER", str(folders)) if isinstance(v, str) else v
             for k, v in changes.items()}

  def no_reads(*args, **kwargs):
    raise AssertionError("a tensor was read before the refusal")
  monkeypatch.setattr(layout, "read_state_dict", no_reads)
  with pytest.raises(ValueError, match=message):
    job.plan(_job_config(folders, **changes))
