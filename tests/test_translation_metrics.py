"""Tests of lm_decoding.evaluation.translation_metrics."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from lm_decoding.evaluation import quality
from lm_decoding.evaluation import translation_metrics as tm

REFERENCES = ["Y dijo Dios: Sea la luz: y fué la luz.",
              "EN el principio crió Dios los cielos y la tierra.",
              "Y vió Dios que la luz era buena.",
              "hola mundo"]
HYPOTHESES = ["Y dijo Dios: Sea luz y fué luz.",
              "En el principio creó Dios el cielo y la tierra.",
              "Y Dios vió la luz la luz buena.",
              "hola a todo el mundo"]


def _cli(tmp_path, metric):
  ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
  ref.write_text("\n".join(REFERENCES) + "\n")
  hyp.write_text("\n".join(HYPOTHESES) + "\n")
  cli = pathlib.Path(sys.executable).with_name("sacrebleu")
  out = subprocess.run([str(cli), str(ref), "-i", str(hyp), "-m", metric,
                        "-b", "-w", "6"], capture_output=True, text=True,
                       check=True)
  return float(out.stdout)


@pytest.mark.parametrize("metric,fn", [("bleu", tm.corpus_bleu),
                                       ("chrf", tm.corpus_chrf)])
def test_scores_equal_the_sacrebleu_command_line(tmp_path, metric, fn):
  score = fn(HYPOTHESES, REFERENCES)
  assert score.score == pytest.approx(_cli(tmp_path, metric), abs=1e-5)
  assert score.score > 0 and "version:" in score.signature


def test_bleu_is_100_on_the_references_and_checks_alignment():
  assert tm.corpus_bleu(REFERENCES, REFERENCES).score == pytest.approx(100)
  with pytest.raises(ValueError, match="equally many"):
    tm.corpus_bleu(HYPOTHESES[:2], REFERENCES)


def test_consecutive_repetition_rate():
  rates = tm.consecutive_repetition_rate(
      ["y y dijo dijo Dios", "Dios dijo", "luz", "la luz, la luz LUZ"])
  np.testing.assert_array_equal(rates[[0, 1, 3]], [0.5, 0.0, 0.25])
  assert np.isnan(rates[2])


def test_both_omission_rates_take_hypotheses_then_references():
  # The reference's content word 'mat' is missing from the hypothesis; the
  # other order would find nothing missing from 'mat cat'.
  hypothesis, reference = ["cat"], ["mat cat"]
  assert quality.omission_rate(hypothesis, reference)[0] == 0.5
  assert tm.omission_rate(["luz"], ["dios luz"])[0] == 0.5


def test_omission_rate_ignores_spanish_stopwords():
  rates = tm.omission_rate(["la luz era", "de la"],
                           ["Y vió Dios que la luz era buena.", "de la"])
  # content words {vió, dios, luz, buena} ('que', 'la', 'era' are stop
  # words): 3 missing (vió, dios, buena)
  assert rates[0] == pytest.approx(3 / 4)
  assert np.isnan(rates[1])


def test_length_error():
  err = tm.length_error([3, 5, 4], [4, 5, 2])
  assert err == pytest.approx({"mean_abs": 1.0, "mean_signed": 1 / 3,
                               "relative": (1 / 4 + 0 + 1) / 3,
                               "exact": 1 / 3})
  with pytest.raises(ValueError, match="must be \\[R\\]"):
    tm.length_error([1, 2], [1])
