"""Jacobi trajectories of a causal LM over fixed blocks: the states that
consistency training learns from (CLLM, Kou et al. 2024, "CLLMs: Consistency
Large Language Models", arXiv:2403.00835; Jacobi Forcing, arXiv:2512.14681).
The loss that trains on them is `objectives/jacobi_forcing.py`; the decoder
they are for is `jacobi` (`decoding/self_drafting.py`), which stays lossless.

A row [prefix (P) | y*] holds the AR model's greedy continuation y* (the
greedy rows of a distillation set, `self_distillation.greedy_rows`). Block k
covers positions s = P + k n .. s + n - 1. Jacobi decoding of the block after
the committed text row[:s] iterates, one causal forward on [row[:s], g^j]
per iteration,

  g^0       = (PAD, ..., PAD)     (the `jacobi` decoder's first guess)
  g^{j+1}_i = argmax_v p(v | row[:s], g^j_0 .. g^j_{i-1})   (i = 0 .. n-1),

the prediction at position s + i - 1. g^{j+1}_0 is always y*_s, and under
greedy decoding each iteration fixes at least one more token, so g^j is
y*[s:s+n] for some j <= n: the fixed point. The states are g^0 .. g^{J-1},
J the first j with g^j = y*[s:s+n] (the converged state left out), J <= n
(a float tie that keeps the fixed point off y* stops at n;
`Trajectories.converged` says whether g^n reached y*, the n-th forward run
for that check alone). Block positions after an EOS of y* (PAD in the row)
are not compared. Blocks starting after the row's first EOS at or after P
(or at a PAD) are not live.

Worked example, n = 3, y*[s:s+3] = (a, b, c), a model that is right one
token past its last right input:

  g^0 = (PAD, PAD, PAD)
  g^1 = (a,   x,   y)      states g^0, g^1, g^2; J = 3
  g^2 = (a,   b,   z)
  g^3 = (a,   b,   c) = y*

The set `experiments/jacobi_data.py` writes holds one row per sampled state,
[row[:s] | g^j | PAD ...] (`state_rows`), its block start and its clean row;
`forcing_pairs` lays them out for the loss.
"""

from __future__ import annotations

import pathlib

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from lm_decoding.checks import is_count
from lm_decoding.special_tokens import EOS_ID, PAD_ID
from lm_decoding.training import self_distillation

# The arrays of a Jacobi state set (`self_distillation.write_set`).
SET_ARRAYS = ("tokens", "block_starts", "row_index", "clean")


def block_starts(prompt_length: int, block_length: int, num_blocks: int,
                 length: int) -> np.ndarray:
  """int32[N]: the block starts P, P + n, ..., P + (N - 1) n.

  Raises:
    ValueError: P, n or K below 1, or the last block ending after `length`.
  """
  for name, value in (("prompt_length", prompt_length),
                      ("block_length", block_length),
                      ("num_blocks", num_blocks)):
    if not is_count(value):
      raise ValueError(f"{name}={value!r} must be an integer >= 1")
  end = prompt_length + num_blocks * block_length
  if end > length:
    raise ValueError(f"{num_blocks} blocks of {block_length} after a prefix "
                     f"of {prompt_length} end at {end}; the rows hold {length}"
                     f" tokens (num_blocks <= "
                     f"{(length - prompt_length) // block_length})")
  return (prompt_length + block_length * np.arange(num_blocks)).astype(
      np.int32)


