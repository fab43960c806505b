"""A researcher's own parallel text: reading, splitting, translate.py's
answers to malformed files, and a 200-pair non-Bible file trained and decoded
end to end.

The fixture is a deterministic toy language pair, English -> a Spanish-like
language: 'the ADJ NOUN VERB the NOUN' -> 'el NOUN ADJ VERB el NOUN' (the
adjective moves after its noun), 15 nouns, 10 adjectives, 8 verbs, 4 pairs
per reference group ('story12 0' .. 'story12 3'). docs/import_and_data.md
uses the same file.
"""

import codecs
import os
import pathlib
import random
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from lm_decoding.data import parallel_text as pt
from lm_decoding.decoding import sampling
from lm_decoding.decoding.autoregressive import AutoregressiveDecoder
from lm_decoding.evaluation import translation_metrics as tm
from lm_decoding.models import Model, make_logits_fn
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import distillation, train
from lm_decoding.training.pretrained import member_recipes, store

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "configs"))
import translation  # noqa: E402

NOUNS = dict(cat="gato", dog="perro", bird="pájaro", house="casa",
             tree="árbol", river="río", book="libro", child="niño",
             moon="luna", sun="sol", horse="caballo", city="ciudad",
             friend="amigo", door="puerta", road="camino")
ADJECTIVES = dict(big="grande", small="pequeño", red="rojo", old="viejo",
                  new="nuevo", happy="feliz", dark="oscuro", green="verde",
                  quiet="tranquilo", strong="fuerte")
VERBS = dict(sees="ve", likes="ama", follows="sigue", finds="encuentra",
             hears="oye", helps="ayuda", paints="pinta", watches="mira")


def toy_pairs(count=200, seed=0):
  """[(reference, source, target)] of the toy language pair."""
  rng = random.Random(seed)
  pick = lambda words: rng.choice(sorted(words))
  out = []
  for i in range(count):
    a, n1, v, n2 = pick(ADJECTIVES), pick(NOUNS), pick(VERBS), pick(NOUNS)
    out.append((f"story{i // 4} {i % 4}", f"the {a} {n1} {v} the {n2}",
                f"el {NOUNS[n1]} {ADJECTIVES[a]} {VERBS[v]} el {NOUNS[n2]}"))
  return out


def write_toy_file(path, columns=3, newline="\n", encoding="utf-8",
                   signature=b""):
  rows = [fields[3 - columns:] for fields in toy_pairs()]
  text = newline.join("\t".join(row) for row in rows) + newline
  path.write_bytes(signature + text.encode(encoding))
  return path


@pytest.fixture()
def toy_file(tmp_path):
  return write_toy_file(tmp_path / "toy_en_es.tsv")


# --- reading ----------------------------------------------------------------

@pytest.mark.parametrize("newline, encoding, signature", [
    ("\n", "utf-8", b""), ("\r\n", "utf-8", codecs.BOM_UTF8),
    ("\r", "utf-8", b""), ("\r\n", "utf-16-le", codecs.BOM_UTF16_LE),
    ("\n", "utf-16-be", codecs.BOM_UTF16_BE)])
def test_editor_variants_of_a_pairs_file_read_the_same(tmp_path, newline,
                                                       encoding, signature):
  path = write_toy_file(tmp_path / "pairs.tsv", 3, newline, encoding,
                        signature)
  assert pt.read_pairs(path) == [pt.Pair(*row) for row in toy_pairs()]


def test_two_column_files_get_references_by_document_or_line(tmp_path):
  lines = write_toy_file(tmp_path / "lines.tsv", columns=2)
  pairs = pt.read_pairs(lines)
  assert [p.reference for p in pairs[:2]] == ["line1", "line2"]
  assert [(p.source, p.target) for p in pairs] == [
      row[1:] for row in toy_pairs()]
  documents = tmp_path / "documents.tsv"
  documents.write_text("a b\tc d\ne f\tg h\n\n\ni j\tk l\n", encoding="utf-8")
  assert [p.reference for p in pt.read_pairs(documents)] == [
      "doc1 1", "doc1 2", "doc2 1"]
  assert [p.group for p in pt.read_pairs(documents)] == ["doc1", "doc1",
                                                         "doc2"]


def test_split_by_fraction_keeps_groups_and_is_stable(toy_file):
  """Without the Bible's held-out books: whole reference groups, about 10%
  each to valid and test, the same for any file holding a group (a subset
  in another order, as a distilled file is)."""
  pairs = pt.read_pairs(toy_file)
  splits = pt.split_pairs(pairs)
  sizes = {name: len(split) for name, split in splits.items()}
  assert sizes == {"train": 164, "valid": 8, "test": 28}  # docs example
  groups = {name: {p.group for p in split} for name, split in splits.items()}
  assert not (groups["train"] & groups["valid"] or groups["train"]
              & groups["test"] or groups["valid"] & groups["test"])
  again = pt.split_pairs(list(reversed(pairs[::2])))
  for name in pt.SPLITS:
    assert {p.group for p in again[name]} <= groups[name]


