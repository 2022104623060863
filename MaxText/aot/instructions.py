"""A kernel's instruction time on a GPU target from the code each thread runs (aot.ptx, aot.sass): the one model every
kernel is costed by where its code can be read -- XLA's fusions, the Pallas kernels, Transformer Engine's kernels.

Each SM issues one warp instruction per clock from each of its 4 schedulers (128 thread-instructions per clock), and
each pipe retires its instructions at its own rate per SM per clock, the NVIDIA CUDA C++ Programming Guide's table of
arithmetic-instruction throughput ("Arithmetic Instructions", operations per clock cycle per multiprocessor) for
compute capabilities 9.0 and 10.x: 32-bit floating-point add / multiply / multiply-add 128; 32-bit integer add,
logic, shift, compare, min / max 64; type conversions and the special functions (reciprocal, square root, log2,
exp2, sine, cosine) 16; warp shuffle 32. Shared memory moves 128 bytes per clock per SM (FlashAttention-4, arXiv
2603.05451: unchanged from H100 to B200). A block of T threads takes max over pipes of T x its slots in that pipe /
the pipe's rate clocks; an SM runs ceil(blocks / SMs) blocks' worth (the last wave's idle SMs are lost), at the
target's clock (aot.targets). A loop runs as many times as the bytes the kernel reads need: what each thread reads
(the kernel's operand bytes over its threads), less what its straight-line code loads, over what one pass of its
loops loads (a loop that loads nothing counts once)."""

import collections
import dataclasses
import math

SOURCE = (
  "NVIDIA CUDA C++ Programming Guide, Arithmetic Instructions (throughput per clock per SM, compute capability 9.0 "
  "and 10.x); shared-memory bandwidth: FlashAttention-4 (arXiv 2603.05451)"
)
RATES = {"issue": 128, "fp": 128, "alu": 64, "xu": 16, "shfl": 32, "smem_bytes": 128}


@dataclasses.dataclass(frozen=True)
class ThreadWork:
  """What one thread of a kernel executes: instructions, pipe slots, and each loop's estimated trip count."""

  instructions: float
  slots: dict
  trips: tuple


def thread_work(entry, read_bytes_per_thread) -> ThreadWork:
  """The dynamic work of one thread of `entry` (aot.ptx.Entry) reading `read_bytes_per_thread` bytes."""
  loading = sum(loop.load_bytes for loop in entry.loops)
  rest = max(0.0, read_bytes_per_thread - entry.straight.load_bytes)
  trip = max(1.0, rest / loading) if loading > 0 else 1.0
  trips = tuple(trip if loop.load_bytes > 0 else 1.0 for loop in entry.loops)
  slots = collections.Counter(entry.straight.slots)
  instructions = float(entry.straight.instructions)
  for loop, times in zip(entry.loops, trips):
    instructions += loop.instructions * times
    for pipe, count in loop.slots.items():
      slots[pipe] += count * times
  return ThreadWork(instructions, dict(slots), trips)


def block_clocks(work, threads_per_block):
  """Clocks one SM takes for one block: its busiest pipe (issue included)."""
  return max((threads_per_block * count / RATES[pipe] for pipe, count in work.slots.items()), default=0.0)


def bottleneck(work):
  """The pipe that bounds a thread's work."""
  return max(work.slots, key=lambda pipe: work.slots[pipe] / RATES[pipe]) if work.slots else "issue"


def seconds(code, read_bytes, gpu):
  """(seconds, ThreadWork) of an HLO instruction's kernel (aot.dump.Code) reading `read_bytes` on `gpu`."""
  launch = code.launch
  threads = max(1, launch.blocks * launch.threads_per_block)
  work = thread_work(code.entry, read_bytes / threads)
  waves = math.ceil(launch.blocks / gpu.core_count)
  return waves * block_clocks(work, launch.threads_per_block) / (gpu.clock_ghz * 1e9), work
