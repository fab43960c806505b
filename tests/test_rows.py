"""The one prompt check and the one EOS rule (lm_decoding.decoding.rows)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding import rows

PROMPTS = [[5, 6, 7], [8, 0, 0]]


def test_is_eos_marks_any_of_the_ids_and_nothing_without_ids():
  tokens = jnp.asarray([[3, 5, 7], [7, 3, 0]])
  np.testing.assert_array_equal(rows.is_eos(tokens, (3,)),
                                [[1, 0, 0], [0, 1, 0]])
  np.testing.assert_array_equal(rows.is_eos(tokens, (3, 7)),
                                [[1, 0, 1], [1, 1, 0]])
  assert not rows.is_eos(tokens, ()).any()
  assert rows.is_eos(jnp.int32(3), (3,)).shape == ()


@pytest.mark.parametrize("needs_prompt, low", [(True, 1), (False, 0)])
def test_check_prompts_range_is_low_to_width(needs_prompt, low):
  prompts, lengths = rows.check_prompts(PROMPTS, [3, low], needs_prompt)
  assert prompts.dtype == jnp.int32 and lengths.dtype == jnp.int32
  np.testing.assert_array_equal(lengths, [3, low])
  for bad in ([4, 1], [3, low - 1]):
    with pytest.raises(ValueError,
                       match=rf"prompt_lengths=.* must be in \[{low}, P=3\]"):
      rows.check_prompts(PROMPTS, bad, needs_prompt)


def test_check_prompts_shapes_and_dtypes():
  with pytest.raises(ValueError, match=r"prompts must be int\[B, P\]"):
    rows.check_prompts([5, 6], [1], True)
  with pytest.raises(ValueError, match=r"prompts must be int\[B, P\]"):
    rows.check_prompts(np.zeros((2, 3), np.float32), [1, 1], True)
  with pytest.raises(ValueError, match=r"P >= 1"):
    rows.check_prompts(np.zeros((2, 0), np.int32), [0, 0], True)
  rows.check_prompts(np.zeros((2, 0), np.int32), [0, 0], False)
  for bad in ([1], [1.0, 1.0]):
    with pytest.raises(ValueError,
                       match=r"prompt_lengths must be int\[B\] with B=2"):
      rows.check_prompts(PROMPTS, bad, True)


def test_check_prompts_leaves_traced_lengths_unchecked():
  out = jax.jit(lambda n: rows.check_prompts(PROMPTS, n, True)[1])(
      jnp.asarray([9, 9]))
  np.testing.assert_array_equal(out, [9, 9])


def test_finish_at_eos_and_eos_counts_use_the_rule():
  raw = jnp.asarray([[3, 3], [5, 7], [5, 6]])
  tokens, lengths = rows.finish_at_eos(raw, (3, 7), pad_id=0)
  np.testing.assert_array_equal(tokens, [[3, 0], [5, 7], [5, 6]])
  np.testing.assert_array_equal(lengths, [1, 2, 2])
  assert tuple(map(int, rows.eos_counts(raw, (3, 7)))) == (1, 1)
