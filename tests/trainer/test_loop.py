"""The loop alone, with stand-in steps and batches (nothing compiles): which hook events come when, in what order."""

import types

import numpy as np
import pytest

from MaxText.data import DataError
from MaxText.trainer.loop import Hook, Loop, NonFiniteLoss
from MaxText.trainer.train_step import TrainState


class _Steps:
  """for_step -> a 'step' that adds 1 to params; its loss is losses[step]."""

  seed_key = None

  def __init__(self, losses):
    self.losses = losses

  def for_step(self, step):
    def step_fn(params, rest, opt_state, batch, step_index, seed_key):
      return params + 1, rest, opt_state, {"loss": np.float32(self.losses[int(step_index)])}

    return "plan", step_fn


class _Batches:
  def __init__(self, fail_at=None):
    self.read, self.fail_at = 0, fail_at

  def next(self, should_stop):
    if should_stop():
      return None
    if self.read == self.fail_at:
      raise DataError("record 3 of shard-0 is damaged")
    self.read += 1
    return types.SimpleNamespace(arrays={"inputs": self.read}, position={"read": self.read})


class _Recorder(Hook):
  """Records every event; needs a sync every `every` steps."""

  def __init__(self, every):
    self.every, self.events = every, []

  def needs_sync(self, step):
    return step % self.every == 0

  def on_step(self, result, progress):
    self.events.append(("step", result.step, progress.state.step))

  def after_steps(self, results, progress, sync):
    if results or sync:
      self.events.append(("after", [r.step for r in results], sync, progress.position["read"]))

  def on_stop(self, progress, trained):
    self.events.append(("stop", progress.state.step, trained))


def _loop(hooks, steps=7, should_stop=lambda: False, losses=None, batches=None):
  losses = losses or [10.0 - i for i in range(steps)]
  return Loop(
    TrainState(0, np.float32(0), {}, {}),
    _Steps(losses),
    batches or _Batches(),
    hooks,
    last_step=steps,
    should_stop=should_stop,
  )


def test_steps_are_read_one_late_and_synced_where_a_hook_or_the_last_step_asks():
  hook = _Recorder(every=3)
  loop = _loop([hook])
  assert loop.train() == [10.0 - i for i in range(7)]
  assert float(loop.state.params) == 7 and loop.state.step == 7
  after = [e for e in hook.events if e[0] == "after"]
  # Each step's loss is read after the next one is dispatched, except at a sync (steps 3 and 6 done, and the last).
  assert after == [
    ("after", [0], False, 2),
    ("after", [1, 2], True, 3),
    ("after", [3], False, 5),
    ("after", [4, 5], True, 6),
    ("after", [6], True, 7),
  ]
  assert [e[1] for e in hook.events if e[0] == "step"] == list(range(7))  # every step once, in order


def test_a_stop_request_finishes_what_is_in_flight_then_stops_once():
  hook = _Recorder(every=100)
  loop = _loop([hook], should_stop=lambda: loop.state.step >= 4)
  assert len(loop.train()) == 4
  assert hook.events[-2:] == [("after", [2, 3], True, 4), ("stop", 4, True)]
  stopped_early = _Recorder(every=100)
  assert _loop([stopped_early], should_stop=lambda: True).train() == []
  assert stopped_early.events == [("stop", 0, False)]


def test_a_non_finite_loss_names_its_step_before_any_hook_sees_it():
  hook = _Recorder(every=2)
  with pytest.raises(NonFiniteLoss, match="loss is nan at step 3"):
    _loop([hook], losses=[3.0, 2.0, 1.0, float("nan"), 0.5, 0.4, 0.3]).train()
  assert [e[1] for e in hook.events if e[0] == "step"] == [0, 1, 2]


def test_a_data_error_names_the_step_after_the_finished_steps_are_handed_over():
  hook = _Recorder(every=100)
  with pytest.raises(DataError, match=r"reading the batch of step 3: record 3 of shard-0 is damaged"):
    _loop([hook], batches=_Batches(fail_at=3)).train()
  assert [e[1] for e in hook.events if e[0] == "after"] == [[0], [1], [2]]
