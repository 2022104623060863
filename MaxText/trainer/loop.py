"""The training entry point: config -> plan -> a built run (run_setup) -> the step loop -> metrics and checkpoints.

    python train.py CONFIG.yml [key=value ...]     (same as python -m MaxText.train ...)

The loop never waits for the device between steps: step N+1 is dispatched before step N's metrics are
read (MaxText's one-step-late logging), with batches read and placed ahead by a background thread
(data_prefetch_depth). It synchronises only where it must: checkpoints, evals, profile windows, the
last step and a stop, so a checkpoint never holds a step whose loss has not been checked.
"""

import dataclasses
import logging
import sys
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np

from MaxText import checkpointing, config as config_lib, data, precision
from MaxText.runtime import compile_cache, distributed, preemption, sharding
from MaxText.trainer.hooks import metrics
from MaxText.trainer import preflight, run_setup
from MaxText.errors import UserError
from MaxText.quantization import backends
from MaxText.runtime.run_lock import RunLockError

# Names kept for callers of the trainer's module.
abstract_model = run_setup.abstract_model
summary, memory_check = preflight.summary, preflight.memory_check

# Mistakes the user can fix (and environment faults): the CLI prints them as one line and exits 2.
USER_ERRORS = (config_lib.ConfigError, UserError, data.DataError, data.TokenizerError, checkpointing.CheckpointError,
               sharding.ShardingError, distributed.DistributedError, backends.BackendError, metrics.MetricsError,
               RunLockError)


class _Dispatched(typing.NamedTuple):
  """A step handed to the device whose metrics haven't been read yet."""
  step: int
  plan: typing.Any
  metrics: dict
  step_fn: typing.Any
  batch: dict


@dataclasses.dataclass
class Loop:
  """The step loop over a built Run; the state its parts share."""
  run: run_setup.Run
  losses: list = dataclasses.field(default_factory=list)
  in_flight: list = dataclasses.field(default_factory=list)  # _Dispatched, oldest first
  position: typing.Any = None  # the data position after the newest dispatched batch
  last_done: float = dataclasses.field(default_factory=time.perf_counter)  # when the previous step completed

  def train(self):
    """Steps until `steps` or a stop request; returns the losses of the steps run."""
    cfg, state = self.run.cfg, self.run.state
    if preemption.requested() and state.step < cfg.steps:
      return self._stopped_before()
    while self.run.state.step < cfg.steps:
      placed = self._next_batch()
      if placed is None:  # a stop request arrived while waiting for data
        break
      self._dispatch(placed)
      if self._at_boundary():
        self._boundary()
      else:
        self._write(self._finish_all(but_newest=True))
      if preemption.requested():
        break
    if preemption.requested() and self.run.state.step < cfg.steps:
      self._stop()
    return self.losses

  def _next_batch(self):
    try:
      return self.run.batches.next(should_stop=preemption.requested)
    except data.DataError as e:
      self._write(self._finish_all())
      raise data.DataError(f"reading the batch of step {self.run.state.step}: {e}") from None

  def _dispatch(self, placed):
    run, state = self.run, self.run.state
    if run.profiler.starts_at(state.step):
      self._write(self._finish_all())  # the trace holds the profiled steps only
    plan, step_fn = run.steps.for_step(state.step)
    run.profiler.before_step(state.step)
    params, rest, opt_state, step_metrics = step_fn(state.params, state.rest, state.opt_state, placed.arrays,
                                                    jnp.int32(state.step))
    self.in_flight.append(_Dispatched(state.step, plan, step_metrics, step_fn, placed.arrays))
    run.state = run_setup.TrainState(state.step + 1, params, rest, opt_state)
    self.position = placed.position
    if run.checkpointer is not None:
      run.checkpointer.check()  # a failed background save stops the run now, not a period later

  def _finish_all(self, but_newest=False):
    """Waits for the dispatched steps (all, or all but the newest) and returns their metrics records."""
    records = []
    while len(self.in_flight) > (1 if but_newest else 0):
      records.append(self._finish(self.in_flight.pop(0)))
    return records

  def _finish(self, done):
    """(step, record) of a dispatched step, after the finite-loss check; seconds since the previous completion."""
    run = self.run
    loss = float(done.metrics["loss"])
    now = time.perf_counter()
    seconds, self.last_done = now - self.last_done, now
    if not np.isfinite(loss):
      kept = run.checkpointer.steps() if run.checkpointer else []
      kept_text = f"; the last good checkpoint is {kept[-1]}" if kept else ""
      raise UserError(f"loss is {loss} at step {done.step}; lower learning_rate or check the data "
                      f"(metrics so far in {run.out_dir}{kept_text})")
    record = _record(run, done, loss, seconds)
    print(metrics.step_line(done.step, seconds, record["TFLOP/s/device"], record["Tokens/s/device"],
                            record["total_weights"], loss), flush=True)
    self.losses.append(loss)
    if run.profiler.after_step(done.step, (run.state.params, run.state.opt_state), self._hlo_of(done)) is not None:
      self.last_done = time.perf_counter()
    return done.step, record

  def _hlo_of(self, done):
    """The compiled step, for the profile's HLO and memory analysis (a cache hit: the step has just run)."""
    state = self.run.state
    args = (state.params, state.rest, state.opt_state, done.batch, jnp.int32(done.step))
    return lambda: done.step_fn.lower(*args).compile()

  def _at_boundary(self):
    """Whether the step just dispatched ends at a point that needs its results: eval, checkpoint, profile end,
    the last step, a stop."""
    run, step = self.run, self.run.state.step
    cfg = run.cfg
    return (step == cfg.steps or preemption.requested() or run.profiler.ends_at(step - 1)
            or (run.checkpointer is not None and run.checkpointer.due(step))
            or (run.steps.eval_step is not None and step % cfg.eval_interval == 0))

  def _boundary(self):
    """Drains the dispatched steps, evaluates and checkpoints where due."""
    run, step = self.run, self.run.state.step
    records = self._finish_all()
    if run.steps.eval_step is not None and (step % run.cfg.eval_interval == 0 or step == run.cfg.steps):
      result = evaluate(run)
      if result is not None and records:
        records[-1][1]["eval_loss"], records[-1][1]["eval_weights"] = result
      self.last_done = time.perf_counter()
    self._write(records)
    self._save(force=step == run.cfg.steps)

  def _write(self, records):
    for step, record in records:
      self.run.writer.write(step, record)

  def _save(self, force=False):
    run = self.run
    if run.checkpointer is None or not run.checkpointer.due(run.state.step, force):
      return
    run.writer.flush()  # the metrics reach disk no later than the checkpoint that covers them
    run.checkpointer.save(run.state.step, run.state.checkpoint_tree(), run.data_position(self.position), force=force)
    self.last_done = time.perf_counter()

  def _stop(self):
    """A stop request: finish what is in flight, checkpoint, say so."""
    self._write(self._finish_all())
    self._save(force=True)
    run, step = self.run, self.run.state.step
    where = (f", checkpoint {run.checkpointer.directory}/{step}" if run.checkpointer else
             " (enable_checkpointing=false: nothing saved)")
    print(f"{preemption.signal_name()}: stopped after step {step - 1}{where}", flush=True)

  def _stopped_before(self):
    step = self.run.state.step
    print(f"{preemption.signal_name()} before step {step}: stopped, nothing trained" + (
        f" (the checkpoint at step {step} is unchanged)" if step else ""), flush=True)
    return self.losses


