"""A kernel's instruction time from the code its threads run: loops as many times as its bytes need, the busiest
pipe per block at the published per-SM rates, whole waves of blocks at the target's clock."""

import pytest

from MaxText.aot import dump, instructions, ptx, targets
from tests.aot.test_ptx import PTX

GB200, H100 = targets.GPUS["gb200"], targets.GPUS["h100"]


def test_a_loop_runs_as_often_as_the_bytes_each_thread_reads_need():
  entry = ptx.entries(PTX)["input_reduce_fusion"]
  work = instructions.thread_work(entry, read_bytes_per_thread=8.0 * 100)
  assert work.trips == (100.0,)
  assert work.instructions == 3 + 5 * 100
  assert instructions.thread_work(entry, 0.0).trips == (1.0,)  # at least once


def test_a_block_takes_its_busiest_pipes_clocks_and_the_gpu_its_waves():
  entry = ptx.entries(PTX)["quantize_x"]
  work = instructions.thread_work(entry, 16.0)
  # issue 25 slots / 128, fp 10 / 128, alu 6 / 64, xu 4 / 16, shfl 1 / 32, shared 16 B / 128: the conversion unit.
  assert instructions.bottleneck(work) == "xu"
  assert instructions.block_clocks(work, 128) == pytest.approx(128 * 4 / 16)
  code = dump.Code(dump.Launch("quantize_x", GB200.core_count + 1, 128, 0), entry)  # one block past a wave
  seconds, _ = instructions.seconds(code, 16.0 * 128 * (GB200.core_count + 1), GB200)
  assert seconds == pytest.approx(2 * 128 * 4 / 16 / (GB200.clock_ghz * 1e9))


def test_the_rates_are_the_published_ones():
  assert instructions.RATES == {"issue": 128, "fp": 128, "alu": 64, "xu": 16, "shfl": 32, "smem_bytes": 128}
  assert "Programming Guide" in instructions.SOURCE
