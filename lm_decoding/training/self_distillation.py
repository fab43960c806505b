"""The self-distillation data set: a teacher's continuations of training
prefixes (dParallel, Chen et al. 2025, arXiv:2509.26488; the loss that trains
on them is `objectives/certainty_forcing.py`).

R prefixes of P training tokens, each continued for T tokens by a registered
decoder on the teacher (the AR parent with the cached `ar` decoder is the
cheapest; greedy and sampled); rows [prefix (P) | continuation (T)], PAD
after an EOS, saved as `tokens.npy` int32[R, P + T] beside `manifest.json`
(teacher, decoder, prefixes, counts, seconds, command).
"""

from __future__ import annotations

import io
import json
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.checks import is_count
from lm_decoding.data import pipeline
from lm_decoding.decoding.sampling import is_greedy
from lm_decoding.models import Model
from lm_decoding.special_tokens import EOS_ID, MASK_ID, PAD_ID

TOKENS_FILE = "tokens.npy"
TOKENS = TOKENS_FILE.removesuffix(".npy")  # its array's name (`write_set`)
MANIFEST_FILE = "manifest.json"
# The reserved ids no training target may hold: a teacher's decoder is given
# them as `SamplingConfig.suppress_ids` (an AR model gives MASK a small but
# nonzero probability: 3 draws in 196,637 tokens at temperature 1), and a set
# holding MASK is refused (its target scores SUBS's finite log 0: a loss
# near 1e35).
UNTARGETED_IDS = (PAD_ID, MASK_ID)


PREFIX_PLACES = ("cuts", "document_starts")


