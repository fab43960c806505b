"""The commit rules' curves on the exact tasks (studies.task_rules) and the
certainty-forcing distillation of a task MDLM (training.task_distillation)."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import stubs
from lm_decoding.config_reference import load_config
from lm_decoding.data import tasks
from lm_decoding.decoding import base
from lm_decoding.decoding.base import make_decoder
from lm_decoding.evaluation import parallelism
from lm_decoding.models import TransformerConfig, make_logits_fn
from lm_decoding.models.output import ModelOutput
from lm_decoding.special_tokens import MASK_ID
from lm_decoding.studies import task_rules
from lm_decoding.studies.task_scores import GREEDY
from lm_decoding.training import task_distillation, train_step as train
from lm_decoding.training import train as train_lib
from lm_decoding.training.objectives import registry
from lm_decoding.training.objectives import certainty_forcing as cf

TASK = tasks.make_task("permutation", num_items=4, alphabet=6)
SPLIT = tasks.make_splits(TASK, dict(train=8, valid=2, test=6), seed=0)


@dataclasses.dataclass(frozen=True, eq=False)
class CopyDenoiser:
  """A sure denoiser of the permutation task: answer slot j holds the
  prompt's item j with logit 20 (the prompt in order, a valid answer);
  with `repeat`, the prompt's item 0 in every slot (never valid)."""

  vocab_size: int
  repeat: bool = False
  num_items: int = 4
  max_len: int = 64

  def __call__(self, params, tokens, positions, cache=None,
               attention_mask=None):
    n = self.num_items
    prompt = tokens[:, :n]
    if self.repeat:
      prompt = jnp.broadcast_to(prompt[:, :1], prompt.shape)
    items = jnp.concatenate([prompt, prompt], 1)
    logits = 20.0 * jax.nn.one_hot(items, self.vocab_size)
    return ModelOutput(logits, cache)

  def init_cache(self, batch_size, length):
    return None


def test_rule_grid_labels_and_kinds():
  grid = task_rules.rule_grid("mdlm", 16, 4, (0.5, 0.9), (1.0,), (0.1,))
  assert [g.label for g in grid] == [
      "threshold/0.5", "threshold/0.9", "factor/1.0", "entropy_bound/0.1",
      "one_a_step/low_confidence", "one_a_step/margin", "one_a_step/entropy"]
  grid = task_rules.rule_grid("bd3lm", 16, 4, (0.5,), (1.0,), (0.1,))
  assert [g.label for g in grid] == [
      "threshold/0.5", "one_a_step/low_confidence", "one_a_step/margin",
      "one_a_step/entropy"]
  assert all(g.decoder.sampling == GREEDY for g in grid)
  with pytest.raises(ValueError, match="kind='ar'"):
    task_rules.rule_grid("ar", 16, 4, (0.5,), (1.0,), (0.1,))


def test_settings_read_the_config_section():
  rules = ml_collections.ConfigDict(dict(
      thresholds="0.5, 0.9", factors="1", entropy_bounds="0.1"))
  assert task_rules.settings(rules) == dict(
      thresholds=[0.5, 0.9], factors=[1.0], entropy_bounds=[0.1])
  for bad in ("", "0.5,x"):
    rules.factors = bad
    with pytest.raises(ValueError, match="rules.factors"):
      task_rules.settings(rules)


def test_a_sure_model_commits_every_cell_in_one_pass():
  """Every rule commits the whole answer in one forward pass (TPF = T,
  exact 1); one cell a step takes T passes."""
  grid = task_rules.rule_grid("mdlm", 4, 4, (0.5,), (1.0,), (0.1,))
  models = base.bind(CopyDenoiser(TASK.vocab_size), None)
  rows = task_rules.measure(TASK, SPLIT["test"], "copy", grid, models, 0,
                            log=lambda line: None)
  by = {r["decoder"]: r for r in rows}
  for label in ("threshold/0.5", "factor/1.0", "entropy_bound/0.1"):
    assert by[label]["tpf"] == 4.0 and by[label]["batch_tpf"] == 4.0
    assert by[label]["exact"] == 1.0 and by[label]["exact_se"] == 0.0
  assert by["one_a_step/margin"]["tpf"] == 1.0
  assert by["one_a_step/margin"]["row_nfe"] == 4.0


