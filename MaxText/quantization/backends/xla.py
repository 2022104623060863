"""XLA backend: each quantized GEMM as JAX's block-scaled dot (`jax.nn.scaled_matmul`, custom call
`__op$block_scaled_dot`) on operands from our own NVFP4 / MX quantizers.

The operands are exactly the emulated backend's (16x16 weight tiles, RHT on the wgrad operands, SR
on the gradients, the per-tensor amax as the global scale); only the GEMM differs: XLA turns the
custom call into a cuDNN block-scaled FP4 GEMM on Blackwell (SM100+, cuDNN >= 9.7) and expands it
into dequantize + dot elsewhere on NVIDIA GPUs. E2M1 x E4M3 products are exact in f32 and TF32, so
the result equals the emulated backend's up to the order of the f32 accumulation. JAX has no CPU
lowering of the custom call: on CPU this backend can be lowered for CUDA (jax.export), not run.

Where the Pallas kernels run (`quantization_kernels`, quantizer_impl: auto = one NVIDIA GPU) the NVFP4 operands come
from them, narrow (pallas_quantize.nvfp4_narrow: the XLA path's bits, packed E2M1 and E4M3 codes written once by one
kernel after the amax pass) instead of from the XLA path's five to eight fusions per operand; MX operands always
take the XLA path. The dot emits the caller's compute dtype (bf16 in training: half the bytes of f32), and the
global scales multiply that (in f32, rounded once more to the compute dtype): XLA's cuDNN block-scaled dot takes no
epilogue scale, so a bf16 result is rounded twice, once in the dot and once after the scale. That differs from the
emulated backend's single rounding of acc * alpha by at most one bf16 unit in the last place (2**-8 relative),
against NVFP4's own error of ~2**-3 per element. An f32 compute dtype keeps f32 outputs and the single rounding.
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import target
from MaxText.quantization.backends import emulated
from MaxText.quantization.backends.base import Backend
from MaxText.quantization.formats import Format, grids, mx, nvfp4, sr_bits
from MaxText.quantization.formats.tensor import QuantizedTensor
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import RECIPES, Recipe

NATIVE_MIN_SM = 100  # cuDNN's block-scaled FP4 GEMM: Blackwell


def unavailable_reason(recipe: Recipe, platform=None):
  """None when this backend can run `recipe` here, else why not (one line)."""
  if recipe.block_size is None:
    names = ", ".join(n for n, r in RECIPES.items() if r.block_size)
    return f"{recipe.name}: the xla backend runs the block-scaled recipes ({names}) only"
  platform = platform or target.platform()
  if platform not in ("gpu", "cuda"):
    return f"jax.nn.scaled_matmul (__op$block_scaled_dot) runs on NVIDIA GPUs only, not on {platform}"
  return None


def native(recipe: Recipe):
  """Whether the block-scaled dot becomes a real FP4 GEMM here (what `auto` needs to prefer it)."""
  from MaxText.quantization.backends import te  # pylint: disable=import-outside-toplevel

  sm = te.gpu_compute_capability()
  return unavailable_reason(recipe) is None and sm is not None and sm >= NATIVE_MIN_SM


@functools.partial(jax.jit, static_argnums=(1, 2), static_argnames=("amax_axes",))
def quantize_for_gemm(x, recipe: Recipe, role: str, key=None, amax_axes=(), draws=None) -> QuantizedTensor:
  """Our quantization of one operand [rows, contraction], narrow: NVFP4 (E2M1, E4M3 per 16, amax) or MX (E4M3 /
  E2M1, E8M0 per 32: the power of two itself, exact in float8_e8m0fnu). `amax_axes`, `draws`: x is a shard of the
  operand inside a partitioned GEMM (nvfp4.quantize)."""
  if recipe.format is Format.NVFP4:
    return nvfp4.quantize(x, **emulated.nvfp4_options(recipe, role, key), amax_axes=amax_axes, draws=draws)
  q = mx.quantize(x, emulated.element_grid(recipe, role))
  return QuantizedTensor(q.values, q.scales.astype(jnp.float8_e8m0fnu), q.global_scale, tile=q.tile)


def _quantize_with_kernels(x, recipe: Recipe, role: str, key, transpose, interpret, amax_axes, draws):
  """An NVFP4 operand from the Pallas kernels, narrow (same bits as quantize_for_gemm), or None where they don't cover
  it (MX, a shard's draws given as values rather than where it lies: the XLA path then)."""
  if recipe.format is not Format.NVFP4 or not (draws is None or isinstance(draws, sr_bits.ShardIndex)):
    return None
  # Imported here: Pallas takes ~0.7 s to import, and only the kernel path needs it.
  from MaxText.quantization.kernels import pallas_quantize  # pylint: disable=import-outside-toplevel

  options = emulated.nvfp4_options(recipe, role, key)
  shape = x.shape[::-1] if transpose else x.shape
  if not pallas_quantize.nvfp4_supported(
    shape, tile=options["tile"], stochastic_rounding=options["stochastic_rounding"], key=key
  ):
    return None
  # The plain amax (no RHT) without a pass of its own over x (_plain_amax), the same number as the amax pass; a
  # shard's (partition.py) is then the largest over `amax_axes`, in nvfp4_narrow, as the pass's would be.
  amax = None if options["rht"] else _plain_amax(x, recipe, role, transpose, interpret)
  values, scales, amax = pallas_quantize.nvfp4_narrow(
    x, **options, transpose=transpose, interpret=interpret, amax=amax, amax_axes=amax_axes, draws=draws
  )
  e4m3_max = jnp.float32(nvfp4.global_e4m3_max(options["four_over_six"]))
  return QuantizedTensor(values, scales, amax, e4m3_max, tile=options["tile"])


# Roles whose operand's other role (which reads it transposed) may be quantized with the RHT.
_RHT_PARTNERS = {"dy": "dy_t", "x": "x_t"}


def _plain_amax(x, recipe: Recipe, role, transpose, interpret):
  """max |x| (f32) for a role without the RHT. Where the operand's other role is quantized with the RHT (x_t, dy_t):
  the RHT amax pass's second output, that role's pass on the same array, which XLA runs once where both roles are in
  one computation (dy and dy_t; x and x_t where the backward recomputes the forward); a forward's x reads x once more,
  which the gb200-8 estimate prices below the reduction XLA otherwise fuses into x's producer. Else that reduction."""
  partner = _RHT_PARTNERS.get(role)
  # The partner's RHT runs along x's axis 0 (its contraction): whole blocks there, or the partner has no kernel pass.
  if partner and not transpose and recipe.rht(partner) and x.shape[0] % nvfp4.BLOCK == 0:
    from MaxText.quantization.kernels import pallas_quantize  # pylint: disable=import-outside-toplevel

    return pallas_quantize.nvfp4_rht_pass_amax(x, transpose=True, interpret=interpret)
  return grids.abs_max(x.astype(jnp.float32))


@functools.partial(jax.jit, static_argnums=(1, 2), static_argnames=("kernels", "transpose", "amax_axes"))
def quantize_operand(
  x, recipe: Recipe, role: str, key=None, *, kernels=Kernels.AUTO, transpose=False, amax_axes=(), draws=None
):
  """quantize_for_gemm of x (x.T if `transpose`), by the Pallas kernels where `kernels` resolves to them and they
  cover the operand (reading x as it is stored), else by the XLA path. `amax_axes`, `draws`: x is a shard of the
  operand inside a partitioned GEMM (nvfp4.quantize; `draws` are the operand's, transposed or not)."""
  impl = quantizer_impl.resolve(kernels)
  if impl is not Kernels.XLA:
    interpret = impl is Kernels.INTERPRET
    op = _quantize_with_kernels(x, recipe, role, key, transpose, interpret, amax_axes, draws)
    if op is not None:
      return op
  return quantize_for_gemm(x.T if transpose else x, recipe, role, key, amax_axes=amax_axes, draws=draws)


def gemm(a: QuantizedTensor, b_t: QuantizedTensor, recipe: Recipe, out_dtype=jnp.float32):
  """a [M, K] . b_t [N, K]^T through the block-scaled dot, emitted in `out_dtype`; NVFP4's global scales multiply it
  in f32 (XLA fuses that into the consumer), rounded to `out_dtype` (see the module doc)."""
  acc = jax.nn.scaled_matmul(
    a.values[None], b_t.values[None], a.scales[None], b_t.scales[None], preferred_element_type=out_dtype
  )[0]
  if recipe.format is not Format.NVFP4:
    return acc
  alpha = nvfp4.gemm_alpha(a.global_scale, b_t.global_scale, a.e4m3_max, b_t.e4m3_max)
  return (acc.astype(jnp.float32) * alpha).astype(out_dtype)


class XlaBackend(Backend):
  """Our operands through XLA's block-scaled dot (a native FP4 GEMM on SM100+); NVIDIA GPUs, block-scaled recipes."""

  name = "xla"

  def unavailable_reason(self, recipe: Recipe):
    return unavailable_reason(recipe)

  def quantize(self, x, recipe: Recipe, role: str, key=None, *, kernels, transpose=False, amax_axes=(), draws=None):
    return quantize_operand(
      x, recipe, role, key, kernels=kernels, transpose=transpose, amax_axes=tuple(amax_axes), draws=draws
    )

  def gemm(self, a, b_t, recipe: Recipe, out_dtype=jnp.float32):
    return gemm(a, b_t, recipe, out_dtype)

  def dequantize(self, q, recipe: Recipe, dtype):
    """NVFP4: values * block scale * 1/S_enc rounded to `dtype`, as the emulated backend's."""
    return emulated.dequantize(q, recipe, dtype)

  def quantizers(self, kernels, recipe=None):
    """The NVFP4 quantizers' implementation (MX operands always take the XLA path)."""
    if recipe is not None and recipe.format is not Format.NVFP4:
      return Kernels.XLA.value
    return quantizer_impl.resolve(kernels).value


BACKEND = XlaBackend()
