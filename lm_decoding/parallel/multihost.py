"""Multi-host (multi-process) start, per-process data and global batches.

JAX's multi-controller model: every process runs the same program on its own
devices; `jax.distributed.initialize` joins them (one coordinator, process
ids 0..N-1), after which `jax.devices()` lists every process's devices and a
mesh over them (`sharding.mesh_from_config`) spans processes. GSPMD adds the
collectives; across CPU processes they go through gloo (jax's default for
`jax_cpu_collectives_implementation`), across GPUs and TPUs through the
accelerator's own.

Off by default: without a coordinator address nothing starts and a run is the
one-process run it always was. `experiments/train.py` takes the flags
--coordinator_address, --num_processes and --process_id.

Data: each process reads only the rows its devices hold
(`pipeline.process_batches`, grain sharding; the share comes from the batch
sharding, `process_shard`) and `global_batches` joins the shares into one
global jax.Array per step (`jax.make_array_from_process_local_data`): the
same global batches one process would read, so N processes train as one
(tests/test_multihost.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding

from lm_decoding.data import pipeline


def check_arguments(coordinator_address: str | None,
                    num_processes: int | None,
                    process_id: int | None) -> bool:
  """Whether to start multi-process JAX; raises on a bad combination.

  Args:
    coordinator_address: 'host:port' of process 0's coordinator service
      (--coordinator_address), or None: single process (then the other two
      must be None too).
    num_processes: N >= 1 (--num_processes).
    process_id: this process's id in [0, N) (--process_id).
  Returns:
    False when all three are None (the single-process default), else True.
  Raises:
    ValueError: naming the flag: some given and others not, an address
      without a host or a port in [1, 65535], N < 1, or a process id
      outside [0, N).
  """
  given = {"--coordinator_address": coordinator_address,
           "--num_processes": num_processes, "--process_id": process_id}
  if all(v is None for v in given.values()):
    return False
  missing = [name for name, v in given.items() if v is None]
  if missing:
    raise ValueError(
        f"multi-host needs --coordinator_address, --num_processes and "
        f"--process_id together; missing {', '.join(missing)}")
  host, _, port = str(coordinator_address).rpartition(":")
  if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ValueError(
        f"--coordinator_address={coordinator_address!r} must be 'host:port' "
        "with a port in [1, 65535]")
  if (isinstance(num_processes, bool) or not isinstance(num_processes, int)
      or num_processes < 1):
    raise ValueError(f"--num_processes={num_processes!r} must be an integer "
                     ">= 1")
  if (isinstance(process_id, bool) or not isinstance(process_id, int)
      or not 0 <= process_id < num_processes):
    raise ValueError(f"--process_id={process_id!r} must be an integer in "
                     f"[0, {num_processes - 1}] (--num_processes="
                     f"{num_processes})")
  return True


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: Sequence[int] | None = None,
               initialization_timeout_s: int = 300) -> bool:
  """Joins this process to a multi-process JAX job (`jax.distributed`).

  Call before anything touches a device. Process 0 serves the coordinator at
  `coordinator_address`; every process blocks until all N have joined (at
  most `initialization_timeout_s`).

  Args:
    coordinator_address, num_processes, process_id: see `check_arguments`;
      all None (the default) starts nothing.
    local_device_ids: this process's devices (e.g. one GPU per process);
      None: all it sees.
    initialization_timeout_s: seconds to wait for the other processes.
  Returns:
    Whether multi-process JAX was started.
  Raises:
    ValueError: as `check_arguments`, before anything starts.
  """
  if not check_arguments(coordinator_address, num_processes, process_id):
    return False
  jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes,
      process_id=process_id, local_device_ids=local_device_ids,
      initialization_timeout=initialization_timeout_s)
  return True


def process_shard(batch_sharding: NamedSharding,
                  global_shape: Sequence[int]) -> grain.sharding.ShardOptions:
  """The share of the batch rows this process's devices hold.

  Reads the rows from the sharding itself rather than from the process index,
  so it is right for any mesh: with the batch split over processes in process
  order it equals `grain.sharding.ShardByJaxProcess()`; with the batch
  replicated over processes (e.g. a mesh whose 'tensor' axis spans them) the
  processes that share rows get the same share.

  Args:
    batch_sharding: NamedSharding of the global batch (`sharding.
      batch_sharding`).
    global_shape: (B, L) of the global batch.
  Returns:
    ShardOptions(shard_index=c, shard_count=n_c): rows [c * B / n_c,
    (c + 1) * B / n_c) are this process's.
  Raises:
    ValueError: this process's devices hold rows that are not one contiguous
      block of B / n_c rows for an integer n_c (a device order that interleaves
      processes along the batch axis).
  """
  size = global_shape[0]
  rows = sorted({index[0].indices(size)[:2] for index in
                 batch_sharding.addressable_devices_indices_map(
                     tuple(global_shape)).values()})
  start, stop = rows[0][0], max(end for _, end in rows)
  covered = np.zeros(size, bool)
  for a, b in rows:
    covered[a:b] = True
  share = stop - start
  if not covered[start:stop].all() or size % share or start % share:
    raise ValueError(
        f"process {jax.process_index()} holds batch rows {rows} of {size}: "
        "not one contiguous share of equal size; order the mesh's devices "
        "by process along the batch axes")
  return grain.sharding.ShardOptions(shard_index=start // share,
                                     shard_count=size // share,
                                     drop_remainder=True)


def global_batches(packed: np.ndarray, batch_size: int, seed: int,
                   batch_sharding: NamedSharding, start_step: int = 0
                   ) -> Iterator[jax.Array]:
  """The batches of `pipeline.batches` as global arrays on `batch_sharding`.

  Each process reads only its rows (`pipeline.process_batches` with
  `process_shard`) and `jax.make_array_from_process_local_data` assembles
  the int32[B, L] array the processes hold together. With one process it is
  `pipeline.batches` placed on the sharding.

  Args:
    packed: int32[R, L] sequences (`pipeline.pack`).
    batch_size: B, the global batch size.
    seed: the data order's seed.
    batch_sharding: NamedSharding of an int32[B, L] batch.
    start_step: index of the first batch (resumed training).
  Returns:
    An iterator of int32[B, L] jax.Arrays with sharding `batch_sharding`.
  Raises:
    ValueError: as `process_shard` and `pipeline.process_batches` (raised by
      this call, not by the first `next`).
  """
  global_shape = (batch_size, packed.shape[1])
  shard = process_shard(batch_sharding, global_shape)
  shares = pipeline.process_batches(packed, batch_size, seed, shard,
                                    start_step)
  return (jax.make_array_from_process_local_data(batch_sharding, local,
                                                 global_shape)
          for local in shares)
