"""Transformer Engine backend: the te_* recipes on TE's native kernels, called as TE's own Flax modules call them.

`transformer_engine.jax` is imported lazily, only when a GEMM goes to TE: the main install never needs it.
`unavailable_reason()` is safe to call anywhere; quantizer_set() and qmatmul() need TE (on a GPU, or for lowering
to CUDA from any machine: tests/te/).
"""

import contextlib
import functools
import importlib
import sys

import jax
import jax.numpy as jnp

from MaxText.quantization import target
from MaxText.quantization.backends.base import REMAT_NAME, Backend
from MaxText.quantization.errors import BackendError
from MaxText.quantization.formats import Format
from MaxText.quantization.recipes import Recipe

NVFP4_MIN_SM = 100  # Blackwell
FP8_MIN_SM = 89  # Ada / Hopper


def gpu_compute_capability():
  """Major*10+minor of the GPU built for (target.compiling_for's, else this machine's first), or None without one."""
  named = target.named()
  return named.sm if named is not None else target.local_gpu_sm()


# TE's Python modules that hold a name get_device_compute_capability, by import or re-export (TE 2.20).
COMPUTE_CAPABILITY_HOLDERS = (
  "transformer_engine_jax",
  "transformer_engine.jax.quantize",
  "transformer_engine.jax.quantize.device_utils",
  "transformer_engine.jax.quantize.helper",
  "transformer_engine.jax.cpp_extensions.gemm",
)


@contextlib.contextmanager
def compiling_for_sm(sm):
  """Inside: Transformer Engine sees a GPU of compute capability `sm` (it asks the CUDA driver, which a machine
  compiling for a GPU that is not there has not), so its recipes, layouts and kernels are the ones that GPU gets.
  Nothing without TE."""
  if _import_te() is None:
    yield
    return
  holders = {
    name: module
    for name, module in list(sys.modules.items())
    if (name == "transformer_engine_jax" or name.startswith("transformer_engine."))
    and callable(getattr(module, "get_device_compute_capability", None))
  }
  saved = {name: module.get_device_compute_capability for name, module in holders.items()}
  helper = importlib.import_module("transformer_engine.jax.quantize.helper")
  device_utils = importlib.import_module("transformer_engine.jax.quantize.device_utils")
  saved_support = helper._is_scaling_mode_supported  # pylint: disable=protected-access  (TE's cached answer)

  def forget():  # what TE derived from an earlier answer: its support table and layout check
    helper._is_scaling_mode_supported = None  # pylint: disable=protected-access
    device_utils.is_fp8_gemm_with_all_layouts_supported.cache_clear()

  for module in holders.values():
    module.get_device_compute_capability = lambda gpu_id=0: sm
  forget()
  try:
    yield
  finally:
    for name, module in holders.items():
      module.get_device_compute_capability = saved[name]
    forget()
    helper._is_scaling_mode_supported = saved_support  # pylint: disable=protected-access


@functools.lru_cache(maxsize=None)
def _import_te():
  try:
    return importlib.import_module("transformer_engine.jax")
  except Exception:  # ImportError, or a TE build that fails to load its CUDA library
    return None


def min_sm(recipe: Recipe) -> int:
  return NVFP4_MIN_SM if recipe.format in (Format.NVFP4, Format.MXFP8) else FP8_MIN_SM


def _options_reason(recipe: Recipe):
  """Why TE can't run the recipe's Four Over Six / backward_override settings, or None without them.

  TE 2.20 has both in its PyTorch NVFP4BlockScaling only (transformer_engine.jax reads neither), and even there
  applies 4/6 to weights and activations only (never to gradients) and without the RHT or stochastic rounding.
  """
  if recipe.nvfp4_4over6 == "none" and recipe.backward_override == "none":
    return None
  settings = ", ".join(
    f"{k}={getattr(recipe, k)}" for k in ("nvfp4_4over6", "backward_override") if getattr(recipe, k) != "none"
  )
  why = "Transformer Engine's JAX bindings (2.20) read neither nvfp4_4over6 nor backward_override"
  if recipe.nvfp4_4over6 in ("gradients", "all"):
    why += "; TE never applies Four Over Six to gradients"
  elif recipe.nvfp4_4over6 == "activations" and not recipe.disable_rht:
    why += "; TE's Four Over Six doesn't take the RHT its activation quantizer applies"
  return f"{settings}: {why}"


