"""The per-step cost of a multi-process job's stop agreement (runtime/job_stop.py: JAX's
reached_preemption_sync_point, polled once before every step), on processes of this machine.

    python benchmarks/stop_agreement_bench.py [--processes 2] [--steps 2000]

Starts the processes on localhost (CPU, gloo collectives, 2 devices each). Each runs `steps` steps of a small
jitted all-reduce over every device of the job (a step's collective, waited for), in blocks of 100 alternating
with and without the poll, and times every poll. Prints, per process: the poll's median / p99 / max, and the mean
step time with and without it (their ratio is measured in the same run). Then one SIGTERM to the last process
shows after how many steps every process agreed to stop.
"""

import argparse
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

BLOCK = 100


def _worker(rank, count, port, steps):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from MaxText.runtime import distributed, job_stop, preemption  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  with preemption.installed():
    jax.distributed.initialize(f"127.0.0.1:{port}", count, rank)
    preemption.reclaim()
    stop = job_stop.JobStop(distributed.client(), rank)
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.ones((jax.local_device_count(), 256)))
    step = jax.jit(lambda a: a + jnp.sum(a) * 1e-9, out_shardings=NamedSharding(mesh, P("d")))
    x = step(x).block_until_ready()
    polls, with_poll, without = [], [], []
    for i in range(steps):
      polled = (i // BLOCK) % 2 == 1
      start = time.perf_counter()
      if polled:
        stop.poll(i)
        polls.append(time.perf_counter() - start)
      x = step(x).block_until_ready()
      (with_poll if polled else without).append(time.perf_counter() - start)
    us = np.array(polls) * 1e6
    plain, polled = np.mean(without) * 1e3, np.mean(with_poll) * 1e3
    print(
      f"{rank:>7} {np.median(us):>10.1f} {np.percentile(us, 99):>8.1f} {us.max():>8.1f} "
      f"{plain:>12.3f} {polled:>12.3f} {polled / plain:>7.3f}",
      flush=True,
    )
    # The agreement itself: the last process gets SIGTERM (from the parent, once it prints 'ready').
    print("ready", flush=True)
    n = 0
    while not stop.requested():
      stop.poll(n)
      x = step(x).block_until_ready()
      n += 1
    print(f"stopped {rank} after {n} steps", flush=True)


def _line(proc):
  """The worker's next line of ours (gloo prints its connection lines on stdout too)."""
  while True:
    line = proc.stdout.readline()
    if not line or not line.startswith("[Gloo]"):
      return line.rstrip()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--processes", type=int, default=2)
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.processes < 2 or args.steps < 2 * BLOCK:
    parser.error(f"--processes must be >= 2 and --steps >= {2 * BLOCK}")
  if args.worker is not None:
    return _worker(args.worker, args.processes, args.port, args.steps)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        __file__,
        f"--processes={args.processes}",
        f"--steps={args.steps}",
        f"--worker={r}",
        f"--port={port}",
      ],
      env=env,
      stdout=subprocess.PIPE,
      text=True,
    )
    for r in range(args.processes)
  ]
  print(f"stop agreement, {args.processes} processes on {socket.gethostname()} (CPU, gloo), {args.steps} steps each")
  header = ("process", "poll p50 us", "p99 us", "max us", "step ms w/o", "step ms with", "ratio")
  print(" ".join(f"{h:>{w}}" for h, w in zip(header, (7, 10, 8, 8, 12, 12, 7))))
  rows = []
  for p in procs:
    rows.append(_line(p))
    assert _line(p) == "ready"
  print("\n".join(sorted(rows)))
  start = time.perf_counter()
  procs[-1].send_signal(signal.SIGTERM)
  for p in procs:
    print(_line(p), f"({time.perf_counter() - start:.2f} s after the SIGTERM)")
    p.wait()
  return 0


if __name__ == "__main__":
  sys.exit(main())
