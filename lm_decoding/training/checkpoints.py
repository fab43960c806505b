"""Atomic, resumable checkpoints with orbax-checkpoint's CheckpointManager.

Orbax writes each step into a temporary directory and renames it when the
write is complete, so an interrupted save (a crash, `kill -9`, a full disk)
never replaces a good checkpoint: `latest_step` only ever sees complete steps,
and leftover temporary directories are removed when the folder is opened
again. `max_to_keep` bounds disk use; older steps are deleted only after a
newer one is complete. Beside the train state, each step stores a JSON record
(config, metrics) that callers use to check a checkpoint fits before restoring
it.

`Checkpoints` is a context manager: leaving the `with` block (normally or by
an exception) closes orbax's manager and its background threads, so nothing
is left running at interpreter exit. A write that fails (full disk, read-only
file system) raises one `CheckpointWriteError`; the callbacks of orbax's
other in-flight I/O, which then find its event loop closed, are dropped
instead of printing dozens of 'Event loop is closed' tracebacks.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
  """A checkpoint is missing, corrupt, or does not fit the requested state."""


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (full disk, read-only folder, ...).

  The steps saved before it are intact.
  """


def _os_error(error: BaseException) -> tuple[int, str] | None:
  """(errno, description) of the operating-system error behind `error`.

  Looks along the chain of causes for an OSError, or for the error code that
  tensorstore (orbax's array writer) puts in its messages
  ("... No space left on device [os_error_code='28']"); None if neither.
  """
  found = None
  while error is not None:
    if isinstance(error, OSError) and error.errno:
      found = (error.errno, error.strerror or os.strerror(error.errno))
    else:
      code = re.search(r"os_error_code='(\d+)'", str(error))
      if code:
        found = (int(code[1]), os.strerror(int(code[1])))
    error = error.__cause__ or error.__context__
  return found


def _is_orphaned_io_callback(unraisable) -> bool:
  """Whether an unraisable exception is orbax's I/O outliving its event loop.

  When one array write or read of a save/restore fails, orbax closes the
  asyncio loop that ran it while tensorstore still completes the others;
  their callbacks then hit the closed loop ('Event loop is closed') or their
  abandoned coroutines are closed ('Encountered error while reading array
  index'). The failure itself was already raised; these are its echoes.
  """
  error = unraisable.exc_value
  return ((isinstance(error, RuntimeError)
           and str(error) == "Event loop is closed")
          or (isinstance(error.__cause__, GeneratorExit)
              and str(error).startswith("Encountered error while reading")))


