"""Building a run: a setup that fails closes what it had opened (data, prefetch thread, writer, checkpointer,
profiler, lock), newest first, even when one of those closes fails, and the error that stopped it is the one
raised."""

import logging
import threading
import time

import jax
import pytest

from MaxText import config, precision
from MaxText.config import RunShape
from MaxText.runtime import run_lock
from MaxText.trainer import run_setup
from MaxText.trainer.hooks import profiler
from tests.conftest import REPO
from tests.data.corpus import grain_overrides
from tests.trainer.test_train import SMALL


def _build(cfg, out_dir):
  devices = jax.devices()
  return run_setup.build(
    cfg, precision.plan_from_config(cfg), RunShape.of(cfg, len(devices)), devices, 0, 1, str(out_dir)
  )


def test_a_failed_setup_closes_everything_it_opened(tmp_path, corpus, monkeypatch, caplog):
  cfg = config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL
    + grain_overrides(corpus)
    + ["enable_checkpointing=true", "enable_tensorboard=true", "data_prefetch_depth=2", "profiler=xplane"]
    + [f"base_output_directory={tmp_path}", "run_name=r", "eval_interval=5", "steps=10"],
  )
  out_dir = tmp_path / "r"
  # Once whole (the process-wide threads jax, Orbax and grain start at their first use exist after it).
  _build(cfg, out_dir).close()
  before = set(threading.enumerate())

  def late_failure(*args, **kwargs):
    raise RuntimeError("setup failed after everything was opened")

  def failing_close(self):
    raise RuntimeError("the profiler's close failed too")

  monkeypatch.setattr(run_setup, "Run", late_failure)
  monkeypatch.setattr(profiler.Profiler, "close", failing_close)  # closed before the checkpointer, writer, data
  with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="^setup failed after everything"):
    _build(cfg, out_dir)
  # The prefetch thread, grain's readers, Orbax's and tensorboardX's writer: stopped (grain's pool ends its threads
  # once their current read is done, so they are given a few seconds).
  deadline = time.monotonic() + 10.0
  for t in set(threading.enumerate()) - before:
    t.join(max(0.0, deadline - time.monotonic()))
  left = [t.name for t in set(threading.enumerate()) - before]
  assert left == [], left
  assert "closing ProfilerHook after the failure failed too: the profiler's close failed too" in caplog.text
  run_lock.RunLock(str(out_dir)).acquire().release()  # the lock was released: the next run may start
