"""What XLA writes for a compiled GPU program under --xla_dump_to=DIR, read back per HLO instruction: the kernel each
launches (its PTX entry, from the thunk sequence and its metadata), its grid and block, and the entry's code
(aot.ptx). File reading; `compile_reading_code` compiles a jax Lowered with the dump on and reads it back."""

import dataclasses
import os
import pathlib
import re
import tempfile

from MaxText.aot import ptx

_THUNK = re.compile(
  r"^\s*(\d+): kCustomKernel\s+\[[^\]]*\]\s+(\S+) grid: \[(\d+), (\d+), (\d+)\] threads: \[(\d+), (\d+), (\d+)\]"
  r"\s+shared_memory: (\d+) bytes"
)
_METADATA = re.compile(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)')


@dataclasses.dataclass(frozen=True)
class Launch:
  """One kernel launch of an HLO instruction: its PTX entry, blocks, threads per block, shared memory per block."""

  kernel: str
  blocks: int
  threads_per_block: int
  shared_memory: int


@dataclasses.dataclass(frozen=True)
class Code:
  """An HLO instruction's kernel: how it is launched and what each thread executes (aot.ptx.Entry)."""

  launch: Launch
  entry: ptx.Entry


def _step_prefix(directory):
  """The dump file prefix ('module_0001.jit_step_fn') of the module with the most thunks, or None."""
  sequences = sorted(directory.glob("*.thunk_sequence.txt"), key=lambda p: -p.stat().st_size)
  return sequences[0].name[: -len(".thunk_sequence.txt")] if sequences else None


def launches(directory, prefix) -> dict:
  """{HLO instruction name: Launch} of a module's custom-kernel thunks (the first launch where one has several)."""
  metadata = (directory / f"{prefix}.thunk_metadata.txt").read_text(encoding="utf-8", errors="replace")
  names = {int(thunk): name for name, thunk in _METADATA.findall(metadata)}
  out = {}
  sequence = (directory / f"{prefix}.thunk_sequence.txt").read_text(encoding="utf-8", errors="replace")
  for line in sequence.splitlines():
    match = _THUNK.match(line)
    if not match:
      continue
    thunk, kernel, *dims, shared = match.groups()
    grid, block = [int(d) for d in dims[:3]], [int(d) for d in dims[3:]]
    name = names.get(int(thunk))
    if name and name not in out:
      out[name] = Launch(kernel, grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2], int(shared))
  return out


def entries(directory, prefix) -> dict:
  """{entry name: aot.ptx.Entry} of every PTX file of a module."""
  out = {}
  for path in sorted(directory.glob(f"{prefix}.*.ptx")):
    out.update(ptx.entries(path.read_text(encoding="utf-8", errors="replace")))
  return out


def read(directory) -> dict:
  """{HLO instruction name: Code} of the compiled step in a dump directory ({} where it holds none)."""
  directory = pathlib.Path(directory)
  prefix = _step_prefix(directory)
  if prefix is None:
    return {}
  code = entries(directory, prefix)
  return {
    name: Code(launch, code[launch.kernel])
    for name, launch in launches(directory, prefix).items()
    if launch.kernel in code
  }


def compile_reading_code(lowered, compiler_options=None):
  """(lowered.compile(...), {HLO instruction: Code}): compiled with --xla_dump_to (a temporary directory, or the one
  $XLA_FLAGS names, where the dump is then also kept), the kernels' code read back from it."""
  options = dict(compiler_options or {})
  flags = dict(f.lstrip("-").split("=", 1) for f in os.environ.get("XLA_FLAGS", "").split() if "=" in f)
  if flags.get("xla_dump_to"):
    return lowered.compile(compiler_options=options or None), read(flags["xla_dump_to"])
  with tempfile.TemporaryDirectory(prefix="xla_dump_") as directory:
    compiled = lowered.compile(compiler_options={**options, "xla_dump_to": directory})
    return compiled, read(directory)
