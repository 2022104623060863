"""Two processes on localhost train together through jax.distributed (CPU collectives) and agree on every loss;
an unreachable coordinator is a clear error."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import pytest

from MaxText import config, train
from MaxText.runtime import distributed
from tests.conftest import REPO, cpu_subprocess_env
from tests.trainer.test_train import SMALL

LOSS = re.compile(r"^completed step: \d+, .* loss: ([\d.]+)$", re.M)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(rank, port, nnodes=2):
  return cpu_subprocess_env(
    2, JAX_COORDINATOR_IP="127.0.0.1", JAX_COORDINATOR_PORT=str(port), NNODES=str(nnodes), NODE_RANK=str(rank)
  )


@pytest.mark.slow
def test_two_processes_train_together_and_agree(tmp_path):
  port = _free_port()
  args = [
    sys.executable,
    "train.py",
    "configs/llama3_tiny.yml",
    *SMALL,
    "steps=4",
    "dtype=float32",
    "per_device_batch_size=2",
    f"base_output_directory={tmp_path}",
    "run_name=mp",
    "hardware=cpu",
    "ici_fsdp_parallelism=2",
    "dcn_data_parallelism=2",
    "jax_distributed_initialization_timeout=120",
  ]
  procs = [
    subprocess.Popen(args, cwd=REPO, env=_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for rank in (0, 1)
  ]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  losses = [[float(v) for v in LOSS.findall(out)] for out, _ in outs]
  assert len(losses[0]) == 4 and losses[0] == losses[1]
  assert "mesh: data 2 x fsdp 2 x context 1 x tensor 1 (4 device(s))" in outs[0][0]
  # One process, one device, the same global batch of 8 sequences.
  single = train.train(
    config.load(
      REPO / "configs" / "llama3_tiny.yml",
      SMALL
      + ["steps=4", "dtype=float32", "per_device_batch_size=8", f"base_output_directory={tmp_path}", "run_name=one"],
    )
  )
  assert losses[0] == pytest.approx([round(v, 3) for v in single], abs=1.5e-3)  # the step line prints 3 decimals
  assert (tmp_path / "mp" / "metrics.jsonl").read_text().count("\n") == 4  # written once, by process 0


def test_unreachable_coordinator_is_a_clear_error(tmp_path):
  args = [
    sys.executable,
    "train.py",
    "configs/llama3_tiny.yml",
    *SMALL,
    "steps=1",
    f"base_output_directory={tmp_path}",
    "hardware=cpu",
    "jax_distributed_initialization_timeout=3",
  ]
  proc = subprocess.run(args, cwd=REPO, env=_env(1, _free_port()), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()[-1]
  assert err.startswith("error: could not join the coordinator 127.0.0.1:") and "within 3 s" in err


@pytest.mark.parametrize(
  "nnodes, rank, message",
  [
    ("2", "2", "NODE_RANK=2 but NNODES=2: ranks go from 0 to 1"),
    ("2", "-1", "NODE_RANK=-1 must be >= 0; set it to this process's rank, 0 to 1"),
    ("2", "one", "NODE_RANK='one' is not an integer"),
    ("0", "0", "NNODES=0 must be >= 1"),
    ("two", "0", "NNODES='two' is not an integer"),
  ],
)
def test_inconsistent_nnodes_and_node_rank_are_named(monkeypatch, nnodes, rank, message):
  monkeypatch.setenv("JAX_COORDINATOR_IP", "127.0.0.1")
  monkeypatch.setenv("NNODES", nnodes)
  monkeypatch.setenv("NODE_RANK", rank)
  with pytest.raises(distributed.DistributedError) as e:
    distributed.coordinator_from_env()
  assert str(e.value).startswith(message)


def _meet(port, ranks, count, timeout=3.0):
  """Process 0 and the peers `ranks` (each claiming NNODES `count[rank]`) meet on `port`, each in a thread (the
  peers wait 2 s longer, as if started later): {rank: None (went on) or the DistributedError's message}."""
  results = {}

  def run(rank):
    try:
      if rank == 0:
        distributed.gather_peers(port, count[0], timeout)
      else:
        distributed.meet_coordinator(f"127.0.0.1:{port}", rank, count[rank], timeout + 2)
      results[rank] = None
    except distributed.DistributedError as e:
      results[rank] = str(e)

  threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout + 10)
  return results


def test_processes_meet_before_jax_and_a_wrong_one_is_named():
  """The meeting on the coordinator's port, before jax.distributed (whose client aborts the process): every
  process learns the job formed, or why not, within the timeout."""
  ok = _meet(_free_port(), [0, 1, 2], {0: 3, 1: 3, 2: 3})
  assert ok == {0: None, 1: None, 2: None}
  missing = _meet(_free_port(), [0, 1], {0: 3, 1: 3}, timeout=1.5)
  assert missing[0].startswith("process 0: rank(s) 2 of NNODES=3 did not come within 1.5 s")
  assert missing[1].startswith("the coordinator 127.0.0.1:") and "stopped the job: rank(s) 2 of NNODES=3" in missing[1]
  mismatch = _meet(_free_port(), [0, 1], {0: 2, 1: 3})
  assert mismatch[0] == (
    "process 0: rank 1 was started with NNODES=3 but process 0 with NNODES=2; give every process the same NNODES"
  )
  assert "stopped the job: rank 1 was started with NNODES=3" in mismatch[1]


