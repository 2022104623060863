"""A training run from start to end: join the job, plan (preflight), build the run, loop, close."""

import contextlib

import jax

from MaxText import precision
from MaxText.config import RunShape
from MaxText.errors import UserError
from MaxText.runtime import compile_cache, distributed, preemption
from MaxText.trainer import preflight, run_setup
from MaxText.trainer.loop import Loop, NonFiniteLoss


def matmul_precision(cfg):
  """MaxText's matmul_precision for every matmul the run traces (f32 operands: TF32 or full f32 on a GPU)."""
  if cfg.matmul_precision in ("default", "bfloat16"):
    return contextlib.nullcontext()
  return jax.default_matmul_precision("highest" if cfg.matmul_precision == "float32" else cfg.matmul_precision)


def train(cfg):
  """Train per `cfg`; returns the per-step losses of the steps this invocation ran.

  SIGTERM and SIGINT from here on are clean stops: before the loop, nothing trained; in it, after a
  checkpoint (runtime/preemption.py). `preemption.requested()` tells the caller afterwards.
  """
  with preemption.installed(), matmul_precision(cfg):
    process_index, process_count = distributed.initialize(cfg)
    devices = jax.devices()
    num_devices, num_processes = (
      preflight.planned_devices(cfg, len(devices)) if cfg.dry_run else (len(devices), process_count)
    )
    run_shape = RunShape.of(cfg, num_devices)
    plan = precision.plan_from_config(cfg)
    mesh_sizes = preflight.sharding_plan(cfg, plan, num_devices, num_processes)
    mem = preflight.print_plan(cfg, plan, run_shape, mesh_sizes, devices)
    if cfg.dry_run:
      return []
    preflight.check_memory(cfg, mem, devices)
    preflight.check_storage(cfg)
    out_dir = preflight.run_dir(cfg)
    preflight.check_writable(out_dir)
    compile_cache.configure(cfg.jax_cache_dir)
    run = run_setup.build(cfg, plan, run_shape, devices, process_index, process_count, out_dir)
    try:
      with jax.set_mesh(run.mesh):
        return Loop(run.state, run.steps, run.batches, run.hooks, last_step=cfg.steps).train()
    except NonFiniteLoss as e:
      kept = run.checkpointer.steps() if run.checkpointer is not None else []
      kept_text = f"; the last good checkpoint is {kept[-1]}" if kept else ""
      raise UserError(f"{e} (metrics so far in {out_dir}{kept_text})") from None
    finally:
      run.close()
