"""benchmarks/isa_cap.py: under each cap, CPUID (as numpy detects features) and /proc/cpuinfo agree on what is hidden,
cpu_gemm's auto sees the capped CPU, and a program's own SIGSEGV handler still runs."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import isa_cap

pytestmark = pytest.mark.skipif(isa_cap.unavailable_reason() is not None, reason=str(isa_cap.unavailable_reason()))

PROBE = """
import json
from numpy._core._multiarray_umath import __cpu_features__ as cpuid
from MaxText.quantization import cpu_gemm
flags = cpu_gemm.cpu_flags()
print(json.dumps({"cpuid": {k: bool(v) for k, v in cpuid.items()}, "flags": sorted(flags),
                  "auto": cpu_gemm.operand_dtype().name}))
"""
# What each cap hides (if this CPU has it), in numpy's CPUID names and in /proc/cpuinfo's.
HIDDEN = {
  "avx2": ({"AVX512F", "AVX512BW", "AVX512_SPR", "AVX512BF16"}, {"avx512f", "avx512bw", "avx512_bf16", "amx_bf16"}),
  "avx512": ({"AVX512BF16", "AVX512FP16", "AVX512_SPR"}, {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}),
  "avx512_bf16": (set(), {"amx_bf16", "amx_tile", "amx_int8"}),
}


def _probe(env):
  done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
  return json.loads(done.stdout)


@pytest.fixture(scope="module")
def native():
  return _probe(None)


@pytest.mark.parametrize("level", isa_cap.LEVELS)
def test_a_cap_hides_the_same_instructions_from_cpuid_and_cpuinfo(native, level):
  capped = _probe({**os.environ, **isa_cap.env(level)})
  cpuid_hidden, flags_hidden = HIDDEN[level]
  assert not cpuid_hidden & {k for k, v in capped["cpuid"].items() if v}
  assert not flags_hidden & set(capped["flags"])
  assert capped["cpuid"]["AVX2"] == native["cpuid"]["AVX2"] and ("avx2" in capped["flags"]) == (
    "avx2" in native["flags"]
  )
  assert set(capped["flags"]) <= set(native["flags"])  # hides, never adds
  assert capped["auto"] == "float32"  # no amx_bf16 left to pick bf16 for


def test_the_programs_own_sigsegv_handler_still_runs():
  crash = "import faulthandler, ctypes; faulthandler.enable(); ctypes.string_at(0)"
  done = subprocess.run([sys.executable, "-c", crash], env={**os.environ, **isa_cap.env("avx2")}, capture_output=True)
  assert done.returncode == -11 and b"Segmentation fault" in done.stderr


def test_an_unknown_level_is_refused():
  with pytest.raises(isa_cap.IsaCapError, match="use one of avx2, avx512, avx512_bf16"):
    isa_cap.env("sse2")


def test_a_cap_inside_a_capped_run_keeps_the_outer_cap(monkeypatch):
  monkeypatch.setenv("ISA_CAP", "avx2")
  assert isa_cap.env("avx512_bf16")["ISA_CAP"] == "avx2"
  monkeypatch.setenv("ISA_CAP", "avx512_bf16")
  assert isa_cap.env("avx2")["ISA_CAP"] == "avx2"
