"""cpu_gemm: auto's choice from real CPUs' flags, the dtype each lowering's GEMMs read under both choices, and the same
numbers from quantized matmuls under both."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from MaxText.quantization import cpu_gemm, get_recipe, qmatmul
from MaxText.quantization.backends import emulated
from MaxText.quantization.formats.tensor import QuantizedTensor

# /proc/cpuinfo flag lines of real CPUs (abridged to the vector and matrix extensions, as the kernel prints them).
HASWELL_OR_ZEN2 = "flags\t\t: fpu vme sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2"
CASCADE_LAKE = HASWELL_OR_ZEN2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
ZEN4 = CASCADE_LAKE + " avx512_bf16 avx512vbmi avx512_vbmi2 gfni vaes"
SAPPHIRE_RAPIDS = ZEN4 + " avx512_fp16 amx_bf16 amx_tile amx_int8"
GRAVITON2 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop"
GRAVITON3 = GRAVITON2 + " sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs dcpodp sve2 i8mm bf16"


@pytest.fixture
def choose(cpu_gemm_choice):
  return cpu_gemm_choice


@pytest.mark.parametrize(
  "cpuinfo, dtype",
  [
    (HASWELL_OR_ZEN2, jnp.float32),
    (CASCADE_LAKE, jnp.float32),
    (ZEN4, jnp.float32),  # avx512_bf16 alone: XLA:CPU's bf16 GEMMs no faster than its f32 ones
    (SAPPHIRE_RAPIDS, jnp.bfloat16),
    (GRAVITON2, jnp.float32),
    (GRAVITON3, jnp.bfloat16),
  ],
)
def test_auto_picks_bf16_only_where_the_cpu_has_bf16_matrix_instructions(cpuinfo, dtype):
  text = f"processor\t: 0\n{cpuinfo}\n\nprocessor\t: 1\n{cpuinfo}\n"
  assert cpu_gemm.auto_dtype(cpu_gemm.flags_from_cpuinfo(text)) == dtype


def test_flags_are_read_from_both_field_names_and_unreadable_flags_mean_f32():
  assert "avx2" in cpu_gemm.flags_from_cpuinfo(HASWELL_OR_ZEN2)
  assert {"asimd", "bf16"} <= cpu_gemm.flags_from_cpuinfo(GRAVITON3)
  assert cpu_gemm.flags_from_cpuinfo("model name\t: flags: amx_bf16 in a name\n") == frozenset()
  assert cpu_gemm.auto_dtype(None) == jnp.float32


def test_forced_choice_and_its_description(choose):
  for choice in ("float32", "bfloat16"):
    choose(choice)
    assert cpu_gemm.operand_dtype() == jnp.dtype(choice)
    assert cpu_gemm.describe() == f"{choice} (cpu_gemm_dtype={choice})"
  choose("auto")
  assert cpu_gemm.operand_dtype() == cpu_gemm.auto_dtype(cpu_gemm.cpu_flags())
  assert cpu_gemm.describe().startswith(f"{cpu_gemm.operand_dtype().name} (auto: ")
  with pytest.raises(ValueError, match="cpu_gemm_dtype='f16'"):
    choose("f16")


def _dot_operand_dtypes(fn, args, platform):
  """{(lhs dtype, rhs dtype)} of the dots in fn's StableHLO lowered for `platform`."""
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
  return set(re.findall(r"stablehlo\.dot_general .*?:\s*\(tensor<[\dx]*x(\w+)>, tensor<[\dx]*x(\w+)>\)", text))


def _dot_f32(a, b):
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


@pytest.mark.parametrize(
  "operand, own, on_cpu",
  [
    # (operand dtype, its MLIR name, {choice: the dtype a CPU's GEMM reads it in})
    (jnp.float8_e4m3fn, "f8E4M3FN", {"float32": "f32", "bfloat16": "bf16"}),
    (jnp.bfloat16, "bf16", {"float32": "f32", "bfloat16": "bf16"}),
    (jnp.float16, "f16", {"float32": "f32", "bfloat16": "f16"}),  # f16 values aren't all bf16 values
    (jnp.float32, "f32", {"float32": "f32", "bfloat16": "f32"}),
  ],
)
def test_cpu_lowering_reads_the_chosen_dtype_and_others_the_operands_own(choose, operand, own, on_cpu):
  args = [jnp.ones((32, 64), operand), jnp.ones((16, 64), operand)]
  for choice, dtype in on_cpu.items():
    choose(choice)
    assert _dot_operand_dtypes(lambda a, b: cpu_gemm.gemm(_dot_f32, a, b), args, "cpu") == {(dtype, dtype)}
    assert _dot_operand_dtypes(lambda a, b: cpu_gemm.gemm(_dot_f32, a, b), args, "cuda") == {(own, own)}


