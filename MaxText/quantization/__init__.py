"""Low-precision numerics (NVFP4, FP8, MX) as a library: recipes, quantizers and the quantized matmul.

Nothing here imports the trainer; the trainer imports this.
"""

from MaxText.quantization import delayed
from MaxText.quantization.qdot import qdense, qmatmul
from MaxText.quantization.recipes import RECIPES, Recipe, get_recipe, recipe_names

__all__ = ["delayed", "RECIPES", "Recipe", "get_recipe", "qdense", "qmatmul", "recipe_names"]
