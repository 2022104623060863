"""Building for a GPU that is not here (target.compiling_for): the backend and kernel choices are the target's inside,
this machine's again outside, whatever was resolved before (no stale cache)."""

import jax

from MaxText.quantization import backends, target
from MaxText.quantization.backends import te, xla
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import get_recipe

NVFP4 = get_recipe("te_nvfp4")
ON_CPU = jax.default_backend() == "cpu"


def test_outside_a_target_it_is_this_machine():
  assert target.named() is None
  assert target.platform() == jax.default_backend() and target.device_count() == jax.device_count()


def test_the_targets_choices_inside_and_this_machines_after():
  before = backends.resolve(NVFP4, backends.Choice.AUTO)
  with target.compiling_for(sm=100, device_count=1) as named:
    assert target.named() is named and target.platform() == "cuda" and target.nvidia_gpu()
    assert te.gpu_compute_capability() == 100
    assert quantizer_impl.resolve(Kernels.AUTO) is Kernels.PALLAS  # one NVIDIA GPU: the Pallas quantizers
    assert xla.native(NVFP4)  # SM100: the block-scaled dot is a native FP4 GEMM
    chosen = backends.resolve(NVFP4, backends.Choice.AUTO)
    assert chosen is (backends.TE if te.unavailable_reason(NVFP4) is None else backends.XLA)
    with target.compiling_for(sm=90, device_count=8):  # nested: the innermost counts
      assert quantizer_impl.resolve(Kernels.AUTO) is Kernels.XLA  # not partitioned: XLA's quantizers on a mesh
      assert not xla.native(NVFP4)  # Hopper: no FP4 GEMM
      assert backends.resolve(NVFP4, backends.Choice.AUTO) is backends.EMULATED
    assert te.gpu_compute_capability() == 100
  assert target.named() is None
  assert backends.resolve(NVFP4, backends.Choice.AUTO) is before
  if ON_CPU:
    assert quantizer_impl.resolve(Kernels.AUTO) is Kernels.XLA and te.gpu_compute_capability() is None
