"""Tests of the transfer schedules of parallel decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.decoding import schedule
from lm_decoding.decoding.schedule import dream_schedule, transfer_schedule


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


# Dream's counts, from its generate's own arithmetic (torch.linspace in
# float32, int(n * (1 - s / t))), computed with torch when this was written.
@pytest.mark.parametrize("num_masked, steps, expected", [
    (64, 8, [7, 8, 8, 8, 8, 8, 8, 9]),
    (10, 5, [1, 2, 2, 2, 3]),
    (64, 64, [0] + [1] * 62 + [2]),   # step 0 commits nothing
    (0, 3, [0, 0, 0]),
    (7, 1, [7]),
])
def test_dream_examples(num_masked, steps, expected):
  got = jax.jit(dream_schedule, static_argnums=1)(num_masked, steps)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, expected)


def test_dream_grid_is_rounded_as_torch_linspace():
  """torch.linspace(1, 1e-3, 9) in float32 (the second half counted from
  the end): points 3 and 4 differ in the last bit from start + i step in
  float32."""
  torch_points = np.array([1.0, 0.875124990940094, 0.750249981880188,
                           0.625374972820282, 0.5005000233650208,
                           0.37562501430511475, 0.25075000524520874,
                           0.12587499618530273, 0.0010000000474974513],
                          np.float32)
  ours = schedule._linspace_float32(1.0, 1e-3, 9)
  np.testing.assert_array_equal(ours, torch_points)
  step = (np.float32(1e-3) - np.float32(1)) / np.float32(8)
  naive = np.float32(1) + step * np.arange(9, dtype=np.float32)
  assert not np.array_equal(naive[3:5], torch_points[3:5])


def test_dream_bad_eps_raises():
  with pytest.raises(ValueError, match="eps=1.5 must be in"):
    dream_schedule(4, 2, eps=1.5)
