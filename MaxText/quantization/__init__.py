"""Low-precision numerics (NVFP4, FP8, MX) as a library: recipes, number formats, quantizer kernels, backends and the
one quantized Dense. Nothing here imports the rest of MaxText; the trainer imports this.

    qdot.py      qdense: y = x . w per a recipe over N-D operands on any mesh (one device the trivial one), the
                 backend resolved once; partitioning, delayed scaling's history and telemetry are options of the call
    gemms.py     the forward, dgrad and wgrad GEMMs written once: each GEMM's operand roles, what the forward keeps
                 and the SR keys (derive), one device's block of them (forward, backward), the one-device custom_vjp
    partition.py the same GEMMs per device under shard_map, each device quantizing its own shards
    backends/    who runs a quantized GEMM: a Backend supplies quantize and gemm (emulated: pure JAX; xla: block-scaled
                 dot), or a dense of its own (te: Transformer Engine's; bf16: the plain dot); resolve, register
    recipes.py   what each recipe quantizes and how (plain Python: importable without JAX); registry.py the backends'
                 names (plain Python)
    formats/     element grids and scale math, NVFP4 (and Four Over Six), FP8, MX, the QuantizedTensor
    kernels/     Pallas (Triton) quantizer kernels, same bits as the XLA path
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
