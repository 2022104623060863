"""gemms.py: one Plan per recipe says the operand roles, kept residuals and SR keys of the three GEMMs; the one-device
and the partitioned GEMM both read it, and on a one-device mesh the partitioned program has the one-device bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization import backends, gemms, get_recipe, partition, qdense
from MaxText.quantization.kernels.quantizer_impl import Kernels

AXES = ("data", "fsdp", "context", "tensor")
COLUMN = partition.GemmAxes(
  rows=(("data", "fsdp"), ("context",)), x_k=(), w_k=("fsdp", "context"), w_out=(("tensor",),), y_out=(("tensor",),)
)


def test_each_gemm_reads_its_roles_and_the_forward_keeps_what_the_backward_needs():
  nvfp4 = gemms.derive(get_recipe("te_nvfp4"))
  # 16x16 weight tiles: w^T's transpose is dgrad's w; x (1x16 blocks along K) is quantized again along the tokens.
  assert nvfp4 == gemms.Plan("quantized", (("x", "input"), ("w", "transposed")), (("w_t", "w"),))
  assert gemms.derive(get_recipe("te_nvfp4", disable_2d_quantization=True, disable_rht=True)).transposes == ()
  fp8 = gemms.derive(get_recipe("te_fp8_currentscaling"))  # one scale per tensor: every transpose the same numbers
  assert fp8.kept == (("x", "transposed"), ("w", "transposed"))
  assert [fp8.transpose_of(r) for r in ("w_t", "x_t", "dy_t")] == ["w", "x", "dy"]
  assert gemms.derive(get_recipe("te_mxfp8")).kept == (("x", "input"), ("w", "input"))
  high = gemms.derive(get_recipe("te_nvfp4", backward_override="high_precision"))
  assert (high.backward, high.kept) == ("high_precision", (("x", "input"), ("w", "input")))
  assert gemms.derive(get_recipe("te_nvfp4", backward_override="dequantized")).kept == (
    ("x", "operand"),
    ("w", "operand"),
  )
  with pytest.raises(ValueError, match="quantizes no operand"):
    gemms.derive(get_recipe(""))
  # The roles: each GEMM's two operands, each from an input or its transpose.
  assert {g: [gemms.OPERANDS[r] for r in roles] for g, roles in gemms.GEMMS.items()} == {
    "fprop": [("x", False), ("w", True)],
    "dgrad": [("dy", False), ("w", False)],
    "wgrad": [("x", True), ("dy", True)],
  }
  key = jax.random.key(3)
  assert [jax.random.key_data(k).tolist() for k in gemms.grad_keys(key).values()] == [
    jax.random.key_data(k).tolist() for k in jax.random.split(key)
  ]


def _fwd_bwd(f, x, w, dy):
  y, vjp = jax.vjp(f, x, w)
  return [np.asarray(a.astype(jnp.float32)) for a in (y, *vjp(dy))]


@pytest.mark.parametrize(
  "name, knobs",
  [
    ("te_nvfp4", {}),
    pytest.param("te_nvfp4", {"backward_override": "dequantized"}, marks=pytest.mark.slow),
    ("te_fp8_currentscaling", {}),
  ],
)
def test_one_plan_for_one_device_and_the_partitioned_gemm_and_the_same_bits_on_a_one_device_mesh(
  monkeypatch, name, knobs
):
  """Both paths ask gemms.derive for the recipe's plan (a spy on it; shapes of this test alone, so both are traced
  here), and the partitioned program
  (shard_map, amax reductions and SR draws by global index, on a mesh of one device) computes y, dx and dw bit for
  bit as the one-device custom_vjp."""
  recipe = get_recipe(name, **knobs)
  x = jax.random.normal(jax.random.key(0), (3, 32, 64), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (64, 96), jnp.float32) * 0.05
  dy = jax.random.normal(jax.random.key(2), (3, 32, 96), jnp.float32).astype(jnp.bfloat16)
  key = jax.random.key(5)
  asked, derive = [], gemms.derive
  monkeypatch.setattr(gemms, "derive", lambda r: asked.append(r) or derive(r))
  # Per-tensor FP8's own fused layer is the emulated backend's one-device path: the three GEMMs are the xla-path's.
  one_device = lambda x, w: backends.Backend.dense(backends.EMULATED, x, w, recipe, key=key, kernels=Kernels.XLA)
  one = _fwd_bwd(one_device, x, w, dy)
  assert asked and set(asked) == {recipe}
  asked.clear()
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1, 1), AXES)
  dense = lambda x, w: partition.dense(
    x, w, recipe, backends.EMULATED, key=key, kernels=Kernels.XLA, axes=COLUMN, mesh=mesh
  )
  with jax.set_mesh(mesh):
    mesh_out = _fwd_bwd(jax.jit(dense), x, w, dy)
  assert asked and set(asked) == {recipe}
  for a, b in zip(one, mesh_out):
    np.testing.assert_array_equal(a, b)


def test_qdense_resolves_the_backend_once_and_calls_its_dense(monkeypatch):
  """No identity or type dispatch: whatever the request resolves to, its dense is the call (a registered backend's
  too); an unquantized recipe resolves to BF16's dense whatever the request."""
  seen = []

  class Recording(backends.Backend):
    name = "recording"

    def dense(self, x, w, recipe, **kw):
      seen.append((recipe.name, kw["partition"], kw["history"]))
      return backends.Backend.dense(backends.EMULATED, x, w, recipe, **kw)

  resolved = []
  real = backends.resolve
  monkeypatch.setattr(backends, "resolve", lambda r, b=backends.Choice.AUTO: resolved.append(b) or real(r, b))
  x, w = jnp.ones((2, 4, 32), jnp.bfloat16), jnp.ones((32, 16), jnp.float32)
  recipe = get_recipe("te_fp8_currentscaling")
  y = qdense(x, w, recipe, backend=Recording(), kernels=Kernels.XLA)
  assert y.shape == (2, 4, 16) and seen == [("te_fp8_currentscaling", None, None)] and len(resolved) == 1
  np.testing.assert_array_equal(qdense(x, w, get_recipe(""), backend=Recording()), jnp.full((2, 4, 16), 32.0))
  assert len(seen) == 1