def _row(rule, setting, tpf, exact, n=100):
  return task_rules.with_tpf(
      dict(task="t", model="m", decoder=f"{rule}/{setting}", problems=n,
           exact=exact, nfe=16 / tpf, row_nfe=16 / tpf), 16)


def test_summary_holds_the_reference_and_the_aup():
  rows = [_row("one_a_step", "margin", 1.0, 0.8),
          _row("one_a_step", "entropy", 1.0, 0.7),
          _row("threshold", "0.9", 2.0, 0.78),
          _row("threshold", "0.5", 4.0, 0.7),
          _row("factor", "1.0", 3.0, 0.5)]
  table = {r["rule"]: r for r in task_rules.summary(rows)}
  se = (0.8 * 0.2 / 100) ** 0.5
  assert table["one_a_step"]["reference_exact"] == 0.8
  assert table["one_a_step"]["reference_se"] == pytest.approx(se)
  # 0.78 >= 0.8 - 0.04; 0.7 is not: the highest TPF held is 2.
  assert table["threshold"]["max_tpf_within_1se"] == 2.0
  assert table["threshold"]["max_tpf"] == 4.0
  assert table["threshold"]["exact_at_max_tpf"] == 0.7
  assert table["factor"]["max_tpf_within_1se"] == 0.0
  assert table["threshold"]["aup"] == pytest.approx(
      parallelism.aup([2.0, 4.0], [78.0, 70.0], 80.0))
  assert table["one_a_step"]["aup"] == pytest.approx(80.0)
  assert task_rules.standard_error(0.5, 100) == pytest.approx(0.05)


def test_write_record(tmp_path):
  rows = [_row("one_a_step", "margin", 1.0, 0.8),
          _row("threshold", "0.5", 4.0, 0.7)]
  for key in ("valid", "token_accuracy", "ms_per_problem"):
    for r in rows:
      r[key] = 0.0
  task_rules.write_record(rows, str(tmp_path), ["# head"], name="x")
  for name in ("x.csv", "x_summary.csv", "x.md", "x.png"):
    assert (tmp_path / name).is_file()
  assert (tmp_path / "x.md").read_text().startswith("# head\n")


def _fixed_logits(seed=0, length=8, vocab=12):
  table = jax.random.normal(jax.random.key(seed), (length, vocab)) * 3

  def logits_fn(params, tokens, positions, attention_mask=None, **kw):
    return ModelOutput(jnp.broadcast_to(table, tokens.shape + (vocab,)),
                       None)
  return logits_fn, table


def test_answer_loss_scores_every_answer_cell_once_per_pair():
  """With logits that ignore the input, complementary masks score every
  answer cell exactly once per pair, whatever the draw: the CE is the mean
  answer NLL and the entropy term the mean over the cells argmax-right."""
  logits_fn, table = _fixed_logits()
  tokens = jax.random.randint(jax.random.key(1), (3, 8), 5, 12)
  vocab_ok = jnp.arange(12) != MASK_ID
  log_p = jax.nn.log_softmax(jnp.where(vocab_ok, table, -jnp.inf))
  log_q = jax.nn.log_softmax(jnp.where(vocab_ok, table / 0.5, -jnp.inf))
  h = -jnp.where(vocab_ok, jnp.exp(log_q) * log_q, 0.0).sum(-1)
  answer = tokens[:, 3:]
  nll = -jnp.take_along_axis(log_p[3:][None], answer[..., None], -1)[..., 0]
  right = jnp.argmax(log_p[3:], -1)[None] == answer
  expected_h = jnp.where(right, h[3:][None], 0.0).sum() / max(
      int(right.sum()), 1)
  for seed in (0, 1):
    loss, metrics = cf.answer_certainty_forcing_loss(
        logits_fn, None, tokens, jax.random.key(seed), prompt_length=3)
    assert int(metrics["tokens"]) == 15
    np.testing.assert_allclose(float(metrics["ce"]), float(nll.mean()),
                               rtol=1e-5)
    np.testing.assert_allclose(float(metrics["entropy"]), float(expected_h),
                               rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(nll.mean()
                                                  + 2.0 * expected_h),
                               rtol=1e-5)


