"""Multi-process start: jax.distributed from the environment (one process per node, or per GPU under Slurm).

Before jax.distributed (whose C++ client aborts the process when the job doesn't form), the processes
meet on the coordinator's port: process 0 listens there and every other process says who it is
("rank R of N"). So an inconsistent NNODES/NODE_RANK, a rank given twice or a process that never
comes is one line naming it, within jax_distributed_initialization_timeout, on every process that
waits. Then jax's backend is touched once, here, so a platform that isn't there (hardware=gpu without
a GPU, JAX_PLATFORMS naming a missing one) is one line too.
"""

import os
import socket
import sys
import threading
import time

import jax
from jax._src import distributed as jax_distributed  # its global_state.client: jax exports no accessor

from MaxText.errors import UserError
from MaxText.runtime import environment, preemption

HELLO = "maxtext rank {rank} of {count}\n"
POLL_SECONDS = 0.5


class DistributedError(UserError, RuntimeError):
  """The processes could not form a job, or jax can't use the platform asked for: a user/cluster error."""


def _local_device_ids():
  """GPUs this process drives: CUDA_VISIBLE_DEVICES, else SLURM_STEP_GPUS / SLURM_JOB_GPUS, else all (None)."""
  for var in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
    value = os.environ.get(var, "").strip()
    if value:
      try:
        ids = value.split(",")
        return list(range(len(ids))) if var == "CUDA_VISIBLE_DEVICES" else [int(v) for v in ids]
      except ValueError as e:
        raise DistributedError(f"{var}={value!r} is not a comma-separated list of GPU indices") from e
  return None


def _env_int(name, default, low, what):
  raw = os.environ.get(name, default).strip()
  try:
    value = int(raw)
  except ValueError:
    raise DistributedError(f"{name}={raw!r} is not an integer; set it to {what}") from None
  if value < low:
    raise DistributedError(f"{name}={value} must be >= {low}; set it to {what}")
  return value


def coordinator_from_env():
  """(address, num_processes, process_id) from JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK; None if not set."""
  ip, nnodes = os.environ.get("JAX_COORDINATOR_IP"), os.environ.get("NNODES")
  if not ip or not nnodes:
    return None
  port = _env_int("JAX_COORDINATOR_PORT", "1234", 1, "a free TCP port on process 0's node")
  count = _env_int("NNODES", nnodes, 1, "the number of processes (nodes) in the job")
  rank = _env_int("NODE_RANK", "0", 0, f"this process's rank, 0 to {count - 1}")
  if rank >= count:
    raise DistributedError(
      f"NODE_RANK={rank} but NNODES={count}: ranks go from 0 to {count - 1}; give every "
      "process the same NNODES and its own NODE_RANK"
    )
  if port > 65535:
    raise DistributedError(f"JAX_COORDINATOR_PORT={port} is not a TCP port (1 to 65535)")
  return f"{ip}:{port}", count, rank


# -- the meeting on the coordinator's port ------------------------------------------------------------


def _check_stop(doing):
  if preemption.requested():
    raise DistributedError(f"{preemption.signal_name()} while {doing}: stopped, nothing started")


def _listen(port):
  family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
  try:
    server = socket.create_server(("", port), family=family, dualstack_ipv6=family == socket.AF_INET6)
  except OSError as e:
    raise DistributedError(
      f"process 0 can't listen on JAX_COORDINATOR_PORT={port} ({e.strerror or e}); pick a "
      "free port (is another job's coordinator there?)"
    ) from None
  return server


def _read_line(conn, deadline, doing=None):
  """One line from `conn` ('' at EOF or the deadline), in short waits that see a stop request (`doing`)."""
  data = b""
  while b"\n" not in data:
    if doing:
      _check_stop(doing)
    left = deadline - time.monotonic()
    if left <= 0:
      return ""
    conn.settimeout(min(POLL_SECONDS, left))
    try:
      chunk = conn.recv(256)
    except socket.timeout:
      continue
    if not chunk:
      return ""
    data += chunk
  return data.split(b"\n", 1)[0].decode("ascii", "replace")


def _read_hello(conn, deadline):
  """(rank, count) a peer says it is, or None for a connection that isn't one of ours."""
  try:
    words = _read_line(conn, min(deadline, time.monotonic() + 5.0)).split()
    if len(words) != 5 or words[:2] != ["maxtext", "rank"]:
      return None
    return int(words[2]), int(words[4])
  except (OSError, ValueError):
    return None


