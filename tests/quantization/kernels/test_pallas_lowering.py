"""The quantization kernels lower to Triton: a quantized Dense (and the train step) exported for CUDA from CPU runs
exactly the expected Triton kernels per quantized operand, so every primitive in them has a Triton lowering."""

import collections
import os
import re

import jax
import jax.numpy as jnp
import pytest

from MaxText import precision
from MaxText.model import accounting
from MaxText.quantization import backends, delayed, get_recipe, qmatmul
from MaxText.quantization.kernels import pallas_quantize, quantizer_impl
from MaxText.quantization.kernels.quantizer_impl import Kernels
from tests.trainer.test_train_step import _cfg, _step_and_args

TRITON = "__gpu$xla.gpu.triton"
M, K, N = 64, 96, 32


@pytest.fixture
def as_if_on_a_gpu(monkeypatch):
  """Resolve quantization_kernels=pallas as an NVIDIA GPU would (to lower for CUDA from this machine)."""
  monkeypatch.setattr(quantizer_impl, "unavailable_reason", lambda platform=None: None)


def triton_kernels(module_text):
  """Counter of kernel names over every Triton custom call the module runs (a call inside a function counts once
  per call of that function)."""
  functions = re.split(r"\n(?=\s*func\.func )", module_text)
  body = {
    re.search(r"func\.func (?:public |private )?@([\w$.-]+)", f).group(1): f
    for f in functions
    if re.search(r"func\.func (?:public |private )?@", f)
  }

  def runs(name, depth=0):
    text = body[name]
    own = collections.Counter(
      re.search(r'name = "(\w+)"', line).group(1)
      for line in text.splitlines()
      if f"stablehlo.custom_call @{TRITON}" in line
    )
    for callee in re.findall(r"call @([\w$.-]+)\(", text):
      if callee in body and depth < 50:
        own += runs(callee, depth + 1)
    return own

  return runs("main")


def _export(fn, *args):
  # LayoutConstraint: jax's own layout pin (with_layout_constraint), which the FP8 layer puts on its f8 operands.
  checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in (TRITON, "LayoutConstraint")]
  exported = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)
  return triton_kernels(exported.mlir_module())


def _dense_fwd_bwd(name, **knobs):
  recipe = get_recipe(name, **knobs)
  history = jnp.zeros((3, 4), jnp.float32)

  def fwd_bwd(x, w, dy, key):
    if recipe.stateful:
      matmul = lambda x, w: delayed.qmatmul_delayed(x, w, recipe, history, Kernels.PALLAS)
    else:
      matmul = lambda x, w: qmatmul(x, w, recipe, key=key, kernels=Kernels.PALLAS, backend=backends.Choice.EMULATE)
    y, vjp = jax.vjp(matmul, x, w)
    return (y, *vjp(dy))

  shapes = (
    jax.ShapeDtypeStruct((M, K), jnp.bfloat16),
    jax.ShapeDtypeStruct((K, N), jnp.float32),
    jax.ShapeDtypeStruct((M, N), jnp.bfloat16),
  )
  return _export(fwd_bwd, *shapes, jax.random.key(0))


P = pallas_quantize.KERNEL_PREFIX
# Per quantized Dense (fwd + bwd): NVFP4 x, dy, x_t, dy_t, and w (its 16x16 tiles serve w_t), each an amax pass and
# a quantize pass; FP8 current scaling x, w, dy (shared by their transposed roles) the same; delayed scaling only
# the cast; MX one pass for each of the six operands.
EXPECTED = {
  "te_nvfp4": {
    P + "amax": 3,
    P + "amax_rht": 2,
    P + "nvfp4": 1,
    P + "nvfp4_16x16": 1,
    P + "nvfp4_sr": 1,
    P + "nvfp4_rht": 1,
    P + "nvfp4_rht_sr": 1,
  },
  "te_nvfp4_no_rht": {P + "amax": 5, P + "nvfp4": 2, P + "nvfp4_16x16": 1, P + "nvfp4_sr": 2},
  "te_fp8_currentscaling": {P + "amax": 3, P + "fp8_e4m3": 2, P + "fp8_e5m2": 1},
  "te_fp8_delayedscaling": {P + "fp8_e4m3": 2, P + "fp8_e5m2": 1},
  "te_mxfp8": {P + "mx_e4m3": 6},
  "mxfp4": {P + "mx_e2m1": 6},
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_quantized_dense_runs_the_expected_triton_kernels(as_if_on_a_gpu, name):
  assert _dense_fwd_bwd(name) == collections.Counter(EXPECTED[name])


@pytest.mark.parametrize("mode", ["mse", "mae"])
def test_four_over_six_operands_run_the_fused_4over6_kernels(as_if_on_a_gpu, mode):
  """te_nvfp4 with 4/6 on every operand: the same amax passes, each quantize pass the 4/6 kernel of its role."""
  want = {k if "amax" in k else f"{k}_4over6_{mode}": v for k, v in EXPECTED["te_nvfp4"].items()}
  assert _dense_fwd_bwd("te_nvfp4", nvfp4_4over6="all", nvfp4_4over6_err_mode=mode) == collections.Counter(want)


def test_the_train_step_quantizes_every_mlp_operand_with_triton_kernels(as_if_on_a_gpu):
  cfg = _cfg("quantization=te_nvfp4", "quantization_kernels=pallas", "remat_policy=minimal_with_quantization")
  assert "emulated  pallas" in precision.format_plan(precision.plan_from_config(cfg), cfg, accounting.gemm_flops(cfg))
  step, args = _step_and_args(cfg)
  kernels = _export(step, *args)
  dense_layers = 3 * cfg.base_num_decoder_layers  # gate, up, down; attention and the lm head stay bf16
  assert kernels == collections.Counter({k: v * dense_layers for k, v in EXPECTED["te_nvfp4"].items()})


@pytest.mark.slow
def test_every_kernel_compiles_to_a_cubin_with_triton(tmp_path):
  """Past lowering: Triton's own pipeline and ptxas accept every kernel for H100 and B200 (needs TRITON_PYTHON, an
  interpreter with the `triton` package: see triton_compile_check.py)."""
  triton_python = os.environ.get("TRITON_PYTHON")
  if not triton_python:
    pytest.skip("set TRITON_PYTHON to a Python with `pip install triton` to compile the kernels")
  from tests.quantization import triton_compile_check  # pylint: disable=import-outside-toplevel

  names = triton_compile_check.dump_ttir(tmp_path)
  assert set(names) == {k for counts in EXPECTED.values() for k in counts}
  results = triton_compile_check.compile_all(triton_python, tmp_path, [90, 100])
  assert len(results) == 2 * len(names)
  assert all(r["ok"] for r in results.values()), {k: r for k, r in results.items() if not r["ok"]}
  assert all("0 bytes spilled" in r["usage"] for r in results.values() if r["usage"])
