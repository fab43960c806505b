"""Multi-host: flags, per-process batches, and two real processes = one.

`test_two_processes_equal_one_process` starts two JAX processes joined over
loopback (127.0.0.1, a free port, gloo CPU collectives, one CPU device
each) and, beside them, a one-process one-device reference
(tests/_multihost_worker.py): a data-parallel 3-step training run on batches
each process reads half of, an orbax save and restore of the sharded state,
and a greedy AR decode must equal the reference. Every process is killed
(its whole process group) when the test ends or times out; on failure the
test shows each process's output.

Tolerances against the reference, and why. The two processes split the
batch; each device computes its half's loss and gradient sums and gloo
all-reduces them, so float32 sums are added in another order than one
device adds them (a few ulp, ~6e-8 relative each):
- losses: rtol 1e-5 (~100 ulp; measured 1.1e-7 relative);
- parameters after 3 AdamW steps: atol 1e-4 = learning rate / 100: Adam's
  update lr * m / (sqrt(v) + eps) amplifies the gradients' rounding where
  |g| is near eps (measured 1.2e-6 with the test's XLA flags, 2.2e-6 with
  the default ones);
- greedy tokens: exact; the restored state: bitwise the saved one.
"""

import gzip
import os
import pathlib
import signal
import subprocess
import sys
import time

import grain
import jax
import numpy as np
import portpicker
import pytest

from lm_decoding.data import corpus as corpus_lib
from lm_decoding.data import pipeline
from lm_decoding.parallel import multihost, sharding

WORKER = pathlib.Path(__file__).with_name("_multihost_worker.py")
TIMEOUT_S = 240  # a generous bound for a busy machine; idle it takes < 60 s
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-4


@pytest.mark.parametrize("args, message", [
    (("localhost:1234", None, None), "missing --num_processes, --process_id"),
    ((None, 2, 0), "missing --coordinator_address"),
    (("localhost", 2, 0), "--coordinator_address='localhost'"),
    (("localhost:0", 2, 0), "port in [1, 65535]"),
    (("localhost:70000", 2, 0), "port in [1, 65535]"),
    (("localhost:1234", 0, 0), "--num_processes=0 must be an integer >= 1"),
    (("localhost:1234", 2, 2), "--process_id=2 must be an integer in [0, 1]"),
    (("localhost:1234", 2, -1), "--process_id=-1"),
])
def test_bad_flags_raise_before_starting(args, message):
  with pytest.raises(ValueError) as e:
    multihost.initialize(*args)
  assert message in str(e.value)


def test_no_flags_start_nothing():
  assert multihost.check_arguments(None, None, None) is False
  assert multihost.check_arguments("127.0.0.1:1234", 2, 1) is True
  assert multihost.initialize() is False
  assert jax.process_count() == 1


@pytest.mark.parametrize("count", [1, 2, 4])
def test_process_shares_concatenate_to_the_one_process_batches(count):
  packed = np.arange(37 * 5, dtype=np.int32).reshape(37, 5)
  want = pipeline.batches(packed, 8, seed=3, start_step=5)
  shares = [pipeline.process_batches(
      packed, 8, 3, grain.sharding.ShardOptions(c, count), start_step=5)
            for c in range(count)]
  for _ in range(12):  # crosses epochs (4 steps each)
    got = np.concatenate([next(share) for share in shares])
    assert got.shape == (8, 5) and got.dtype == np.int32
    np.testing.assert_array_equal(got, next(want))


def test_process_batches_refuses_an_uneven_share():
  packed = np.zeros((20, 4), np.int32)
  with pytest.raises(ValueError, match="batch_size=6 must divide into "
                     "shard.shard_count=4"):
    pipeline.process_batches(packed, 6, 0, grain.sharding.ShardOptions(0, 4))


