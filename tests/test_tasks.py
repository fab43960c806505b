"""Exact-answer tasks (lm_decoding/data/tasks): generators, splits, metrics,
the config's options of the list tasks, and the permutation task's closed-form failure of one-step parallel
decoding checked against an exact denoiser driven by the real decoders."""

import dataclasses
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.data import tasks
from lm_decoding.config_reference import load_config
from lm_decoding.data.tasks import countdown, permutation, sort, sudoku
from lm_decoding.decoding import base, make_decoder
from lm_decoding.decoding.sampling import SamplingConfig
from lm_decoding.decoding.schedule import transfer_schedule
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID
from lm_decoding.training import task_training

SIZES = dict(train=40, valid=10, test=10)


@pytest.mark.parametrize("name,options", [
    ("sudoku4", {}), ("sudoku6", dict(min_givens=14, max_givens=20)),
    ("countdown", {}), ("permutation", {}), ("sort", {})])
def test_splits_are_disjoint_deterministic_and_unique(name, options):
  task = tasks.make_task(name, **options)
  splits = tasks.make_splits(task, SIZES, seed=3)
  again = tasks.make_splits(task, SIZES, seed=3)
  keys = {s: [task.key(p) for p in splits[s].problems] for s in tasks.SPLITS}
  flat = sum(keys.values(), [])
  assert len(flat) == len(set(flat)) == sum(SIZES.values())
  for split in tasks.SPLITS:
    np.testing.assert_array_equal(splits[split].rows, again[split].rows)
    assert splits[split].rows.shape == (
        SIZES[split], task.prompt_length + task.answer_length)
    assert splits[split].rows.min() >= tasks.FIRST_TASK_ID
    assert splits[split].rows.max() < task.vocab_size
    # the reference answer scores as right
    scored = tasks.score_rows(task, splits[split].problems,
                              splits[split].answers)
    assert scored["exact"].all() and scored["valid"].all()
  test_keys = set(keys["test"])
  bigger = tasks.make_splits(task, dict(SIZES, train=80), seed=3)
  assert [task.key(p) for p in bigger["test"].problems] == keys["test"]
  assert not test_keys & {task.key(p) for p in bigger["train"].problems}


@pytest.mark.parametrize("size,low,high", [(4, 4, 10), (6, 12, 20),
                                           (9, 36, 40)])
def test_every_sudoku_has_one_solution_and_its_givens(size, low, high):
  task = tasks.make_task(f"sudoku{size}", min_givens=low, max_givens=high)
  count = 30 if size == 4 else 3
  rng = np.random.default_rng(0)
  for _ in range(count):
    puzzle = task.generate(rng)
    assert sudoku.count_solutions(puzzle.givens, size) == 1
    assert sudoku.is_solved(puzzle.solution, size)
    assert all(g in (0, s) for g, s in zip(puzzle.givens, puzzle.solution))
    assert task.difficulty(puzzle) >= low


def test_solver_counts_known_grids():
  empty4 = (0,) * 16
  assert sudoku.count_solutions(empty4, 4, limit=1000) == 288
  broken = (1, 1) + (0,) * 14
  assert sudoku.count_solutions(broken, 4) == 0
  with pytest.raises(ValueError, match="no solutions"):
    sudoku.solve(broken, 4)
  with pytest.raises(ValueError, match="several"):
    sudoku.solve(empty4, 4)


SOLUTION = (1, 2, 3, 4,
            3, 4, 1, 2,
            2, 1, 4, 3,
            4, 3, 2, 1)


def test_sudoku_metrics_on_hand_made_answers():
  task = tasks.make_task("sudoku4")
  givens = (1, 0, 0, 0, 0, 4, 0, 0, 0, 0, 4, 3, 0, 0, 0, 1)
  puzzle = sudoku.Puzzle(givens=givens, solution=sudoku.solve(givens, 4))
  assert puzzle.solution == SOLUTION
  ids = lambda grid: np.array(grid) + tasks.FIRST_TASK_ID
  right = task.score(puzzle, ids(SOLUTION))
  assert right == tasks.Score(exact=True, valid=True, token_accuracy=1.0)
  # another valid grid (digits 1 and 2 swapped): no rule broken, wrong cells
  swapped = tuple({1: 2, 2: 1}.get(v, v) for v in SOLUTION)
  wrong = task.score(puzzle, ids(swapped))
  assert wrong == tasks.Score(exact=False, valid=True, token_accuracy=0.5)
  # one cell changed: a row, a column and a box hold a digit twice
  broken = list(SOLUTION)
  broken[0] = 2
  bad = task.score(puzzle, ids(broken))
  assert bad == tasks.Score(exact=False, valid=False, token_accuracy=15 / 16)
  # a MASK left in the answer is no digit
  masked = ids(SOLUTION).copy()
  masked[5] = MASK_ID
  assert task.score(puzzle, masked).valid is False


