"""Exact-answer benchmarks from a file (lm_decoding/evaluation/
exact_answer.py): GSM8K extraction and prompts, HumanEval programs run in a
subprocess with a timeout, and one decoder scored on small synthetic files
with a scripted stub model."""

import json

import numpy as np
import pytest

from lm_decoding.decoding import base
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.evaluation import exact_answer as ea
from lm_decoding.models import Model

from stubs import TableLogitsFn

ADD = {"task_id": "Toy/0", "prompt": "def add(a, b):\n",
       "canonical_solution": "    return a + b\n",
       "test": "def check(f):\n    assert f(2, 3) == 5\n",
       "entry_point": "add"}


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


@pytest.mark.parametrize("text, want", [
    ("3 + 4 = 7. #### 7", "7"),
    ("so 1,234 apples\n#### 1,234", "1234"),
    ("#### $12.50.", "12.50"),
    ("We get 5, then 8, so the answer is 13.", "13"),
    ("it costs -3 dollars", "-3"),
    ("no number here", None),
    ("#### (none) but 4 before", "4"),
])
def test_extract_number(text, want):
  assert ea.extract_number(text) == want


def test_same_number_compares_values():
  assert ea.same_number("7.0", "7") and ea.same_number("1234", "1234")
  assert not ea.same_number("7.5", "7") and not ea.same_number(None, "7")


def test_read_problems_and_refusals(tmp_path):
  gsm = _write(tmp_path / "gsm.jsonl", [
      {"question": "2 + 2?", "answer": "2 + 2 = 4\n#### 4"},
      {"question": "Tom has 1,000.", "answer": "#### 1,000"}])
  problems = ea.read_problems(gsm, "gsm8k")
  assert [p.target for p in problems] == ["4", "1000"]
  assert len(ea.read_problems(gsm, "gsm8k", limit=1)) == 1
  shots = ea.few_shot_prompt(problems[:1], "3 + 3?")
  assert shots == ("Question: 2 + 2?\nAnswer: 2 + 2 = 4\n#### 4\n\n"
                   "Question: 3 + 3?\nAnswer:")
  bad = _write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "4"}])
  with pytest.raises(ValueError, match=r"bad.jsonl:1: the answer has no"):
    ea.read_problems(bad, "gsm8k")
  with pytest.raises(ValueError, match=r"missing \['entry_point'\]"):
    ea.read_problems(_write(tmp_path / "he.jsonl", [
        {k: v for k, v in ADD.items() if k != "entry_point"}]), "humaneval")
  with pytest.raises(ValueError, match="kind='mbpp'"):
    ea.read_problems(gsm, "mbpp")


def test_humaneval_programs_run_in_a_subprocess_with_a_timeout(tmp_path):
  (problem,) = ea.read_problems(_write(tmp_path / "he.jsonl", [ADD]),
                                "humaneval")
  assert ea.passes_tests(problem, problem.answer)
  assert not ea.passes_tests(problem, "    return a - b\n")
  assert not ea.passes_tests(problem, "    while True:\n        pass\n",
                             timeout_s=2.0)
  # Cut at the next top-level statement, as the benchmark's harness does.
  completion = "    return a + b\n\ndef other():\n    raise SystemExit(1)\n"
  assert ea.truncate_completion(completion) == "    return a + b\n"
  assert ea.correct(problem, completion, timeout_s=10.0)


# A character tokenizer over a tiny vocabulary (the stub's table is V^3).
CHARS = "0123456789 #Q?:"
EOS = len(CHARS) + 1  # id 0 pads


class CharTokenizer:
  vocab_size = len(CHARS) + 2
  eos_id = EOS

  def encode(self, text):
    return [CHARS.index(c) + 1 for c in text]

  def decode(self, ids):
    return "".join(CHARS[i - 1] for i in ids if 0 < i < EOS)

  def id_to_piece(self, token_id):
    return self.decode([token_id])


def test_a_decoder_is_scored_on_a_file(tmp_path):
  """Two problems decoded greedily in one batch by a scripted stub: row 0
  writes '#### 7' (right), row 1 '12' for 13 (wrong); accuracy 1/2, NFE
  and tokens per forward from the decode."""
  gsm = _write(tmp_path / "gsm.jsonl", [
      {"question": "3", "answer": "#### 7"},
      {"question": "4", "answer": "#### 13"}])
  problems = ea.read_problems(gsm, "gsm8k")
  tok = CharTokenizer()
  prompts, lengths = ea.prompt_ids(tok, [p.prompt for p in problems])
  np.testing.assert_array_equal(lengths, [1, 1])
  said = [tok.encode("#### 7") + [EOS], tok.encode("12") + [EOS]]
  stub = TableLogitsFn.scripted([s + [EOS] * (12 - len(s)) for s in said],
                                tok.vocab_size)
  decoder = base.make_decoder("ar", output_length=8, eos_ids=(EOS,),
                              pad_id=0,
                              sampling=SamplingConfig(temperature=0.0))
  record, texts = ea.score("ar", decoder, {"model": Model(stub, None)}, tok,
                           problems, prompts, lengths)
  assert texts == ["#### 7", "12"]
  assert record["exact"] == 0.5 and record["problems"] == 2
  assert record["generated_tokens"] == 5.0  # 7 and 3 tokens with EOS
  assert record["tokens_per_forward"] == 5.0 / record["nfe"]
  assert set(record) >= {"decoder", "exact", "nfe", "tokens_per_forward",
                         "ms_per_problem", "compile_s"}


def test_batches_score_as_one(tmp_path):
  """batch_size 1 (and a padded last batch of 3 rows) gives the texts and
  accuracy of one batch: rows decode alone as in the batch."""
  gsm = _write(tmp_path / "gsm.jsonl", [
      {"question": str(i), "answer": f"#### {a}"}
      for i, a in enumerate((7, 13, 7, 1))])
  problems = ea.read_problems(gsm, "gsm8k")
  tok = CharTokenizer()
  prompts, lengths = ea.prompt_ids(tok, [p.prompt for p in problems])
  said = ["#### 7", "12", "7", "1 #"]
  # One trigram table whose continuation depends on the prompt, not on
  # the row's place in the batch: (position, previous, token) -> next.
  table = np.zeros((1, 12) + (tok.vocab_size,) * 3, np.float32)
  table[..., EOS] = 1.0  # after a script: EOS
  for problem, text in zip(problems, said):
    row = tok.encode(problem.prompt) + tok.encode(text) + [EOS]
    previous = 0
    for p in range(len(row) - 1):
      table[0, p, previous, row[p]] = 0.0
      table[0, p, previous, row[p], row[p + 1]] = 10.0
      previous = row[p]
  stub = TableLogitsFn(table)
  decoder = base.make_decoder("ar", output_length=8, eos_ids=(EOS,),
                              pad_id=0,
                              sampling=SamplingConfig(temperature=0.0))
  runs = {b: ea.score("ar", decoder, {"model": Model(stub, None)}, tok,
                      problems, prompts, lengths, batch_size=b)
          for b in (None, 1, 3)}
  for b in (1, 3):
    assert runs[b][1] == runs[None][1] == ["#### 7", "12", "7", "1 #"]
    assert runs[b][0]["exact"] == runs[None][0]["exact"] == 0.75
  with pytest.raises(ValueError, match="batch_size=0"):
    ea.score("ar", decoder, {"model": Model(stub, None)}, tok, problems,
             prompts, lengths, batch_size=0)