def test_global_batches_on_one_process_are_the_batches():
  mesh = sharding.make_mesh()
  packed = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
  batch_sharding = sharding.batch_sharding(mesh, (8, 3))
  shard = multihost.process_shard(batch_sharding, (8, 3))
  assert (shard.shard_index, shard.shard_count) == (0, 1)
  got = multihost.global_batches(packed, 8, 1, batch_sharding, start_step=2)
  want = pipeline.batches(packed, 8, 1, start_step=2)
  for _ in range(3):
    array = next(got)
    assert array.sharding == batch_sharding
    np.testing.assert_array_equal(np.asarray(array), next(want))


def _start(args, log):
  return subprocess.Popen(
      [sys.executable, str(WORKER), *map(str, args)], stdout=log,
      stderr=subprocess.STDOUT, start_new_session=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))  # XLA_FLAGS: conftest.py


def test_two_processes_equal_one_process(tmp_path):
  address = f"127.0.0.1:{portpicker.pick_unused_port()}"
  runs = {"reference": (tmp_path / "reference.npz", 0, 0),
          "process 0": (tmp_path / "multihost.npz", 0, 2),
          "process 1": (tmp_path / "multihost.npz", 1, 2)}
  logs, procs = {}, {}
  start = time.monotonic()
  try:
    for name, (out, process_id, count) in runs.items():
      logs[name] = open(tmp_path / f"{name}.log", "w+")
      procs[name] = _start((out, process_id, count, address,
                            tmp_path / "checkpoints"), logs[name])
    for name, proc in procs.items():
      left = TIMEOUT_S - (time.monotonic() - start)
      try:
        proc.wait(timeout=max(left, 0.1))
      except subprocess.TimeoutExpired:
        pass
  finally:
    for proc in procs.values():
      if proc.poll() is None:  # the whole group: nothing left running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  output = ""
  for name, log in logs.items():
    log.seek(0)
    output += f"\n--- {name} (exit {procs[name].returncode}):\n{log.read()[-4000:]}"
    log.close()
  print(f"two processes + reference: {time.monotonic() - start:.1f} s")
  assert all(p.returncode == 0 for p in procs.values()), output

  want, got = (np.load(runs[n][0]) for n in ("reference", "process 0"))
  np.testing.assert_allclose(got["losses"], want["losses"], rtol=LOSS_RTOL)
  np.testing.assert_array_equal(got["tokens"], want["tokens"])
  params = [k for k in want.files if k.startswith("param/")]
  assert params and len(params) == len(
      [k for k in got.files if k.startswith("param/")])
  for name in params:
    np.testing.assert_allclose(got[name], want[name], rtol=0,
                               atol=PARAM_ATOL, err_msg=name)
    restored = name.replace("param/", "restored/", 1)
    np.testing.assert_array_equal(got[restored], got[name], err_msg=restored)


def test_train_on_a_mesh_reads_global_batches_and_resumes_onto_it(tmp_path):
  """train() on a one-device mesh (the per-process reader, global arrays,
  restore onto the mesh) logs the losses of the run without a mesh, also
  when stopped at step 2 and resumed (same device, same program: exact)."""
  from test_training import read_metrics, tiny_config
  from lm_decoding.training import train as train_lib

  corpus = tmp_path / "corpus.txt"  # small: the tokenizer trains in a second
  with gzip.open(pathlib.Path(corpus_lib.__file__).with_name(
      corpus_lib.BUNDLED_CORPUS), "rt") as f:
    corpus.write_text(f.read(200_000))

  def run(name, mesh_shape, stops):
    config = tiny_config(num_steps=4)
    config.data.update(dict(path=str(corpus), vocab_size=400, seq_len=16))
    config.train.update(dict(batch_size=4, eval_every=4, checkpoint_every=2,
                             eval_batches=1))
    config.mesh.shape = mesh_shape
    workdir = str(tmp_path / name)
    for stop in stops:
      train_lib.train(config, workdir, progress=False,
                      data_dir=str(tmp_path / "data"), stop_at=stop)
    return [r.get("loss") for r in read_metrics(workdir)]

  plain = run("plain", (1, 1, 1), [4])
  assert len(plain) == 5 and all(plain[1:])
  assert run("mesh", (-1, 1, 1), [2, 4]) == plain