def unavailable_reason(recipe: Recipe):
  """None when TE can run `recipe` here, else why not (one line)."""
  if recipe.te_name is None:
    return f"{recipe.name} has no Transformer Engine kernel"
  if recipe.stateful:
    return "the trainer carries the amax history itself (TE would keep it in its own variable collection)"
  options = _options_reason(recipe)
  if options is not None:
    return options
  if recipe.format is Format.NVFP4 and recipe.disable_2d_quantization and not recipe.disable_rht:
    return (
      "disable_2d_quantization=true with the RHT: Transformer Engine 2.20's JAX NVFP4 then puts the RHT on the "
      "weight's 1D quantization too, which its forward GEMM refuses; set disable_rht=true as well"
    )
  sm = gpu_compute_capability()
  need = min_sm(recipe)
  kind = "NVFP4" if recipe.format is Format.NVFP4 else "FP8"
  if sm is None or sm < need:
    return f"Transformer Engine {kind} needs an SM{need}+ GPU"
  if _import_te() is None:
    return "transformer_engine.jax is not importable"
  return None


def te_recipe(recipe: Recipe):
  """The TE recipe object for one of our te_* recipes."""
  r = importlib.import_module("transformer_engine.common.recipe")
  if recipe.format is Format.NVFP4:
    return r.NVFP4BlockScaling(
      disable_rht=recipe.disable_rht,
      disable_stochastic_rounding=recipe.disable_stochastic_rounding,
      disable_2d_quantization=recipe.disable_2d_quantization,
    )
  if recipe.format is Format.FP8_CURRENT:
    return r.Float8CurrentScaling(fp8_format=r.Format.HYBRID)
  if recipe.format is Format.FP8_DELAYED:
    return r.DelayedScaling(
      fp8_format=r.Format.HYBRID, amax_history_len=recipe.amax_history_len, amax_compute_algo=recipe.amax_compute_algo
    )
  if recipe.format is Format.MXFP8:
    return r.MXFP8BlockScaling()
  raise ValueError(f"{recipe.name} has no Transformer Engine recipe")


class _SrRngStream:
  """What TE's QuantizeConfig.get_quantize_flax_meta reads from the Flax module it is given, for the stateless
  recipes: the module's `sr_rng` stream, here our (seed, step, layer, GEMM) key, so TE's SR state derivation (a
  fold-in of the quantizer's name, one uint32[4] per device of the mesh) runs unchanged on our seed discipline."""

  def __init__(self, key):
    self._key = key

  def make_rng(self, name):
    if name != "sr_rng":
      raise ValueError(f"Transformer Engine asked for the {name!r} rng stream; only 'sr_rng' is provided")
    return self._key


