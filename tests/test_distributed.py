"""Two processes on localhost train together through jax.distributed (CPU collectives) and agree on every loss;
an unreachable coordinator is a clear error."""

import os
import re
import socket
import subprocess
import sys

import pytest

from MaxText import config, train
from tests.conftest import REPO
from tests.test_train import SMALL

LOSS = re.compile(r"^completed step: \d+, .* loss: ([\d.]+)$", re.M)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(rank, port, nnodes=2):
  return dict(os.environ, JAX_COORDINATOR_IP="127.0.0.1", JAX_COORDINATOR_PORT=str(port), NNODES=str(nnodes),
              NODE_RANK=str(rank), XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")


def test_two_processes_train_together_and_agree(tmp_path):
  port = _free_port()
  args = [sys.executable, "train.py", "configs/llama3_tiny.yml", *SMALL, "steps=4", "dtype=float32",
          "per_device_batch_size=2", f"base_output_directory={tmp_path}", "run_name=mp", "hardware=cpu",
          "ici_fsdp_parallelism=2", "dcn_data_parallelism=2", "jax_distributed_initialization_timeout=120"]
  procs = [subprocess.Popen(args, cwd=REPO, env=_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for rank in (0, 1)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  losses = [[float(v) for v in LOSS.findall(out)] for out, _ in outs]
  assert len(losses[0]) == 4 and losses[0] == losses[1]
  assert "mesh: data 2 x fsdp 2 x context 1 x tensor 1 (4 device(s))" in outs[0][0]
  # One process, one device, the same global batch of 8 sequences.
  single = train.train(config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + [
      "steps=4", "dtype=float32", "per_device_batch_size=8", f"base_output_directory={tmp_path}", "run_name=one"]))
  assert losses[0] == pytest.approx([round(v, 3) for v in single], abs=1.5e-3)  # the step line prints 3 decimals
  assert (tmp_path / "mp" / "metrics.jsonl").read_text().count("\n") == 4  # written once, by process 0


def test_unreachable_coordinator_is_a_clear_error(tmp_path):
  args = [sys.executable, "train.py", "configs/llama3_tiny.yml", *SMALL, "steps=1", f"base_output_directory={tmp_path}",
          "hardware=cpu", "jax_distributed_initialization_timeout=3"]
  proc = subprocess.run(args, cwd=REPO, env=_env(1, _free_port()), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()[-1]
  assert err.startswith("error: could not join the coordinator 127.0.0.1:") and "within 3 s" in err