def test_read_puzzles(tmp_path):
  good = tmp_path / "good.txt"
  good.write_text("# a comment\n1...\n".replace("1...\n", "1....4....43...1\n"))
  [puzzle] = sudoku.read_puzzles(good, 4)
  assert puzzle.solution == SOLUTION
  for text, match in [("1....4....43..1\n", "16 characters"),
                      ("1....4....43..x1\n", "16 characters"),
                      ("................\n", "several solutions"),
                      ("# only a comment\n", "no puzzle")]:
    bad = tmp_path / "bad.txt"
    bad.write_text(text)
    with pytest.raises(ValueError, match=match):
      sudoku.read_puzzles(bad, 4)


def test_countdown_metrics_on_hand_made_answers():
  task = tasks.make_task("countdown")
  problem = countdown.Problem(numbers=(3, 5, 7), target=22,
                              expression=(3, 5, "*", 7, "+"))
  ids = lambda symbols: np.array(
      [task.token(s) for s in symbols]
      + [tasks.EMPTY_ID] * (task.answer_length - len(symbols)))
  assert task.score(problem, ids([3, 5, "*", 7, "+"])) == tasks.Score(
      exact=True, valid=True, token_accuracy=1.0)
  # another expression with the same value: right, though not the reference
  other = task.score(problem, ids([7, 5, 3, "*", "+"]))
  assert other.exact and other.valid
  # well formed, right numbers, wrong value
  wrong = task.score(problem, ids([3, 5, "+", 7, "*"]))
  assert (wrong.exact, wrong.valid) == (False, True)
  # malformed (stack underflow), a number used twice, a number not given,
  # a negative intermediate, a symbol after the end
  for symbols in ([3, "*", 5, 7, "+"], [3, 3, "*", 7, "+"],
                  [3, 5, "*", 8, "+"], [3, 5, "-", 7, "+"]):
    assert task.score(problem, ids(symbols)).valid is False
  trailing = ids([3, 5, "*", 7, "+"])
  trailing[-1] = task.token(1)
  assert task.score(problem, trailing).valid is False
  assert countdown.evaluate([8, 4, "/", 3, "*"]) == 6
  assert countdown.evaluate([8, 3, "/"]) is None


@pytest.mark.parametrize("name,options,match", [
    ("chess", {}, "unknown task"), ("sudoku4", dict(min_givens=0), "min_givens"),
    ("sudoku4", dict(size=5), "size"), ("countdown", dict(counts=(5,)), "counts"),
    ("permutation", dict(num_items=9, alphabet=8), "num_items"),
    ("permutation", dict(colour=1), "colour"),
    ("sort", dict(num_items=1), "num_items"),
    ("sort", dict(alphabet=1), "alphabet")])
def test_bad_task_options(name, options, match):
  with pytest.raises(ValueError, match=match):
    tasks.make_task(name, **options)


# Every integer option of every task, given as a float, a whole float, a
# bool and a string: each refused by name (a float n made a float layout).
INTEGER_OPTIONS = [
    (name, field.name) for name, task in tasks.TASKS.items()
    for field in dataclasses.fields(getattr(task, "func", task))
    if type(field.default) is int]


@pytest.mark.parametrize("name,option", INTEGER_OPTIONS)
@pytest.mark.parametrize("value", [2.5, 4.0, True, "4"])
def test_integer_task_options_refuse_other_types(name, option, value):
  assert len(INTEGER_OPTIONS) >= 7  # sudoku x3 (size, givens), countdown, lists
  with pytest.raises(ValueError, match=f"task '{name}': {option}="
                     f"{re.escape(repr(value))} must be an integer"):
    tasks.make_task(name, **{option: value})