def test_answer_loss_bad_options_raise():
  logits_fn, _ = _fixed_logits()
  tokens = jnp.full((1, 8), 5, jnp.int32)
  for kwargs, match in (({"prompt_length": 8}, "prompt_length"),
                        ({"prompt_length": 2, "weight": -1.0}, "weight"),
                        ({"prompt_length": 2, "temperature": 0.0},
                         "temperature")):
    with pytest.raises(ValueError, match=match):
      cf.answer_certainty_forcing_loss(logits_fn, None, tokens,
                                       jax.random.key(0), **kwargs)
  causal = make_logits_fn(TransformerConfig(
      vocab_size=12, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2,
      head_dim=8, mlp_dim=32, max_len=8, attention="causal"))
  with pytest.raises(ValueError, match="answer_certainty_forcing_loss"):
    cf.answer_certainty_forcing_loss(causal, None, tokens, jax.random.key(0),
                                     prompt_length=2)


def test_teacher_rows_keep_what_the_task_scores():
  """The copy denoiser answers every puzzle validly; a denoiser sure of
  item 0 of the prompt in every slot answers none validly."""
  decoder = make_decoder("llada", output_length=4, eos_ids=(), steps=4,
                         remasking="margin", sampling=GREEDY)
  split = SPLIT["train"]
  rows, kept = task_distillation.teacher_rows(
      TASK, split, decoder, base.bind(CopyDenoiser(TASK.vocab_size),
                                      None)["model"],
      jax.random.key(0), 3, keep="valid")
  np.testing.assert_array_equal(rows[:, :4], split.prompts)
  np.testing.assert_array_equal(rows[:, 4:], split.prompts)
  assert kept.all()
  repeat = CopyDenoiser(TASK.vocab_size, repeat=True)
  _, kept = task_distillation.teacher_rows(
      TASK, split, decoder, base.bind(repeat, None)["model"],
      jax.random.key(0), 8, keep="exact")
  assert not kept.any()
  with pytest.raises(ValueError, match="keep='some'"):
    task_distillation.teacher_rows(TASK, split, decoder, None,
                                   jax.random.key(0), 8, keep="some")


def _tiny_task_config():
  task_config = load_config(pathlib.Path(__file__).parents[1] / "configs"
                            / "tasks.py")
  task_config.model.update(d_model=16, num_layers=1, num_heads=2,
                           num_kv_heads=2, head_dim=8, mlp_dim=32, max_len=8)
  return task_config


ROWS = np.concatenate([SPLIT["train"].prompts] * 2, 1)  # the copy answers
TRAIN = ml_collections.ConfigDict(dict(
    batch_size=8, learning_rate=3e-3, warmup_steps=0, num_steps=30,
    weight_decay=0.0, grad_clip_norm=1.0, eval_every=30))


def test_fine_tune_lowers_the_loss_on_its_rows(tmp_path):
  """A `train.train` run of a few steps on the copy answers: the
  cross-entropy falls (the loss need not: its entropy term starts once cells
  come right), the caller's parameters survive, the summary counts the rows
  and steps, its valid NELBO is the MDLM's valid loss (`valid_loss_fn`), and
  the run's log holds the certainty terms."""
  task_config = _tiny_task_config()
  config = task_distillation.task_training.model_config(TASK, "mdlm",
                                                        task_config)
  params = train.unbox(stubs.random_params(config))
  ce_fn = jax.jit(lambda p: cf.answer_certainty_forcing_loss(
      make_logits_fn(config), p, ROWS, jax.random.key(0),
      prompt_length=4)[1]["ce"])
  before = float(ce_fn(params))
  tuned, summary = task_distillation.fine_tune(
      TASK, params, ROWS, SPLIT["valid"].rows, task_config, TRAIN, 0,
      str(tmp_path / "run"), progress=False)
  assert float(ce_fn(tuned)) < before
  assert float(ce_fn(params)) == before
  assert summary["steps"] == 30 and summary["rows"] == 8
  valid = task_distillation.task_training.valid_loss_fn(
      TASK, "mdlm", task_config, SPLIT["valid"].rows)
  np.testing.assert_allclose(summary["valid_nelbo"], valid(tuned), rtol=1e-6)
  assert {"loss", "ce", "entropy", "correct"} <= set(summary)
  log = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert len(log) == 31 and "correct" in log[-1]
  with pytest.raises(ValueError, match="rows"):
    task_distillation.fine_tune(TASK, params, ROWS[:0], ROWS, task_config,
                                TRAIN, 0, str(tmp_path / "empty"))
  with pytest.raises(ValueError, match="temperature=0"):
    task_distillation.fine_tune(TASK, params, ROWS, ROWS, task_config,
                                TRAIN, 0, str(tmp_path / "bad"),
                                temperature=0)


