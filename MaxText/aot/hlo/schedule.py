"""A compiled step's time as its schedule runs it: the optimized HLO's instructions in their scheduled order (XLA's
latency-hiding scheduler fixed it: the module is `is_scheduled`), kernels one after another on the compute stream,
each asynchronous collective (a `*-start` / `*-done` pair, or an `async-start` wrapping one) on its own stream
from its start, the compute stream waiting at its done only for what is left of it. So a collective costs the
step only the time nothing else hides: the exposed time; the rest is hidden. A synchronous collective (one XLA runs
in place, `is_sync`) is exposed whole.

Streams as XLA:GPU assigns them: the collectives share one stream (they run in their start order), point-to-point
ones (collective-permute, send / recv) another, memory copies a third. A loop body runs its trip count times (two
iterations walked, the rest extrapolated from the second: the steady state, a collective started in one iteration
and finished in the next included). While a collective runs, the compute kernels beside it may run slower (NCCL
takes SMs and memory bandwidth): `overlap_slowdown` stretches them by that share. Pure text processing (no jax)."""

import dataclasses

from MaxText.aot.hlo.collectives import collective_opcode
from MaxText.aot.hlo.text import trip_count

_P2P = ("collective-permute", "send", "recv")
_EXTRAPOLATE_AFTER = 2  # loop iterations walked before the rest are extrapolated


@dataclasses.dataclass
class Streams:
  """Where the walk is: the compute stream's clock, when each other stream is free, the asynchronous ops in flight
  ((end time, whether a collective) by start name) and those carried into a loop's next iteration, and the step's
  sums so far."""

  compute: float = 0.0
  free: dict = dataclasses.field(default_factory=dict)
  in_flight: dict = dataclasses.field(default_factory=dict)
  carried: list = dataclasses.field(default_factory=list)
  compute_s: float = 0.0
  collective_s: float = 0.0
  exposed_s: float = 0.0

  def shift(self, seconds, sums):
    """Advances every clock by `seconds` and the sums by `sums` (compute_s, collective_s, exposed_s)."""
    self.compute += seconds
    self.free = {k: v + seconds for k, v in self.free.items()}
    self.in_flight = {k: (end + seconds, collective) for k, (end, collective) in self.in_flight.items()}
    self.carried = [(end + seconds, collective) for end, collective in self.carried]
    self.compute_s += sums[0]
    self.collective_s += sums[1]
    self.exposed_s += sums[2]

  def sums(self):
    return self.compute_s, self.collective_s, self.exposed_s

  def copy(self):
    return dataclasses.replace(self, free=dict(self.free), in_flight=dict(self.in_flight), carried=list(self.carried))


