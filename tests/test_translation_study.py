"""translation_study: buckets, scores and the speed-up table, exactly."""

import ml_collections
import numpy as np

from lm_decoding.studies import translation_study as study


def test_bucketed_keeps_non_empty_buckets_in_order_and_caps_them():
  lengths = np.array([3, 30, 12, 13, 50, 1])
  assert study.bucketed(lengths) == {(1, 12): [0, 2, 5], (13, 24): [3],
                                     (25, 36): [1]}
  assert study.bucketed(lengths, limit=2)[1, 12] == [0, 2]


def test_score_of_a_perfect_and_a_repeating_hypothesis():
  refs = ["el hombre come pan", "la casa es grande"]
  row, signature = study.score("x", "m", refs, np.array([4, 4]), refs,
                               np.array([4, 4]))
  assert (row["bleu"], row["repetition"], row["omission"]) == (100.0, 0.0,
                                                               0.0)
  assert (row["length_mean_abs"], row["length_exact"]) == (0.0, 1.0)
  assert signature.startswith("nrefs:1")
  row, _ = study.score("y", "m", ["el el hombre come pan", refs[1]],
                       np.array([5, 4]), refs, np.array([4, 4]))
  assert row["repetition"] == round((1 / 4 + 0) / 2, 4)
  assert row["length_mean_signed"] == 0.5


def test_speedups_and_table_against_both_ar_rows():
  rows = [dict(decoder="AR greedy", bleu=10.0, ms_per_sentence=4.0),
          dict(decoder="AR beam 4", bleu=12.0, ms_per_sentence=8.0),
          dict(decoder="CTC x2", bleu=9.0, ms_per_sentence=2.0, chrf=30.0,
               repetition=0.1, omission=0.2)]
  study.add_speedups(rows)
  assert [(r["speedup_vs_ar_greedy"], r["speedup_vs_ar_beam"])
          for r in rows] == [(1.0, 2.0), (0.5, 1.0), (2.0, 4.0)]
  table = study.speedup_table(rows).splitlines()
  assert len(table) == 3  # header, rule, the one NAR row
  assert table[2] == ("| CTC x2 | 9.0 | -1.00 | -3.00 | 30.0 | 0.1 | 0.2 | "
                      "2.0 | 2.0 | 4.0 |")


def test_decoders_grid_follows_the_config():
  config = ml_collections.ConfigDict(dict(
      data=dict(max_target_tokens=8), train=dict(ctc_upsample=2),
      translate=dict(num_beams=4, length_beams=(1, 3),
                     mask_predict_steps=(1, 4), distill=False,
                     distilled_length_beams=(1,))))
  labels = [label for label, _, _ in study.decoders(config)]
  assert labels == ["AR greedy", "AR beam 4", "CMLM one-shot l=1",
                    "Mask-Predict K=4 l=1", "CMLM one-shot l=3",
                    "Mask-Predict K=4 l=3", "CTC x2"]
  config.translate.distill = True
  assert [label for label, _, _ in study.decoders(config)][-1] == "CTC x2 KD"
