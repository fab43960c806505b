"""The decoders a comparison runs, as config data: parsing, resolution, checks.

The decoders to compare are entries, one line of text each (so a list of
them is an ml_collections config value that a command line can replace):

    "label | decoder | roles | options"
    "LLaDA K={steps} block={block_length} | llada | model=mdlm | steps=32 block_length=32"

- label: the row's name, a `str.format` template over the entry's options.
  Every option the entry sets must appear in it, so a label always shows the
  settings its row was decoded with.
- decoder: a registered decoder name (`base.registered()`).
- roles: `role=member` pairs binding every role the decoder declares to a
  model of `member_recipes.member_configs` by member name ("model=ar",
  "model=mdlm", "model=bd3lm", an AR draft "draft=draft_small"); never the
  evaluator, which only scores.
- options: `key=value` pairs, values read as Python literals (`steps=32`,
  `threshold=0.9`; a bare word such as `kv_cache=prefix` is a string).

Resolution per output length T (`resolve`): the value `T` stands for T;
`steps`, `block_length` and `draft_steps` above T are clamped to T; a block
of T is one block (the decoder's default `block_length` when that is None).
The row label
is the template formatted with the values used, the series label (plots,
notes) with the values as written ("MDLM K=T"). Entries that resolve to the
same decoder (same class and options after defaults, same bindings) at some
T run once there; `Planned.series` lists every entry a row stands for. The
harness sets the output length, `eos_ids` and `sampling` itself: entries
cannot set them. The sampling temperature is `compare.temperature` for every
decoder but those whose entry sets `temperature` (e.g. `temperature=0`:
greedy), shown in the label like any option.

Two references (`judged_against`): a row that decodes greedily (temperature
0, or a decoder that does not sample) is judged against
`compare.greedy_baseline` (AR greedy) when that is set; every other row
against `compare.baseline` (AR sampling).

Every check here is pure and fast: the main job runs them all (`plan`,
`check_options`, `check_baseline`, `check_served`) before any data
preparation or training.
"""

from __future__ import annotations

import ast
import dataclasses
import string
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from lm_decoding.checks import is_count
from lm_decoding.decoding import base, conventions
from lm_decoding.decoding.sampling import SamplingConfig, is_greedy
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.special_tokens import EOS_ID

EVALUATOR = "evaluator"  # the member that scores samples; never decoded
OUTPUT_LENGTH = "T"  # the option value that stands for the output length
CLAMPED_TO_T = ("steps", "block_length", "draft_steps")
HARNESS_OPTIONS = ("output_length", "eos_ids", "sampling")


@dataclasses.dataclass(frozen=True)
class Entry:
  """One line of `compare.decoders`, parsed (see the module docstring).

  Attributes:
    label: the label template, e.g. "MDLM K={steps}".
    name: the registered decoder name.
    roles: (role, member) pairs.
    options: (option, value) pairs as written (a value may be "T").
    index: the entry's position in `compare.decoders` (for messages).
  """

  label: str
  name: str
  roles: tuple[tuple[str, str], ...]
  options: tuple[tuple[str, Any], ...] = ()
  index: int = 0

  @property
  def where(self) -> str:
    """Where the entry is, for error messages."""
    return f"compare.decoders[{self.index}] ({self.label!r})"

  @property
  def series(self) -> str:
    """The label with the options as written: one name over all T."""
    return self.label.format(**dict(self.options))


def _pairs(text: str, what: str, where: str) -> list[tuple[str, str]]:
  pairs = []
  for item in text.split():
    key, sep, value = item.partition("=")
    if not sep or not key.isidentifier() or not value:
      raise ValueError(f"{where}: {what} {item!r} must be key=value")
    if key in dict(pairs):
      raise ValueError(f"{where}: {what} {key!r} is given twice")
    pairs.append((key, value))
  return pairs


def _literal(value: str) -> Any:
  try:
    return ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return value  # a bare word: a string


