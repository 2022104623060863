"""The training entry point: config -> model and precision plan -> jitted train step -> metrics.

    python train.py CONFIG.yml [key=value ...]     (same as python -m MaxText.train ...)
"""

import datetime
import json
import logging
import os
import pathlib
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from MaxText import (accounting, checkpointing, config as config_lib, data, distributed, metrics, optimizer,
                     precision, profiling, sharding, train_step)
from MaxText.model.decoder import Transformer
from MaxText.quantization import backends

log = logging.getLogger("MaxText")


class UserError(Exception):
  """A mistake the user can fix: printed as one line on stderr, exit code 2."""


# Mistakes the user can fix: the CLI prints them as one line and exits 2.
USER_ERRORS = (config_lib.ConfigError, UserError, data.DataError, data.TokenizerError, checkpointing.CheckpointError,
               sharding.ShardingError, distributed.DistributedError, backends.BackendError)


def device_memory_gib(cfg, devices):
  """Memory per device for the preflight: hardware_memory_gib, gpu_type, the accelerator's limit, or host RAM."""
  if cfg.hardware_memory_gib > 0:
    return cfg.hardware_memory_gib, "hardware_memory_gib"
  if cfg.gpu_type:
    return accounting.gpu_usable_gib(cfg.gpu_type), f"a {cfg.gpu_type.upper()} (90% of its HBM)"
  local = [d for d in devices if d.process_index == jax.process_index()]
  stats = local[0].memory_stats() if hasattr(local[0], "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return stats["bytes_limit"] / accounting.GIB, local[0].device_kind
  with open("/proc/meminfo", encoding="ascii") as f:
    info = dict(line.split(":", 1) for line in f)
  available_kib = int(info["MemAvailable"].split()[0])
  return available_kib / 2 ** 20 / len(local), local[0].platform  # virtual CPU devices share the host


def planned_devices(cfg, local_count):
  """(devices, processes) the run is planned for: num_devices, else an explicit ici x dcn product, else local."""
  ici = [getattr(cfg, f"ici_{a}_parallelism") for a in sharding.MESH_AXES]
  dcn = [getattr(cfg, f"dcn_{a}_parallelism") for a in sharding.MESH_AXES]
  processes = int(np.prod(dcn)) if -1 not in dcn else 1
  if cfg.num_devices > 0:
    return cfg.num_devices, processes
  if -1 not in ici + dcn:
    return int(np.prod(ici) * np.prod(dcn)), processes
  return local_count, processes


def summary(cfg, run_shape, mesh_sizes):
  flops = accounting.training_flops_per_device(cfg)
  mem = accounting.memory_per_device(cfg, mesh_sizes, run_shape.micro_batch_size)
  mesh_text = " x ".join(f"{a} {n}" for a, n in mesh_sizes.items())
  lines = [
      f"model: {cfg.model_name}",
      f"parameters: {accounting.param_count(cfg)}",
      f"TFLOPs per device per step: {flops.tflops:.2f}",
      f"mesh: {mesh_text} ({run_shape.num_devices} device(s))",
      f"memory per device: {mem.total_gib:.2f} GiB",
      f"  parameters {mem.params / accounting.GIB:.2f} GiB ({cfg.weight_dtype}), gradients "
      f"{mem.grads / accounting.GIB:.2f} GiB (f32), optimizer state {mem.optimizer / accounting.GIB:.2f} GiB "
      f"(AdamW mu+nu f32), activations ~{mem.activations / accounting.GIB:.2f} GiB "
      f"(remat_policy={cfg.remat_policy}, micro-batch {run_shape.micro_batch_size}, estimate)",
      f"global batch: {run_shape.global_batch_size} sequences x {cfg.max_target_length} tokens "
      f"({run_shape.tokens_per_step} tokens/step)",
  ]
  return "\n".join(lines), mem


def memory_check(cfg, mem, devices):
  """(fits, needed GiB, available GiB, of what) for the estimate against the device (or gpu_type) memory."""
  have, what = device_memory_gib(cfg, devices)
  return mem.total_gib <= have, mem.total_gib, have, what


def preflight(cfg, mem, devices):
  fits, need, have, what = memory_check(cfg, mem, devices)
  if not fits:
    raise UserError(
        f"estimated memory per device {need:.1f} GiB exceeds the {have:.1f} GiB available on {what} "
        f"({len(devices)} device(s)); use more devices, a smaller model, or lower per_device_batch_size / "
        "max_target_length, or remat_policy=full (or set hardware_memory_gib)")


def run_dir(cfg):
  name = cfg.run_name or datetime.datetime.now().strftime("run_%Y%m%d_%H%M%S")
  return os.path.join(cfg.base_output_directory, name)


class _Preemption:
  """SIGTERM (Slurm preemption, scancel) asks the loop to checkpoint and stop after the current step."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def evaluate(cfg, run_shape, eval_step, params, rest, batch_sharding):
  """Mean eval loss over up to eval_steps batches of a fresh pass over the eval split (None: no eval data)."""
  eval_iter = data.make_eval_iterator(cfg, run_shape, jax.process_index(), jax.process_count())
  if eval_iter is None:
    return None
  xent, weights = 0.0, 0.0
  for _, batch in zip(range(cfg.eval_steps), eval_iter):
    x, w = eval_step(params, rest, _global_batch(batch, batch_sharding))
    xent, weights = xent + float(x), weights + float(w)
  return xent / max(weights, 1.0), weights


def _data_states(data_iter):
  """{process index: iterator position} of every process (each reads its own slice), gathered to all."""
  state = data_iter.get_state()
  if jax.process_count() == 1:
    return {"0": state}
  blob = np.frombuffer(json.dumps(state).encode("utf-8"), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([blob.size])).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = multihost_utils.process_allgather(padded)
  return {str(i): json.loads(bytes(blobs[i][:lengths[i]]).decode("utf-8")) for i in range(len(lengths))}


def _train_state(params, rest, opt_state):
  """What a checkpoint holds: parameters, optimizer state and, with delayed scaling, the amax histories."""
  state = {"params": params, "opt_state": opt_state}
  if jax.tree.leaves(rest):
    state["amax_history"] = rest
  return state


def _initial_state(cfg, checkpointer, state):
  """(first step, state, data iterator state): resume from the run's own checkpoints, else a load_* path."""
  if checkpointer is not None:
    restored = checkpointer.restore_latest(state)
    if restored is not None:
      step, state, data_state = restored
      print(f"resuming from checkpoint {checkpointer.directory}/{step}", flush=True)
      return step, state, data_state
  if cfg.load_full_state_path:
    loaded, data_state = checkpointing.restore_step_dir(cfg.load_full_state_path, state)
    step = int(pathlib.Path(cfg.load_full_state_path).name) if pathlib.Path(cfg.load_full_state_path).name.isdigit() else 0
    print(f"loaded the full state from {cfg.load_full_state_path} (step {step})", flush=True)
    return step, loaded, data_state
  if cfg.load_parameters_path:
    loaded, _ = checkpointing.restore_step_dir(cfg.load_parameters_path, state)
    print(f"loaded parameters from {cfg.load_parameters_path}; fresh optimizer state, step 0", flush=True)
    return 0, {**state, "params": loaded["params"]}, {}
  return 0, state, {}


def _sharding_plan(cfg, plan, num_devices, num_processes):
  """{axis: size} of the mesh, after checking that the parameters (built abstractly) and quantization blocks fit it."""
  mesh_sizes, _, _ = sharding.mesh_shape(cfg, num_devices, num_processes)
  sharding.param_specs(abstract_model(cfg)[1], mesh_sizes)
  sharding.check_quantization_blocks(cfg, mesh_sizes, precision.block_sizes(plan))
  return mesh_sizes


def abstract_model(cfg):
  """(graphdef, params, rest) of the model with shapes only (nothing allocated)."""
  return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(cfg.seed))), nnx.Param, ...)