def test_too_few_groups_to_split_is_named(tmp_path):
  path = tmp_path / "one.tsv"
  path.write_text("only 1\ta\tb\nonly 2\tc\td\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"1 groups .* leaves \['(valid|test)"):
    pt.split_pairs(pt.read_pairs(path))


# --- malformed files: one line from translate.py, no workdir left -----------

MALFORMED = {
    "wrong_columns.tsv": ("a 1\tone\tuno\na 2\tonly two\n".encode(),
                          r"wrong_columns.tsv:2: expected 3 tab-separated"),
    "four_columns.tsv": (b"a\tb\tc\td\n", r"four_columns.tsv:1: expected 2 "
                         r"or 3"),
    "empty.tsv": (b"", r"empty.tsv' is empty"),
    "blank.tsv": (b"\r\n \n", r"blank.tsv' is empty"),
    "latin1.tsv": ("a 1\tcafe\tcaf\xe9\n".encode("latin-1"),
                   r"latin1.tsv' is not UTF-8 text: line 1 holds byte 0xe9"),
    "no_target.tsv": ("a 1\tone\tuno\na 2\ttwo\t \n".encode(),
                      r"no_target.tsv:2: the target \(column 3\) is empty"),
    "no_source.tsv": ("one\tuno\n\tdos\n".encode(),
                      r"no_source.tsv:2: the source \(column 1\) is empty"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_files_are_refused_by_read_pairs(tmp_path, name):
  content, message = MALFORMED[name]
  (tmp_path / name).write_bytes(content)
  with pytest.raises(ValueError, match=message):
    pt.split_pairs(pt.read_pairs(tmp_path / name))


def _translate(tmp_path, *flags, timeout=120):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  tick = time.time()
  proc = subprocess.run(
      [sys.executable, str(REPO / "experiments" / "translate.py"), *flags],
      capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
  return proc, time.time() - tick


@pytest.mark.parametrize("name", ["wrong_columns.tsv", "empty.tsv",
                                  "latin1.tsv", "no_target.tsv"])
def test_translate_refuses_a_malformed_file_in_one_line(tmp_path, name):
  content, message = MALFORMED[name]
  (tmp_path / name).write_bytes(content)
  workdir = tmp_path / "work"
  proc, seconds = _translate(tmp_path, f"--workdir={workdir}",
                             f"--config.data.path={tmp_path / name}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith("translate: error: ")
  assert re.search(message, lines[0]), lines[0]
  assert not workdir.exists()
  assert seconds < 60  # imports, then the check: before any compile


@pytest.mark.parametrize("flags, message", [
    ((), "vocab_size=2048 does not fit the texts"),
    (("--config.data.vocab_size=360",),
     "validation split has 8 sequences .* fewer than train.batch_size=32"),
])
def test_translate_removes_its_workdir_when_the_data_fails_later(
    tmp_path, toy_file, flags, message):
  """A vocabulary too large for the file (tokenizer training) or a valid
  split smaller than a batch (training's own check) fails after the data
  cache was created: still one line, no workdir."""
  workdir = tmp_path / "work"
  proc, _ = _translate(tmp_path, f"--workdir={workdir}",
                       f"--config.data.path={toy_file}", *flags)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-3000:]
  assert re.search(message, lines[0]), lines[0]
  assert not workdir.exists()


# --- end to end ---------------------------------------------------------------

def toy_config(path):
  """configs/translation.py at smoke size for the toy file (the docs'
  command sets the same values as flags)."""
  config = translation.get_config()
  config.data.update(path=str(path), vocab_size=360, max_source_tokens=16,
                     max_target_tokens=16, seq_len=34)
  config.model.update(d_model=32, num_layers=1, head_dim=8, mlp_dim=64,
                      max_len=64)
  config.train.update(num_steps=3, eval_every=3, eval_batches=1,
                      checkpoint_every=3, batch_size=8)
  config.translate.distill = False
  return config


def test_own_file_trains_and_decodes_end_to_end(tmp_path, toy_file):
  """The path translate.py takes, for its AR member: prepare (split, joint
  tokenizer), train 3 steps, greedy-decode every test pair, score."""
  config = toy_config(toy_file)
  data_dir = tmp_path / "data"
  data = pt.prepare(config.data.vocab_size, config.data.max_source_tokens,
                    config.data.max_target_tokens, config.data.path,
                    cache_dir=data_dir)
  assert {n: len(e.pairs) for n, e in data.splits.items()} == {
      "train": 160, "valid": 8, "test": 25}
  member = member_recipes.translation_member_configs(config)["translation_ar"]
  summary = train.train(member, str(tmp_path / "ar"), progress=False,
                        data_dir=str(data_dir))
  assert summary["steps"] == 3 and np.isfinite(summary["valid_loss"])
  params = store.load_trained_params(member, str(tmp_path / "ar"))
  model = Model(make_logits_fn(train.model_config(member)), params)
  decoder = AutoregressiveDecoder(
      sampling=sampling.SamplingConfig(temperature=0.0),
      output_length=config.data.max_target_tokens + 1, eos_ids=(EOS_ID,),
      pad_id=PAD_ID, prompt_attention="bidirectional")
  prompts, lengths = pt.prompts(data.splits["test"])
  tokens, nfe = distillation.translate_all(decoder, model, prompts, lengths,
                                           batch_size=25)
  hypotheses, counts = distillation.texts(data.tokenizer, tokens)
  assert len(hypotheses) == 25 and nfe > 0
  references = [p.target for p in data.splits["test"].pairs]
  assert 0.0 <= tm.corpus_bleu(hypotheses, references).score <= 100.0