@pytest.mark.parametrize("rows, valid, match", [
    (ROWS[:, :7], SPLIT["valid"].rows[:, :7],
     r"rows passed \(data=\) are 7 tokens wide; data.seq_len=8"),
    (np.concatenate([ROWS, ROWS[:, :1]], 1),
     np.concatenate([SPLIT["valid"].rows] * 2, 1)[:, :9],
     r"rows passed \(data=\) are 9 tokens wide; data.seq_len=8"),
    (ROWS, SPLIT["valid"].rows[:, :7], r"valid rows of task permutation"),
    (ROWS[:3], SPLIT["valid"].rows, r"batch_size=8 must be in \[1, 3\]"),
])
def test_fine_tune_refuses_rows_of_another_shape(tmp_path, rows, valid,
                                                 match):
  """Rows narrower or wider than the task's prompt + answer (both splits
  alike, which the task source accepts) trained silently on shifted
  answers; now every bad shape is refused before compiling."""
  task_config = _tiny_task_config()
  params = train.unbox(stubs.random_params(
      task_distillation.task_training.model_config(TASK, "mdlm",
                                                   task_config)))
  with pytest.raises(ValueError, match=match):
    task_distillation.fine_tune(TASK, params, rows, valid, task_config,
                                TRAIN, 0, str(tmp_path / "run"),
                                progress=False)


@pytest.mark.parametrize("weight,temperature,golden", [
    (2.0, 0.5, (7.162484169006348, 2.376443386077881, 2.3930203914642334,
                666.7730712890625)),
    (0.7, 1.3, (4.054462909698486, 2.376443386077881, 2.3971707820892334,
                666.73388671875))])
def test_fine_tune_step_is_the_old_loops_objective(weight, temperature,
                                                   golden):
  """The step `train.train` runs for the fine-tune (the registry's task
  certainty forcing with the config's options) gives the loss, terms and
  updated parameters the removed loop's step gave on one fixed batch:
  `golden` is (loss, ce, entropy, sum |params| after the step) computed at
  82716a2 by `make_train_step(model, ANSWER_CERTAINTY_FORCING, optimizer,
  prompt_length=4, weight, temperature)` (random params of seed 4, the
  copy answers, key 7; 6 of the 32 masked cells right)."""
  run = task_distillation.distill_config(TASK, _tiny_task_config(), TRAIN,
                                         0, weight, temperature, 2)
  entry = registry.of_config(run)
  assert entry.name == "task_certainty_forcing" and not entry.blocks
  model = train_lib.model_config(run)
  optimizer = train.make_optimizer(run.train)
  step = train.make_train_step(model, entry, optimizer,
                               *dict(registry.block_schedule(run)).values(),
                               **entry.options(run))
  params = train.unbox(stubs.random_params(model, 4))
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=optimizer.init(params))
  state, metrics = step(state, ROWS, jax.random.key(7))
  loss, ce, entropy, total = golden
  np.testing.assert_allclose(
      [float(metrics[k]) for k in ("loss", "ce", "entropy", "correct")],
      [loss, ce, entropy, 0.1875], rtol=1e-5)
  np.testing.assert_allclose(
      float(sum(jnp.abs(x).sum() for x in jax.tree.leaves(state.params))),
      total, rtol=1e-5)