def _init_sharded(cfg, mesh):
  """(graphdef, params, rest) created directly in their shardings (nothing materialised whole on one device)."""
  graphdef, abstract_params, abstract_rest = abstract_model(cfg)
  shardings = sharding.param_shardings(abstract_params, mesh)
  replicated = jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract_rest)

  def init():
    _, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(cfg.seed)), nnx.Param, ...)
    return params, rest
  params, rest = jax.jit(init, out_shardings=(shardings, replicated))()
  return graphdef, params, rest


def _global_batch(batch, batch_sharding):
  """This process's rows of the batch -> global arrays sharded over the mesh."""
  return {k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v)) for k, v in batch._asdict().items()}


def train(cfg):
  """Train per `cfg`; returns the per-step losses of the steps this invocation ran."""
  # SIGTERM from here on is a clean stop: before the loop, nothing trained; in it, after a checkpoint.
  with _Preemption() as preemption:
    return _train(cfg, preemption)


def _check_writable(out_dir):
  """The run directory exists (created) and takes files: a clear error now, not after compiling."""
  try:
    os.makedirs(out_dir, exist_ok=True)
    probe = os.path.join(out_dir, ".write_test")
    with open(probe, "w", encoding="utf-8"):
      pass
    os.remove(probe)
  except OSError as e:
    raise UserError(f"can't write the run directory {out_dir} ({e.strerror or e}); set base_output_directory to "
                    "a writable directory") from None


