"""Faults injected into real training runs, in subprocesses on this machine's
filesystem (issue 11): kill -9 at random points and during checkpoint writes,
a full disk, a read-only workdir. Every run here stops by itself (timeouts).

The harness is experiments/kill_trials.py, which also runs the long trials.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "kill_trials", ROOT / "experiments" / "kill_trials.py")
kill_trials = importlib.util.module_from_spec(_spec)
sys.modules["kill_trials"] = kill_trials  # dataclasses look their module up
_spec.loader.exec_module(kill_trials)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  """Corpus, data cache, compilation cache and reference run, shared."""
  root = tmp_path_factory.mktemp("faults")
  kill_trials.prepare(root)
  return root


def check(counts, trials):
  assert counts.trials == trials
  assert counts.chains_completed >= 1
  assert counts.killed_during_write >= 1  # every other kill targets a write
  assert counts.corrupt_chosen == 0
  assert counts.wrong_resume_step == 0
  assert counts.metrics_problems == 0
  assert counts.max_steps_lost <= counts.interval
  assert counts.over_one_interval_lost == 0


def test_kill_9_resumes_from_the_latest_complete_checkpoint(root):
  check(kill_trials.run_trials(root, trials=3, seed=0), 3)


@pytest.mark.slow
def test_kill_9_many_trials(root):
  check(kill_trials.run_trials(root, trials=12, seed=1), 12)


# --- A full disk and a read-only workdir (real tmpfs mounts). ---------------

@pytest.fixture()
def tmpfs(tmp_path):
  """A 4 MiB tmpfs at tmp_path/fs; skipped where mounts are not allowed."""
  mount_point = tmp_path / "fs"
  mount_point.mkdir()
  if os.geteuid() != 0 or subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
      capture_output=True).returncode != 0:
    pytest.skip("needs root and tmpfs mounts; the portable stand-in is "
                "test_checkpoints.py::test_failed_write_is_one_error_and_"
                "earlier_steps_stay (an injected OSError)")
  try:
    yield mount_point
  finally:
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(mount_point: pathlib.Path, leave: int) -> None:
  """Fills the file system but for about `leave` bytes."""
  filler = mount_point / "filler"
  # Unbuffered: a write that fails leaves nothing for close() to flush
  # (a buffered file re-raised ENOSPC from close, outside the try).
  with open(filler, "wb", buffering=0) as f:
    try:
      while True:
        f.write(b"\0" * 65536)
    except OSError:
      pass
  with open(filler, "r+b") as f:
    f.truncate(max(filler.stat().st_size - leave, 0))


def remount_read_only(mount_point: pathlib.Path) -> None:
  """Retries while the run holds a file open for writing (EBUSY)."""
  for _ in range(500):
    if subprocess.run(["mount", "-o", "remount,ro", str(mount_point)],
                      capture_output=True).returncode == 0:
      return
    time.sleep(0.01)
  raise AssertionError("could not remount read-only")


def run_with_fault(root, tmp_path, workdir, inject):
  """Starts a training run, calls `inject()` once its first checkpoint is
  complete, and returns (return code, stderr, seconds from the fault to exit,
  checkpoint steps complete at the fault)."""
  env = kill_trials.environment(root)
  command = kill_trials.train_command(workdir, root)
  stderr_path = tmp_path / "stderr.txt"
  with open(stderr_path, "w") as err:
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=err)
    try:
      while not kill_trials.complete_steps(workdir):
        assert proc.poll() is None, stderr_path.read_text()[-3000:]
        time.sleep(kill_trials.POLL_S)
      inject()
      fault_time = time.time()
      before = kill_trials.complete_steps(workdir)
      proc.wait(timeout=300)
    finally:
      if proc.poll() is None:
        proc.kill()
  return (proc.returncode, stderr_path.read_text(), time.time() - fault_time,
          before)


def check_one_error_and_intact(root, workdir, result, reason):
  code, stderr, seconds, before = result
  lines = [line for line in stderr.replace("\r", "\n").splitlines() if line]
  assert code == 1, stderr[-3000:]
  assert lines[-1].startswith("error: ") and reason in lines[-1], lines[-5:]
  assert sum(line.startswith("error") for line in lines) == 1, stderr[-3000:]
  assert "Traceback" not in stderr
  assert seconds < 60  # no writer thread keeps the process alive
  steps = kill_trials.complete_steps(workdir)
  assert steps and steps[-1] >= before[-1]
  cfg = kill_trials.config(root / "corpus.txt")
  state = kill_trials.restore_state(cfg, workdir)  # intact and restorable
  assert int(state.step) == steps[-1]


def test_disk_full_during_training_is_one_error(root, tmp_path, tmpfs):
  """Room for the metrics lines but not the next checkpoint: orbax's
  asynchronous write fails; the run reports it and exits at once."""
  workdir = tmpfs / "run"
  result = run_with_fault(root, tmp_path, workdir,
                          lambda: fill(tmpfs, 64 * 1024))
  check_one_error_and_intact(root, workdir, result,
                             "No space left on device")
  assert "could not write checkpoint step" in result[1]


def test_read_only_workdir_during_training_is_one_error(root, tmp_path, tmpfs):
  workdir = tmpfs / "run"
  result = run_with_fault(root, tmp_path, workdir,
                          lambda: remount_read_only(tmpfs))
  check_one_error_and_intact(root, workdir, result, "Read-only file system")


def test_read_only_workdir_at_start_is_refused_before_training(root, tmpfs):
  workdir = tmpfs / "run"
  workdir.mkdir()
  remount_read_only(tmpfs)
  proc = subprocess.run(kill_trials.train_command(workdir, root),
                        env=kill_trials.environment(root),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: workdir={str(workdir)!r} is not writable")