def _drop_orphaned_io_callbacks() -> None:
  """Installs (once) an unraisable-exception hook that drops the echoes of a
  failed orbax write or read (`_is_orphaned_io_callback`) and passes every
  other exception to the hook it replaces."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_orphaned_io", False):
    return

  def hook(unraisable):
    if not _is_orphaned_io_callback(unraisable):
      previous(unraisable)

  hook.drops_orphaned_io = True
  sys.unraisablehook = hook


def _on_this_process(abstract_state: Any) -> Any:
  """`abstract_state` as `jax.ShapeDtypeStruct`s placed on this process's
  devices: a leaf's own sharding when it has one (a `jax.Array`, or a
  ShapeDtypeStruct given one), else the default device.

  Without a sharding orbax places an array as it was saved, and a checkpoint
  saved on a mesh of other devices (2 devices, restored in a 1-device
  process) then fails with a topology mismatch.
  """
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def place(leaf):
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
      return leaf
    return jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype,
        sharding=getattr(leaf, "sharding", None) or default)

  return jax.tree.map(place, abstract_state)


def _describe(shape: tuple[int, ...], dtype: Any) -> str:
  return f"shape: {tuple(shape)} dtype: {np.dtype(dtype).name}"


class Checkpoints:
  """Saves and restores (state, metadata) pairs under `directory`.

  Use as a context manager (or call `close`) so orbax's threads end with it.

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
    self._write_failed = False
    # A failed write or read echoes as unraisable exceptions, some before
    # orbax even reports the failure: filter them from the start.
    _drop_orphaned_io_callbacks()
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True),
        item_names=("state", "meta"),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})

  def __enter__(self) -> Checkpoints:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def latest_step(self) -> int | None:
    """The newest complete step, or None if there is none."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Writes `state` (a pytree of arrays) and `meta` (JSON) at `step`.

    Returns once the step is complete on disk (orbax writes in a background
    thread; its failure is raised here, not left to a later call).

    Raises:
      CheckpointWriteError: the write failed (e.g. no space left, read-only
        file system); the message names the directory, the step and the
        operating system's error. Earlier steps are untouched.
    """
    try:
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
      self._manager.wait_until_finished()
    except Exception as e:  # orbax wraps I/O errors of its threads
      self._write_failed = True
      cause = _os_error(e)
      if cause is None:
        raise
      raise CheckpointWriteError(
          cause[0], f"could not write checkpoint step {step} in "
          f"{self.directory} ({cause[1]}); the earlier steps are intact"
      ) from e

  def check_fits(self, abstract_state: Any, step: int) -> None:
    """Compares `abstract_state` with the stored metadata of `step`.

    Only orbax's metadata is read, no array values: a state that does not fit
    is refused before anything is restored (orbax would otherwise cast a
    stored dtype to the requested one silently, or return the stored shape).

    Args:
      abstract_state: a pytree whose leaves have `.shape` and `.dtype`
        (arrays or `jax.ShapeDtypeStruct`).
      step: a saved step.
    Raises:
      CheckpointError: the metadata is unreadable, or a leaf is missing on
        either side or differs in shape or dtype; the message names the
        directory, the step and, per leaf, its path, the stored shape and
        dtype and the requested ones.
    """
    where = f"checkpoint step {step} in {self.directory}"
    try:
      stored = self._manager.item_metadata(step)["state"]
      stored_leaves = ocp.tree.to_flat_dict(stored.tree)
    except Exception as e:  # orbax raises many types for bad files
      raise CheckpointError(
          f"{where} is corrupt (unreadable metadata): {type(e).__name__}: {e}"
      ) from e
    wanted_leaves = ocp.tree.to_flat_dict(
        ocp.tree.serialize_tree(abstract_state, keep_empty_nodes=True))
    problems = []
    for path in sorted(set(stored_leaves) | set(wanted_leaves)):
      name = "/".join(str(k) for k in path)
      have, want = stored_leaves.get(path), wanted_leaves.get(path)
      if have is None:
        problems.append(f"{name}: requested but not stored")
      elif want is None:
        problems.append(f"{name}: stored but not requested")
      elif (tuple(have.shape) != tuple(want.shape)
            or np.dtype(have.dtype) != np.dtype(want.dtype)):
        problems.append(f"{name}: stored {_describe(have.shape, have.dtype)}, "
                        f"requested {_describe(want.shape, want.dtype)}")
    if problems:
      raise CheckpointError(
          f"{where} does not fit the requested state (nothing was restored): "
          + "; ".join(problems))

  def restore(self, abstract_state: Any, step: int | None = None
              ) -> tuple[Any, dict]:
    """Restores (state, meta) at `step` (default: the latest).

    Args:
      abstract_state: a pytree of arrays or `jax.ShapeDtypeStruct` giving the
        structure, shapes and dtypes to restore into; they must equal the
        stored ones exactly (no casting, see `check_fits`). Leaves are
        placed by their own sharding (a jax.Array's, a ShapeDtypeStruct's),
        else on the default device, whatever mesh the checkpoint was saved
        from.
      step: which step; None for the latest.
    Raises:
      CheckpointError: no checkpoint, or it is unreadable or does not match
        `abstract_state` (the message names the directory and step, and the
        leaves that differ).
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    self.check_fits(abstract_state, step)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(_on_this_process(abstract_state)),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for bad files
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} is corrupt: "
          f"{type(e).__name__}: {e}") from e
    return restored["state"], dict(restored["meta"])

  def read_meta(self, step: int | None = None) -> dict:
    """Only the JSON metadata of `step` (default: the latest).

    Raises:
      CheckpointError: no checkpoint, or its metadata is unreadable.
    """
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
    """Waits for pending writes and ends orbax's background threads.

    After a failed `save` (already raised there) orbax raises that failure
    again on closing; it is not raised twice.
    """
    try:
      self._manager.close()
    except Exception:  # the failed write's error, kept by orbax's thread
      if not self._write_failed:
        raise
