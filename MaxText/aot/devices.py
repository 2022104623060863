"""Compile-only devices of a GPU target: jax's deviceless ahead-of-time compilation, through its CUDA plugin, for GPUs
that are not on this machine (`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)`).

What it needs and what it can't do: jax's CUDA plugin (`jax-cuda13-plugin`, which `make te` puts in .venv-te); no
eager jnp call can run on these devices (build inputs as jax.ShapeDtypeStruct); Pallas' Triton lowering asks the
default device which GPU it targets (lower under `jax.default_device(devices[0])`); `compiled.cost_analysis()` is None
on this client and no autotuning runs (hence cuBLAS GEMMs: xla_gpu_enable_triton_gemm=false).
"""

import functools
import importlib.util

import jax

from MaxText.errors import UserError


def plugin_missing_reason():
  """None where jax's CUDA plugin is installed, else what to do (one line)."""
  if importlib.util.find_spec("jax_plugins") is not None and any(
    importlib.util.find_spec(f"jax_plugins.{name}") for name in ("xla_cuda13", "xla_cuda12")
  ):
    return None
  return (
    "compiling for a GPU target needs jax's CUDA plugin, which this Python lacks; run it as "
    '`make train-compile ARGS="..."` (which sets up .venv-te, where the plugin is), or install '
    f"'jax[cuda13]=={jax.__version__}' here"
  )


@functools.lru_cache(maxsize=None)
def compile_only_devices(target_config, topology):
  """The devices of `topology` ('slices x hosts x GPUs per host') of the GPU `target_config` describes, in id order;
  each host's GPUs share a process_index."""
  reason = plugin_missing_reason()
  if reason:
    raise UserError(reason)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  try:
    description = topologies.get_topology_desc(platform="cuda", target_config=target_config, topology=topology)
  except Exception as e:  # the plugin refused the description: a version of jaxlib that reads other fields
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise UserError(f"jax's CUDA plugin could not make compile-only devices for topology {topology}: {first}") from None
  return tuple(sorted(description.devices, key=lambda d: d.id))


def for_target(target):
  """The compile-only devices of an aot.targets.Target."""
  return compile_only_devices(target.gpu.target_config(), target.topology)