def distillation_prefixes(stream: np.ndarray, prompt_length: int, count: int,
                          seed: int, at: str = "cuts") -> np.ndarray:
  """int32[count, P]: `count` distinct prefixes of P tokens of the token
  stream `stream` (a training split, documents ended by EOS), drawn without
  replacement by `numpy.random.default_rng(seed)`.

  at="cuts" cuts the stream at multiples of P (a prefix may start mid-
  document or hold an EOS); at="document_starts" takes the first P tokens of
  documents of at least P tokens, as the held-out prompts are
  (`pipeline.prompts`), so the teacher continues them as far as it
  continues those.

  Raises:
    ValueError: P or count below 1, `at` not in PREFIX_PLACES, or more
      prefixes asked than the stream holds.
  """
  if not is_count(prompt_length) or not is_count(count):
    raise ValueError(f"prompt_length={prompt_length!r} and count={count!r} "
                     "must be integers >= 1")
  if at == "cuts":
    candidates = np.arange(len(stream) // prompt_length) * prompt_length
  elif at == "document_starts":
    starts, lengths = pipeline.document_spans(stream)
    candidates = starts[lengths >= prompt_length]
  else:
    raise ValueError(f"at={at!r}; allowed: {PREFIX_PLACES}")
  if count > len(candidates):
    raise ValueError(f"count={count} prefixes of {prompt_length} tokens at "
                     f"{at}; the stream holds {len(candidates)}")
  starts = np.random.default_rng(seed).choice(candidates, count,
                                              replace=False)
  return np.stack([stream[s:s + prompt_length] for s in starts]).astype(
      np.int32)


def teacher_continuations(decoder, teacher: Model, prefixes_RxP: np.ndarray,
                          key: jax.Array, batch_size: int) -> np.ndarray:
  """int32[R, P + T]: each prefix followed by the `decoder`'s continuation.

  The rows are decoded in chunks of `batch_size` (the last one padded with
  copies of its first row, so one compile serves every chunk); chunk c
  uses `fold_in(key, c)`, and a registered decoder's rows decode alike in
  any batch, so the result depends on (decoder, teacher, prefixes, key,
  batch_size) only. Tokens after a row's EOS are PAD.

  Args:
    decoder: a registered decoder config with role 'model' (e.g. `ar`).
    teacher: the model it decodes with.
    prefixes_RxP: int32[R, P] prompts (full length, no PAD).
    key: PRNG key (unused by greedy decoders).
    batch_size: rows per decode call, >= 1.
  Raises:
    ValueError: batch_size below 1, no prefix, or as the decoder's decode.
  """
  if not is_count(batch_size):
    raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
  prefixes_RxP = np.asarray(prefixes_RxP, np.int32)
  rows, prompt_length = prefixes_RxP.shape
  if rows < 1:
    raise ValueError("prefixes_RxP must hold at least one row")
  models = {"model": teacher}
  out = []
  for c, start in enumerate(range(0, rows, batch_size)):
    chunk = prefixes_RxP[start:start + batch_size]
    padded = np.concatenate(
        [chunk, np.repeat(chunk[:1], batch_size - len(chunk), 0)])
    result = decoder.decode(models, jnp.asarray(padded),
                            jnp.full((batch_size,), prompt_length, jnp.int32),
                            jax.random.fold_in(key, c))
    out.append(np.asarray(result.tokens)[:len(chunk)])
  return np.concatenate([prefixes_RxP, np.concatenate(out)], axis=1)


def write_set(out_dir: str | pathlib.Path, arrays: dict[str, np.ndarray],
              manifest: dict) -> pathlib.Path:
  """Writes each of `arrays` ({name: array}) as `<name>.npy` and `manifest`
  (plus 'arrays': their names) as `manifest.json` into `out_dir` (created):
  the folder layout of every set written here (distillation, Jacobi
  states). The old manifest goes first and the new one is written last,
  each file atomically, so a stopped write leaves no readable set.

  Returns:
    `out_dir` as a path.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  # No set until the new manifest is in place: a write stopped part way
  # leaves a folder `read_set` refuses, never an old manifest beside some
  # new arrays. Each file is replaced atomically.
  (out / MANIFEST_FILE).unlink(missing_ok=True)
  for name, array in arrays.items():
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array))
    pipeline.write_atomic(out / f"{name}.npy", buffer.getvalue())
  manifest = {**manifest, "arrays": sorted(arrays)}
  pipeline.write_atomic(out / MANIFEST_FILE,
                        (json.dumps(manifest, indent=2) + "\n").encode())
  return out


def read_set(path: str | pathlib.Path, names, what: str, writer: str
             ) -> tuple[dict[str, np.ndarray], dict]:
  """({name: array}, manifest) of the set `write_set` wrote at `path`.

  Args:
    path: the folder.
    names: the arrays to read (`<name>.npy` each).
    what: how the error names the folder (a config key or a flag).
    writer: the script that writes such a set (named in the error).
  Raises:
    ValueError: `path` holds no `manifest.json` or one of the arrays, or
      its manifest's 'arrays' do not list it (another set's leftover).
  """
  path = pathlib.Path(path)
  manifest_file = path / MANIFEST_FILE
  manifest = (json.loads(manifest_file.read_text())
              if manifest_file.is_file() else {})
  written = manifest.get("arrays")  # absent in sets written before it
  missing = ([] if manifest_file.is_file() else [MANIFEST_FILE]) + [
      f"{name}.npy" for name in names if not (path / f"{name}.npy").is_file()
      or (written is not None and name not in written)]
  if missing:
    raise ValueError(f"{what}={str(path)!r} holds no {' and '.join(missing)} "
                     f"(write it with {writer})")
  return {name: np.load(path / f"{name}.npy") for name in names}, manifest


def write_distillation_set(out_dir: str | pathlib.Path, tokens_RxL: np.ndarray,
                           manifest: dict) -> pathlib.Path:
  """Writes `tokens.npy` (int32[R, L]) and `manifest.json` (`manifest` plus
  'rows' and 'tokens', the non-PAD count) into `out_dir` (created;
  `write_set`).

  Returns:
    `out_dir` as a path.
  Raises:
    ValueError: a row holding MASK_ID (nothing is written).
  """
  tokens_RxL = np.asarray(tokens_RxL, np.int32)
  _check_no_mask(tokens_RxL, f"the rows for {str(out_dir)!r}")
  return write_set(out_dir, {TOKENS: tokens_RxL}, {
      **manifest, "rows": int(tokens_RxL.shape[0]),
      "tokens": int((tokens_RxL != PAD_ID).sum())})


def read_distillation_set(path: str | pathlib.Path
                          ) -> tuple[np.ndarray, dict]:
  """(tokens int32[R, L], manifest) of a set `write_distillation_set` wrote.

  Raises:
    ValueError: `path` holds no such set, or a row holding MASK_ID.
  """
  arrays, manifest = read_set(path, [TOKENS],
                              "data.distillation_set",
                              "experiments/distill_data.py")
  tokens_RxL = arrays[TOKENS].astype(np.int32)
  _check_no_mask(tokens_RxL, f"data.distillation_set={str(path)!r}")
  return tokens_RxL, manifest


def greedy_rows(tokens_RxL: np.ndarray, manifest: dict) -> np.ndarray:
  """int32[R', L]: the rows of a distillation set (`read_distillation_set`)
  that its greedy decoder wrote: the block of prefixes.count rows of the
  manifest's decoder labelled 'temperature=<t>' with t greedy
  (`temperature_labels`; `timed_continuations` writes one block of rows
  per decoder, in the manifest's order).

  Raises:
    ValueError: the manifest names no greedy decoder, or its rows are not
      decoders x prefixes.count.
  """
  labels = manifest.get("decoders", [])
  count = manifest.get("prefixes", {}).get("count")
  greedy = [i for i, label in enumerate(labels) if "temperature=" in label
            and is_greedy(float(label.split("temperature=")[1].split()[0]))]
  if not greedy:
    raise ValueError(f"the distillation set's decoders {labels} hold no "
                     "greedy one ('... temperature=0'); write one with "
                     "experiments/distill_data.py --temperatures=0,...")
  if not is_count(count) or len(tokens_RxL) != count * len(labels):
    raise ValueError(f"the distillation set holds {len(tokens_RxL)} rows; "
                     f"its manifest says {len(labels)} decoders x {count} "
                     "prefixes")
  return np.asarray(tokens_RxL[greedy[0] * count:(greedy[0] + 1) * count],
                    np.int32)


def _check_no_mask(tokens_RxL: np.ndarray, what: str) -> None:
  """Raises ValueError naming the rows of `tokens_RxL` that hold MASK_ID."""
  rows = np.flatnonzero((tokens_RxL == MASK_ID).any(-1))
  if rows.size:
    raise ValueError(f"{what}: {rows.size} row(s) hold the MASK id "
                     f"{MASK_ID} (rows {rows[:5].tolist()}), which no "
                     "target may be; decode them with "
                     "SamplingConfig(suppress_ids=UNTARGETED_IDS), as "
                     "experiments/distill_data.py does")


def eos_filled(tokens_RxL: np.ndarray, block_length: int,
               eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> np.ndarray:
  """int32[R, L]: `tokens_RxL` with the PAD after a row's EOS turned into EOS
  up to the end of the EOS's block (blocks of `block_length` from index 0,
  the BD3-LM layout); later blocks keep their PAD.

  A teacher's row ends in PAD after its EOS (`teacher_continuations`), and
  PAD is never masked nor scored, so a student trained on such rows sees the
  PAD after an EOS in its noisy block, a cue no decoder gives it (a block
  decoder shows MASK there), and is never taught to write the end. Filled
  with EOS, the rest of that block is masked and scored like any token
  (LLaDA's SFT pads its answers with EOS the same way, to the row's end);
  the blocks after it are never decoded, since a block decoder stops once
  its rows have ended, so they stay PAD and unscored.

  Raises:
    ValueError: block_length below 1.
  """
  if not is_count(block_length):
    raise ValueError(f"block_length={block_length!r} must be an integer >= 1")
  tokens_RxL = np.asarray(tokens_RxL, np.int32)
  rows, length = tokens_RxL.shape
  is_pad_RxL = tokens_RxL == pad_id
  first_pad_R = np.where(is_pad_RxL.any(1), np.argmax(is_pad_RxL, 1), length)
  after_eos_R = (first_pad_R > 0) & (
      tokens_RxL[np.arange(rows), np.maximum(first_pad_R - 1, 0)] == eos_id)
  block_end_R = ((first_pad_R - 1) // block_length + 1) * block_length
  index_L = np.arange(length)
  fill_RxL = (after_eos_R[:, None] & is_pad_RxL
              & (index_L[None, :] < block_end_R[:, None]))
  return np.where(fill_RxL, eos_id, tokens_RxL).astype(np.int32)


def temperature_labels(entries) -> dict[str, float]:
  """{label: temperature} of the teacher's temperatures (`distill_data.py`'s
  --temperatures), in order.

  Entry i is labelled 'temperature=<entry>', with ' sample <i>' added when
  another entry has the same value (each repeat samples again with its own
  key in `timed_continuations`).

  Args:
    entries: strings (or numbers), e.g. ['0', '0.7', '0.7'].
  Returns:
    {label: float temperature}.
  Raises:
    ValueError: naming --temperatures: no entry, an entry that is not a
      number in [0, inf), or more than one greedy entry (below
      `sampling.MIN_TEMPERATURE`, 0 included: greedy decoding gives the same
      rows again).
  """
  values = []
  for entry in entries:
    try:
      value = float(entry)
    except (TypeError, ValueError):
      value = math.nan
    if not 0 <= value < math.inf:
      raise ValueError(f"--temperatures entry {entry!r} must be a number in "
                       "[0, inf) (0: greedy)")
    values.append(value)
  if not values:
    raise ValueError("--temperatures must hold at least one temperature")
  greedy = [str(e) for e, v in zip(entries, values) if is_greedy(v)]
  if len(greedy) > 1:
    raise ValueError(f"--temperatures holds {len(greedy)} greedy entries "
                     f"{greedy}: greedy decoding repeats the same rows; give "
                     "one")
  return {f"temperature={str(e).strip()}"
          + (f" sample {i}" if values.count(v) > 1 else ""): v
          for i, (e, v) in enumerate(zip(entries, values))}


def member_widths(entries, default: int) -> dict[str, int]:
  """{member: block length} of `distill_measure.py`'s --models.

  Args:
    entries: 'NAME' (block length `default`) or 'NAME:W' strings.
  Returns:
    {NAME: W}, in order.
  Raises:
    ValueError: naming --models: a W that is not an integer >= 1, or a
      member named twice (its rows would share their labels).
  """
  widths = {}
  for entry in entries:
    name, _, width = entry.partition(":")
    if name in widths:
      raise ValueError(f"--models names {name!r} twice; give each member once")
    if width and not (width.isdigit() and int(width) >= 1):
      raise ValueError(f"--models entry {entry!r}: the block length after ':' "
                       "must be an integer >= 1")
    widths[name] = int(width) if width else default
  return widths


def timed_continuations(decoders: dict, teacher: Model,
                        prefixes_RxP: np.ndarray, key: jax.Array,
                        batch_size: int) -> tuple[np.ndarray, dict]:
  """(tokens int32[D R, P + T], {label: seconds}): `teacher_continuations`
  of every decoder of `decoders` ({label: config}) in order, decoder d with
  `fold_in(key, d)`, with each one's wall seconds (compile included: the
  generation's compute, counted in the student's)."""
  rows, seconds = [], {}
  for d, (label, decoder) in enumerate(decoders.items()):
    tick = time.time()
    rows.append(teacher_continuations(decoder, teacher, prefixes_RxP,
                                      jax.random.fold_in(key, d), batch_size))
    seconds[label] = time.time() - tick
  return np.concatenate(rows), seconds

