"""The batch prefetcher: order and positions kept, errors delivered in order, a stop seen while data hangs."""

import threading
import time

import pytest

from MaxText.runtime import prefetch


class _Counting:
  """Yields 0, 1, 2, ...; raises at `fail_at`; blocks forever at `hang_at` (as a pipeline that can't produce)."""

  def __init__(self, fail_at=None, hang_at=None):
    self.n, self.fail_at, self.hang_at = 0, fail_at, hang_at
    self.release = threading.Event()

  def __next__(self):
    if self.n == self.fail_at:
      raise ValueError(f"bad record {self.n}")
    if self.n == self.hang_at:
      self.release.wait()
    self.n += 1
    return self.n - 1

  def get_state(self):
    return {"next": self.n}


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_batches_arrive_in_order_with_the_position_after_each(depth):
  batches = prefetch.Prefetcher(_Counting(), lambda b: {"x": b * 10}, depth)
  got = [batches.next() for _ in range(6)]
  batches.close()
  assert [g.arrays["x"] for g in got] == [0, 10, 20, 30, 40, 50]
  assert [g.position["next"] for g in got] == [1, 2, 3, 4, 5, 6]  # not the reader's, which is ahead


def test_an_error_arrives_after_the_batches_read_before_it():
  batches = prefetch.Prefetcher(_Counting(fail_at=2), lambda b: b, 2)
  assert [batches.next().arrays for _ in range(2)] == [0, 1]
  with pytest.raises(ValueError, match="bad record 2"):
    batches.next()


def test_a_stop_request_is_seen_while_the_pipeline_hangs():
  source = _Counting(hang_at=1)
  batches = prefetch.Prefetcher(source, lambda b: b, 2)
  assert batches.next().arrays == 0
  stop_at = time.monotonic() + 0.5
  assert batches.next(should_stop=lambda: time.monotonic() > stop_at) is None  # returns, doesn't hang
  source.release.set()
  batches.close()
