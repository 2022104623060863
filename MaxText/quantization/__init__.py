"""Low-precision numerics (NVFP4, FP8, MX) as a library: recipes, number formats, quantizer kernels, backends and the
quantized matmul. Nothing here imports the rest of MaxText; the trainer imports this.

    recipes.py   what each recipe quantizes and how (plain Python: importable without JAX)
    formats/     element grids and scale math, NVFP4 (and Four Over Six), FP8, MX, the QuantizedTensor
    kernels/     Pallas (Triton) quantizer kernels, same bits as the XLA path
    backends/    who runs a quantized GEMM: emulated (pure JAX), xla (block-scaled dot), te (Transformer Engine)
    qdot.py      qmatmul / qdense: the quantized matmul with the recipe's forward and backward GEMMs
    delayed.py   FP8 delayed scaling (the amax history), dots.py (bf16 contractions), stats.py (telemetry)
    cpu_gemm.py  which operand dtype (f32 or bf16) the GEMMs take on a CPU: what that CPU multiplies fastest

The names below load their modules on first use, so `import MaxText.quantization.recipes` needs no JAX.
"""

import importlib

_LAZY = {
  "delayed": ("MaxText.quantization.delayed", None),
  "qdense": ("MaxText.quantization.qdot", "qdense"),
  "qmatmul": ("MaxText.quantization.qdot", "qmatmul"),
  "RECIPES": ("MaxText.quantization.recipes", "RECIPES"),
  "Recipe": ("MaxText.quantization.recipes", "Recipe"),
  "get_recipe": ("MaxText.quantization.recipes", "get_recipe"),
  "recipe_names": ("MaxText.quantization.recipes", "recipe_names"),
  "Format": ("MaxText.quantization.formats", "Format"),
  "QuantizedTensor": ("MaxText.quantization.formats.tensor", "QuantizedTensor"),
}
__all__ = [
  "Format",
  "QuantizedTensor",
  "RECIPES",
  "Recipe",
  "delayed",
  "get_recipe",
  "qdense",
  "qmatmul",
  "recipe_names",
]


def __getattr__(name):
  if name not in _LAZY:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  module, attribute = _LAZY[name]
  value = importlib.import_module(module)
  return value if attribute is None else getattr(value, attribute)