def test_a_new_choice_drops_programs_traced_under_the_old_one(choose):
  f = jax.jit(lambda a, b: cpu_gemm.gemm(_dot_f32, a, b))
  a = jnp.ones((32, 64), jnp.bfloat16)
  choose("bfloat16")
  assert "tensor<32x64xbf16>, tensor<32x64xbf16>" in f.lower(a, a).as_text()
  choose("float32")
  assert "tensor<32x64xf32>, tensor<32x64xf32>" in f.lower(a, a).as_text()


def _integer_valued(key, shape, top):
  """Random integers in [-top, top] as f32: every product and partial sum of a small GEMM is exact in f32."""
  return jax.random.randint(key, shape, -top, top + 1).astype(jnp.float32)


def _matmul_and_grads(recipe_name, x, w, dy, dtype):
  recipe = get_recipe(recipe_name)
  y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=jax.random.key(7)), x.astype(dtype), w)
  return (y, *vjp(dy.astype(dtype)))


@pytest.mark.parametrize("recipe", ["", "te_fp8_currentscaling"])
def test_exact_sums_give_the_same_bits_under_both_choices(choose, recipe):
  """Integer-valued operands (7 * 64 = 448 and its multiples are E4M3 values, so FP8's per-tensor scale 64 keeps
  them exact): every sum is exact in f32, whatever its order, so both choices agree to the bit, forward and backward."""
  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x, w, dy = _integer_valued(kx, (64, 32), 7), _integer_valued(kw, (32, 48), 7), _integer_valued(kd, (64, 48), 1)
  x = x.at[0, 0].set(7.0)
  w = w.at[0, 0].set(7.0)
  outs = {}
  for choice in ("bfloat16", "float32"):
    choose(choice)
    outs[choice] = _matmul_and_grads(recipe, x, w, dy, jnp.bfloat16)
  for name, a, b in zip(("y", "dx", "dw"), outs["bfloat16"], outs["float32"]):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=name)
  if not recipe:  # and they are the exact product, rounded to bf16
    np.testing.assert_array_equal(np.asarray(outs["float32"][0]), np.asarray((x @ w).astype(jnp.bfloat16)))


@pytest.mark.parametrize(
  "recipe",
  [
    "",
    "te_fp8_currentscaling",
    pytest.param("te_nvfp4", marks=pytest.mark.slow),
    pytest.param("te_mxfp8", marks=pytest.mark.slow),
  ],
)
def test_both_choices_give_the_same_numbers_up_to_the_f32_sums_order(choose, recipe):
  """Random operands: the same quantized values reach both GEMMs, so results differ only where the f32 sums' order
  moves a bf16-rounded output across a rounding boundary: by at most one bf16 step, in a few elements (1 in 10^4
  measured)."""
  kx, kw, kd = jax.random.split(jax.random.key(1), 3)
  x, w, dy = jax.random.normal(kx, (128, 256)), jax.random.normal(kw, (256, 96)), jax.random.normal(kd, (128, 96))
  outs = {}
  for choice in ("bfloat16", "float32"):
    choose(choice)
    outs[choice] = _matmul_and_grads(recipe, x, w, dy, jnp.bfloat16)
  for name, a, b in zip(("y", "dx", "dw"), outs["bfloat16"], outs["float32"]):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    step = np.abs(a).astype(ml_dtypes.bfloat16).astype(np.float32) * 2.0**-7  # one bf16 step at a's magnitude
    assert np.all(np.abs(a - b) <= step), name
    assert np.mean(a == b) > 0.999, (name, np.mean(a == b))


def test_emulated_fp8_gemm_reads_f8_on_a_gpu_and_the_chosen_dtype_on_a_cpu(choose):
  recipe = get_recipe("te_fp8_currentscaling")
  x, w = jnp.ones((32, 64), jnp.bfloat16), jnp.ones((64, 16), jnp.bfloat16)

  def fprop(x, w):
    x_op = emulated.quantize_for_gemm(x, recipe, "x", kernels=emulated.Kernels.XLA)
    w_op = emulated.quantize_for_gemm(w, recipe, "w", kernels=emulated.Kernels.XLA, transpose=True)
    return emulated.gemm(x_op, w_op, recipe)

  for choice, dtype in (("bfloat16", "bf16"), ("float32", "f32")):
    choose(choice)
    assert _dot_operand_dtypes(fprop, (x, w), "cpu") == {(dtype, dtype)}
    assert _dot_operand_dtypes(fprop, (x, w), "cuda") == {("f8E4M3FN", "f8E4M3FN")}


def test_transposed_operands_are_copied_row_by_row_only_for_bf16_gemms(choose):
  values = jnp.arange(32 * 64, dtype=jnp.float32).reshape(32, 64).astype(jnp.float8_e5m2)

  def transposed(v):
    return QuantizedTensor(v, None, jnp.float32(1)).T.values

  for choice, copies in (("bfloat16", 1), ("float32", 0)):
    choose(choice)
    assert jax.jit(transposed).lower(values).as_text().count("stablehlo.optimization_barrier") == copies, choice
    np.testing.assert_array_equal(np.asarray(jax.jit(transposed)(values)), np.asarray(values).T)