def gather_peers(port, count, timeout):
  """Process 0: wait on `port` until ranks 1..count-1 have each said hello, then tell them to go on."""
  server, peers, deadline = _listen(port), {}, time.monotonic() + timeout
  try:
    while len(peers) < count - 1:
      _check_stop("waiting for the other processes")
      if time.monotonic() >= deadline:
        missing = ", ".join(str(r) for r in range(1, count) if r not in peers)
        raise DistributedError(
          f"rank(s) {missing} of NNODES={count} did not come within {timeout} s "
          "(jax_distributed_initialization_timeout); start every rank with the same NNODES "
          "and JAX_COORDINATOR_IP/PORT, and check that the port is reachable from their nodes"
        )
      server.settimeout(max(0.01, min(POLL_SECONDS, deadline - time.monotonic())))
      try:
        conn, _ = server.accept()
      except socket.timeout:
        continue
      hello = _read_hello(conn, deadline)
      problem = _hello_problem(hello, count, peers)
      if problem:
        peers[-1] = conn
        raise DistributedError(problem)
      if hello is None:
        conn.close()
        continue
      peers[hello[0]] = conn
  except DistributedError as e:
    _reply_all(peers, f"error {e}")  # the waiting ranks stop now, with the reason, not at their own timeout
    raise DistributedError(f"process 0: {e}") from None
  finally:
    server.close()
  _reply_all(peers, "go")


def _hello_problem(hello, count, peers):
  if hello is None:
    return None
  rank, their_count = hello
  if their_count != count:
    return (
      f"rank {rank} was started with NNODES={their_count} but process 0 with NNODES={count}; give every "
      "process the same NNODES"
    )
  if rank in peers or rank == 0 or not 0 < rank < count:
    return f"two processes say NODE_RANK={rank}; give every process its own NODE_RANK from 0 to {count - 1}"
  return None


def _reply_all(conns, message):
  """Send every peer `message`, then let the peers close first (within 2 s in all), so that the port is free
  again at once for jax's coordinator."""
  for conn in conns.values():
    try:
      conn.sendall(f"{message}\n".encode("ascii"))
    except OSError:
      pass
  deadline = time.monotonic() + 2.0
  for conn in conns.values():
    try:
      conn.settimeout(max(0.01, deadline - time.monotonic()))
      conn.recv(1)
    except OSError:
      pass
    finally:
      conn.close()


def meet_coordinator(address, rank, count, timeout):
  """Rank > 0: say hello to process 0 until it answers 'go' (or says what is wrong) within `timeout` s."""
  host, port = address.rsplit(":", 1)
  deadline, heard = time.monotonic() + timeout, False
  while True:
    reply = _hello(host, int(port), rank, count, deadline, f"waiting for the coordinator {address}")
    if reply == "go":
      return
    if reply and reply.startswith("error "):
      raise DistributedError(f"the coordinator {address} (process 0) stopped the job: {reply[6:]}")
    heard = heard or reply is not None
    if time.monotonic() >= deadline:
      why = "process 0 answered but the job did not form: another rank is missing" if heard else "nothing listens there"
      raise DistributedError(
        f"could not join the coordinator {address} (process {rank} of {count}) within "
        f"{timeout} s ({why}); check JAX_COORDINATOR_IP/JAX_COORDINATOR_PORT are reachable "
        "from every node, NNODES/NODE_RANK, and that process 0 was started "
        "(jax_distributed_initialization_timeout)"
      )
    time.sleep(POLL_SECONDS)


def _hello(host, port, rank, count, deadline, doing):
  """Process 0's answer ('go', 'error ...', '' when it closed without one), or None when nothing listens."""
  _check_stop(doing)
  try:
    conn = socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
  except OSError:
    return None
  with conn:
    try:
      conn.sendall(HELLO.format(rank=rank, count=count).encode("ascii"))
      return _read_line(conn, deadline, doing).strip()
    except OSError:
      return ""


# -- jax.distributed and the platform -----------------------------------------------------------------


def _watchdog(timeout, where):
  """jax's client aborts the process (a C++ check failure) when the job doesn't form; say why first and exit 2."""

  def expire():
    print(
      f"error: the job did not form within {timeout} s at {where}: a process stopped or is missing; check "
      "every process's log (jax_distributed_initialization_timeout)",
      file=sys.stderr,
      flush=True,
    )
    os._exit(2)  # pylint: disable=protected-access

  timer = threading.Timer(timeout, expire)
  timer.daemon = True
  return timer