def parse_entry(text: str, index: int = 0) -> Entry:
  """Parses "label | decoder | roles | options" (options may be omitted).

  Raises:
    ValueError: not 3 or 4 fields, an empty label or decoder, a pair not
      key=value, a key given twice, an option the harness sets itself, or a
      label that does not show every option or names one not set; the
      message names `compare.decoders[index]`.
  """
  where = f"compare.decoders[{index}] ({text!r})"
  if not isinstance(text, str):
    raise ValueError(f"{where} must be a string 'label | decoder | roles | "
                     "options'")
  fields = [f.strip() for f in text.split("|")]
  if len(fields) not in (3, 4):
    raise ValueError(f"{where} must have 3 or 4 fields 'label | decoder | "
                     f"roles | options'; got {len(fields)}")
  label, name, roles = fields[:3]
  options = fields[3] if len(fields) == 4 else ""
  if not label or not name:
    raise ValueError(f"{where}: label and decoder must not be empty")
  where = f"compare.decoders[{index}] ({label!r})"
  role_pairs = _pairs(roles, "role binding", where)
  if not role_pairs:
    raise ValueError(f"{where}: bind the decoder's roles, e.g. model=mdlm")
  option_pairs = [(k, _literal(v)) for k, v in _pairs(options, "option",
                                                       where)]
  for key, _ in option_pairs:
    if key in HARNESS_OPTIONS:
      raise ValueError(f"{where}: option {key!r} is set by the harness "
                       "(compare.output_lengths, compare.temperature, EOS "
                       "mode); remove it")
  try:
    shown = {f for _, f, _, _ in string.Formatter().parse(label)
             if f is not None}
  except ValueError as e:
    raise ValueError(f"{where}: label is not a template over the options "
                     f"(e.g. 'K={{steps}}'): {e}") from e
  set_ = {k for k, _ in option_pairs}
  if shown != set_:
    raise ValueError(
        f"{where}: the label must show every option it sets, as {{option}}: "
        f"missing {sorted(set_ - shown)}, not set {sorted(shown - set_)}")
  return Entry(label=label, name=name, roles=tuple(role_pairs),
               options=tuple(option_pairs), index=index)


def parse_entries(texts: Sequence[str]) -> tuple[Entry, ...]:
  """`parse_entry` for each line of `compare.decoders`.

  Raises:
    ValueError: as `parse_entry`; no entry; two entries with one series
      label.
  """
  if isinstance(texts, str) or not texts:
    raise ValueError("compare.decoders must be a non-empty list of "
                     "'label | decoder | roles | options' strings")
  entries = tuple(parse_entry(t, i) for i, t in enumerate(texts))
  seen = {}
  for e in entries:
    if e.series in seen:
      raise ValueError(f"{e.where} and {seen[e.series].where} have the same "
                       f"label {e.series!r}")
    seen[e.series] = e
  return entries


def resolve(entry: Entry, output_length: int) -> dict[str, Any]:
  """The entry's options at output length T: `T` replaced, clamped to T.

  The values used, as the label shows them (a block of T stays T here;
  `build` turns it into the decoder's one-block default).
  """
  options = {}
  for key, value in entry.options:
    if value == OUTPUT_LENGTH:
      value = output_length
    if (key in CLAMPED_TO_T and is_count(value)
        and value > output_length):
      value = output_length
    options[key] = value
  return options