def quantizer_set(recipe: Recipe, key, checkpoint_name=None):
  """TE's quantizer set for `recipe`, made as TE's Flax modules make theirs (TransformerEngineBase.
  generate_quantizer_set): the recipe's QuantizeConfig gives the x, kernel and grad quantizers their QuantizeMeta
  (NVFP4: the RHT flag where the scaling is 1D, the SR state on the gradient quantizer), create_set the rest."""
  te_quantize = importlib.import_module("transformer_engine.jax.quantize")
  fp8_recipe = te_recipe(recipe)
  config = te_quantize.get_quantize_config_with_recipe(fp8_recipe)
  module = _SrRngStream(key)
  sources = {
    "x": te_quantize.TensorSource.X,
    "kernel": te_quantize.TensorSource.KERNEL,
    "grad": te_quantize.TensorSource.DGRAD,
  }
  metas = {
    name: config.get_quantize_flax_meta(module, config.COLLECTION_NAME, "", source, name)
    for name, source in sources.items()
  }
  return te_quantize.QuantizerFactory.create_set(
    fp8_recipe=fp8_recipe, quantize_meta_set=te_quantize.QuantizeMetaSet(**metas), checkpoint_name=checkpoint_name
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _grad_in_dtype(w, dtype):
  """w itself; its gradient cast to `dtype`. TE's wgrad GEMM returns the compute dtype (bf16) for f32 master weights,
  which JAX can't add into the f32 gradient of the stacked layer weights; the emulated backend rounds its wgrad to
  the compute dtype and then to the weight's dtype, and so does this."""
  del dtype
  return w


def _grad_in_dtype_fwd(w, dtype):
  del dtype
  return w, None


def _grad_in_dtype_bwd(dtype, _, dw):
  return (dw.astype(dtype),)


_grad_in_dtype.defvjp(_grad_in_dtype_fwd, _grad_in_dtype_bwd)


class _MeshResource:
  """Which mesh axis plays which of Transformer Engine's parts (its MeshResource), for the TE GEMMs under a mesh.

  TE's partitioning rules read its global MeshResource when a GEMM is traced and again when the program is
  compiled (custom_partitioning's callbacks), so it must stay set from the first TE GEMM to the end of the run:
  `mesh_resource` says the names (the trainer: around its mesh), the first TE GEMM inside sets TE's global (TE is
  imported only by a GEMM that runs on it), and leaving `mesh_resource` restores it."""

  def __init__(self):
    self.names = []  # the innermost mesh_resource's names last
    self.guards = []  # (names, TE's entered global_shard_guard) per mesh_resource

  def apply(self):
    """Inside a mesh_resource, sets TE's global MeshResource to its names (once per mesh_resource)."""
    if not self.names or (self.guards and self.guards[-1][0] is self.names[-1]):
      return
    sharding = importlib.import_module("transformer_engine.jax.sharding")
    guard = sharding.global_shard_guard(sharding.MeshResource(**self.names[-1]))
    guard.__enter__()  # pylint: disable=unnecessary-dunder-call  (left when the mesh_resource is)
    self.guards.append((self.names[-1], guard))


_MESH_RESOURCE = _MeshResource()


@contextlib.contextmanager
def mesh_resource(*, data=None, fsdp=None, tensor=None, context=None):
  """Inside: TE GEMMs are partitioned by TE's own rules with these mesh axes as its data-parallel, FSDP, tensor- and
  context-parallel resources (upstream MaxText's transformer_engine_context). Nothing is imported here."""
  names = dict(dp_resource=data, fsdp_resource=fsdp, tp_resource=tensor, cp_resource=context)
  _MESH_RESOURCE.names.append(names)
  try:
    yield
  finally:
    _MESH_RESOURCE.names.pop()
    if _MESH_RESOURCE.guards and _MESH_RESOURCE.guards[-1][0] is names:
      _MESH_RESOURCE.guards.pop()[1].__exit__(None, None, None)


def qmatmul(x, w, recipe: Recipe, *, key, checkpoint_name=None):
  """x [..., K] . w [K, *out] through TE's dense, as TE's DenseGeneral calls it (no bias), -> [..., *out];
  `checkpoint_name` names the quantized operands kept for the backward (a remat policy can save them). dw comes back
  in w's dtype. Under a mesh, TE partitions it (`mesh_resource`)."""
  te_dense = importlib.import_module("transformer_engine.jax.dense")
  _MESH_RESOURCE.apply()
  return te_dense.dense(
    x,
    _grad_in_dtype(w, jnp.dtype(w.dtype)),
    contracting_dims=((x.ndim - 1,), (0,)),
    quantizer_set=quantizer_set(recipe, key, checkpoint_name),
  )


class TEBackend(Backend):
  """Transformer Engine's dense for the recipes TE has (`recipe.te_name`): TE's quantizers and GEMMs in TE's own
  forward and backward rule, partitioned under a mesh by TE's rules (`mesh_resource`)."""

  name = "te"

  def unavailable_reason(self, recipe: Recipe):
    return unavailable_reason(recipe)

  def dense(self, x, w, recipe: Recipe, *, key, kernels, partition=None, history=None):
    del kernels, partition  # TE quantizes with its own kernels and partitions by its own rules
    if history is not None:  # unavailable_reason refuses the stateful recipes
      raise BackendError(f"{recipe.name}: the trainer carries the amax history itself, which TE would keep")
    return qmatmul(x, w, recipe, key=key, checkpoint_name=REMAT_NAME)


BACKEND = TEBackend()
