"""Multi-process start: jax.distributed from the environment (one process per node, or per GPU under Slurm)."""

import os
import socket
import time

import jax


class DistributedError(RuntimeError):
  """The processes could not form a job: a user/cluster error with what to check."""


def _local_device_ids():
  """GPUs this process drives: CUDA_VISIBLE_DEVICES, else SLURM_STEP_GPUS / SLURM_JOB_GPUS, else all (None)."""
  for var in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
    value = os.environ.get(var, "").strip()
    if value:
      try:
        return list(range(len(value.split(",")))) if var == "CUDA_VISIBLE_DEVICES" else [int(v) for v in value.split(",")]
      except ValueError as e:
        raise DistributedError(f"{var}={value!r} is not a comma-separated list of GPU indices") from e
  return None


def coordinator_from_env():
  """(address, num_processes, process_id) from JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK; None if not set."""
  ip, nnodes = os.environ.get("JAX_COORDINATOR_IP"), os.environ.get("NNODES")
  if not ip or not nnodes:
    return None
  port = os.environ.get("JAX_COORDINATOR_PORT", "1234")
  try:
    return f"{ip}:{int(port)}", int(nnodes), int(os.environ.get("NODE_RANK", "0"))
  except ValueError as e:
    raise DistributedError(f"JAX_COORDINATOR_PORT={port!r}, NNODES={nnodes!r}, NODE_RANK="
                           f"{os.environ.get('NODE_RANK')!r} must be integers") from e


def _wait_for_coordinator(address, timeout):
  """Poll the coordinator's TCP port: jax.distributed aborts the process when it can't connect, so check first."""
  host, port = address.rsplit(":", 1)
  deadline = time.monotonic() + timeout
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=min(5.0, timeout)):
        return True
    except OSError:
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.5)


def initialize(cfg):
  """Join the job as `cfg.hardware` says; a no-op for a single process. Returns (process_index, process_count).

    cpu               single process, or NNODES>1 processes on CPU with gloo collectives (tests)
    gpu               one process per node: JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK; local GPUs from
                      CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS
    gpu_multiprocess  one process per GPU; jax.distributed detects Slurm (SLURM_* variables)
  """
  if jax.distributed.is_initialized():
    return jax.process_index(), jax.process_count()
  timeout = cfg.jax_distributed_initialization_timeout
  if cfg.hardware == "gpu_multiprocess":
    kwargs, where = {}, "the Slurm-detected coordinator"
  else:
    env = coordinator_from_env()
    if env is None or env[1] == 1:
      return 0, 1
    address, num_processes, process_id = env
    kwargs = dict(coordinator_address=address, num_processes=num_processes, process_id=process_id)
    where = f"the coordinator {address} (process {process_id} of {num_processes})"
    if cfg.hardware == "gpu":
      kwargs["local_device_ids"] = _local_device_ids()
    else:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if kwargs.get("process_id", 0) != 0 and not _wait_for_coordinator(kwargs["coordinator_address"], timeout):
    raise DistributedError(f"could not join {where} within {timeout} s (nothing listens there); check "
                           "JAX_COORDINATOR_IP/JAX_COORDINATOR_PORT are reachable from every node, NNODES/NODE_RANK, "
                           "and that process 0 was started (jax_distributed_initialization_timeout)")
  try:
    jax.distributed.initialize(initialization_timeout=timeout, **kwargs)
  except Exception as e:  # connection refused, deadline exceeded, Slurm not detected, ...
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise DistributedError(f"could not join {where} within {timeout} s ({first}); check JAX_COORDINATOR_IP/"
                           "JAX_COORDINATOR_PORT are reachable from every node, NNODES/NODE_RANK, and that all "
                           "processes were started (jax_distributed_initialization_timeout)") from e
  return jax.process_index(), jax.process_count()
