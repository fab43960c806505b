"""Tests of the transfer schedule of parallel decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding.schedule import transfer_schedule


@pytest.mark.parametrize("num_masked, steps, expected", [
    (5, 3, [2, 2, 1]),         # C7: larger counts first
    (4, 2, [2, 2]),            # C7: one block of 4 over its 2 steps
    (8, 4, [2, 2, 2, 2]),
    (7, 3, [3, 2, 2]),
    (2, 4, [1, 1, 0, 0]),      # fewer masks than steps
    (0, 3, [0, 0, 0]),
    (7, 1, [7]),
    (1, 1, [1]),
])
def test_examples(num_masked, steps, expected):
  got = transfer_schedule(num_masked, steps)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, expected)


def test_sums_exactly_evenly_larger_first():
  for steps in range(1, 13):
    for num_masked in range(0, 41):
      got = np.asarray(transfer_schedule(num_masked, steps))
      assert got.shape == (steps,)
      assert got.sum() == num_masked
      assert got.max() - got.min() <= 1
      assert np.all(np.diff(got) <= 0), (num_masked, steps, got)


def test_traced_per_row_count():
  counts = jnp.array([5, 0, 9, 1], jnp.int32)
  got = jax.jit(jax.vmap(lambda n: transfer_schedule(n, 3)))(counts)
  expected = [transfer_schedule(int(n), 3) for n in counts]
  np.testing.assert_array_equal(got, np.stack(expected))
  np.testing.assert_array_equal(got.sum(1), counts)


@pytest.mark.parametrize("num_masked, steps, match", [
    (4, 0, "steps=0"),
    (4, -2, "steps=-2"),
    (-1, 3, "num_masked=-1"),
])
def test_bad_arguments_raise(num_masked, steps, match):
  with pytest.raises(ValueError, match=match):
    transfer_schedule(num_masked, steps)
