"""The step loop: dispatches the compiled steps and calls its hooks; it owns no I/O (the hooks print and write).

The loop never waits for the device between steps: step N+1 is dispatched before step N's loss is read
(MaxText's one-step-late logging), with batches read and placed ahead by a background thread
(data_prefetch_depth). It synchronises only where it must: where a hook needs the results (an eval, a
checkpoint, a profile window's edges), at the last step and at a stop, so a checkpoint never holds a step
whose loss has not been checked. A step's `seconds` run from the previous step's completion (all its
metrics readable) to its own, or from the end of a hook's work outside the steps (an eval, a save).
"""

import dataclasses
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.errors import UserError
from MaxText.runtime import preemption
from MaxText.trainer.train_step import TrainState


class NonFiniteLoss(UserError):
  """A step's loss is NaN or infinite: the run stops there, and no checkpoint holds that step's effects."""

  def __init__(self, step, loss):
    super().__init__(f"loss is {loss} at step {step}; lower learning_rate or check the data")
    self.step, self.loss = step, loss


@dataclasses.dataclass
class StepResult:
  """A finished step as the hooks see it; `record` is its metrics row, filled and written by the hooks."""

  step: int
  loss: float
  seconds: float
  metrics: dict  # the step's outputs besides the state, on the host: loss, total_weights, grad_norm, quant_stats
  plan: typing.Any  # the precision plan the step ran
  compiled: typing.Callable  # () -> the compiled step (a cache hit: it has just run), for the profiler
  record: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Progress:
  """Where the loop is: the state after the newest dispatched step, and the data position after its batch."""

  state: TrainState
  position: typing.Any


class Hook:
  """Something the loop calls around its steps. Every method is optional; hooks run in the order given, each event
  to every hook before the next event. An event returns True where the hook spent time that is no step's (an eval,
  a checkpoint, a profile summary): the next step's seconds then start after it."""

  def needs_sync(self, step: int) -> bool:
    """Whether the loop must finish every dispatched step once `step` steps are done (and call after_steps with
    sync=True), e.g. every N steps for an eval or a checkpoint."""
    return False

  def before_step(self, step: int):
    """Step `step` is about to be dispatched."""

  def after_dispatch(self, step: int):
    """Step `step` has been handed to the device."""

  def on_step(self, result: StepResult, progress: Progress):
    """A step has finished (its loss checked): called in step order."""

  def after_steps(self, results: list, progress: Progress, sync: bool):
    """The steps just finished (possibly none); `sync`: nothing is in flight, at a point some hook (or the last step)
    asked for."""

  def on_stop(self, progress: Progress, trained: bool):
    """A stop was requested (SIGTERM, SIGINT); `trained`: whether any step ran. Nothing is in flight."""

  def close(self):
    """The run is over (finished, stopped or failed)."""


class _Dispatched(typing.NamedTuple):
  """A step handed to the device whose loss hasn't been read yet."""

  step: int
  plan: typing.Any
  metrics: dict
  step_fn: typing.Any
  batch: dict


class Loop:
  """Runs `steps` (train_step.StepFunctions) over `batches` (runtime.prefetch.Prefetcher) from `state` to
  `last_step`, or until `should_stop()` (polled where the loop waits; `stop_point(step)` before each step),
  calling `hooks`."""

  def __init__(
    self, state: TrainState, steps, batches, hooks, *, last_step, should_stop=preemption.requested, stop_point=None
  ):
    self.state, self.steps, self.batches, self.hooks = state, steps, batches, list(hooks)
    self.last_step, self.should_stop = last_step, should_stop
    # Called once before each step is dispatched, on every process at the same steps: where the processes of a
    # job agree to stop (runtime/job_stop.py); should_stop() then reads the outcome.
    self.stop_point = stop_point or (lambda step: None)
    self.losses = []
    self.in_flight = []  # _Dispatched, oldest first
    self.position = None  # the data position after the newest dispatched batch
    self.last_done = time.perf_counter()  # when the previous step completed

  def train(self):
    """Steps until `last_step` or a stop request; returns the losses of the steps run."""
    trained = False
    while self.state.step < self.last_step:
      self.stop_point(self.state.step)
      if self.should_stop():
        break
      placed = self._next_batch()
      if placed is None:  # a stop request arrived while waiting for data
        break
      self._dispatch(placed)
      trained = True
      sync = self._sync_point()
      self._call("after_steps", self._finish_all(but_newest=not sync), self._progress(), sync)
    if self.should_stop() and self.state.step < self.last_step:
      if trained:
        self._call("after_steps", self._finish_all(), self._progress(), False)
      self._call("on_stop", self._progress(), trained)
    return self.losses

  def _call(self, event, *args):
    """`event` on every hook; where one says it did work outside the steps, the next step's time starts now."""
    outside_the_steps = [getattr(hook, event)(*args) for hook in self.hooks]
    if any(outside_the_steps):
      self.last_done = time.perf_counter()

  def _progress(self):
    return Progress(self.state, self.position)

  def _next_batch(self):
    try:
      return self.batches.next(should_stop=self.should_stop)
    except UserError as e:  # bad data found mid-run: named with the step whose batch it was
      self._call("after_steps", self._finish_all(), self._progress(), False)
      raise type(e)(f"reading the batch of step {self.state.step}: {e}") from None

  def _sync_point(self):
    """Whether the step just dispatched ends where results are needed: a hook's, the last step, a stop."""
    step = self.state.step
    return step == self.last_step or self.should_stop() or any(h.needs_sync(step) for h in self.hooks)

  def _dispatch(self, placed):
    state = self.state
    plan, step_fn = self.steps.for_step(state.step)
    self._call("before_step", state.step)
    params, rest, opt_state, step_metrics = step_fn(
      state.params, state.rest, state.opt_state, placed.arrays, jnp.int32(state.step), self.steps.seed_key
    )
    self.in_flight.append(_Dispatched(state.step, plan, step_metrics, step_fn, placed.arrays))
    self.state = TrainState(state.step + 1, params, rest, opt_state)
    self.position = placed.position
    self._call("after_dispatch", state.step)  # e.g. a failed background save stops the run now, not a period later

  def _finish_all(self, but_newest=False):
    """Waits for the dispatched steps (all, or all but the newest) and returns their StepResults."""
    results = []
    while len(self.in_flight) > (1 if but_newest else 0):
      results.append(self._finish(self.in_flight.pop(0)))
    return results

  def _finish(self, done):
    """The StepResult of a dispatched step, after the finite-loss check; seconds since the previous completion (the
    step is complete when all its metrics can be read)."""
    step_metrics = jax.device_get(done.metrics)
    loss = float(step_metrics["loss"])
    now = time.perf_counter()
    seconds, self.last_done = now - self.last_done, now
    if not np.isfinite(loss):
      raise NonFiniteLoss(done.step, loss)
    state = self.state
    args = (state.params, state.rest, state.opt_state, done.batch, jnp.int32(done.step), self.steps.seed_key)
    result = StepResult(
      done.step, loss, seconds, step_metrics, done.plan, compiled=lambda: done.step_fn.lower(*args).compile()
    )
    self.losses.append(loss)
    self._call("on_step", result, self._progress())
    return result
