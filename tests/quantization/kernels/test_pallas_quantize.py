"""Pallas quantization kernels in interpret mode: the XLA path's bits for every recipe and role, on random and
adversarial operands, under IEEE and GPU-like division, and on the golden TE cases.

Operands are always jit arguments, never closed-over constants: XLA:CPU constant-folds a closed-over operand
through its HLO evaluator, whose results for these quantizers can differ from compiled code.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization import delayed, get_recipe, qmatmul
from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import grids, nvfp4
from MaxText.quantization.kernels import pallas_quantize
from MaxText.quantization.kernels.quantizer_impl import Kernels
from tests.conftest import division_modes, golden_params
from tests.quantization.gpu_division import gpu_like_division

M, K, N = 32, 64, 64  # x [M, K], w [K, N], dy [M, N]: every operand axis a multiple of 32 (MX blocks)
# (operand, transposed) per role, as qdot hands them to quantize_for_gemm
ROLE_INPUTS = {
  "x": ("x", False),
  "w": ("w", True),
  "dy": ("dy", False),
  "w_t": ("w", False),
  "x_t": ("x", True),
  "dy_t": ("dy", True),
}
TRAINER_ROLES = {
  "te_nvfp4": tuple(ROLE_INPUTS),
  "te_nvfp4_no_rht": tuple(ROLE_INPUTS),
  "te_fp8_currentscaling": ("x", "w", "dy"),
  "te_fp8_delayedscaling": ("x", "w", "dy"),
  "te_mxfp8": tuple(ROLE_INPUTS),
  "mxfp4": tuple(ROLE_INPUTS),
}
E2M1_MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def same_bits(got, want):
  """Equal bits (as f32: every quantized dtype converts exactly), NaN equal to NaN."""
  got = np.asarray(jnp.asarray(got).astype(jnp.float32))
  want = np.asarray(jnp.asarray(want).astype(jnp.float32))
  return got.shape == want.shape and bool(
    np.all((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want)))
  )


def _lognormal(key, shape):
  """Magnitudes over many binades with 1% outliers: blocks of every scale."""
  k1, k2, k3 = jax.random.split(key, 3)
  x = jax.random.normal(k1, shape) * jnp.exp(2.0 * jax.random.normal(k2, shape))
  return jnp.where(jax.random.uniform(k3, shape) < 0.01, x * 300, x)


def _midpoints(shape):
  """Global amax 2688 (S_enc = 1) and blocks of amax 6 (block scale 1): the scaled values are the inputs, and
  most lie exactly halfway between two E2M1 values (ties to even)."""
  row = np.array([6.0, *E2M1_MIDPOINTS, *(-v for v in E2M1_MIDPOINTS), 0.0], np.float32)
  x = np.tile(row, (shape[0], shape[1] // 16))
  x[0, 0] = 2688.0
  return jnp.asarray(x)


def adversarial_operands(shape, seed=0):
  """{kind: f32 array}: what the kernels must get exactly right beyond random data."""
  rand = _lognormal(jax.random.key(seed), shape)
  return {
    "random": rand,
    "midpoints": _midpoints(shape),
    "zeros": jnp.zeros(shape),
    "tiny": rand * 1e-30,
    "huge": rand / jnp.max(jnp.abs(rand)) * 3e38,
    "inf": rand.at[1, 3].set(jnp.inf).at[2, 40].set(-jnp.inf),
    "nan": rand.at[3, 5].set(jnp.nan),
    "zero_blocks": rand.at[:, 16:48].set(0.0).at[4:8].set(-0.0),
  }


def _quantize_roles(name, roles, kernels):
  """jit(x, w, dy, key, history) -> {role: QuantizedTensor} for `name`'s (a recipe name, or a Recipe) roles with
  `kernels`."""
  recipe = get_recipe(name) if isinstance(name, str) else name
  arrays = lambda x, w, dy: {"x": x, "w": w, "dy": dy}

  def run(x, w, dy, key, scales):
    out = {}
    for role in roles:
      operand, transpose = ROLE_INPUTS[role]
      scale = scales[("x", "w", "dy").index(operand)] if recipe.stateful else None
      out[role] = emulated.quantize_for_gemm(
        arrays(x, w, dy)[operand], recipe, role, key, scale, kernels=kernels, transpose=transpose
      )
    return out

  return jax.jit(run)


def _inputs(kind, operands_by_shape):
  x = operands_by_shape[(M, K)][kind].astype(jnp.bfloat16)
  w = operands_by_shape[(K, N)][kind]  # f32 master weights, as the trainer quantizes them
  dy = operands_by_shape[(M, N)][kind].astype(jnp.bfloat16)
  return x, w, dy


def _assert_roles_equal(name, kernels_fn, xla_fn):
  by_shape = {s: adversarial_operands(s, seed=i) for i, s in enumerate([(M, K), (K, N), (M, N)])}
  scales = jnp.float32([0.7, 3.1, 41.0])  # delayed scaling: scales from a history, not the operand
  for kind in by_shape[(M, K)]:
    args = (*_inputs(kind, by_shape), jax.random.key(11), scales)
    got, want = kernels_fn(*args), xla_fn(*args)
    for role in want:
      for part in ("values", "global_scale", "e4m3_max"):
        g, w = getattr(got[role], part), getattr(want[role], part)
        assert g.dtype == w.dtype, (name, kind, role, part)
        assert same_bits(g, w), (name, kind, role, part)


@pytest.mark.parametrize("name", ["te_nvfp4", "te_fp8_currentscaling", "mxfp4"])
def test_kernels_give_the_xla_paths_bits_for_every_role(name):
  roles = TRAINER_ROLES[name]
  _assert_roles_equal(name, _quantize_roles(name, roles, Kernels.INTERPRET), _quantize_roles(name, roles, Kernels.XLA))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["mse", "mae"])
def test_the_four_over_six_kernel_gives_the_xla_paths_bits_for_every_role(mode):
  """Four Over Six in the NVFP4 kernel: 1x16 (x, w_t), 16x16 tiles (w), SR (dy), RHT (x_t), RHT + SR (dy_t), on
  random and adversarial operands; the kernel path is taken, not the XLA fallback."""
  recipe = get_recipe("te_nvfp4", nvfp4_4over6="all", nvfp4_4over6_err_mode=mode)
  roles = TRAINER_ROLES["te_nvfp4"]
  kernel_names = str(
    jax.make_jaxpr(_quantize_roles(recipe, roles, Kernels.INTERPRET))(
      *(jnp.zeros(s, d) for s, d in (((M, K), jnp.bfloat16), ((K, N), jnp.float32), ((M, N), jnp.bfloat16))),
      jax.random.key(0),
      jnp.float32([1, 1, 1]),
    )
  )
  suffixes = ("", "_16x16", "_sr", "_rht", "_rht_sr")  # x and w_t share the 1x16 kernel
  assert set(re.findall(r"name=quantize_(nvfp4\w*)", kernel_names)) == {f"nvfp4{s}_4over6_{mode}" for s in suffixes}
  _assert_roles_equal(
    recipe, _quantize_roles(recipe, roles, Kernels.INTERPRET), _quantize_roles(recipe, roles, Kernels.XLA)
  )


@pytest.mark.slow
def test_the_four_over_six_kernel_ignores_how_the_backend_divides():
  recipe = get_recipe("te_nvfp4", nvfp4_4over6="all")
  roles = TRAINER_ROLES["te_nvfp4"]
  by_shape = {s: adversarial_operands(s, seed=i) for i, s in enumerate([(M, K), (K, N), (M, N)])}
  args = (*_inputs("random", by_shape), jax.random.key(11), jnp.float32([0.7, 3.1, 41.0]))
  want = _quantize_roles(recipe, roles, Kernels.XLA)(*args)
  with gpu_like_division():
    got = _quantize_roles(recipe, roles, Kernels.INTERPRET)(*args)
  for role in roles:
    assert same_bits(got[role].values, want[role].values), role


@pytest.mark.slow
@pytest.mark.parametrize("name", ["te_nvfp4_no_rht", "te_fp8_delayedscaling", "te_mxfp8"])
def test_kernels_give_the_xla_paths_bits_for_the_other_recipes(name):
  roles = TRAINER_ROLES[name]
  _assert_roles_equal(name, _quantize_roles(name, roles, Kernels.INTERPRET), _quantize_roles(name, roles, Kernels.XLA))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["te_nvfp4", "te_fp8_currentscaling", "te_mxfp8", "mxfp4"])
def test_kernels_ignore_how_the_backend_divides(name):
  """The kernels under a GPU's f32 division give the XLA path's IEEE bits (they never divide in f32)."""
  roles = TRAINER_ROLES[name]
  xla = _quantize_roles(name, roles, Kernels.XLA)
  by_shape = {s: adversarial_operands(s, seed=i) for i, s in enumerate([(M, K), (K, N), (M, N)])}
  args = (*_inputs("random", by_shape), jax.random.key(11), jnp.float32([0.7, 3.1, 41.0]))
  want = xla(*args)
  with gpu_like_division():
    got = _quantize_roles(name, roles, Kernels.INTERPRET)(*args)
  for role in roles:
    assert same_bits(got[role].values, want[role].values) and same_bits(got[role].global_scale, want[role].global_scale)


def test_the_rht_amax_pass_gives_the_operands_plain_amax_too():
  """The RHT amax pass's second output (dy's amax, from the pass dy_t runs anyway) is grids.abs_max's number bit for
  bit on random and adversarial operands (NaN, inf, zeros, subnormals), bf16 (f32 too for two), read as dy^T; its
  first, the RHT's, the XLA path's."""
  operands = adversarial_operands((M, K), seed=5)
  operands["subnormal"] = operands["random"] * 1e-39
  for kind, x in operands.items():
    for dtype in (jnp.bfloat16, jnp.float32) if kind in ("random", "nan") else (jnp.bfloat16,):
      dy = x.astype(dtype)
      plain = pallas_quantize.nvfp4_rht_pass_amax(dy, transpose=True, interpret=True)
      assert plain.dtype == jnp.float32 and same_bits(plain, grids.abs_max(dy.astype(jnp.float32))), (kind, dtype)
      rht = pallas_quantize.amax_padded(dy, transpose=True, rht=True, interpret=True)
      want = grids.abs_max(nvfp4.hadamard16(dy.T).astype(jnp.float32))
      assert kind == "subnormal" or same_bits(rht, want), (kind, dtype)  # subnormal sums: the module's one exception


@pytest.mark.slow
def test_ragged_operands_pad_as_the_xla_path_does():
  """Last axis (and, for 16x16 tiles, first axis) not a multiple of 16; odd rows with SR too (the counter hash draws
  per row and group of 4, so the kernels take any row count)."""
  x = _lognormal(jax.random.key(2), (24, 40)).astype(jnp.bfloat16)
  odd = _lognormal(jax.random.key(3), (5, 48)).astype(jnp.bfloat16)
  cases = [
    ("te_nvfp4", "x", "x", False),
    ("te_nvfp4", "w", "x", True),
    ("te_nvfp4", "w_t", "x", False),
    ("te_nvfp4", "dy", "x", False),
    ("te_nvfp4", "dy", "odd", False),
    ("te_fp8_currentscaling", "w", "x", True),
  ]

  def run(kernels, x, odd, key):
    arrays = {"x": x, "odd": odd}
    return [
      emulated.quantize_for_gemm(arrays[a], get_recipe(n), role, key, kernels=kernels, transpose=t)
      for n, role, a, t in cases
    ]

  got = jax.jit(lambda *a: run(Kernels.INTERPRET, *a))(x, odd, jax.random.key(4))
  want = jax.jit(lambda *a: run(Kernels.XLA, *a))(x, odd, jax.random.key(4))
  for case, g, w in zip(cases, got, want):
    assert same_bits(g.values, w.values) and same_bits(g.global_scale, w.global_scale), case[:2]
  assert pallas_quantize.nvfp4_supported((24, 40), stochastic_rounding=True, key=jax.random.key(0))
  assert pallas_quantize.nvfp4_supported((5, 48), stochastic_rounding=True, key=jax.random.key(0))
  assert not pallas_quantize.nvfp4_supported((5, 48), stochastic_rounding=True, key=None)


@pytest.mark.slow
@pytest.mark.parametrize("division", division_modes())
@pytest.mark.parametrize("case", golden_params("quantize"))
def test_golden_te_cases_through_the_kernels(case, division):
  """TE's reference quantizer's values x scales, amax and dequantized values, from the kernel path."""
  _, meta, d = case
  tile = tuple(meta["tile"])
  with division():
    for side in ("row", "col"):
      rht = meta["rht"] and side == "col"
      block_scaled, amax = jax.jit(
        lambda x: pallas_quantize.nvfp4_block_scaled(x, tile=tile, rht=rht, transpose=side == "col", interpret=True)
      )(jnp.asarray(d["x"]))
      scales = np.repeat(d[f"{side}_scales"], nvfp4.BLOCK, axis=1)
      np.testing.assert_array_equal(np.asarray(block_scaled.astype(jnp.float32)), d[f"{side}_values"] * scales)
      assert float(amax) == float(d[f"{side}_amax"])
      dequant = block_scaled.astype(jnp.float32) * grids.div_rn(1.0, nvfp4.global_encode_scale(amax))
      np.testing.assert_array_equal(np.asarray(dequant), d[f"{side}_dequant"], err_msg=side)


@pytest.mark.slow
@pytest.mark.parametrize("case", golden_params("linear"))
def test_golden_linear_through_the_kernels_equals_the_xla_path(case):
  """TE's reference linear layer (fprop, dgrad, wgrad): the kernel path's outputs are the XLA path's, bit for bit."""
  _, meta, d = case
  recipe = get_recipe("te_nvfp4" if meta["rht"] else "te_nvfp4_no_rht", disable_stochastic_rounding=True)

  def run(kernels, x, w, dy):
    y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, kernels=kernels), x, w)
    return (y, *vjp(dy))

  args = (jnp.asarray(d["x"], jnp.bfloat16), jnp.asarray(d["w"]), jnp.asarray(d["dy"], jnp.bfloat16))
  got = jax.jit(lambda *a: run(Kernels.INTERPRET, *a))(*args)
  want = jax.jit(lambda *a: run(Kernels.XLA, *a))(*args)
  for name, g, w in zip(("y", "dx", "dw"), got, want):
    assert same_bits(g, w), name
  rel = np.linalg.norm(np.asarray(got[0], np.float32) - d["y"]) / np.linalg.norm(d["y"])
  assert rel < 5e-3  # and that is TE's layer up to bf16 outputs


