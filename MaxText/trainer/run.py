"""A training run from start to end: join the job, plan (preflight), build the run, loop, close."""

import contextlib
import os
import tempfile

import jax

from MaxText import precision, storage
from MaxText.config import RunShape
from MaxText.errors import UserError
from MaxText.quantization import cpu_gemm
from MaxText.quantization.errors import BackendError
from MaxText.runtime import compile_cache, distributed, job_stop, peers, preemption, sharding
from MaxText.trainer import aot_step, preflight, run_setup
from MaxText.trainer.loop import Loop, NonFiniteLoss


def matmul_precision(cfg):
  """MaxText's matmul_precision for every matmul the run traces (f32 operands: TF32 or full f32 on a GPU)."""
  if cfg.matmul_precision in ("default", "bfloat16"):
    return contextlib.nullcontext()
  return jax.default_matmul_precision("highest" if cfg.matmul_precision == "float32" else cfg.matmul_precision)


def train(cfg):
  """Train per `cfg`; returns the per-step losses of the steps this invocation ran.

  SIGTERM and SIGINT from here on are clean stops: before the loop, nothing trained; in it, after a
  checkpoint (runtime/preemption.py). `preemption.requested()` tells the caller afterwards. In a multi-process
  job every process stops after the same step (runtime/job_stop.py), and a process that dies, hangs or fails
  is named by the others, which exit too (runtime/peers.py).
  """
  refuse_train_compile_keys(cfg)
  cpu_gemm.configure(cfg.cpu_gemm_dtype)
  try:
    return _joined(cfg)
  except BackendError as e:
    raise precision.backend_error_for_key(cfg, e) from None


COMPILE_OUTPUT_KEYS = ("compile_report", "compile_hlo")


def refuse_train_compile_keys(cfg):
  """compile_report and compile_hlo are train_compile's outputs: a training run writes neither, so setting one is a
  mistake said before anything runs."""
  for key in COMPILE_OUTPUT_KEYS:
    if getattr(cfg, key):
      raise UserError(
        f"{key}={getattr(cfg, key)} does nothing in a training run: it is where python -m MaxText.train_compile "
        f"writes its {'report' if key == 'compile_report' else 'optimized HLO'}; run train_compile with it, or drop it"
      )


def _joined(cfg):
  """train()'s run, inside the process's stop handling and the job (single- or multi-process)."""
  with preemption.installed(), matmul_precision(cfg):
    process_index, process_count = distributed.initialize(cfg)
    if process_count == 1:
      return _train(cfg, process_index, process_count, None, None)
    client = distributed.client()
    watchdog = peers.Watchdog(client, process_index, process_count, cfg.jax_distributed_heartbeat_timeout_seconds)
    watchdog.start()
    stop = job_stop.JobStop(client, process_index)
    try:
      losses = _train(cfg, process_index, process_count, watchdog, stop)
    except UserError as e:
      watchdog.leave(error=str(e))
      raise
    except BaseException as e:  # a collective that failed because a peer went away: the watchdog names it
      watchdog.settle()
      watchdog.leave(error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:150] if str(e).strip() else ''}")
      raise
    finally:
      stop.close()
    watchdog.leave()
    return losses


def _train(cfg, process_index, process_count, watchdog, stop):
  devices = jax.devices()
  target = aot_step.named_target(cfg)
  if target is not None:  # compile_topology: planned for the target's devices and hosts
    num_devices, num_processes = target.num_devices, target.hosts
  else:
    num_devices, num_processes = (
      preflight.planned_devices(cfg, len(devices)) if cfg.dry_run else (len(devices), process_count)
    )
  hw = aot_step.gpu_hardware(target.gpu, target.name) if target is not None else preflight.local_hardware(cfg, devices)
  cfg, auto = preflight.resolve_auto(cfg, hw, num_devices, num_processes)
  run_shape = RunShape.of(cfg, num_devices)
  plan = precision.plan_from_config(cfg)
  mesh_sizes = preflight.sharding_plan(cfg, plan, num_devices, num_processes)
  if not cfg.dry_run:
    compile_cache.configure(cfg.jax_cache_dir)  # before the preflight compiles: the run's step is then a cache hit
  compiled = aot_step.preflight_memory(cfg, target, devices, num_devices)
  mem = preflight.print_plan(cfg, plan, run_shape, mesh_sizes, devices, compiled, auto)
  if cfg.dry_run:
    return []
  preflight.check_memory(cfg, mem, devices, compiled)
  preflight.check_storage(cfg)
  out_dir = preflight.run_dir(cfg)
  preflight.check_writable(out_dir)
  if watchdog is not None:  # jax's C++ messages (and its abort, should it come first) into the run directory
    log_dir = tempfile.gettempdir() if storage.is_remote(out_dir) else out_dir  # object storage has no append
    peers.native_stderr_to(os.path.join(log_dir, f"native_stderr.process{process_index}.log"))
  run = run_setup.build(cfg, plan, run_shape, devices, process_index, process_count, out_dir)
  try:
    with sharding.use_mesh(run.mesh):
      loop = Loop(
        run.state,
        run.steps,
        run.batches,
        run.hooks,
        last_step=cfg.steps,
        should_stop=stop.requested if stop else preemption.requested,
        stop_point=stop.poll if stop else None,
      )
      return loop.train()
  except NonFiniteLoss as e:
    kept = run.checkpointer.steps() if run.checkpointer is not None else []
    kept_text = f"; the last good checkpoint is {kept[-1]}" if kept else ""
    raise UserError(f"{e} (metrics so far in {out_dir}{kept_text})") from None
  except BaseException:
    if watchdog is not None:
      watchdog.settle()  # before closing (Orbax's barriers would wait for a lost peer)
    run.close(after_failure=True)
    raise
  finally:
    if not run.closed:
      run.close()