def test_a_rank_given_twice_is_named():
  port, results = _free_port(), {}

  def peer(i):
    try:
      distributed.meet_coordinator(f"127.0.0.1:{port}", 1, 3, 3.0)
      results[i] = None
    except distributed.DistributedError as e:
      results[i] = str(e)

  peers = [threading.Thread(target=peer, args=(i,)) for i in range(2)]
  for t in peers:
    t.start()
  with pytest.raises(distributed.DistributedError, match="two processes say NODE_RANK=1; give every process its own"):
    distributed.gather_peers(port, 3, 3.0)
  for t in peers:
    t.join(10)
  assert any(r and "two processes say NODE_RANK=1" in r for r in results.values()), results


def test_a_platform_that_is_not_there_is_one_line(tmp_path):
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + ["hardware=gpu"])
  if jax.devices()[0].platform != "gpu":
    with pytest.raises(distributed.DistributedError, match="^hardware=gpu but jax sees no GPU here"):
      distributed.check_platform(cfg)
    assert distributed.check_platform(cfg.replace(dry_run=True))  # planning a GPU job on a laptop is fine
  proc = subprocess.run(
    [sys.executable, "train.py", "configs/llama3_tiny.yml", *SMALL, "steps=1", f"base_output_directory={tmp_path}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "nosuchplatform"},
  )
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert proc.stderr.strip().splitlines() == [
    line
    for line in proc.stderr.strip().splitlines()
    if line.startswith("error: jax can't start JAX_PLATFORMS='nosuchplatform' here")
  ]


def test_a_stop_request_ends_the_wait_for_other_processes():
  """SIGTERM/SIGINT while a process waits for the others (up to the timeout): it stops at once, with the reason."""
  from MaxText.runtime import preemption  # pylint: disable=import-outside-toplevel

  try:
    with preemption.installed():
      preemption.request()
      with pytest.raises(distributed.DistributedError, match="^SIGTERM while waiting for the coordinator 127.0.0.1"):
        distributed.meet_coordinator(f"127.0.0.1:{_free_port()}", 1, 2, 300)
      with pytest.raises(distributed.DistributedError, match="^process 0: SIGTERM while waiting for the other"):
        distributed.gather_peers(_free_port(), 2, 300)
  finally:
    with preemption.installed():  # entering resets the request for whatever runs next
      pass


def _two_trainers(tmp_path, *extra, run="job"):
  """Two train.py processes of one job (checkpoints every 4 steps, synchronous saves), stdout/stderr piped."""
  port = _free_port()
  args = [sys.executable, "train.py", "configs/llama3_tiny.yml", *SMALL, "per_device_batch_size=2", "hardware=cpu"]
  args += ["ici_fsdp_parallelism=2", "dcn_data_parallelism=2", f"base_output_directory={tmp_path}", f"run_name={run}"]
  args += ["enable_checkpointing=true", "checkpoint_period=4", "async_checkpointing=false", *extra]
  return [
    subprocess.Popen(args, cwd=REPO, env=_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for rank in (0, 1)
  ]


def _read_until(proc, prefix):
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith(prefix):
      return lines
  raise AssertionError(f"ended before {prefix!r}: {''.join(lines[-5:])}{proc.stderr.read()[-2000:]}")


@pytest.mark.slow
def test_sigterm_to_one_process_stops_the_job_after_one_step_with_one_checkpoint(tmp_path):
  """A node's preemption notice (SIGTERM to process 1 only): both processes stop after the same step, one
  checkpoint holds it, both exit 0; the same command resumes there and finishes."""
  procs = _two_trainers(tmp_path, "steps=100000")
  try:
    _read_until(procs[1], "completed step: 6,")
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
  stops = [re.findall(r"^(.*): stopped after step (\d+), checkpoint (\S+)$", out, re.M) for out, _ in outs]
  assert stops[0][0][0] == "SIGTERM to process 1" and stops[1][0][0] == "SIGTERM", stops
  assert stops[0][0][1:] == stops[1][0][1:], stops  # the same step, the same checkpoint
  done = int(stops[0][0][1]) + 1
  ckpts = tmp_path / "job" / "checkpoints"
  assert stops[0][0][2] == str(ckpts / str(done)) and (ckpts / str(done)).is_dir()
  assert not [p for p in ckpts.iterdir() if not p.name.isdigit()]
  procs = _two_trainers(tmp_path, f"steps={done + 2}")
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
  for out, _ in outs:
    assert f"resuming from checkpoint {ckpts / str(done)}" in out and f"completed step: {done + 1}," in out


@pytest.mark.slow
def test_kill_9_of_one_process_is_one_line_on_the_other_and_the_rerun_resumes(tmp_path):
  """kill -9 of process 1 mid-run: process 0 names it in one line within the heartbeat timeout and exits 75, jax's
  abort and stack trace (if any) in the run directory's log, not on stderr; the rerun resumes from the last
  complete checkpoint."""
  procs = _two_trainers(tmp_path, "steps=100000", "jax_distributed_heartbeat_timeout_seconds=10")
  try:
    _read_until(procs[1], "completed step: 9,")
    procs[1].kill()
    start = time.monotonic()
    _, err = procs[0].communicate(timeout=120)
    seconds = time.monotonic() - start
  finally:
    for p in procs:
      p.kill()
  assert procs[0].returncode == 75 and seconds < 10, (seconds, err[-3000:])
  assert "Check failure stack trace" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
  assert re.match(r"^error: process 1 \(.*\) stopped answering: no heartbeat for \d+ s", err), err
  ckpts = tmp_path / "job" / "checkpoints"
  last = max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
  procs = _two_trainers(tmp_path, f"steps={last + 2}")
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
  assert all(f"resuming from checkpoint {ckpts / str(last)}" in out for out, _ in outs)