@pytest.mark.slow
def test_a_quantized_dense_is_the_same_with_kernels_and_xla():
  """fwd + bwd of one te_nvfp4 Dense (SR on, RHT on): identical outputs and gradients."""
  recipe = get_recipe("te_nvfp4")
  x = _lognormal(jax.random.key(5), (M, K)).astype(jnp.bfloat16)
  w = _lognormal(jax.random.key(6), (K, N)) * 0.05
  dy = _lognormal(jax.random.key(7), (M, N)).astype(jnp.bfloat16)

  def run(kernels, x, w, dy, key):
    y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=key, kernels=kernels), x, w)
    return (y, *vjp(dy))

  got = jax.jit(lambda *a: run(Kernels.INTERPRET, *a))(x, w, dy, jax.random.key(8))
  want = jax.jit(lambda *a: run(Kernels.XLA, *a))(x, w, dy, jax.random.key(8))
  for g, w_ in zip(got, want):
    assert same_bits(g, w_)


def test_delayed_scaling_takes_the_kernel_path_too():
  recipe = get_recipe("te_fp8_delayedscaling")
  history = delayed.init_history(recipe).at[:, 0].set(jnp.float32([0.7, 3.1, 41.0]))
  x = _lognormal(jax.random.key(5), (M, K)).astype(jnp.bfloat16)
  w = _lognormal(jax.random.key(6), (K, N)) * 0.05
  dy = _lognormal(jax.random.key(7), (M, N)).astype(jnp.bfloat16)

  def run(kernels, x, w, dy, h):
    y, vjp = jax.vjp(lambda x, w, h: delayed.qmatmul_delayed(x, w, recipe, h, kernels), x, w, h)
    return (y, *vjp(dy))

  got = jax.jit(lambda *a: run(Kernels.INTERPRET, *a))(x, w, dy, history)
  want = jax.jit(lambda *a: run(Kernels.XLA, *a))(x, w, dy, history)
  for g, w_ in zip(got, want):
    assert same_bits(g, w_)
