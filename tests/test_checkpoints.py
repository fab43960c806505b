"""Checkpoints: a restore into a template of another dtype or shape is refused
from the metadata, before any value is read (R1 of reliability_cases.md);
write failures raise one error and leave the earlier steps intact."""

import errno
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm_decoding.training.checkpoints import (CheckpointError,
                                              CheckpointWriteError, Checkpoints)

S = jax.ShapeDtypeStruct


@pytest.fixture()
def saved(tmp_path):
  """R1's checkpoint: step 1 with an int32 above 2**24 and two float32s."""
  state = {"step": jnp.int32(16777217), "w": jnp.asarray([0.1, 0.2], jnp.float32)}
  with Checkpoints(str(tmp_path / "ckpt")) as checkpoints:
    checkpoints.save(1, state, {"note": "r1"})
  return str(tmp_path / "ckpt"), state


@pytest.fixture()
def no_reads(monkeypatch):
  """Fails the test if orbax is asked to read array values."""
  def forbidden(*args, **kwargs):
    raise AssertionError("read values before checking the metadata")
  monkeypatch.setattr("orbax.checkpoint.CheckpointManager.restore", forbidden)


def test_matching_template_restores_exact_values(saved):
  directory, state = saved
  with Checkpoints(directory) as checkpoints:
    restored, meta = checkpoints.restore(
        {"step": S((), jnp.int32), "w": S((2,), jnp.float32)})
  assert int(restored["step"]) == 16777217 and meta == {"note": "r1"}
  np.testing.assert_array_equal(restored["w"], state["w"])


@pytest.mark.parametrize("leaf, template, stored", [
    ("step", S((), jnp.float32), "shape: () dtype: int32"),
    ("step", S((), jnp.int8), "shape: () dtype: int32"),
    ("step", S((), jnp.uint32), "shape: () dtype: int32"),
    ("step", S((1,), jnp.int32), "shape: () dtype: int32"),
    ("w", S((2,), jnp.bfloat16), "shape: (2,) dtype: float32"),
    ("w", S((2,), jnp.float16), "shape: (2,) dtype: float32"),
    ("w", S((2,), jnp.int32), "shape: (2,) dtype: float32"),
    ("w", S((3,), jnp.float32), "shape: (2,) dtype: float32"),
    ("w", S((1,), jnp.float32), "shape: (2,) dtype: float32"),
    ("w", S((1, 2), jnp.float32), "shape: (2,) dtype: float32"),
    ("w", S((), jnp.float32), "shape: (2,) dtype: float32"),
])
def test_other_dtype_or_shape_is_refused_before_reading(saved, no_reads, leaf,
                                                        template, stored):
  directory, _ = saved
  wanted = {"step": S((), jnp.int32), "w": S((2,), jnp.float32), leaf: template}
  requested = (f"shape: {template.shape} dtype: "
               f"{np.dtype(template.dtype).name}")
  with Checkpoints(directory) as checkpoints:
    with pytest.raises(CheckpointError) as e:
      checkpoints.restore(wanted)
  message = str(e.value)
  assert f"{leaf}: stored {stored}, requested {requested}" in message
  assert "step 1" in message and directory in message
  other = "w" if leaf == "step" else "step"
  assert f"{other}:" not in message  # only the leaf that differs is named


@pytest.mark.parametrize("template, problem", [
    ({"step": S((), jnp.int32)}, "w: stored but not requested"),
    ({"step": S((), jnp.int32), "w": S((2,), jnp.float32),
      "b": S((2,), jnp.float32)}, "b: requested but not stored"),
    ({"step": S((), jnp.int32), "w": {"x": S((2,), jnp.float32)}},
     "w/x: requested but not stored"),
])
def test_other_structure_is_refused_before_reading(saved, no_reads, template,
                                                   problem):
  with Checkpoints(saved[0]) as checkpoints:
    with pytest.raises(CheckpointError, match=problem):
      checkpoints.restore(template)


def test_arrays_as_template_are_checked_like_shape_dtype_structs(saved):
  with Checkpoints(saved[0]) as checkpoints:
    with pytest.raises(CheckpointError, match="requested shape: \\(\\) dtype: "
                       "float32"):
      checkpoints.restore({"step": np.float32(0), "w": np.zeros(2, np.float32)})


