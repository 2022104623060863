"""One process of a two-process job for the runtime tests: forms the job on localhost as the trainer does
(distributed.initialize: gloo collectives, our SIGTERM handler back, jax's heartbeat above ours), starts the
peer watchdog and the stop agreement, then runs 'steps' (a cross-process all-reduce each) polling the agreement
before each, until the job agrees to stop. Prints 'step N' lines and 'stopped before step N: <reason>'.

    python tests/runtime/job_worker.py RUN_DIR HEARTBEAT_TIMEOUT [compile]   (env: JAX_COORDINATOR_*, NNODES, NODE_RANK)

'compile': first compile a long program (seconds of XLA work in one native call), saying 'compiling' before.
"""

import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from MaxText import config  # noqa: E402
from MaxText.runtime import distributed, job_stop, peers, preemption  # noqa: E402


def _long_compile():
  def chain(x):
    for i in range(300):
      x = jnp.sin(x @ x.T + i) * 1.0001
    return x

  print("compiling", flush=True)
  jax.jit(chain).lower(jnp.ones((64, 64))).compile()


def main(run_dir, heartbeat_timeout, compile_first=False):
  cfg = config.load(
    pathlib.Path(__file__).resolve().parents[2] / "configs" / "llama3_tiny.yml",
    [f"jax_distributed_heartbeat_timeout_seconds={heartbeat_timeout}", "jax_distributed_initialization_timeout=60"],
  )
  with preemption.installed():
    rank, count = distributed.initialize(cfg)
    watchdog = peers.Watchdog(distributed.client(), rank, count, cfg.jax_distributed_heartbeat_timeout_seconds)
    watchdog.start()
    peers.native_stderr_to(os.path.join(run_dir, f"native_stderr.process{rank}.log"))
    stop = job_stop.JobStop(distributed.client(), rank)
    if compile_first:
      _long_compile()
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.ones((jax.local_device_count(), 8)))
    step_fn = jax.jit(lambda a: a + jnp.sum(a) * 1e-9, out_shardings=NamedSharding(mesh, P("d")))
    step = 0
    try:
      while True:
        stop.poll(step)
        if stop.requested():
          break
        x = step_fn(x).block_until_ready()
        print(f"step {step}", flush=True)
        step += 1
        time.sleep(0.05)
    except Exception as e:  # a collective that failed because the peer went away: the watchdog names it
      watchdog.settle()
      raise SystemExit(f"unexpected: {e}") from None
    print(f"stopped before step {step}: {preemption.reason()}", flush=True)
    watchdog.leave()
  return preemption.exit_code()


if __name__ == "__main__":
  sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["compile"]))
