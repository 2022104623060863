"""The xla backend: the train step lowered for CUDA has one block-scaled dot per quantized GEMM (3 per MLP Dense)
on E2M1/E4M3 operands and none elsewhere; on a GPU it equals the emulated backend; elsewhere it is a clear error."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.model import accounting
from tests import stablehlo
from MaxText import precision, train
from MaxText.quantization import backends, get_recipe, qmatmul
from MaxText.quantization.backends import emulated, xla as xla_backend
from MaxText.quantization.kernels.quantizer_impl import Kernels
from tests.conftest import REPO
from tests.trainer.test_train import SMALL
from tests.trainer.test_train_step import _cfg, _step_and_args

ON_GPU = jax.default_backend() == "gpu"


def _block_scaled_dots(module_text):
  """Each block-scaled dot the module runs (a custom call in a function counts once per call of that function)."""
  functions = re.split(r"\n(?=\s*func\.func )", module_text)
  body = {
    re.search(r"func\.func (?:public |private )?@([\w$.-]+)", f).group(1): f
    for f in functions
    if re.search(r"func\.func (?:public |private )?@", f)
  }

  def runs(name, depth=0):
    text = body[name]
    own = [l for l in text.splitlines() if "stablehlo.custom_call @__op$block_scaled_dot" in l]
    for callee in re.findall(r"call @([\w$.-]+)\(", text):
      if callee in body and depth < 50:
        own += runs(callee, depth + 1)
    return own

  return runs("main")


@pytest.fixture
def as_if_on_a_gpu(monkeypatch):
  """Resolve quantization_backend=xla as a GPU would (for lowering to CUDA from this machine)."""
  real = xla_backend.unavailable_reason
  monkeypatch.setattr(xla_backend, "unavailable_reason", lambda recipe, platform=None: real(recipe, "gpu"))
  backends.resolve.cache_clear()
  yield
  backends.resolve.cache_clear()


@pytest.mark.parametrize(
  "quantization, operand, scale",
  [("te_nvfp4", "f4E2M1FN", "f8E4M3FN"), ("mxfp4", "f4E2M1FN", "f8E8M0FNU"), ("te_mxfp8", "f8E", "f8E8M0FNU")],
)
def test_train_step_lowered_for_cuda_has_a_block_scaled_dot_per_quantized_gemm(
  as_if_on_a_gpu, quantization, operand, scale
):
  cfg = _cfg(f"quantization={quantization}", "quantization_backend=xla")
  assert "xla" in precision.format_plan(precision.plan_from_config(cfg), cfg, accounting.gemm_flops(cfg))
  step, args = _step_and_args(cfg)
  exported = jax.export.export(
    step, platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__op$block_scaled_dot")]
  )(*args)
  calls = _block_scaled_dots(exported.mlir_module())
  # fprop, dgrad and wgrad of gate, up and down in each layer; attention and the lm head stay bf16.
  assert len(calls) == 3 * 3 * cfg.base_num_decoder_layers
  for line in calls:
    lhs, rhs, lhs_scales, rhs_scales = re.search(r"\(tensor<([^)]*)\) ->", line).group(1).split(", tensor<")
    assert operand in lhs and operand in rhs and scale in lhs_scales and scale in rhs_scales, line


def test_where_it_cannot_run_it_is_one_line_and_auto_never_picks_it(capsys):
  if ON_GPU:
    pytest.skip("runs where the block-scaled dot cannot")
  base = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, "quantization=te_nvfp4", "dry_run=true"]
  assert train.main(base + ["quantization_backend=xla"]) == 2
  err = capsys.readouterr().err
  assert err.strip() == (
    "error: quantization_backend=xla: jax.nn.scaled_matmul (__op$block_scaled_dot) runs on "
    f"NVIDIA GPUs only, not on {jax.default_backend()}; use quantization_backend=auto or emulate"
  )
  assert backends.resolve(get_recipe("te_nvfp4"), backends.Choice.AUTO) is backends.EMULATED


@pytest.mark.skipif(not ON_GPU, reason="jax.nn.scaled_matmul has no CPU lowering")
@pytest.mark.parametrize("name", ["te_nvfp4", "te_nvfp4_no_rht", "te_mxfp8", "mxfp4"])
def test_xla_equals_emulated_up_to_accumulation_order(name):
  recipe = get_recipe(name)
  kx, kw, kd, ks = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(kx, (256, 512), jnp.bfloat16)
  w = jax.random.normal(kw, (512, 384), jnp.float32) * 0.05
  dy = jax.random.normal(kd, (256, 384), jnp.bfloat16)
  # Each GEMM on the same quantized operands: f32 results equal up to the order of the f32 sum.
  for (a, role_a), (b, role_b) in [((x, "x"), (w.T, "w")), ((dy, "dy"), (w, "w_t")), ((x.T, "x_t"), (dy.T, "dy_t"))]:
    got = xla_backend.gemm(
      xla_backend.quantize_for_gemm(a, recipe, role_a, ks), xla_backend.quantize_for_gemm(b, recipe, role_b, ks), recipe
    )
    want = emulated.gemm(
      emulated.quantize_for_gemm(a, recipe, role_a, ks), emulated.quantize_for_gemm(b, recipe, role_b, ks), recipe
    )
    assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5 * np.abs(np.asarray(want)).max(), role_a

  # The quantized matmul and its gradients: at most one bf16 rounding apart (XLA on a GPU may keep the
  # f32 GEMM result where the step rounds to bf16, so most elements differ in their last f32 bits).
  def run(backend):
    y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=ks, backend=backend), x, w)
    return (y, *vjp(dy))

  for got, want in zip(run(backends.Choice.XLA), run(backends.Choice.EMULATE)):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.all(np.abs(got - want) <= 2**-7 * np.abs(want) + 1e-6 * np.abs(want).max())


@pytest.mark.parametrize(
  "options, per_dense",
  [
    (["nvfp4_4over6=all"], 3),
    (["nvfp4_backward_override=high_precision"], 1),
    (["nvfp4_backward_override=dequantized", "nvfp4_4over6=weights"], 1),
  ],
)
def test_nvfp4_options_lowered_for_cuda(as_if_on_a_gpu, options, per_dense):
  """4/6 keeps every GEMM block-scaled; a backward_override leaves only fprop's, and dgrad and wgrad become bf16 x bf16
  dots (the HLO's dot FLOPs: all but the MLP forward, whose GEMMs are the block-scaled custom calls)."""
  cfg = _cfg("quantization=te_nvfp4", "quantization_backend=xla", *options)
  step, args = _step_and_args(cfg)
  exported = jax.export.export(
    step, platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__op$block_scaled_dot")]
  )(*args)
  assert len(_block_scaled_dots(exported.mlir_module())) == per_dense * 3 * cfg.base_num_decoder_layers
  by_dtype = stablehlo.dot_flops_by_dtype(exported.mlir_module())
  flops = accounting.training_flops_per_device(cfg)
  block_scaled = flops.mlp * per_dense / 3
  assert sum(by_dtype.values()) == pytest.approx(flops.total + flops.attention_core - block_scaled, rel=1e-9)
  assert set(by_dtype) == {("bf16", "bf16")}, by_dtype


def _xla_backend_roles(recipe, kernels):
  """jit(x, w, dy, key) -> {role: the xla backend's operand} for every role, as the quantized matmul asks for them."""
  from tests.quantization.kernels.test_pallas_quantize import ROLE_INPUTS  # pylint: disable=import-outside-toplevel

  def run(x, w, dy, key):
    arrays = {"x": x, "w": w, "dy": dy}
    out = {}
    for role, (operand, transpose) in ROLE_INPUTS.items():
      out[role] = xla_backend.BACKEND.quantize(arrays[operand], recipe, role, key, kernels=kernels, transpose=transpose)
    return out

  return jax.jit(run)


@pytest.mark.parametrize("knobs", [{}, pytest.param({"nvfp4_4over6": "all"}, marks=pytest.mark.slow)])
def test_the_pallas_kernels_give_the_xla_backend_the_xla_paths_narrow_operands(knobs):
  """Every NVFP4 role from the narrow kernels (interpret mode) on random and adversarial operands: E2M1 values (packed
  two to a byte), E4M3 scales and the amax bit for bit the XLA path's, in the dtypes the block-scaled dot reads."""
  from tests.quantization.kernels import test_pallas_quantize as tk  # pylint: disable=import-outside-toplevel

  recipe = get_recipe("te_nvfp4", **knobs)
  shapes = [(tk.M, tk.K), (tk.K, tk.N), (tk.M, tk.N)]
  by_shape = {s: tk.adversarial_operands(s, seed=i) for i, s in enumerate(shapes)}
  got_fn = _xla_backend_roles(recipe, Kernels.INTERPRET)
  want_fn = _xla_backend_roles(recipe, Kernels.XLA)
  names = str(jax.make_jaxpr(got_fn)(*(jnp.zeros(s) for s in shapes), jax.random.key(0)))
  assert len(re.findall(r"name=quantize_nvfp4\w*_narrow", names)) == 6  # the kernel path, not the fallback
  # The amax pass only of the RHT (x_t, dy_t); x's and dy's plain amax are their partner's pass's second output (the
  # same call on the same array, one once XLA has compiled it), the 16x16 w's XLA's reduction.
  assert len(re.findall(r"name=quantize_amax_rht\b", names)) == 4 and not re.findall(r"name=quantize_amax\b", names)
  for kind in by_shape[shapes[0]]:
    args = (*tk._inputs(kind, by_shape), jax.random.key(11))  # pylint: disable=protected-access
    got, want = got_fn(*args), want_fn(*args)
    for role in want:
      assert got[role].values.dtype == jnp.float4_e2m1fn and got[role].scales.dtype == jnp.float8_e4m3fn
      for part in ("values", "scales", "global_scale", "e4m3_max"):
        assert tk.same_bits(getattr(got[role], part), getattr(want[role], part)), (kind, role, part)
      packed = lambda q: jax.lax.bitcast_convert_type(q.values.reshape(q.values.shape[0], -1, 2), jnp.uint8)
      assert np.array_equal(packed(got[role]), packed(want[role])), (kind, role)


def test_the_xla_backend_names_its_quantizers():
  assert xla_backend.BACKEND.quantizers(Kernels.INTERPRET) == "interpret"
  assert xla_backend.BACKEND.quantizers(Kernels.XLA) == "xla"