def build(entry: Entry, output_length: int, temperature: float,
          eos_ids: tuple[int, ...]) -> Any:
  """The decoder config of `entry` at output length T.

  Raises:
    ValueError: unknown decoder, an option it does not take or out of
      range (the decoder's own check; `temperature` by `SamplingConfig`),
      `temperature` on a decoder that does not sample, roles other than the
      decoder's.
  """
  cls = base.decoder_class(entry.name)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  options = resolve(entry, output_length)
  block = fields.get("block_length")
  if (options.get("block_length") == output_length and block is not None
      and block.default is None):
    options["block_length"] = None  # one block: the decoder's own default
  options["output_length"] = output_length
  options["eos_ids"] = eos_ids
  temperature = options.pop("temperature", temperature)
  if "sampling" in fields:
    options["sampling"] = SamplingConfig(temperature=temperature)
  elif "temperature" in dict(entry.options):
    raise ValueError(f"decoder {entry.name!r} does not sample; remove "
                     "temperature")
  decoder = base.make_decoder(entry.name, **options)
  roles = {r for r, _ in entry.roles}
  if roles != set(decoder.roles):
    raise ValueError(f"decoder {entry.name!r} has roles "
                     f"{sorted(decoder.roles)}; the entry binds "
                     f"{sorted(roles)}")
  return decoder


@dataclasses.dataclass(frozen=True)
class Planned:
  """One decoder of the comparison at one output length.

  Attributes:
    label: the row label, with the settings used at this T.
    series: series labels of the entries this row stands for (the first is
      its own; more when entries resolved to the same decoder).
    output_length: T.
    roles: (role, member) bindings.
    decoder: the fixed-length decoder (eos_ids=()).
    eos_decoder: the same decoder in EOS mode.
    reference: for a cached decoder (kv_cache other than "none"), the same
      decoder with kv_cache="none" (token agreement); else None.
    reference_label: the label of the planned row that is `reference`, if
      one is (its speed-up is reported), else None.
    judged_against: the label of the row whose quality the verdict holds
      this one to (`judged_against`); '' until then.
  """

  label: str
  series: tuple[str, ...]
  output_length: int
  roles: tuple[tuple[str, str], ...]
  decoder: Any
  eos_decoder: Any
  reference: Any = None
  reference_label: str | None = None
  judged_against: str = ""

  @property
  def cached(self) -> bool:
    return self.reference is not None


def _check_members(entries: Sequence[Entry], members: Collection[str]
                   ) -> None:
  """Raises ValueError unless every role binds a decoded model of
  `members` (never the evaluator)."""
  for entry in entries:
    for role, member in entry.roles:
      if member == EVALUATOR or member not in members:
        raise ValueError(
            f"{entry.where}: role {role}={member!r} must name a decoded "
            f"model, one of {sorted(set(members) - {EVALUATOR})}")


def _built(entry: Entry, t: int, temperature: float,
           eos_ids: tuple[int, ...]) -> tuple[Any, Any, Any]:
  """(fixed-length decoder, EOS-mode decoder, the fixed-length one with
  kv_cache="none" or None when it has no cache) of `entry` at T = t.

  Raises:
    ValueError: any error of `build`, naming the entry and T.
  """
  try:
    decoder = build(entry, t, temperature, eos_ids=())
    eos_decoder = build(entry, t, temperature, eos_ids)
    reference = None
    if getattr(decoder, "kv_cache", "none") != "none":
      reference = dataclasses.replace(decoder, kv_cache="none")
  except ValueError as e:
    raise ValueError(f"{entry.where} at output_length={t}: {e}") from e
  return decoder, eos_decoder, reference


