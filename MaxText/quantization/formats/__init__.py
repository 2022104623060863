"""Number formats: which one a recipe's operands use (`Format`, plain Python: importable without JAX), and in the
modules below the arithmetic of each: grids (element grids, exact scale math), nvfp4, four_over_six, fp8, mx, and
tensor (the one QuantizedTensor every backend reads)."""

import enum


class Format(enum.Enum):
  """The number format of a recipe's quantized GEMM operands."""

  BF16 = "bf16"  # no quantization
  NVFP4 = "nvfp4"  # E2M1 values, an E4M3 scale per 16, an f32 scale per tensor
  FP8_CURRENT = "fp8_current"  # per-tensor FP8, scale from the tensor's own amax
  FP8_DELAYED = "fp8_delayed"  # per-tensor FP8, scale from an amax history carried across steps
  MXFP8 = "mxfp8"  # E4M3 values, an E8M0 scale per 32
  MXFP4 = "mxfp4"  # E2M1 values, an E8M0 scale per 32

  @property
  def block_size(self):
    """Elements per scaling block along the contraction axis; None for per-tensor scaling and BF16."""
    return {Format.NVFP4: 16, Format.MXFP8: 32, Format.MXFP4: 32}.get(self)

  @property
  def per_tensor_fp8(self) -> bool:
    return self in (Format.FP8_CURRENT, Format.FP8_DELAYED)

  @property
  def fp4(self) -> bool:
    """E2M1 element values."""
    return self in (Format.NVFP4, Format.MXFP4)

  @property
  def label(self) -> str:
    """How logs name it: NVFP4, MXFP8, MXFP4, FP8, BF16."""
    return "FP8" if self.per_tensor_fp8 else self.value.upper()


__all__ = ["Format"]