def _record(run, done, loss, seconds):
  """The metrics record of a finished step."""
  tokens_per_device = run.run_shape.tokens_per_step / run.run_shape.num_devices
  record = {"loss": loss, "seconds": seconds, "TFLOP/s/device": run.flops.tflops / seconds,
            "Tokens/s/device": tokens_per_device / seconds,
            "total_weights": float(done.metrics["total_weights"]), "grad_norm": float(done.metrics["grad_norm"]),
            "learning_rate": float(run.schedule(done.step))}
  if "quant_stats" in done.metrics:
    record.update(precision.stats_record(done.plan, jax.device_get(done.metrics["quant_stats"])))
  return record


def evaluate(run):
  """(mean eval loss, eval tokens) over up to eval_steps batches of a fresh pass over the eval split; None when
  there is no eval data or it yields no tokens (never a loss of 0 from nothing)."""
  cfg = run.cfg
  eval_iter = data.make_eval_iterator(cfg, run.run_shape, jax.process_index(), jax.process_count())
  if eval_iter is None:
    return None
  try:
    sums = [run.steps.eval_step(run.state.params, run.state.rest, run_setup.global_batch(batch, run.batch_sharding))
            for _, batch in zip(range(cfg.eval_steps), eval_iter)]
  finally:
    eval_iter.close()
  xent, weights = (float(sum(s[i] for s in sums)) if sums else 0.0 for i in (0, 1))
  if weights <= 0:
    print(f"warning: eval after step {run.state.step - 1}: the eval split yielded no tokens; no eval loss logged",
          flush=True)
    return None
  print(f"eval after step {run.state.step - 1}: loss: {xent / weights:.3f}, perplexity: {np.exp(xent / weights):.2f}, "
        f"tokens: {int(weights)}", flush=True)
  return xent / weights, weights


def _sharding_plan(cfg, plan, num_devices, num_processes):
  """{axis: size} of the mesh, after checking that the parameters (built abstractly) and quantization blocks fit it."""
  mesh_sizes, _, _ = sharding.mesh_shape(cfg, num_devices, num_processes)
  sharding.param_specs(abstract_model(cfg)[1], mesh_sizes)
  sharding.check_quantization_blocks(cfg, mesh_sizes, precision.block_sizes(plan))
  return mesh_sizes


def train(cfg):
  """Train per `cfg`; returns the per-step losses of the steps this invocation ran.

  SIGTERM and SIGINT from here on are clean stops: before the loop, nothing trained; in it, after a
  checkpoint (preemption.py). `preemption.requested()` tells the caller afterwards.
  """
  with preemption.installed():
    process_index, process_count = distributed.initialize(cfg)
    devices = jax.devices()
    num_devices, num_processes = (preflight.planned_devices(cfg, len(devices)) if cfg.dry_run
                                  else (len(devices), process_count))
    run_shape = config_lib.RunShape.of(cfg, num_devices)
    plan = precision.plan_from_config(cfg)
    mem = preflight.print_plan(cfg, plan, run_shape, _sharding_plan(cfg, plan, num_devices, num_processes), devices)
    if cfg.dry_run:
      return []
    preflight.check_memory(cfg, mem, devices)
    out_dir = preflight.run_dir(cfg)
    preflight.check_writable(out_dir)
    compile_cache.configure(cfg.jax_cache_dir)
    run = run_setup.build(cfg, plan, run_shape, devices, process_index, process_count, out_dir)
    try:
      with jax.set_mesh(run.mesh):
        return Loop(run).train()
    finally:
      run.close()


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
  except KeyboardInterrupt:  # Ctrl-C before the trainer took over the signal: nothing started
    print("interrupted", file=sys.stderr)
    return 130
  return preemption.exit_code() if preemption.requested() else 0


if __name__ == "__main__":
  sys.exit(main())
