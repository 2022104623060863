"""QuantizedTensor: a quantized GEMM operand, the one type every quantizer returns and every backend reads."""

import dataclasses
import typing

import jax
import jax.numpy as jnp

from MaxText.quantization import cpu_gemm

E4M3_MAX = 448.0  # NVFP4's usual global-scale bound (TE's nvfp4_e4m3_max)


@dataclasses.dataclass(frozen=True)
class QuantizedTensor:
  """A quantized operand [rows, contraction], scaling blocks along the contraction axis.

  values        the elements. Narrow: on the format's grid in its own dtype (E2M1, E4M3, E5M2), with their block
                scales in `scales` (what Transformer Engine and XLA's block-scaled dot read). Folded (`scales`
                None): the values already multiplied by their block scales, in bf16 (exact: at most 6 significant
                bits), or per-tensor FP8 values in f8 (what a tensor-core GEMM reads in the emulated backend).
  scales        block decode scales [rows, ceil(cols / block)]: E4M3 (NVFP4) or f32 powers of two (MX); None when
                folded or per tensor.
  global_scale  f32 scalar for the GEMM's epilogue: NVFP4 the tensor's amax (its global scale is
                S_enc = 6 * e4m3_max / amax); per-tensor FP8 its decode scale 1/scale; 1 for MX and BF16.
  e4m3_max      NVFP4: the E4M3 bound its global scale maps amax to (448; 256 under Four Over Six).
  tile          the scaling block (rows, cols): (1, 16) or (16, 16) NVFP4, (1, 32) MX; None per tensor or BF16.
                Static: not an array.
  """

  values: jax.Array
  scales: typing.Optional[jax.Array]
  global_scale: jax.Array
  e4m3_max: jax.Array = E4M3_MAX
  tile: typing.Optional[tuple] = None

  @property
  def T(self):  # pylint: disable=invalid-name
    """The transposed operand, where it has the same numbers: per-tensor scaling, or NVFP4 16x16 tiles (each tile's
    scale moves with it)."""
    if self.tile not in (None, (16, 16)):
      raise ValueError(
        f"a tensor quantized in {self.tile} blocks has no transposed view with the same numbers; "
        "quantize the transposed operand instead"
      )
    if cpu_gemm.transposes_in_memory():
      values_t = jax.lax.platform_dependent(self.values, cpu=_transpose_in_memory, default=jnp.transpose)
    else:
      values_t = jnp.transpose(self.values)
    if self.scales is None:
      return dataclasses.replace(self, values=values_t)
    cols = self.values.shape[1]
    tile_scales = self.scales[::16]  # [rows / 16, cols / 16]: every row of a tile repeats the tile's scale
    return dataclasses.replace(self, values=values_t, scales=jnp.repeat(tile_scales.T, 16, axis=0)[:cols])


def _transpose_in_memory(values):
  """values.T as an array of its own, rows contiguous: what XLA:CPU's bf16 GEMMs (YNNPACK) read, where the CPU's
  GEMMs take bf16 (cpu_gemm.transposes_in_memory; f32 GEMMs run faster on the transpose folded in). A plain transpose
  reaches XLA as a transposed layout, or is folded into the dot as a left operand contracted on its first axis:
  XLA:CPU then runs the GEMM on operands widened to f32, two to three times slower. Through a unit axis and a reshape
  (the same elements), behind a barrier XLA doesn't fold through, the transpose is a copy instead."""
  rows, cols = values.shape
  (values_t,) = jax.lax.optimization_barrier((jnp.transpose(values[:, :, None], (1, 0, 2)).reshape(cols, rows),))
  return values_t


jax.tree_util.register_dataclass(
  QuantizedTensor, data_fields=["values", "scales", "global_scale", "e4m3_max"], meta_fields=["tile"]
)