def live_blocks(rows_RxL: jax.Array, starts_N, prompt_length: int,
                eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> jax.Array:
  """bool[R, N]: whether block k of row r is decoded: its first token is not
  PAD and no EOS lies in row[P:s] (an EOS inside the prefix does not end it).

  Args:
    rows_RxL: int32[R, L] rows [prefix | greedy continuation, PAD after EOS].
    starts_N: int32[N] block starts (`block_starts`), each < L.
    prompt_length: P.
  """
  starts_N = jnp.asarray(starts_N)
  index_L = jnp.arange(rows_RxL.shape[1])
  eos_RxL = (rows_RxL == eos_id) & (index_L >= prompt_length)[None]
  first_eos_R = jnp.where(eos_RxL.any(1), jnp.argmax(eos_RxL, 1),
                          rows_RxL.shape[1])
  return ((rows_RxL[:, starts_N] != pad_id)
          & (starts_N[None, :] <= first_eos_R[:, None]))


def jacobi_iteration(logits_fn, params, rows_RxL: jax.Array, start: int,
                     guess_RxW: jax.Array) -> jax.Array:
  """int32[R, n]: g^{j+1} of the block at `start` from the guess g^j: the
  argmax at positions start - 1 .. start + n - 2 of one uncached causal
  forward on [row[:start], guess] (module docstring).

  Args:
    logits_fn: a causal model (the decoder boundary), uncached.
    params: its parameters.
    rows_RxL: int32[R, L] the rows; row[:start] is the committed text.
    start: s >= 1, static.
    guess_RxW: int32[R, n] g^j.
  """
  inputs_RxL = jnp.concatenate([rows_RxL[:, :start], guess_RxW], 1)
  positions_RxL = jnp.broadcast_to(jnp.arange(inputs_RxL.shape[1]),
                                   inputs_RxL.shape)
  logits_RxLxV = logits_fn(params, inputs_RxL, positions_RxL).logits
  block_RxWxV = logits_RxLxV[:, start - 1:start - 1 + guess_RxW.shape[1]]
  return jnp.argmax(block_RxWxV, -1).astype(jnp.int32)


def block_trajectory(logits_fn, params, rows_RxL: jax.Array, start: int,
                     block_length: int, pad_id: int = PAD_ID) -> jax.Array:
  """int32[R, n + 1, n]: g^0 .. g^n of the block at `start` (g^0 all PAD;
  n `jacobi_iteration`s), state j at [:, j]."""
  guess_RxW = jnp.full((rows_RxL.shape[0], block_length), pad_id, jnp.int32)

  def iterate(guess, _):
    following = jacobi_iteration(logits_fn, params, rows_RxL, start, guess)
    return following, following

  _, later_KxRxW = jax.lax.scan(iterate, guess_RxW, None,
                                length=block_length)
  return jnp.concatenate([guess_RxW[None], later_KxRxW], 0).transpose(1, 0, 2)


@flax.struct.dataclass
class Trajectories:
  """The Jacobi states of R rows x N blocks (`jacobi_states`).

  Attributes:
    states: int32[R, N, n, n] g^j of block k of row r at [r, k, j].
    live: bool[R, N, n] whether g^j is a state of the trajectory (the block
      is live and g^0 .. g^j all differ from y*[s:s+n]).
    starts: int32[N] the block starts.
    converged: bool[R, N] whether the block is live and one of g^0 .. g^n
      is y*[s:s+n] (always, but for float ties, under the greedy rows of
      the same model: False flags rows of another model).
  """

  states: jax.Array
  live: jax.Array
  starts: jax.Array
  converged: jax.Array


def jacobi_states(logits_fn, params, rows_RxL: jax.Array, *,
                  prompt_length: int, block_length: int, num_blocks: int,
                  eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> Trajectories:
  """The Jacobi trajectory states of the first `num_blocks` blocks of n =
  `block_length` after the prefix of each row (module docstring). Pure; jit
  it with `logits_fn` and the keyword arguments static (`jitted_states`).
  Rows are independent: a batch gives each row's own states.

  Args:
    logits_fn: a causal model (the decoder boundary), run uncached.
    params: its parameters.
    rows_RxL: int32[R, L] rows [prefix (P) | the model's greedy
      continuation y*, PAD after its EOS].
    prompt_length: P >= 1.
    block_length: n >= 1.
    num_blocks: K >= 1, P + K n <= L.
  Returns:
    `Trajectories` (states int32[R, N, n, n], live bool[R, N, n]).
  Raises:
    ValueError: rows not int[R, L], or as `block_starts`.
  """
  if rows_RxL.ndim != 2 or not jnp.issubdtype(rows_RxL.dtype, jnp.integer):
    raise ValueError(f"rows must be int[R, L]; got {rows_RxL.dtype}"
                     f"{list(rows_RxL.shape)}")
  starts = block_starts(prompt_length, block_length, num_blocks,
                        rows_RxL.shape[1])
  rows_RxL = rows_RxL.astype(jnp.int32)
  states_RxNxK1xW = jnp.stack([
      block_trajectory(logits_fn, params, rows_RxL, int(s), block_length,
                       pad_id) for s in starts], 1)
  target_RxNxW = rows_RxL[:, starts[:, None] + np.arange(block_length)]
  fixed_RxNxK1 = jnp.all((states_RxNxK1xW == target_RxNxW[:, :, None])
                         | (target_RxNxW[:, :, None] == pad_id), -1)
  reached_RxNxK = jnp.cumsum(fixed_RxNxK1, -1)[..., :-1] > 0
  live_RxN = live_blocks(rows_RxL, starts, prompt_length, eos_id, pad_id)
  return Trajectories(states=states_RxNxK1xW[:, :, :-1],
                      live=live_RxN[..., None] & ~reached_RxNxK,
                      starts=jnp.asarray(starts),
                      converged=live_RxN & fixed_RxNxK1.any(-1))


jitted_states = jax.jit(
    jacobi_states, static_argnums=0,
    static_argnames=("prompt_length", "block_length", "num_blocks", "eos_id",
                     "pad_id"))


def check_state_options(per_block, seed, batch_size: int = 1) -> None:
  """Raises ValueError naming the option unless states_per_block and
  batch_size are integers >= 1 and seed one >= 0 (`state_set`)."""
  for name, value, least in (("states_per_block", per_block, 1),
                             ("seed", seed, 0), ("batch_size", batch_size, 1)):
    if not is_count(value, least):
      raise ValueError(f"{name}={value!r} must be an integer >= {least}")


def sample_states(live_RxNxK: np.ndarray, per_block: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(row int64[S], block int64[S], state int64[S]): up to `per_block` of
  each block's live states, drawn without replacement by
  `numpy.random.default_rng(seed)`, in (row, block, state) order.

  Raises:
    ValueError: as `check_state_options`.
  """
  check_state_options(per_block, seed)
  live_RxNxK = np.asarray(live_RxNxK, bool)
  draw = np.random.default_rng(seed).random(live_RxNxK.shape)
  draw[~live_RxNxK] = np.inf
  rank = np.argsort(np.argsort(draw, -1, kind="stable"), -1, kind="stable")
  return np.nonzero(live_RxNxK & (rank < per_block))


def state_rows(rows_RxL: np.ndarray, trajectories: Trajectories, row_S,
               block_S, state_S, pad_id: int = PAD_ID) -> np.ndarray:
  """int32[S, L]: [row[:s] | g^j | PAD ...] for each (row, block, state)
  picked (`sample_states`)."""
  rows_RxL = np.asarray(rows_RxL, np.int32)
  states = np.asarray(trajectories.states)[row_S, block_S, state_S]
  starts_S = np.asarray(trajectories.starts)[block_S]
  n = states.shape[-1]
  index_L = np.arange(rows_RxL.shape[1])
  offset_SxL = index_L[None] - starts_S[:, None]
  in_block = (offset_SxL >= 0) & (offset_SxL < n)
  block_tokens = np.take_along_axis(states, np.clip(offset_SxL, 0, n - 1), 1)
  return np.where(in_block, block_tokens,
                  np.where(offset_SxL < 0, rows_RxL[row_S], pad_id)).astype(
                      np.int32)


def forcing_pairs(states_RxL: np.ndarray, clean_RxL: np.ndarray, starts_R,
                  block_length: int, seq_len: int,
                  pad_id: int = PAD_ID) -> np.ndarray:
  """int32[R', 2 seq_len]: the rows `objectives.jacobi_forcing` trains on,
  [state row | block targets], each half cut to `seq_len`: the block
  targets are PAD except y*[s:s+n] (the clean row's block) at [s, s+n).
  States whose block ends after `seq_len` are left out; rows shorter than
  `seq_len` are extended with PAD (nothing after a block is scored).

  Args:
    states_RxL: int32[R, L] [row[:s] | g^j | PAD] (`state_rows`).
    clean_RxL: int32[R, L] each state's clean row.
    starts_R: int[R] each state's block start s.
    block_length: n.
    seq_len: the positions the model sees.
  """
  extend = ((0, 0), (0, max(0, seq_len - states_RxL.shape[1])))
  states_RxL = np.pad(states_RxL, extend, constant_values=pad_id)
  clean_RxL = np.pad(clean_RxL, extend, constant_values=pad_id)
  starts_R = np.asarray(starts_R)
  keep = starts_R + block_length <= seq_len
  index_L = np.arange(seq_len)[None]
  start_Rx1 = starts_R[keep, None]
  in_block = (index_L >= start_Rx1) & (index_L < start_Rx1 + block_length)
  targets = np.where(in_block, clean_RxL[keep, :seq_len], pad_id)
  return np.concatenate([states_RxL[keep, :seq_len], targets], 1).astype(
      np.int32)


def read_forcing_pairs(path: str | pathlib.Path, seq_len: int) -> np.ndarray:
  """int32[S', 2 seq_len]: `forcing_pairs` of the Jacobi state set at
  `path` (written by experiments/jacobi_data.py).

  Raises:
    ValueError: naming data.jacobi_set: no such set, or no state whose
      block ends within `seq_len`.
  """
  arrays, manifest = self_distillation.read_set(
      path, SET_ARRAYS, "data.jacobi_set", "experiments/jacobi_data.py")
  pairs = forcing_pairs(arrays["tokens"], arrays["clean"][arrays["row_index"]],
                        arrays["block_starts"], manifest["block_length"],
                        seq_len)
  if not len(pairs):
    raise ValueError(f"data.jacobi_set={str(path)!r}: no state's block ends "
                     f"within data.seq_len={seq_len}")
  return pairs


def state_set(logits_fn, params, rows_RxL: np.ndarray, *, prompt_length: int,
              block_length: int, num_blocks: int, per_block: int, seed: int,
              batch_size: int) -> tuple[dict[str, np.ndarray], dict]:
  """(arrays, counts) of a Jacobi state set: `jitted_states` of the rows in
  chunks of `batch_size` (the last padded with copies of its first row, so
  one compile serves every chunk), up to `per_block` states of each live
  block (`sample_states`, by `seed`) as rows (`state_rows`).

  Args:
    logits_fn, params: the causal model whose greedy rows these are.
    rows_RxL: int32[R, L] [prefix (P) | greedy continuation].
    prompt_length, block_length, num_blocks: P, n, K (`jacobi_states`).
    per_block: states kept per block, >= 1.
    seed: the draw of the states kept.
    batch_size: rows per call, >= 1.
  Returns:
    ({'tokens': int32[S, L] state rows, 'block_starts': int32[S],
      'row_index': int32[S] (into `rows_RxL`), 'clean': int32[R, L] the
      rows}, counts: states kept, live blocks, their trajectory states, the
      mean trajectory length J, the blocks that took all n, and those
      whose g^n is not y* (`Trajectories.converged`)).
  Raises:
    ValueError: as `check_state_options` or `jacobi_states`, before the
      model runs.
  """
  check_state_options(per_block, seed, batch_size)  # before any forward
  rows_RxL = np.asarray(rows_RxL, np.int32)
  starts = block_starts(prompt_length, block_length, num_blocks,
                        rows_RxL.shape[-1])
  parts = []
  for first in range(0, len(rows_RxL), batch_size):
    chunk = rows_RxL[first:first + batch_size]
    padded = np.concatenate(
        [chunk, np.repeat(chunk[:1], batch_size - len(chunk), 0)])
    out = jitted_states(logits_fn, params, jnp.asarray(padded),
                        prompt_length=prompt_length,
                        block_length=block_length, num_blocks=num_blocks)
    parts.append(jax.tree.map(lambda a, n=len(chunk): np.asarray(a)[:n],
                              (out.states, out.live, out.converged)))
  trajectories = Trajectories(
      states=np.concatenate([p[0] for p in parts]),
      live=np.concatenate([p[1] for p in parts]), starts=starts,
      converged=np.concatenate([p[2] for p in parts]))
  row_S, block_S, state_S = sample_states(trajectories.live, per_block, seed)
  live_blocks_count = int(trajectories.live[..., 0].sum())
  counts = {"states": len(row_S), "live_blocks": live_blocks_count,
            "trajectory_states": int(trajectories.live.sum()),
            "mean_trajectory_length": float(trajectories.live.sum()
                                            / max(live_blocks_count, 1)),
            "blocks_taking_n_iterations": int(trajectories.live[..., -1].sum()),
            "blocks_off_fixed_point": live_blocks_count - int(
                trajectories.converged.sum())}
  return {"tokens": state_rows(rows_RxL, trajectories, row_S, block_S,
                               state_S),
          "block_starts": starts[block_S].astype(np.int32),
          "row_index": row_S.astype(np.int32), "clean": rows_RxL}, counts