def plan(entries: Sequence[Entry], output_lengths: Sequence[int],
         temperature: float, members: Collection[str],
         eos_ids: tuple[int, ...] = (EOS_ID,)) -> list[Planned]:
  """Builds every entry at every output length; merges equal decoders.

  Every decoder option is checked here, so call it before any data
  preparation or training.

  Args:
    entries: from `parse_entries`.
    output_lengths: the output lengths T.
    temperature: the one sampling temperature.
    members: the model names roles may bind (`member_recipes.member_configs`).
    eos_ids: EOS mode's end ids.
  Returns:
    Planned decoders, by T then entry order.
  Raises:
    ValueError: a member that does not exist or is the evaluator, or any
      error of `build`, naming the entry and T; two different decoders with
      one label at some T.
  """
  _check_members(entries, members)
  planned = []
  for t in output_lengths:
    by_decoder: dict[Any, int] = {}
    labels: dict[str, Any] = {}
    for entry in entries:
      decoder, eos_decoder, reference = _built(entry, t, temperature,
                                               eos_ids)
      label = entry.label.format(**resolve(entry, t))
      key = (decoder, entry.roles)
      if key in by_decoder:
        i = by_decoder[key]
        planned[i] = dataclasses.replace(
            planned[i], series=planned[i].series + (entry.series,))
        continue
      if label in labels:
        raise ValueError(f"{entry.where} at output_length={t}: label "
                         f"{label!r} is also {labels[label]}'s, a different "
                         "decoder; make the labels differ")
      labels[label] = entry.where
      by_decoder[key] = len(planned)
      planned.append(Planned(label=label, series=(entry.series,),
                             output_length=t, roles=entry.roles,
                             decoder=decoder, eos_decoder=eos_decoder,
                             reference=reference))
    labels_at_t = {(p.decoder, p.roles): p.label for p in planned
                   if p.output_length == t}
    planned = [dataclasses.replace(p, reference_label=labels_at_t.get(
        (p.reference, p.roles))) if p.output_length == t and p.cached else p
               for p in planned]
  return planned


def greedy(decoder: Any) -> bool:
  """Whether a decoder config decodes greedily: its sampling temperature is
  greedy (`sampling.is_greedy`), or it does not sample (beam search)."""
  sampling = getattr(decoder, "sampling", None)
  return sampling is None or bool(is_greedy(sampling.temperature))


def judged_against(planned: Sequence[Planned], baseline: str,
                   greedy_baseline: str = "") -> list[Planned]:
  """`planned` with `judged_against` set: at each T, the label of the row
  that stands for `greedy_baseline` for greedy rows (when it is set), else
  the row that stands for `baseline`.

  Args:
    planned: from `plan`.
    baseline: the series label of AR sampling (`check_baseline`).
    greedy_baseline: the series label of AR greedy, or '' (every row is
      judged against `baseline`).
  Raises:
    ValueError: greedy rows are planned and `greedy_baseline` is set but is
      no entry, or its entry does not decode greedily (it names
      compare.greedy_baseline).
  """
  def row(series: str, t: int) -> Planned | None:
    return next((p for p in planned
                 if p.output_length == t and series in p.series), None)
  out = []
  for p in planned:
    ref = baseline
    if greedy_baseline and greedy(p.decoder):
      ref = greedy_baseline
      found = row(ref, p.output_length)
      if found is None or not greedy(found.decoder):
        raise ValueError(
            f"compare.greedy_baseline={greedy_baseline!r} must be the label "
            "of an entry of compare.decoders that decodes greedily (e.g. 'AR "
            "greedy temp={temperature} | ar | model=ar | temperature=0'), "
            f"since {p.label!r} does; or '' to judge every row against "
            "compare.baseline")
    out.append(dataclasses.replace(
        p, judged_against=row(ref, p.output_length).label))
  return out


def check_served(planned: Sequence[Planned],
                 model_configs: Mapping[str, Any]) -> None:
  """Checks that every planned row's members can serve its decoder's roles
  (`decoding.conventions.serves`: AR decoding needs a causal model, a
  denoiser a non-causal one with a MASK id and its block length, a
  block-causal model a block decoder), from the members' model configs
  alone: nothing is loaded, traced or compiled.

  Args:
    planned: from `plan`.
    model_configs: {member: models.TransformerConfig} of every bound member.
  Raises:
    ValueError: a member that cannot serve its role, naming the row's label,
      the decoder, the role and what it needs.
  """
  for p in planned:
    models = {role: Model(make_logits_fn(model_configs[member]))
              for role, member in p.roles}
    try:
      conventions.serves(p.decoder, models)
    except ValueError as e:
      raise ValueError(f"compare.decoders row {p.label!r}: {e}") from e
