"""The NVFP4 quantizer kernels compiled for Blackwell and Hopper (compile-only devices, PTX read from XLA's dump):
on sm_100a / sm_103a they convert with the hardware FP4 instructions, on sm_90a without them, and their
thread-instructions per element stay within what a B200 streams at its bandwidth."""

import glob
import re

import jax
import jax.numpy as jnp
import pytest

from MaxText.aot import devices, targets
from MaxText.quantization import target as quant_target
from MaxText.quantization.kernels import pallas_quantize

ROWS, COLS = 1024, 2048  # whole 8192-element programs: 64 elements per thread at 4 warps
ELEMENTS_PER_THREAD = 64
VARIANTS = {  # kernel name: (nvfp4_narrow options, transposed read)
  "quantize_nvfp4_narrow": {},
  "quantize_nvfp4_sr_narrow": {"stochastic_rounding": True},
  "quantize_nvfp4_rht_narrow": {"rht": True, "transpose": True},
  "quantize_nvfp4_rht_sr_narrow": {"rht": True, "stochastic_rounding": True, "transpose": True},
}
# PTX statements per element on sm_100a (ptxas' input, one per statement, the inline PTX's register moves included),
# with ~10% slack over what the kernels compile to: a change that puts per-element work back shows here.
SM100_BUDGET = {
  "quantize_nvfp4_narrow": 10.3,
  "quantize_nvfp4_sr_narrow": 12.8,
  "quantize_nvfp4_rht_narrow": 21.0,
  "quantize_nvfp4_rht_sr_narrow": 23.0,
  "quantize_amax_rht": 13.0,
}


def entries(ptx_text):
  """{entry name: [instruction mnemonics]} of a PTX module (inline asm blocks included, directives not)."""
  starts = list(re.finditer(r"\.entry (\w+)\(", ptx_text))
  out = {}
  for k, m in enumerate(starts):
    body = ptx_text[m.end() : starts[k + 1].start() if k + 1 < len(starts) else len(ptx_text)]
    body = body[body.index("{") :]
    ops = []
    for statement in (s.strip() for line in body.splitlines() for s in line.split(";")):
      if not statement or statement.startswith(("//", ".", "{", "}", ")", "$L")) or statement.endswith(":"):
        continue
      statement = statement.split(None, 1)[1] if statement.startswith("@") else statement
      ops.append(statement.split()[0])
    out[m.group(1)] = ops
  return out


def compiled_kernels(gpu_name, tmp_path, names=tuple(VARIANTS)):
  """{kernel name: mnemonics} of the NVFP4 narrow variants `names` (and their amax passes) compiled for `gpu_name`."""
  gpu = targets.GPUS[gpu_name]
  device = devices.compile_only_devices(gpu.target_config(), "1x1x1")[0]
  x = jax.ShapeDtypeStruct((ROWS, COLS), jnp.bfloat16)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)
  found = {}
  for i, options in enumerate(VARIANTS[n] for n in names):
    dump = tmp_path / f"{gpu_name}_{i}"
    fn = lambda x, k, o=options: pallas_quantize.nvfp4_narrow(x, key=k if o.get("stochastic_rounding") else None, **o)
    with quant_target.compiling_for(gpu.sm, 1), jax.default_device(device):
      # at XLA's backend optimization as the trainer compiles (the suite's conftest lowers it for speed): the PTX a
      # run gets
      options = {"xla_dump_to": str(dump), "xla_backend_optimization_level": 2}
      jax.jit(fn).lower(x, key).compile(compiler_options=options)
    for path in glob.glob(str(dump / "*.ptx")):
      found.update({k: v for k, v in entries(open(path).read()).items() if k.startswith("quantize_")})
  return found


@pytest.mark.parametrize("gpu_name", ["b200", "gb300"])
def test_blackwell_kernels_convert_with_the_fp4_instructions(gpu_name, tmp_path):
  names = tuple(VARIANTS) if gpu_name == "b200" else ("quantize_nvfp4_sr_narrow",)  # sm_103a: the cvt.rs form
  kernels = compiled_kernels(gpu_name, tmp_path, names)
  assert set(names) <= set(kernels)
  for name in names:
    ops = kernels[name]
    rn, rs = ops.count("cvt.rn.satfinite.e2m1x2.f32"), ops.count("cvt.rs.satfinite.e2m1x4.f32")
    if "_sr" in name:  # two per 8 elements, 4 per block, 64 elements a thread
      assert (rn, rs) == (0, ELEMENTS_PER_THREAD // 4)
    else:
      assert (rn, rs) == (ELEMENTS_PER_THREAD // 2, 0)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ops and "rcp.rn.f32" in ops  # the block scales, once per block
  if gpu_name == "b200":
    for name, budget in SM100_BUDGET.items():
      assert len(kernels[name]) / ELEMENTS_PER_THREAD <= budget, (name, len(kernels[name]) / ELEMENTS_PER_THREAD)


def test_hopper_kernels_compile_without_them(tmp_path):
  names = ("quantize_nvfp4_narrow", "quantize_nvfp4_sr_narrow")  # the twins in Triton arithmetic (slow to compile)
  kernels = compiled_kernels("h100", tmp_path, names)
  assert set(names) <= set(kernels)
  for name in names:
    assert not any(op.startswith(("cvt.rn.satfinite.e2m1", "cvt.rs.")) for op in kernels[name])
    assert "cvt.rn.satfinite.e4m3x2.f32" in kernels[name]
