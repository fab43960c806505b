"""The translation task's members: data, shipped or trained models, and the
distilled targets some of them train on.

The members are `member_recipes.translation_member_configs(config)`
(translation_ar, cmlm, ctc and, with `translate.distill`, cmlm_distilled
and ctc_distilled). Each is loaded from the shipped translation set
(`member_recipes.TRANSLATION_DIR`) when its recipe and tokenizer match, else
trained under {workdir}/{name} (`loading.train_member`) on the data cache
{workdir}/data. Before a *_distilled member trains, the AR member translates
every train source (greedy; Kim & Rush 2016 use beam search, which costs ~8x
greedy on 2 CPU cores) and {workdir}/data/distilled_pairs.tsv.gz holds the
train pairs with those outputs as targets (`distillation`).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import ml_collections

from lm_decoding.data import parallel_text
from lm_decoding.decoding import sampling
from lm_decoding.decoding.autoregressive import AutoregressiveDecoder
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import distillation, train
from lm_decoding.training.pretrained import loading, member_recipes, recipes, store

SET_DIR = member_recipes.TRANSLATION_DIR
STORED_DTYPE = "bfloat16"  # 5 models of ~0.8M parameters: 16 MB in float32


def teacher_decoder(config: ml_collections.ConfigDict
                    ) -> AutoregressiveDecoder:
  """The distillation teacher's decoder: AR greedy over the source read as a
  bidirectional prefix, up to max_target_tokens + 1 tokens (EOS included)."""
  return AutoregressiveDecoder(
      sampling=sampling.SamplingConfig(temperature=0.0),
      output_length=config.data.max_target_tokens + 1, eos_ids=(EOS_ID,),
      pad_id=PAD_ID, prompt_attention="bidirectional")


def distil_once(config: ml_collections.ConfigDict,
                data: parallel_text.TranslationData, teacher: Model,
                data_dir: str) -> str:
  """Writes {data_dir}/distilled_pairs.tsv.gz unless it is there; returns a
  one-line note of what it did (printed too)."""
  path = pathlib.Path(data_dir, parallel_text.DISTILLED_FILE)
  if path.exists():
    return f"distilled targets reused from {path}"
  tick = time.time()
  distilled = distillation.distil(
      teacher_decoder(config), teacher, data.tokenizer,
      data.splits["train"], config.translate.distill_batch_size)
  distillation.write_distilled(data_dir, distilled, config.data.path)
  note = (f"distilled targets: translation_ar greedy on the "
          f"{len(distilled.pairs)} train sources under the limits, "
          f"{distilled.kept_reference} kept their reference (teacher output "
          f"empty or over the limit), {time.time() - tick:.0f} s")
  print(note, flush=True)
  return note


def check(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Checks the options and reads the pairs file; creates nothing.

  Returns:
    The pairs' splits (`parallel_text.split_pairs`), for the summary line.
  Raises:
    ValueError: naming the config key, or the pairs file and its line
      (`parallel_text.read_pairs`, `split_pairs`); `workdir` a file.
  """
  for member in member_recipes.translation_member_configs(config).values():
    train.check_config(member)
  if os.path.isfile(workdir):
    raise ValueError(f"--workdir={workdir} is a file; give a directory")
  return parallel_text.split_pairs(parallel_text.read_pairs(config.data.path))


def prepare_data(config: ml_collections.ConfigDict, workdir: str,
                 retrain: bool) -> parallel_text.TranslationData:
  """The tokenizer and encoded splits, cached in {workdir}/data.

  The bundled pairs start from the shipped set's tokenizer (so the shipped
  models apply); another file trains its own. `retrain` drops the cached
  distilled targets.

  Raises:
    ValueError: the data cache holds another tokenizer than the shipped
      set's (give another --workdir); any error of `parallel_text.prepare`
      (a vocabulary too large for the file, no pair under the limits).
  """
  data_dir = os.path.join(workdir, "data")
  shipped_tokenizer = SET_DIR / recipes.TOKENIZER_FILE
  cached = pathlib.Path(data_dir, parallel_text.TOKENIZER_FILE)
  if shipped_tokenizer.exists() and not config.data.path:
    if not cached.exists():
      cached.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(shipped_tokenizer, cached)
    elif cached.read_bytes() != shipped_tokenizer.read_bytes():
      raise ValueError(f"{cached} is another tokenizer than the shipped "
                       f"{shipped_tokenizer}; give another --workdir")
  if retrain:
    pathlib.Path(data_dir, parallel_text.DISTILLED_FILE).unlink(
        missing_ok=True)
  return parallel_text.prepare(
      config.data.vocab_size, config.data.max_source_tokens,
      config.data.max_target_tokens, config.data.path, cache_dir=data_dir)


def load_members(config: ml_collections.ConfigDict, workdir: str,
                 data: parallel_text.TranslationData, retrain: bool = False,
                 export: bool = False, command: str = "",
                 stop_at: int | None = None) -> dict:
  """{name: (Model, metrics, source)} in the order of
  `member_recipes.translation_member_configs`, for `data` (`prepare_data`).

  Args:
    config: the translation config (configs/translation.py).
    workdir: where members train ({workdir}/{name}) and the data cache is.
    data: the prepared pairs.
    retrain: train every member afresh, ignoring the shipped ones.
    export: write each member trained here into `SET_DIR` (manifest with
      `command`, parameters stored as `STORED_DTYPE`) and use the exported
      parameters as loaded back.
    command: the command line for the manifest (`records.command()`).
    stop_at: end each training run at this step (a budget cut short; the
      metrics say so).
  Raises:
    ValueError, CheckpointError: as `loading.train_member`.
  """
  data_dir = os.path.join(workdir, "data")
  members = {}
  for name, cfg in member_recipes.translation_member_configs(config).items():
    model_dir = os.path.join(workdir, name)
    params, source = (None, "--retrain") if retrain else store.find(
        cfg, name, data.tokenizer, SET_DIR)
    if params is not None:
      metrics = recipes.read_manifest(name, SET_DIR)["metrics"]
    else:
      note = None
      if cfg.data.targets == "distilled":
        note = distil_once(config, data, members["translation_ar"][0],
                           data_dir)
      print(f"{name}: {source}; training {cfg.train.num_steps} steps in "
            f"{model_dir}", flush=True)
      params, metrics = loading.train_member(
          cfg, model_dir, data.tokenizer, fresh=retrain, progress=False,
          out_dir=SET_DIR, data_dir=data_dir, stop_at=stop_at)
      if note:
        metrics["distillation"] = note
      if metrics["steps"] < cfg.train.num_steps:
        metrics["stopped_early"] = (
            f"stopped at step {metrics['steps']} of the "
            f"{cfg.train.num_steps}-step schedule (--stop_at)")
      source = f"trained in {model_dir}"
      if export:  # then decode the exported (rounded) parameters
        store.export(cfg, model_dir, name, data.tokenizer, command,
                          metrics, SET_DIR, stored_dtype=STORED_DTYPE)
        params, _ = store.find(cfg, name, data.tokenizer, SET_DIR)
        source += f", exported to {SET_DIR / name} and loaded back"
    print(f"{name}: {metrics['steps']} steps, valid loss "
          f"{metrics['valid_loss']:.3f} ({source})", flush=True)
    logits_fn = make_logits_fn(train.model_config(cfg))
    members[name] = (Model(logits_fn, params), metrics, source)
  return members