def _train(cfg, preemption):
  process_index, process_count = distributed.initialize(cfg)
  devices = jax.devices()
  num_devices, num_processes = (planned_devices(cfg, len(devices)) if cfg.dry_run
                                else (len(devices), process_count))
  run_shape = config_lib.RunShape.of(cfg, num_devices)
  plan = precision.plan_from_config(cfg)
  mesh_sizes = _sharding_plan(cfg, plan, num_devices, num_processes)
  text, mem = summary(cfg, run_shape, mesh_sizes)
  print(text)
  print("precision plan:\n" + precision.format_plan(plan, cfg))
  if 0 <= cfg.high_precision_from_step < cfg.steps:
    print(f"from step {cfg.high_precision_from_step}: every GEMM in bf16")
  elif cfg.high_precision_from_step >= cfg.steps:
    print(f"high_precision_from_step={cfg.high_precision_from_step} is past the last step (steps={cfg.steps}): "
          "every step runs the plan above")
  if cfg.dry_run:
    fits, need, have, what = memory_check(cfg, mem, devices)
    print(f"memory check: {need:.1f} GiB per device {'fits' if fits else 'does NOT fit'} in {have:.1f} GiB "
          f"({what})")
    return []
  preflight(cfg, mem, devices)
  out_dir = run_dir(cfg)
  _check_writable(out_dir)

  mesh = sharding.make_mesh(cfg, devices)
  batch_sharding = sharding.batch_sharding(mesh)
  # Before the model: bad data fails fast.
  data_iter = data.make_iterator(cfg, run_shape, process_index, process_count)
  with jax.set_mesh(mesh):
    graphdef, params, rest = _init_sharded(cfg, mesh)
    tx = optimizer.make_optimizer(cfg)
    state = _train_state(params, rest, jax.jit(tx.init)(params))
  checkpointer = None
  if cfg.enable_checkpointing:
    checkpointer = checkpointing.Checkpointer(os.path.join(out_dir, "checkpoints"), period=cfg.checkpoint_period,
                                              max_to_keep=cfg.max_num_checkpoints_to_keep,
                                              async_save=cfg.async_checkpointing)
  start_step, state, data_state = _initial_state(cfg, checkpointer, state)
  if start_step >= cfg.steps:
    print(f"the run is at step {start_step} already (steps={cfg.steps}): nothing to train; raise steps to go on",
          flush=True)
  if data_state:
    own = data_state.get(str(process_index))
    if own is None:
      raise UserError(f"the checkpoint holds data positions for processes {sorted(data_state)}, not for process "
                      f"{process_index}; resume with the same number of processes (or load_parameters_path)")
    data_iter.set_state(own)
  params, opt_state = state["params"], state["opt_state"]
  rest = state.get("amax_history", rest)
  state_shardings = jax.tree.map(lambda a: a.sharding, (params, opt_state))

  # A few compiled steps, never one per step: the plan's, the all-BF16 one from
  # high_precision_from_step, and each of those with telemetry every quantization_stats_period.
  compiled_steps = {}

  plans = {False: plan, True: precision.plan_from_config(cfg, high_precision=True)}

  def train_step_for(step):
    high = 0 <= cfg.high_precision_from_step <= step
    step_plan = plans[high]
    stats = step_plan.quantized and cfg.quantization_stats_period > 0 and step % cfg.quantization_stats_period == 0
    if (high, stats) not in compiled_steps:
      compiled_steps[high, stats] = (step_plan, train_step.make_train_step(
          graphdef, tx, step_plan, cfg.gradient_accumulation_steps, cfg.seed,
          num_layers=cfg.base_num_decoder_layers if stats else 0, state_shardings=state_shardings))
    return compiled_steps[high, stats]

  eval_step = train_step.make_eval_step(graphdef, plan) if cfg.eval_interval else None
  flops = accounting.training_flops_per_device(cfg)
  schedule = optimizer.learning_rate_schedule(cfg)
  writer = metrics.MetricsWriter(out_dir, tensorboard=cfg.enable_tensorboard, flush_period=cfg.log_period,
                                 enabled=process_index == 0)
  profiler = profiling.Profiler(cfg, out_dir, enabled=process_index == 0)
  losses = []
  step = start_step

  def save(force=False):
    if checkpointer is not None:
      if checkpointer.due(step, force):
        writer.flush()  # the metrics reach disk no later than the checkpoint that covers them
      checkpointer.save(step, _train_state(params, rest, opt_state), _data_states(data_iter), force=force)

  def log_step(logged_step, step_plan, step_metrics, since):
    """The step's metrics record (waits for the step; seconds since `since`), after the finite-loss check."""
    loss = float(step_metrics["loss"])
    seconds = time.perf_counter() - since
    if not np.isfinite(loss):
      kept = f"; the last good checkpoint is {checkpointer.steps()[-1]}" if checkpointer and checkpointer.steps() else ""
      raise UserError(f"loss is {loss} at step {logged_step}; lower learning_rate or check the data "
                      f"(metrics so far in {out_dir}{kept})")
    tokens_per_device = run_shape.tokens_per_step / run_shape.num_devices
    record = {"loss": loss, "seconds": seconds, "TFLOP/s/device": flops.tflops / seconds,
              "Tokens/s/device": tokens_per_device / seconds,
              "total_weights": float(step_metrics["total_weights"]),
              "grad_norm": float(step_metrics["grad_norm"]),
              "learning_rate": float(schedule(logged_step))}
    if "quant_stats" in step_metrics:
      record.update(precision.stats_record(step_plan, jax.device_get(step_metrics["quant_stats"])))
    print(metrics.step_line(logged_step, seconds, record["TFLOP/s/device"], record["Tokens/s/device"],
                            record["total_weights"], loss), flush=True)
    losses.append(loss)
    return record

  try:
    with jax.set_mesh(mesh):
      if preemption.requested and step < cfg.steps:
        print(f"SIGTERM before step {step}: stopped, nothing trained" + (
            f" (the checkpoint at step {step} is unchanged)" if step else ""), flush=True)
      last = time.perf_counter()
      while step < cfg.steps and not preemption.requested:
        batch = _global_batch(next(data_iter), batch_sharding)
        step_plan, step_fn = train_step_for(step)
        profiler.before_step(step)
        params, rest, opt_state, step_metrics = step_fn(params, rest, opt_state, batch, jnp.int32(step))
        step += 1
        record = log_step(step - 1, step_plan, step_metrics, since=last)
        last = time.perf_counter()
        # The compiled step's HLO (a cache hit: the step has just run) tells the profile what each kernel is.
        hlo = lambda f=step_fn, a=(params, rest, opt_state, batch, jnp.int32(step - 1)): f.lower(*a).compile().as_text()
        if profiler.after_step(step - 1, (params, opt_state), hlo) is not None:
          last = time.perf_counter()
        if eval_step is not None and (step % cfg.eval_interval == 0 or step == cfg.steps):
          result = evaluate(cfg, run_shape, eval_step, params, rest, batch_sharding)
          if result is not None:
            record["eval_loss"], record["eval_weights"] = result
            print(f"eval after step {step - 1}: loss: {result[0]:.3f}, perplexity: {np.exp(result[0]):.2f}, "
                  f"tokens: {int(result[1])}", flush=True)
          last = time.perf_counter()
        writer.write(step - 1, record)
        save(force=step == cfg.steps)
        if preemption.requested:
          save(force=True)
          print(f"SIGTERM: stopped after step {step - 1}" + (
              f", checkpoint {checkpointer.directory}/{step}" if checkpointer else
              " (enable_checkpointing=false: nothing saved)"), flush=True)
          break
  finally:
    profiler.close()
    writer.close()
    if checkpointer is not None:
      checkpointer.close()
  return losses


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__.strip())
    return 0 if argv else 2
  try:
    cfg = config_lib.load(argv[0], argv[1:])
    train(cfg)
  except USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
