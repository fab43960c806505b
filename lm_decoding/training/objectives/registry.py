"""The objectives the trainer knows, one `Objective` entry per name.

`train.train` asks the entry of `config.train.objective` everything that
differs between objectives: the loss and the deterministic validation bound,
the backbone's attention, the data the objective reads, its static options
and the optional config keys it accepts; `check_options` checks those keys
(and the block lengths of the objectives trained in blocks),
`block_schedule` and `scheduled_sampling` read the two that change the
train step. A new objective is a module of this package (its loss and
bound) and one entry in `_ENTRIES`; nothing in the trainer names it. A
config of data.source 'task' (an exact-answer task's rows) trains the task
entry of its objective name (`TASK_OBJECTIVES`: the prompt given, never
scored); `of_config` is the entry a config trains, either way.

    entry = registry.get("mdlm")
    loss, metrics = entry.loss(logits_fn, params, tokens, key,
                               **entry.options(config))
    metrics = entry.bound(logits_fn, params, tokens, num_timesteps,
                          **entry.options(config))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import ml_collections

from lm_decoding.checks import is_count, is_number
from lm_decoding.training.objectives import ar, bd3lm, certainty_forcing
from lm_decoding.training.objectives import jacobi_forcing
from lm_decoding.training.objectives import mdlm, tasks, translation, uniform

ConfigDict = ml_collections.ConfigDict
TASK = "task"  # the data.source of an exact-answer task's config


def _no_options(config: ConfigDict) -> dict:
  del config
  return {}


def _text_length(config: ConfigDict) -> int:
  return config.data.seq_len


@dataclasses.dataclass(frozen=True)
class Objective:
  """One trainable objective.

  Attributes:
    name: the value of `train.objective`.
    loss: (logits_fn, params, tokens int32[B, L], key, **options) ->
      (loss float32[], metrics), metrics holding 'nll' and 'tokens' (see
      the package docstring).
    bound: (logits_fn, params, tokens int32[B, L], num_timesteps,
      **options) -> metrics: the deterministic validation measure (a
      fixed key; `num_timesteps` time bins where the objective integrates
      over time), metrics holding 'nll' and 'tokens'.
    attention: the backbone's attention kind ('causal', 'bidirectional').
    data: 'text' (the packed corpus, rows of data.seq_len tokens),
      'distillation' (a teacher's continuations, `data_sources`), 'jacobi'
      (Jacobi states beside their fixed points, `jacobi_trajectories`),
      'pairs'
      (the verse pairs of `parallel_text.layout`) or 'task' (an
      exact-answer task's rows, given by the caller: `TASK_OBJECTIVES`).
    bound_name: what exp(validation loss) is: 'perplexity' or
      'perplexity bound'.
    options: config -> the static keyword arguments of `loss` and `bound`.
    model_options: config -> backbone options the objective adds (CMLM's
      length head: length_classes).
    sequence_length: config -> the positions the model sees in training.
    row_parts: the sequences of `sequence_length` a training row holds side
      by side (2 for 'jacobi_forcing': [inputs | targets]; else 1).
    optional_keys: the optional config keys ('section.key') it accepts.
    blocks: whether `loss` and `bound` take a `block_length` (BD3-LM's
      train.block_length, or the block length of train.block_schedule at
      the step).
  """

  name: str
  loss: Callable
  bound: Callable
  attention: str
  data: str = "text"
  bound_name: str = "perplexity"
  options: Callable[[ConfigDict], dict] = _no_options
  model_options: Callable[[ConfigDict], dict] = _no_options
  sequence_length: Callable[[ConfigDict], int] = _text_length
  row_parts: int = 1
  optional_keys: tuple[str, ...] = ()
  blocks: bool = False


_KEY = 0  # the validation bounds' fixed key


def _ar_bound(logits_fn, params, tokens, num_timesteps):
  del num_timesteps
  return ar.ar_eval(logits_fn, params, tokens)[1]


def _mdlm_bound(logits_fn, params, tokens, num_timesteps,
                complementary=False):
  del complementary  # a training option; the bound's grid is fixed
  return mdlm.mdlm_bound(logits_fn, params, tokens, jax.random.key(_KEY),
                         num_timesteps)[1]


def _bd3lm_bound(logits_fn, params, tokens, num_timesteps, *, block_length,
                 complementary=False, **training_only):
  del complementary, training_only  # training options (certainty forcing's)
  return bd3lm.bd3lm_bound(logits_fn, params, tokens, jax.random.key(_KEY),
                           num_timesteps, block_length=block_length)[1]


def _uniform_bound(logits_fn, params, tokens, num_timesteps):
  return uniform.uniform_bound(logits_fn, params, tokens,
                               jax.random.key(_KEY), num_timesteps)[1]


def _loss_as_bound(loss: Callable) -> Callable:
  """A translation objective's bound: its loss's metrics at a fixed key
  (CMLM: under one fixed draw of masks)."""
  def bound(logits_fn, params, tokens, num_timesteps, **options):
    del num_timesteps
    return loss(logits_fn, params, tokens, jax.random.key(_KEY),
                **options)[1]
  return bound


def _complementary(config: ConfigDict) -> dict:
  return ({"complementary": True} if config.train.get("complementary_masks")
          else {})


def _certainty_forcing(config: ConfigDict) -> dict:
  """prompt_length (train.prompt_length, default 0), complementary, weight
  and temperature (train.certainty_weight, train.certainty_temperature;
  default dParallel's 2.0 and 0.5)."""
  return {"prompt_length": config.train.get("prompt_length", 0),
          "complementary": bool(config.train.get("complementary_masks")),
          "weight": config.train.get("certainty_weight",
                                     certainty_forcing.CERTAINTY_WEIGHT),
          "temperature": config.train.get(
              "certainty_temperature",
              certainty_forcing.CERTAINTY_TEMPERATURE)}


def _block_certainty_forcing(config: ConfigDict) -> dict:
  """`_certainty_forcing`'s and mask_order (train.mask_order, default
  dParallel's 'random'; `certainty_forcing.semi_ar_masks`)."""
  return {**_certainty_forcing(config),
          "mask_order": config.train.get("mask_order", "random"),
          "teacher_target": config.train.get("teacher_target", "anchors"),
          "view_weight": config.train.get("view_weight", 1.0),
          "consistency_weight": config.train.get("consistency_weight", 0.0)}


def _pair_length(config: ConfigDict) -> int:
  """[source, BOS, target, EOS]: S + T + 2."""
  return config.data.max_source_tokens + config.data.max_target_tokens + 2


def _ctc_length(config: ConfigDict) -> int:
  """The source and its frames: S + 1 + upsample * S."""
  source = config.data.max_source_tokens
  return source + 1 + config.train.ctc_upsample * source


_ENTRIES = (
    Objective("ar", ar.ar_loss, _ar_bound, "causal",
              optional_keys=("train.scheduled_sampling",)),
    Objective("mdlm", mdlm.mdlm_loss, _mdlm_bound, "bidirectional",
              bound_name="perplexity bound", options=_complementary,
              optional_keys=("model.token_shift", "model.self_conditioning",
                             "train.complementary_masks",
                             "train.anneal_steps")),
    # bidirectional: the objective passes its block masks
    Objective("bd3lm", bd3lm.bd3lm_loss, _bd3lm_bound, "bidirectional",
              bound_name="perplexity bound", options=_complementary,
              optional_keys=("model.token_shift", "train.complementary_masks",
                             "train.block_schedule"), blocks=True),
    # dParallel's certainty forcing on the BD3-LM layout, validated by the
    # BD3-LM bound; trains on data.distillation_set when it is set.
    Objective("certainty_forcing", certainty_forcing.certainty_forcing_loss,
              _bd3lm_bound, "bidirectional", data="distillation",
              bound_name="perplexity bound", options=_block_certainty_forcing,
              optional_keys=("model.token_shift", "train.complementary_masks",
                             "train.consistency_weight"),
              blocks=True),
    # Consistency training on the model's own Jacobi trajectories (CLLM),
    # validated by the AR perplexity of the corpus's validation rows.
    Objective("jacobi_forcing", jacobi_forcing.jacobi_forcing_loss,
              jacobi_forcing.jacobi_forcing_bound, "causal", data="jacobi",
              options=lambda c: {"consistency_weight": c.train.get(
                  "consistency_weight", jacobi_forcing.CONSISTENCY_WEIGHT)},
              row_parts=2,
              optional_keys=("train.consistency_weight",)),
    Objective("uniform", uniform.uniform_loss, _uniform_bound,
              "bidirectional", bound_name="perplexity bound",
              optional_keys=("model.self_conditioning",)),
    # The translation objectives pass their own masks.
    Objective("translation_ar", translation.translation_ar_loss,
              _loss_as_bound(translation.translation_ar_loss), "causal",
              data="pairs", sequence_length=_pair_length),
    Objective("cmlm", translation.cmlm_loss,
              _loss_as_bound(translation.cmlm_loss), "bidirectional",
              data="pairs", bound_name="perplexity bound",
              options=lambda c: {"length_weight": c.train.length_weight},
              # the length head: one class per target length
              model_options=lambda c: {
                  "length_classes": c.data.max_target_tokens},
              sequence_length=_pair_length),
    Objective("ctc", translation.ctc_loss,
              _loss_as_bound(translation.ctc_loss), "bidirectional",
              data="pairs",
              options=lambda c: {"source_width": c.data.max_source_tokens,
                                 "upsample": c.train.ctc_upsample},
              sequence_length=_ctc_length),
)
OBJECTIVES: dict[str, Objective] = {o.name: o for o in _ENTRIES}


def _prompt_length(config: ConfigDict) -> dict:
  return {"prompt_length": config.train.prompt_length}


def _answer_nelbo(logits_fn, params, tokens, num_timesteps, *,
                  prompt_length, **training_only):
  """Task certainty forcing's validation measure: the task MDLM's NELBO of
  the answer at the fixed key (`tasks.task_mdlm_loss`), the measure the
  task MDLM itself is validated by."""
  del training_only  # certainty forcing's complementary, weight, temperature
  return _loss_as_bound(tasks.task_mdlm_loss)(
      logits_fn, params, tokens, num_timesteps, prompt_length=prompt_length)


# The exact-answer tasks' objectives (data.source 'task'), keyed by
# train.objective: each LM entry conditioned on the prompt of
# train.prompt_length tokens (never masked nor scored), its validation
# measure its loss at the fixed key; certainty forcing's is
# `answer_certainty_forcing_loss` (the answer one block, complementary
# rows with train.complementary_masks), validated by the MDLM's NELBO.
_TASK_ENTRIES = tuple(
    dataclasses.replace(OBJECTIVES[name], name=f"task_{name}", loss=loss,
                        bound=_loss_as_bound(loss), data=TASK,
                        options=_prompt_length, optional_keys=())
    for name, loss in tasks.TASK_LOSSES.items()) + (
    dataclasses.replace(
        OBJECTIVES["certainty_forcing"], name="task_certainty_forcing",
        loss=certainty_forcing.answer_certainty_forcing_loss,
        options=_certainty_forcing, bound=_answer_nelbo, data=TASK,
        optional_keys=("train.complementary_masks",), blocks=False),)
TASK_OBJECTIVES: dict[str, Objective] = {
    o.name.removeprefix("task_"): o for o in _TASK_ENTRIES}


def get(name: str) -> Objective:
  """The entry of objective `name`.

  Raises:
    ValueError: naming train.objective and the registered names.
  """
  if name not in OBJECTIVES:
    raise ValueError(f"train.objective={name!r}; allowed: "
                     f"{tuple(OBJECTIVES)}")
  return OBJECTIVES[name]


def of_config(config: ConfigDict) -> Objective:
  """The objective `config` trains: the entry of train.objective, or for
  data.source 'task' its task entry (`TASK_OBJECTIVES`).

  Raises:
    ValueError: an unknown objective, or a task objective not in
      `TASK_OBJECTIVES` (naming train.objective and the allowed names).
  """
  name = config.train.objective
  if config.data.get("source") != TASK:
    return get(name)
  if name not in TASK_OBJECTIVES:
    raise ValueError(f"train.objective={name!r} with data.source={TASK!r}; "
                     f"allowed: {tuple(TASK_OBJECTIVES)}")
  return TASK_OBJECTIVES[name]


def accepting(key: str) -> tuple[str, ...]:
  """The objectives that accept the optional config key `key`."""
  return tuple(o.name for o in _ENTRIES if key in o.optional_keys)


def check_options(config: ConfigDict) -> None:
  """Checks the objective's own and optional keys of `config`, before
  anything is built.

  train.scheduled_sampling (`scheduled_sampling`); train.block_length of an
  objective trained in blocks: an integer dividing data.seq_len;
  model.token_shift, model.self_conditioning and train.complementary_masks:
  booleans; train.anneal_steps: an integer >= 0; train.block_schedule
  (`block_schedule`); each only for the objectives whose entry lists it
  (`Objective.optional_keys`); train.mask_order: one of
  `certainty_forcing.MASK_ORDERS`, 'left_to_right' only for
  'certainty_forcing' (not a task's) without complementary masks;
  train.init_from: a string (what it names is resolved by
  `loading.parent_params`); train.teacher: a string, non-empty only for
  'certainty_forcing' (resolved by `loading.teacher_log_probs`);
  train.teacher_target: one of `certainty_forcing.TEACHER_TARGETS`, other
  than 'anchors' only with a teacher ('causal_view' with model.token_shift);
  train.view_weight: a number in [0, inf), 1.0 under a target other than
  'causal_view' (it weighs that term alone); certainty forcing's
  train.prompt_length on text: an integer in [0, data.seq_len - 1];
  train.certainty_weight in [0, inf) and train.certainty_temperature in
  (0, inf); train.consistency_weight: a number in [0, inf), above 0 only
  for 'jacobi_forcing' and 'certainty_forcing' (there with train.mask_order
  'left_to_right').

  Raises:
    ValueError: naming the key, its allowed values and objectives.
  """
  scheduled_sampling(config)
  if of_config(config).blocks:
    block, seq_len = config.train.get("block_length"), config.data.seq_len
    if not is_count(block) or seq_len % block:
      raise ValueError(f"train.block_length={block!r} must be an integer in "
                       f"[1, {seq_len}] dividing data.seq_len={seq_len}")
  _check_optional_keys(config)
  _check_mask_order(config)
  init_from = config.train.get("init_from")
  if init_from is not None and not isinstance(init_from, str):
    raise ValueError(f"train.init_from={init_from!r} must be a string: a "
                     "member of the pretrained set or a training workdir")
  teacher = config.train.get("teacher")
  if teacher is not None and not isinstance(teacher, str):
    raise ValueError(f"train.teacher={teacher!r} must be a string: a causal "
                     "member of the pretrained set, or '' for none")
  if teacher and of_config(config).name != "certainty_forcing":
    raise ValueError(f"train.teacher={teacher!r} applies to train.objective "
                     f"'certainty_forcing'; got {of_config(config).name!r}")
  try:
    certainty_forcing.check_teacher_target(
        config.train.get("teacher_target", "anchors"),
        config.train.get("view_weight", 1.0), bool(teacher),
        bool(config.model.get("token_shift")))
  except ValueError as e:  # name the config section
    raise ValueError(f"train.{e}") from e
  _check_certainty_forcing(config)
  _check_consistency_weight(config)


def _check_consistency_weight(config: ConfigDict) -> None:
  """Checks train.consistency_weight when present (see `check_options`)."""
  weight = config.train.get("consistency_weight")
  if weight is None:
    return
  try:
    jacobi_forcing.check_consistency_weight(weight)
  except ValueError as e:  # name the config section
    raise ValueError(f"train.{e}") from e
  if weight == 0:  # no term: any objective
    return
  allowed = accepting("train.consistency_weight")
  if "train.consistency_weight" not in of_config(config).optional_keys:
    raise ValueError(f"train.consistency_weight={weight!r} applies to "
                     f"train.objective in {allowed} on text or distillation "
                     f"rows; got {of_config(config).name!r}")
  if of_config(config).name == "certainty_forcing":
    try:
      certainty_forcing.check_consistency(
          weight, config.train.get("mask_order", "random"))
    except ValueError as e:  # name the config section
      raise ValueError(f"train.{e}") from e


def _check_certainty_forcing(config: ConfigDict) -> None:
  """Checks certainty forcing's train.prompt_length (text: an integer in
  [0, data.seq_len - 1]; a task's is `data_sources.check`'s),
  train.certainty_weight and train.certainty_temperature (see
  `check_options`), as its loss would once traced."""
  objective = of_config(config)
  if objective.loss not in (certainty_forcing.certainty_forcing_loss,
                            certainty_forcing.answer_certainty_forcing_loss):
    return
  options = _certainty_forcing(config)
  if objective.data != TASK:
    try:
      certainty_forcing.check_prompt_length(options["prompt_length"],
                                            config.data.seq_len)
    except ValueError as e:  # name the config key
      raise ValueError(f"train.{e} (data.seq_len={config.data.seq_len})"
                       ) from e
  try:
    certainty_forcing.check_certainty_term(options["weight"],
                                           options["temperature"])
  except ValueError as e:  # name the config keys
    raise ValueError(f"train.certainty_{e}") from e


def _check_mask_order(config: ConfigDict) -> None:
  """Checks train.mask_order when present (see `check_options`)."""
  order = config.train.get("mask_order")
  if order is None:
    return
  try:
    certainty_forcing.check_mask_order(
        order, bool(config.train.get("complementary_masks")))
  except ValueError as e:  # name the config section
    raise ValueError(f"train.{e}") from e
  if order != "random" and of_config(config).name != "certainty_forcing":
    raise ValueError(f"train.mask_order={order!r} applies to "
                     "train.objective 'certainty_forcing' on text or "
                     f"distillation rows; got {of_config(config).name!r}")


# Optional keys (the adaptation recipes', and model.self_conditioning):
# absent, a recipe (and the shipped members' manifests) is unchanged.
_OPTIONAL_KEYS = (("model", "token_shift"), ("model", "self_conditioning"),
                  ("train", "complementary_masks"), ("train", "anneal_steps"),
                  ("train", "block_schedule"))


def _check_optional_keys(config: ConfigDict) -> None:
  """Checks each of `_OPTIONAL_KEYS` present in `config` (see
  `check_options`)."""
  objective = config.train.objective
  for section, key in _OPTIONAL_KEYS:
    value = config[section].get(key)
    if value is None:
      continue
    if key == "block_schedule":
      block_schedule(config)
      valid = True
    else:
      valid = (is_count(value, minimum=0) if key == "anneal_steps"
               else isinstance(value, bool))
    if not valid:
      kind = "an integer >= 0" if key == "anneal_steps" else "True or False"
      raise ValueError(f"{section}.{key}={value!r} must be {kind}")
    allowed = accepting(f"{section}.{key}")
    if value and objective not in allowed:
      raise ValueError(f"{section}.{key}={value!r} applies to "
                       f"train.objective in {allowed}; got {objective!r}")


def block_schedule(config: ConfigDict) -> tuple[tuple[int, int | None], ...]:
  """The block-length schedule ((from step, W), ...) of an objective trained
  in blocks (`bd3lm.parse_block_schedule` of train.block_schedule, or
  train.block_length from step 0 when that key is absent); ((0, None),) for
  the others.

  Raises:
    ValueError: as `bd3lm.parse_block_schedule`.
  """
  if not of_config(config).blocks:
    return ((0, None),)
  text = config.train.get("block_schedule")
  if text is None:
    return ((0, config.train.get("block_length")),)
  return bd3lm.parse_block_schedule(text, config.data.seq_len,
                                    config.train.block_length)


def scheduled_sampling(config: ConfigDict) -> tuple[float, int] | None:
  """(p_max, ramp_steps) of `train.scheduled_sampling`, None when absent.

  The optional section `train.scheduled_sampling` (keys p_max: the final
  probability of feeding the model its own prediction, in [0, 1];
  ramp_steps: steps of the linear ramp from 0, an integer >= 0) switches
  the 'ar' objective to `ar.ar_scheduled_sampling_loss` with probability
  `ar.scheduled_sampling_probability(step, p_max, ramp_steps)` (Bengio et
  al. 2015; two-pass form of Mihaylova & Martins 2019). Absent, training is
  plain teacher forcing (and the recipe of a shipped model is unchanged).

  Raises:
    ValueError: naming the key: the section is not a mapping of exactly
      p_max and ramp_steps, p_max not a number in [0, 1], ramp_steps not an
      integer >= 0, or the objective does not accept it.
  """
  section = config.train.get("scheduled_sampling")
  if section is None:
    return None
  if (not isinstance(section, (dict, ConfigDict))
      or set(section.keys()) != {"p_max", "ramp_steps"}):
    raise ValueError(f"train.scheduled_sampling={section!r} must hold "
                     "exactly the keys p_max and ramp_steps")
  p_max, ramp_steps = section["p_max"], section["ramp_steps"]
  if not is_number(p_max) or not 0.0 <= p_max <= 1.0:
    raise ValueError(f"train.scheduled_sampling.p_max={p_max!r} must be a "
                     "number in [0, 1]")
  if not is_count(ramp_steps, minimum=0):
    raise ValueError(f"train.scheduled_sampling.ramp_steps={ramp_steps!r} "
                     "must be an integer >= 0")
  allowed = accepting("train.scheduled_sampling")
  if config.train.objective not in allowed:
    raise ValueError("train.scheduled_sampling applies to train.objective in "
                     f"{allowed}; got {config.train.objective!r}")
  return float(p_max), int(ramp_steps)


def fingerprint(config: ConfigDict) -> dict:
  """What a checkpoint must share with `config` to be resumed or reused: the
  data and model sections, the objective and the optional keys present
  (absent ones are left out, so older checkpoints fit; so is an empty
  train.teacher)."""
  out = {"data": config.data.to_dict(), "model": config.model.to_dict(),
         "objective": config.train.objective}
  scheduled = scheduled_sampling(config)
  if scheduled is not None:
    out["scheduled_sampling"] = list(scheduled)
  for key in ("init_from", "complementary_masks", "mask_order",
              "anneal_steps", "block_schedule", "prompt_length",
              "consistency_weight"):
    if config.train.get(key) is not None:
      out[key] = config.train[key]
  if config.train.get("teacher"):  # absent or '': no teacher
    out["teacher"] = config.train.teacher
    if config.train.get("teacher_target", "anchors") != "anchors":
      out["teacher_target"] = config.train.teacher_target
      out["view_weight"] = config.train.get("view_weight", 1.0)
  return out