class Walk:
  """Walks a module's scheduled instructions with `seconds(name)`, each launched instruction's time per run."""

  def __init__(self, module, seconds, overlap_slowdown=0.0):
    self.module, self.seconds, self.slowdown = module, seconds, overlap_slowdown

  def run(self):
    """{total_s, compute_s, collective_s, exposed_s, hidden_s} of one execution of the entry."""
    state = Streams()
    self.computation(self.module.entry, state)
    end = max([state.compute, *(e for e, _ in state.in_flight.values()), *(e for e, _ in state.carried)])
    state.exposed_s += end - state.compute  # collectives still running when the compute stream is done
    exposed = min(state.exposed_s, state.collective_s)
    return {
      "total_s": end,
      "compute_s": state.compute_s,
      "collective_s": state.collective_s,
      "exposed_s": exposed,
      "hidden_s": state.collective_s - exposed,
    }

  def computation(self, name, state):
    for instr in self.module.computations.get(name, []):
      self.instruction(instr, state)

  def instruction(self, instr, state):
    opcode = instr.opcode
    if opcode == "while":
      self.loop(instr, state)
    elif opcode == "call":
      self.computation(instr.called("to_apply") or instr.called("calls"), state)
    elif opcode == "conditional":
      self.conditional(instr, state)
    elif opcode.endswith("-start"):
      self.start(instr, state)
    elif opcode.endswith("-done"):
      self.done(instr, state)
    elif collective_opcode(instr):  # a synchronous collective: the compute stream waits for all of it
      duration = self.seconds(instr.name)
      state.compute += duration
      state.collective_s += duration
      state.exposed_s += duration
    else:
      self.compute(self.seconds(instr.name), state)

  def compute(self, duration, state):
    if duration <= 0:
      return
    running = [*state.in_flight.values(), *state.carried]
    busy = any(end > state.compute and collective for end, collective in running)
    duration *= 1.0 + (self.slowdown if busy else 0.0)
    state.compute += duration
    state.compute_s += duration

  def start(self, instr, state):
    """An asynchronous op's start: its work queued on its stream (a synchronous collective: run in place)."""
    wrapped = instr.called("calls") if instr.opcode == "async-start" else None
    if wrapped:
      body = self.module.computations.get(wrapped, [])
      duration = sum(self.seconds(i.name) for i in body)
      kind = next((collective_opcode(i) for i in body if collective_opcode(i)), None)
    else:
      duration, kind = self.seconds(instr.name), collective_opcode(instr)
    if kind is None:
      stream = "copy" if instr.opcode == "copy-start" else "async"
    else:
      stream = "p2p" if kind in _P2P or instr.opcode.startswith(("send", "recv")) else "collective"
      state.collective_s += duration
      if _is_sync(instr):
        state.compute += duration
        state.exposed_s += duration
        return
    begin = max(state.compute, state.free.get(stream, 0.0))
    state.free[stream] = begin + duration
    state.in_flight[instr.name] = (begin + duration, kind is not None)

  def done(self, instr, state):
    """An asynchronous op's done: the compute stream waits for what is left of it."""
    start = instr.operands[0] if instr.operands else None
    if start in state.in_flight:
      end, collective = state.in_flight.pop(start)
    elif state.carried:  # started in the loop's previous iteration
      end, collective = state.carried.pop(0)
    elif state.in_flight:  # started outside the loop (or computation) its done is in: the oldest still running
      end, collective = state.in_flight.pop(min(state.in_flight, key=lambda k: state.in_flight[k][0]))
    else:
      return
    wait = max(0.0, end - state.compute)
    state.compute += wait
    if collective:
      state.exposed_s += wait

  def loop(self, instr, state):
    """A while loop: its condition and body `trip count` times (two walked, the rest extrapolated)."""
    trips = trip_count(instr) or 1
    body, condition = instr.called("body"), instr.called("condition")
    walked = min(trips, _EXTRAPOLATE_AFTER)
    before = None
    for iteration in range(walked):
      if iteration == walked - 1:  # the last walked iteration is the steady state's measure
        before = (state.compute, state.sums())
      self.computation(condition, state)
      self.computation(body, state)
      state.carried += sorted(state.in_flight.values())  # pipelined into the next iteration
      state.in_flight.clear()
    remaining = trips - walked
    if remaining > 0:
      step = state.compute - before[0]
      sums = [(now - then) * remaining for now, then in zip(state.sums(), before[1])]
      state.shift(step * remaining, sums)
    self.computation(condition, state)

  def conditional(self, instr, state):
    """A conditional: the slowest branch (which runs is decided at run time)."""
    branches = instr.branches or [instr.called("true_computation"), instr.called("false_computation")]
    outcomes = []
    for branch in [b for b in branches if b]:
      trial = state.copy()
      self.computation(branch, trial)
      outcomes.append(trial)
    if outcomes:
      slowest = max(outcomes, key=lambda s: s.compute)
      state.__dict__.update(slowest.__dict__)


def _is_sync(instr):
  config = instr.backend_config.get("collective_backend_config") or {}
  return bool(config.get("is_sync"))


def walk(module, seconds, overlap_slowdown=0.0):
  """{total_s, compute_s, collective_s, exposed_s, hidden_s} of the module's entry as scheduled, `seconds(name)` each
  launched instruction's time per run (0 for what launches nothing)."""
  return Walk(module, seconds, overlap_slowdown).run()
