"""Atomic, resumable checkpoints with orbax-checkpoint's CheckpointManager.

Orbax writes each step into a temporary directory and renames it when the
write is complete, so an interrupted save never replaces a good checkpoint;
`max_to_keep` bounds disk use. Beside the train state, each step stores a
JSON record (config, metrics) that callers use to check a checkpoint fits
before restoring it.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
  """A checkpoint is missing, corrupt, or does not fit the requested state."""


class Checkpoints:
  """Saves and restores (state, metadata) pairs under `directory`.

  Args:
    directory: folder holding one sub-folder per saved step.
    keep: how many of the latest steps to keep (>= 1).
  Raises:
    ValueError: keep < 1.
  """

  def __init__(self, directory: str, keep: int = 2):
    if keep < 1:
      raise ValueError(f"keep={keep} must be >= 1")
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest complete step, or None if there is none."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Writes `state` (a pytree of arrays) and `meta` (JSON) at `step`."""
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None
              ) -> tuple[Any, dict]:
    """Restores (state, meta) at `step` (default: the latest).

    Args:
      abstract_state: a pytree of arrays or `jax.ShapeDtypeStruct` giving the
        structure, shapes and dtypes to restore into.
      step: which step; None for the latest.
    Raises:
      CheckpointError: no checkpoint, or it is unreadable or does not match
        `abstract_state` (the message names the directory and step).
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for bad files
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} is corrupt or does not "
          f"match the expected state: {type(e).__name__}: {e}") from e
    wanted, _ = jax.tree_util.tree_flatten_with_path(abstract_state)
    got = jax.tree_util.tree_leaves(restored["state"])
    for (path, want), have in zip(wanted, got):
      if (have.shape, have.dtype) != (want.shape, want.dtype):
        raise CheckpointError(
            f"checkpoint step {step} in {self.directory}: "
            f"{jax.tree_util.keystr(path)} is {have.dtype}{list(have.shape)}, "
            f"expected {want.dtype}{list(want.shape)}")
    return restored["state"], dict(restored["meta"])

  def read_meta(self, step: int | None = None) -> dict:
    """Only the JSON metadata of `step` (default: the latest)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    try:
      restored = self._manager.restore(
          step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    except Exception as e:
      raise CheckpointError(
          f"metadata of step {step} in {self.directory} is unreadable: {e}"
      ) from e
    return dict(restored["meta"])

  def close(self) -> None:
    self._manager.close()