def test_sort_layout_and_metrics_on_hand_made_answers():
  task = tasks.make_task("sort", num_items=4, alphabet=5)
  rng = np.random.default_rng(0)
  drawn = [task.generate(rng) for _ in range(50)]
  # items repeat (drawn with repetition), the answer is the prompt sorted
  assert any(task.difficulty(p) < 4 for p in drawn)
  split = tasks.to_split(task, drawn)
  np.testing.assert_array_equal(split.answers, np.sort(split.prompts, 1))
  problem = sort.Items(items=(3, 0, 3, 1), answer=(0, 1, 3, 3))
  prompt, answer = task.encode(problem)
  first = tasks.FIRST_TASK_ID + 1
  np.testing.assert_array_equal(prompt, np.array([3, 0, 3, 1]) + first)
  np.testing.assert_array_equal(answer, np.array([0, 1, 3, 3]) + first)
  assert task.difficulty(problem) == 3
  ids = lambda items: np.array(items) + first
  assert task.score(problem, answer) == tasks.Score(
      exact=True, valid=True, token_accuracy=1.0)
  # the input rearranged but not sorted: valid, two slots right
  assert task.score(problem, ids([0, 3, 1, 3])) == tasks.Score(
      exact=False, valid=True, token_accuracy=0.5)
  # sorted but an item dropped for another: not a rearrangement
  assert task.score(problem, ids([0, 1, 1, 3])) == tasks.Score(
      exact=False, valid=False, token_accuracy=0.75)
  masked = answer.copy()
  masked[1] = MASK_ID
  assert task.score(problem, masked).valid is False


@pytest.mark.parametrize("name", ["permutation", "sort"])
def test_the_task_config_reads_the_list_tasks_options(name):
  config = load_config(pathlib.Path(__file__).parents[1] / "configs"
                       / "tasks.py")
  task = tasks.make_task(name, **task_training.task_options(config, name))
  assert (task.num_items, task.alphabet) == (8, 16)
  assert task.prompt_length + task.answer_length <= config.model.max_len


def test_ancestral_closed_form_by_enumeration():
  """Every assignment of 3 slots to 2 steps, each step equally likely."""
  total = 0.0
  for first in range(8):  # bit i: slot i unmasked at step 1
    size = bin(first).count("1")
    total += permutation.success_probability(3, [size, 3 - size]) / 8
  assert permutation.ancestral_success_probability(3, 2) == pytest.approx(
      total)
  assert permutation.ancestral_success_probability(8, 1) == pytest.approx(
      math.factorial(8) / 8 ** 8)


def test_success_probability_closed_form():
  assert permutation.success_probability(3, [3]) == pytest.approx(6 / 27)
  assert permutation.success_probability(4, [2, 2]) == pytest.approx(
      (4 * 3 / 16) * (2 / 4))
  assert permutation.success_probability(5, [1] * 5) == 1.0
  with pytest.raises(ValueError, match="summing"):
    permutation.success_probability(4, [2, 1])


@dataclasses.dataclass(frozen=True, eq=False)
class ExactShuffleDenoiser:
  """The exact conditional marginals of the shuffle task: at every position,
  uniform over the prompt's items not yet in the committed answer."""

  num_items: int
  vocab_size: int
  max_len: int = 64

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    n = self.num_items
    ids_V = jnp.arange(self.vocab_size)
    in_prompt = (tokens[:, :n, None] == ids_V).any(1)
    committed = (tokens[:, n:, None] == ids_V).any(1)
    allowed_BxV = in_prompt & ~committed
    logits = jnp.where(allowed_BxV, 0.0, -1e9)
    return ModelOutput(jnp.broadcast_to(logits[:, None], tokens.shape
                                        + (self.vocab_size,)), cache)

  def init_cache(self, batch_size, length):
    return None


@pytest.mark.parametrize("decoder,steps", [("llada", 1), ("llada", 2),
                                           ("llada", 4), ("mdlm", 2),
                                           ("mdlm", 4)])
def test_parallel_failure_matches_closed_form(decoder, steps):
  task = tasks.make_task("permutation", num_items=4, alphabet=6)
  rows = 4000
  split = tasks.make_splits(task, dict(train=1, valid=1, test=1), seed=0)
  prompts = np.repeat(split["test"].prompts, rows, axis=0)
  options = dict(output_length=4, steps=steps, mask_id=MASK_ID, eos_ids=())
  if decoder == "llada":
    options.update(remasking="random",
                   sampling=SamplingConfig(temperature=1.0))
  model = ExactShuffleDenoiser(num_items=4, vocab_size=task.vocab_size)
  out = jax.jit(make_decoder(decoder, **options).decode)(
      base.bind(model, None), prompts, np.full(rows, 4, np.int32),
      jax.random.key(steps))
  valid = tasks.score_rows(task, split["test"].problems * rows,
                           np.asarray(out.tokens))["valid"]
  if decoder == "llada":  # a fixed schedule of step sizes
    sizes = [int(s) for s in transfer_schedule(jnp.int32(4), steps)]
    p = permutation.success_probability(4, sizes)
  else:  # binomial step sizes
    p = permutation.ancestral_success_probability(4, steps)
  se = np.sqrt(p * (1 - p) / rows)
  assert abs(valid.mean() - p) <= 3 * se, (valid.mean(), p, se)
