"""Which operand dtype the GEMMs take on a CPU (f32 or bf16): the one decision, and the helper that applies it.

Every GEMM of the model and of the quantization emulation reads operands whose values are exact in bf16 (bf16
activations and weights, FP8 values, NVFP4 / MX values with their block scales folded in) and sums in f32. Handed to
XLA:CPU as bf16 or as f32, they give the same products and f32 sums (in another order). XLA:CPU (jax 0.10-0.11) runs
both through YNNPACK, whose speed depends on the CPU: on the 2-core x86_64 box with AMX (amx_bf16), a
1024x256x768 bf16 GEMM takes 0.2-0.3x the f32 one's time; with AVX-512 and AMX hidden from the libraries (AVX2 only)
1.35-1.6x, and still 1.3-1.6x with only AMX hidden (avx512_bf16 left: likely because its dot-product instruction
does no more multiply-adds per cycle than two f32 FMAs). `benchmarks/cpu_gemm_bench.py` measures it
(benchmarks/RESULTS.md, "per CPU kind"). So:

    auto      bf16 where the CPU has bf16 matrix instructions (x86 amx_bf16, ARM's bf16), else f32: read from the
              CPU's feature flags (Linux /proc/cpuinfo; macOS sysctl), f32 where they can't be read
    float32 / bfloat16   that dtype (the cpu_gemm_dtype key; tests and debugging)

Flags rather than a timed probe: the same program on every start (the compilation cache hits, nothing to time at
start-up), and a machine that other jobs share can't flip it. The choice is read when a program is traced, and
only for its CPU lowering (`jax.lax.platform_dependent`): a GPU program is the same under every choice.
"""

import functools
import platform
import subprocess

import jax
import jax.numpy as jnp

CHOICES = ("auto", "float32", "bfloat16")
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "bf16"})  # x86 AMX; ARM FEAT_BF16 (BFDOT/BFMMLA; Linux calls it bf16)
_FLAG_FIELDS = ("flags", "features")  # /proc/cpuinfo: x86 "flags", ARM "Features"
_choice = "auto"


def flags_from_cpuinfo(text):
  """The feature flags named in a /proc/cpuinfo text (every processor's, in Linux's names)."""
  flags = set()
  for line in text.splitlines():
    field, sep, value = line.partition(":")
    if sep and field.strip().lower() in _FLAG_FIELDS:
      flags.update(value.split())
  return frozenset(flags)


@functools.cache
def cpu_flags():
  """This CPU's feature flags (Linux's names), or None where they can't be read."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      return flags_from_cpuinfo(f.read())
  except OSError:
    pass
  if platform.system() == "Darwin":  # Apple silicon: FEAT_BF16 from M2 on
    try:
      out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
      return None
    return frozenset({"bf16"}) if out.stdout.strip() == "1" else frozenset()
  return None


def auto_dtype(flags):
  """What `auto` picks for a CPU with these flags (None: unknown): bf16 where it has bf16 matrix instructions."""
  return jnp.dtype(jnp.bfloat16 if flags is not None and flags & NATIVE_BF16_FLAGS else jnp.float32)


def operand_dtype():
  """The dtype the CPU's GEMMs read their operands in: bfloat16 or float32."""
  return auto_dtype(cpu_flags()) if _choice == "auto" else jnp.dtype(_choice)


def describe():
  """One line for the logs: the choice and, for auto, why."""
  dtype = operand_dtype().name
  if _choice != "auto":
    return f"{dtype} (cpu_gemm_dtype={_choice})"
  flags = cpu_flags()
  if flags is None:
    return f"{dtype} (auto: the CPU's flags can't be read here)"
  have = sorted(flags & NATIVE_BF16_FLAGS)
  return f"{dtype} (auto: {'this CPU has ' + ', '.join(have) if have else 'no amx_bf16 or ARM bf16 on this CPU'})"


def configure(choice):
  """Set the choice for this process: auto, float32 or bfloat16. Programs traced under another operand dtype are
  dropped (jax.clear_caches), so none is reused with the old one."""
  global _choice  # pylint: disable=global-statement
  if choice not in CHOICES:
    raise ValueError(f"cpu_gemm_dtype={choice!r}: expected one of {', '.join(CHOICES)}")
  before = operand_dtype()
  _choice = choice
  if operand_dtype() != before:
    jax.clear_caches()


def _widens(from_dtype, to_dtype):
  """Whether an operand in from_dtype goes to the CPU GEMM in to_dtype: a narrower float whose values to_dtype holds
  exactly (f32 every one, bf16 the 8-bit ones; f16 stays f16 under bf16)."""
  from_dtype = jnp.dtype(from_dtype)
  if not jnp.issubdtype(from_dtype, jnp.floating) or from_dtype == to_dtype:
    return False
  return from_dtype.itemsize < (4 if to_dtype == jnp.float32 else 2)


def gemm(fn, *operands):
  """fn(*operands), a GEMM of operands whose values are exact in bf16 with f32 accumulation, on its operands in
  operand_dtype() where it is lowered for a CPU, on them as they are elsewhere (the same program as without this)."""
  dtype = operand_dtype()
  if not any(_widens(x.dtype, dtype) for x in operands):
    return fn(*operands)

  def on_cpu(*ops):
    return fn(*(x.astype(dtype) if _widens(x.dtype, dtype) else x for x in ops))

  return jax.lax.platform_dependent(*operands, cpu=on_cpu, default=fn)


def transposes_in_memory():
  """Whether a transposed GEMM operand is best stored row by row on a CPU (bf16: YNNPACK's bf16 GEMMs read neither a
  transposed layout nor a left operand contracted on its first axis, and XLA would widen them to f32); f32 GEMMs
  take the transpose folded in."""
  return operand_dtype() == jnp.bfloat16