def jax_heartbeat_timeout(cfg):
  """jax's own heartbeat timeout: above ours (runtime/peers.py names a lost peer in one line; jax aborts), and
  never below jax's default."""
  return max(100, 2 * cfg.jax_distributed_heartbeat_timeout_seconds)


def _join(kwargs, timeout, where):
  timer = _watchdog(timeout, where)
  timer.start()
  try:
    # jax's own deadline comes later than ours, so the clear line wins over its abort.
    jax.distributed.initialize(initialization_timeout=timeout + 60, **kwargs)
  except Exception as e:  # Slurm not detected, bad arguments, ...
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise DistributedError(
      f"could not join {where} ({first}); check JAX_COORDINATOR_IP/JAX_COORDINATOR_PORT are "
      "reachable from every node, NNODES/NODE_RANK, and that all processes were started "
      "(jax_distributed_initialization_timeout)"
    ) from None
  finally:
    timer.cancel()
  # jax's preemption notifier took SIGTERM (a handler that only sets a flag): ours again, feeding the job's stop
  # agreement (runtime/job_stop.py) and keeping the second signal's exit.
  preemption.reclaim()


def client():
  """jax.distributed's client (its coordination service's key-value store), None outside a job."""
  return jax_distributed.global_state.client


def check_platform(cfg):
  """Start jax's backend (its first use): a platform that can't start, or hardware=gpu without a GPU, is one line."""
  devices = environment.start_backend()
  if cfg.hardware.startswith("gpu") and not cfg.dry_run and devices[0].platform != "gpu":
    raise DistributedError(
      f"hardware={cfg.hardware} but jax sees no GPU here ({len(devices)} {devices[0].platform} "
      "device(s)); use hardware=cpu, or install jax with CUDA (pip install 'jax[cuda12]') and "
      "check nvidia-smi"
    )
  if cfg.attention == "cudnn_flash" and not cfg.dry_run:
    _check_cudnn_attention(devices)
  return devices


def _check_cudnn_attention(devices):
  """attention=cudnn_flash (MaxText's cudnn_flash_te) runs cuDNN's fused attention: an NVIDIA GPU of compute
  capability 8.0 or newer (Ampere) with cuDNN, known before anything compiles."""
  device = devices[0]
  if device.platform != "gpu":
    raise DistributedError(
      f"attention=cudnn_flash runs cuDNN's fused attention on an NVIDIA GPU, but jax sees {len(devices)} "
      f"{device.platform} device(s) here; use attention=dot_product"
    )
  capability = getattr(device, "compute_capability", None)
  if capability and float(capability) < 8.0:
    raise DistributedError(
      f"attention=cudnn_flash needs an NVIDIA GPU of compute capability 8.0 or newer for cuDNN's flash attention; "
      f"{device.device_kind} is {capability}: use attention=dot_product"
    )


def initialize(cfg):
  """Join the job as `cfg.hardware` says, then start jax's backend. Returns (process_index, process_count).

  cpu               single process, or NNODES>1 processes on CPU with gloo collectives (tests)
  gpu               one process per node: JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK; local GPUs from
                    CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS
  gpu_multiprocess  one process per GPU; jax.distributed detects Slurm (SLURM_* variables)
  """
  if not jax.distributed.is_initialized():
    _form_job(cfg)
  check_platform(cfg)
  return jax.process_index(), jax.process_count()


def _form_job(cfg):
  timeout = cfg.jax_distributed_initialization_timeout
  heartbeat = dict(heartbeat_timeout_seconds=jax_heartbeat_timeout(cfg))
  if cfg.hardware == "gpu_multiprocess":
    _join(heartbeat, timeout, "the Slurm-detected coordinator")
    return
  env = coordinator_from_env()
  if env is None or env[1] == 1:
    return
  address, count, rank = env
  kwargs = dict(coordinator_address=address, num_processes=count, process_id=rank, **heartbeat)
  if cfg.hardware == "gpu":
    kwargs["local_device_ids"] = _local_device_ids()
  else:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if rank == 0:
    gather_peers(int(address.rsplit(":", 1)[1]), count, timeout)
  else:
    meet_coordinator(address, rank, count, timeout)
  _join(kwargs, timeout, f"the coordinator {address} (process {rank} of {count})")