def test_refused_restore_leaves_no_tracebacks_at_exit(tmp_path):
  """Issue 12 item 4: a refused restore used to abandon orbax's reading
  coroutines, which printed 'Event loop is closed' tracebacks at exit."""
  script = textwrap.dedent(f"""
      import jax, jax.numpy as jnp, numpy as np
      from lm_decoding.training.checkpoints import CheckpointError, Checkpoints
      with Checkpoints({str(tmp_path / 'ckpt')!r}) as c:
        c.save(0, {{"embedding": np.zeros((64, 32), np.float32),
                    "w": jnp.ones((32, 16))}}, {{}})
        try:
          c.restore({{"embedding": jax.ShapeDtypeStruct((512, 32), jnp.float32),
                     "w": jax.ShapeDtypeStruct((32, 16), jnp.float32)}})
        except CheckpointError as e:
          print("REFUSED", e)
      """)
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "REFUSED" in proc.stdout and "embedding" in proc.stdout
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_corrupt_metadata_is_a_checkpoint_error(saved):
  directory, _ = saved
  for path in pathlib.Path(directory, "1").rglob("*"):
    if path.is_file() and path.stat().st_size > 0:
      path.write_bytes(b"garbage")
  with Checkpoints(directory) as checkpoints:
    with pytest.raises(CheckpointError, match="step 1 .* corrupt"):
      checkpoints.restore({"step": S((), jnp.int32), "w": S((2,), jnp.float32)})


def _injected_write_failure(cause):
  """A save that fails with `cause` wrapped, as orbax re-raises its writer
  thread's error (nothing is written)."""
  def failing_save(self, *args, **kwargs):
    raise ValueError("orbax background save failed") from cause
  return failing_save


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_failed_write_is_one_error_and_earlier_steps_stay(saved, monkeypatch,
                                                         code):
  """The portable stand-in for a full disk or read-only folder (the real ones
  are in test_fault_injection.py, where tmpfs mounts are possible)."""
  directory, state = saved
  cause = OSError(code, "injected")
  with Checkpoints(directory) as checkpoints:
    monkeypatch.setattr("orbax.checkpoint.CheckpointManager.save",
                        _injected_write_failure(cause))
    with pytest.raises(CheckpointWriteError) as e:
      checkpoints.save(2, state, {})
    assert e.value.errno == code
    assert f"step 2 in {directory}" in str(e.value) and "injected" in str(e.value)
  monkeypatch.undo()
  with Checkpoints(directory) as checkpoints:
    assert checkpoints.latest_step() == 1
    restored, _ = checkpoints.restore(
        {"step": S((), jnp.int32), "w": S((2,), jnp.float32)})
  assert int(restored["step"]) == 16777217


def test_failure_that_is_not_an_os_error_propagates(saved, monkeypatch):
  with Checkpoints(saved[0]) as checkpoints:
    monkeypatch.setattr("orbax.checkpoint.CheckpointManager.save",
                        _injected_write_failure(RuntimeError("a bug")))
    with pytest.raises(ValueError, match="orbax background save failed"):
      checkpoints.save(2, saved[1], {})
    monkeypatch.undo()


@pytest.mark.parametrize("template", ["shape_dtype", "array"])
def test_checkpoint_saved_on_two_devices_restores_on_one(tmp_path, template):
  """Case I5: saved sharded over a 2-device mesh (a subprocess with two fake
  CPU devices), restored in this process (one device) with either template
  form; a ShapeDtypeStruct template was called 'corrupt: Topology mismatch'."""
  directory = str(tmp_path / "ckpt")
  script = textwrap.dedent(f"""
      import jax, jax.numpy as jnp, numpy as np
      from lm_decoding.training.checkpoints import Checkpoints
      mesh = jax.make_mesh((2,), ("data",))
      sharding = jax.sharding.NamedSharding(mesh, jax.P("data"))
      w = jax.device_put(jnp.arange(8, dtype=jnp.float32), sharding)
      with Checkpoints({directory!r}) as c:
        c.save(3, {{"w": w, "step": jnp.int32(3)}}, {{}})
      """)
  env = dict(os.environ, XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "")
      + " --xla_force_host_platform_device_count=2"), JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=120, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert jax.device_count() == 1
  if template == "shape_dtype":
    abstract = {"w": S((8,), jnp.float32), "step": S((), jnp.int32)}
  else:
    abstract = {"w": jnp.zeros(8, jnp.float32), "step": jnp.int32(0)}
  with Checkpoints(directory) as checkpoints:
    state, _ = checkpoints.restore(abstract)
  np.testing.assert_array_equal(state["w"], np.arange(8, dtype=np.float32))
  assert int(state["step"]) == 3


def test_restore_refuses_a_numpy_checkpoint_of_another_shape(tmp_path):
  """Bug: orbax restores a leaf saved from a numpy array at its stored shape
  whatever the requested one, so `Checkpoints.restore` returns a [64, 32]
  embedding for a [512, 32] model without a word (a checkpoint written from
  numpy, e.g. converted weights, of another vocab).

  Fix: at the end of `Checkpoints.restore`, compare every restored leaf with
  `abstract_state` (`jax.tree_util.tree_flatten_with_path` of both) and raise
  CheckpointError naming the path, both shapes/dtypes, directory and step on
  the first mismatch.
  """
  checkpoints = Checkpoints(str(tmp_path / "ckpt"))
  checkpoints.save(0, {"embedding": np.zeros((64, 32), np.float32)}, {})
  with pytest.raises(CheckpointError, match="embedding"):
    checkpoints.restore(
        {"embedding": jax.ShapeDtypeStruct((512, 32), jnp.float32)})
  checkpoints.close()
