"""Tests of lm_decoding.evaluation.trace."""

import jax
import numpy as np
import pytest

import stubs
from lm_decoding.decoding import make_decoder
from lm_decoding.decoding.base import bind
from lm_decoding.decoding.engine import prompt_layout
from lm_decoding.evaluation import trace
from lm_decoding.special_tokens import MASK_ID


def test_commit_steps_worked_example():
  initial = np.array([[7, MASK_ID, MASK_ID, MASK_ID]])
  states = np.array([[[7, MASK_ID, 5, MASK_ID]], [[7, 6, 5, MASK_ID]],
                     [[7, 6, MASK_ID, 8]], [[7, 6, 9, 8]]])  # re-mask at step 2
  np.testing.assert_array_equal(trace.commit_steps(initial, states),
                                [[-1, 1, 3, 2]])
  with pytest.raises(ValueError, match="still masked"):
    trace.commit_steps(initial, states[:2])
  with pytest.raises(ValueError, match="shape"):
    trace.commit_steps(initial, states[:, 0])


def test_llada_blocks_commit_left_to_right():
  decoder = make_decoder("llada", output_length=8, steps=8, block_length=4)
  prompts, lengths = np.array([[6, 7]]), np.array([2])
  out = decoder.denoise(bind(stubs.HashDenoiser(), np.uint32(1)), prompts,
                        lengths, jax.random.key(0), trace=True)
  initial, _, _ = prompt_layout(prompts, lengths, 8)
  steps = trace.commit_steps(initial, out.states)[0]
  assert list(steps[:2]) == [-1, -1]
  assert steps[2:6].max() < steps[6:].min()  # block 0 before block 1
  assert sorted(steps[2:]) == list(range(8))  # one commit per step
  fig = trace.plot_commit_order(steps, labels=[str(i) for i in range(10)])
  assert len(fig.axes[0].patches) == 8
