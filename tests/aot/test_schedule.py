"""The step as its schedule runs it: kernels one after another on the compute stream, asynchronous collectives on
their stream from their start, the compute stream waiting at a done only for what is left; loops by their trip
counts, a collective pipelined across iterations; synchronous collectives exposed whole."""

import pytest

from MaxText.aot import hlo

HLO = """
HloModule m, is_scheduled=true

%body (p: (s32[], bf16[1024])) -> (s32[], bf16[1024]) {
  %p = (s32[], bf16[1024]{0}) parameter(0)
  %gte = bf16[1024]{0} get-tuple-element(%p), index=1
  %all-gather-start = (bf16[128]{0}, bf16[1024]{0}) all-gather-start(%gte), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %gemm = bf16[1024]{0} custom-call(%gte), custom_call_target="__cublas$gemm"
  %all-gather-done = bf16[1024]{0} all-gather-done(%all-gather-start)
  %add = bf16[1024]{0} fusion(%all-gather-done), kind=kLoop, calls=%fused
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], bf16[1024]{0}) tuple(%i, %add)
}

%cond (c: (s32[], bf16[1024])) -> pred[] {
  %c = (s32[], bf16[1024]{0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

%fused (f: bf16[1024]) -> bf16[1024] {
  %f = bf16[1024]{0} parameter(0)
  ROOT %n = bf16[1024]{0} negate(%f)
}

ENTRY %main (x: bf16[1024]) -> bf16[1024] {
  %x = bf16[1024]{0} parameter(0)
  %first = bf16[1024]{0} fusion(%x), kind=kLoop, calls=%fused
  %all-reduce = bf16[1024]{0} all-reduce(%first), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%fused
  %init = (s32[], bf16[1024]{0}) tuple(%x, %all-reduce)
  %while = (s32[], bf16[1024]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  ROOT %out = bf16[1024]{0} get-tuple-element(%while), index=1
}
"""


def _walk(times, slowdown=0.0):
  return hlo.schedule.walk(hlo.parse(HLO), lambda name: times.get(name, 0.0), slowdown)


def test_a_collective_hidden_behind_compute_costs_nothing_and_a_longer_one_its_excess():
  hidden = _walk({"first": 1.0, "all-reduce": 2.0, "all-gather-start": 3.0, "gemm": 5.0, "add": 1.0})
  # first 1 + the synchronous all-reduce 2 + 10 x (gemm 5, the all-gather hidden behind it, add 1)
  assert hidden["total_s"] == pytest.approx(1 + 2 + 10 * 6)
  assert hidden["collective_s"] == pytest.approx(2 + 10 * 3)
  assert hidden["exposed_s"] == pytest.approx(2) and hidden["hidden_s"] == pytest.approx(30)
  assert hidden["compute_s"] == pytest.approx(1 + 10 * 6)
  exposed = _walk({"first": 1.0, "all-reduce": 2.0, "all-gather-start": 7.0, "gemm": 5.0, "add": 1.0})
  assert exposed["total_s"] == pytest.approx(1 + 2 + 10 * (7 + 1))  # waits 2 for each all-gather
  assert exposed["exposed_s"] == pytest.approx(2 + 10 * 2) and exposed["hidden_s"] == pytest.approx(10 * 5)


def test_compute_beside_a_collective_can_be_slowed_by_it():
  times = {"all-gather-start": 3.0, "gemm": 5.0, "add": 1.0}
  assert _walk(times, slowdown=0.2)["total_s"] == pytest.approx(10 * (5 * 1.2 + 1))  # only the GEMM overlaps


def test_the_kernel_list_and_the_walk_agree_on_what_runs():
  module = hlo.parse(HLO)
  runs = {k.name: k.count for k in hlo.kernels(module, num_devices=8)}
  assert runs["gemm"] == 10 and runs["first"] == 1 and runs["all-gather-start"] == 10


PIPELINED = """
HloModule m, is_scheduled=true

%body (p: (s32[], bf16[1024], bf16[1024])) -> (s32[], bf16[1024], bf16[1024]) {
  %p = (s32[], bf16[1024]{0}, bf16[1024]{0}) parameter(0)
  %carried = bf16[1024]{0} get-tuple-element(%p), index=2
  %previous = bf16[1024]{0} all-gather-done(%carried)
  %gemm = bf16[1024]{0} custom-call(%previous), custom_call_target="__cublas$gemm"
  %next = (bf16[128]{0}, bf16[1024]{0}) all-gather-start(%gemm), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], bf16[1024]{0}, bf16[1024]{0}) tuple(%i, %gemm, %next)
}

%cond (c: (s32[], bf16[1024], bf16[1024])) -> pred[] {
  %c = (s32[], bf16[1024]{0}, bf16[1024]{0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (x: bf16[1024]) -> bf16[1024] {
  %x = bf16[1024]{0} parameter(0)
  %first = (bf16[128]{0}, bf16[1024]{0}) all-gather-start(%x), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %init = (s32[], bf16[1024]{0}, bf16[1024]{0}) tuple(%x, %x, %first)
  %while = (s32[], bf16[1024]{0}, bf16[1024]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  %last = bf16[1024]{0} get-tuple-element(%while), index=2
  ROOT %out = bf16[1024]{0} all-gather-done(%last)
}
"""


def test_a_collective_started_in_one_iteration_is_waited_for_in_the_next():
  """The collective pipeliner's shape: each iteration waits for the gather the previous one started."""
  module = hlo.parse(PIPELINED)
  walked = hlo.schedule.walk(module, lambda name: {"first": 2.0, "next": 2.0, "gemm": 5.0}.get(name, 0.0))
  # Nothing runs beside these gathers: each starts after its iteration's GEMM and the next iteration's GEMM needs it,
  # so every one is exposed (a GEMM independent of the gather would hide it).
  assert walked["total_s"] == pytest.approx(2 + 10 * (5 + 2))
  assert walked["exposed_s"] == pytest.approx(2 + 10 * 2)
