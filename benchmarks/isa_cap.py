"""Run a program as if its x86 CPU lacked newer instructions: an LD_PRELOAD library (isa_cap.c) hides them from CPUID
and from /proc/cpuinfo's flags, so XLA:CPU, YNNPACK, oneDNN, numpy and our cpu_gemm pick the kernels they would pick
on that CPU kind.

    python benchmarks/isa_cap.py avx2 -- python benchmarks/cpu_gemm_bench.py
    python benchmarks/vs_maxtext.py --isa-cap avx2 ...        (both trainers under the cap)

Levels: avx2 (no AVX-512, no AMX: Haswell to Comet Lake, Zen 1-3), avx512 (AVX-512 without its bf16/fp16 and
AMX: Skylake-SP to Ice Lake), avx512_bf16 (no AMX: Cooper Lake, Zen 4). The program still runs on this machine's
cores, caches and clocks (and glibc's string functions keep the versions it chose before the library loaded): a capped
figure is the libraries' choice for that CPU kind on this silicon, an emulation of the choice, not a measurement of a
machine of that kind. Needs Linux on x86_64 with CPUID faulting (flag
cpuid_fault, which KVM guests have too) and a C compiler (cc). XLA's own --xla_cpu_max_isa caps only its JIT; the
GEMM libraries read CPUID themselves (measured: a bf16 GEMM as fast under --xla_cpu_max_isa=AVX2 as without it).
"""

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

SOURCE = pathlib.Path(__file__).with_name("isa_cap.c")
LEVELS = ("avx2", "avx512", "avx512_bf16")


class IsaCapError(RuntimeError):
  """The cap can't be applied here (no cc, no CPUID faulting, not x86_64 Linux)."""


def unavailable_reason():
  """None where the cap works on this machine, else why not (one line)."""
  if sys.platform != "linux" or os.uname().machine != "x86_64":
    return f"isa_cap needs Linux on x86_64 (this is {sys.platform} on {os.uname().machine})"
  try:
    flags = pathlib.Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
  except OSError as e:
    return f"isa_cap can't read /proc/cpuinfo ({e.strerror})"
  if " cpuid_fault" not in flags:
    return "isa_cap needs CPUID faulting (x86 flag cpuid_fault), which this CPU or kernel doesn't offer"
  if shutil.which("cc") is None:
    return "isa_cap needs a C compiler (cc) to build its preload library"
  return None


def library():
  """The preload library, built from isa_cap.c on first use (cached by the source's hash)."""
  reason = unavailable_reason()
  if reason:
    raise IsaCapError(reason)
  digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
  cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "maxtext_nvfp4"
  built = cache / f"isa_cap-{digest}.so"
  if built.exists():
    return built
  cache.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache) as tmp:
    out = pathlib.Path(tmp) / built.name
    cmd = ["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE), "-ldl"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
      raise IsaCapError(f"building {SOURCE.name} failed: {done.stderr.strip().splitlines()[-1:]}")
    out.replace(built)  # atomic: a parallel build's result is as good
  return built


def env(level):
  """The environment variables that run a child process under the cap `level`, or under this process's own cap
  where that one hides more (a cap inside a capped run never shows what the outer one hid)."""
  if level not in LEVELS:
    raise IsaCapError(f"ISA cap {level!r}: use one of {', '.join(LEVELS)}")
  outer = os.environ.get("ISA_CAP")
  if outer in LEVELS:
    level = min(level, outer, key=LEVELS.index)
  preload = " ".join(p for p in (str(library()), os.environ.get("LD_PRELOAD", "")) if p)
  return {"LD_PRELOAD": preload, "ISA_CAP": level}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) < 3 or argv[0] not in LEVELS or argv[1] != "--":
    print(f"usage: python benchmarks/isa_cap.py {{{','.join(LEVELS)}}} -- COMMAND [ARGS...]", file=sys.stderr)
    return 2
  try:
    extra = env(argv[0])
  except IsaCapError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  os.execvpe(argv[2], argv[2:], {**os.environ, **extra})
  return 0  # not reached


if __name__ == "__main__":
  sys.exit(main())
