"""partition.py: a shard's stochastic-rounding draws and quantized bits equal the whole operand's, and the partitioned
GEMM (8 virtual CPU devices, a subprocess) gives one device's outputs on fsdp, tensor and context meshes, row and
column GEMMs, a fused kernel, per backend and recipe."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization import partition
from MaxText.quantization.formats import grids
from tests.conftest import run_on_cpu_devices


@pytest.mark.parametrize("shape", [(64, 48), (33, 7), (1, 5), (96, 130)])
def test_draws_of_a_window_are_the_whole_operands(shape):
  key = jax.random.fold_in(jax.random.key(3), 11)
  whole = np.asarray(grids.draws16(key, shape))
  rng = np.random.default_rng(1)
  rows = np.sort(rng.choice(shape[0], min(shape[0], 9), replace=False)).astype(np.uint32)
  cols = np.sort(rng.choice(shape[1], min(shape[1], 6), replace=False)).astype(np.uint32)
  got = partition.draws(key, shape, jnp.asarray(rows), jnp.asarray(cols))
  assert got.dtype == jnp.uint16
  np.testing.assert_array_equal(np.asarray(got), whole[rows][:, cols])


def test_draws_past_two_to_the_32_elements_are_a_function_of_row_and_column():
  """An operand of more than 2**33 elements (405B's wgrad gradient: [53248, 1048576]) draws by (row, column): the
  same as any operand's element at that row and column, the whole operand's shape playing no part."""
  key = jax.random.key(0)
  rows, cols = jnp.asarray([0, 8191, 26623, 53247], jnp.uint32), jnp.asarray([0, 5, 1048575], jnp.uint32)
  got = np.asarray(partition.draws(key, (53248, 1048576), rows, cols))
  small = np.asarray(partition.draws(key, (60000, 1048576 + 16), rows, cols))
  np.testing.assert_array_equal(got, small)
  assert len(np.unique(got)) == got.size


def test_refused_splits_say_what_to_change():
  with pytest.raises(partition.PartitionError, match="must lead the kernel's"):
    partition._minor_suffix(("context",), ("fsdp", "context"), "x's contraction")
  assert partition._minor_suffix(("fsdp",), ("fsdp", "context"), "x") == ("context",)
  assert partition._minor_suffix((), ("fsdp", "context"), "x") == ("fsdp", "context")


def test_a_block_split_over_shards_is_refused():
  from MaxText.quantization import get_recipe  # pylint: disable=import-outside-toplevel

  mesh = jax.sharding.AbstractMesh((1, 4, 2, 2), ("data", "fsdp", "context", "tensor"))
  axes = partition.GemmAxes(
    rows=(("data", "fsdp"), ("context",)), x_k=("tensor",), w_k=("tensor",), w_out=(("fsdp", "context"),), y_out=((),)
  )
  partition._check_blocks(get_recipe("te_nvfp4"), axes, mesh, (8, 64, 128), (128, 256))  # 32 tokens, K 64, N 32
  with pytest.raises(partition.PartitionError, match="a shard holds 16 of the kernel's last output dim, not a mult"):
    partition._check_blocks(get_recipe("mxfp4"), axes, mesh, (8, 128, 128), (128, 128))
  with pytest.raises(partition.PartitionError, match="holds 8 of the tokens of a wgrad operand"):
    partition._check_blocks(get_recipe("te_nvfp4"), axes, mesh, (8, 16, 128), (128, 256), backward=True)
  partition._check_blocks(get_recipe("te_nvfp4"), axes, mesh, (8, 16, 128), (128, 256))  # forward only: decoding
  partition._check_blocks(get_recipe("te_fp8_currentscaling"), axes, mesh, (8, 16, 128), (128, 8))  # no blocks


SCRIPT = r"""
import json, re, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from MaxText.quantization import backends, get_recipe, partition, qdense
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.partition import GemmAxes

AXES = ("data", "fsdp", "context", "tensor")
COLUMN = dict(rows=(("data", "fsdp"), ("context",)), x_k=(), w_k=("fsdp", "context"))
ROW = dict(rows=(("data", "fsdp"), ("context",)), x_k=("tensor",), w_k=("tensor",))
CASES = {  # mesh (data, fsdp, context, tensor), GEMM axes, kernel output dims
  "fsdp8": ((1, 8, 1, 1), GemmAxes(**COLUMN, w_out=(("tensor",),), y_out=(("tensor",),)), (64,)),
  "data2_fsdp4": ((2, 4, 1, 1), GemmAxes(**COLUMN, w_out=(("tensor",),), y_out=(("tensor",),)), (64,)),
  "fsdp4_tensor2": ((1, 4, 1, 2), GemmAxes(**COLUMN, w_out=(("tensor",),), y_out=(("tensor",),)), (64,)),
  "fsdp2_context2_tensor2": ((1, 2, 2, 2), GemmAxes(**COLUMN, w_out=(("tensor",),), y_out=(("tensor",),)), (64,)),
  "row_fsdp4_tensor2": ((1, 4, 1, 2), GemmAxes(**ROW, w_out=(("fsdp", "context"),), y_out=((),)), (128,)),
  "fused_fsdp4_tensor2": ((1, 4, 1, 2), GemmAxes(**COLUMN, w_out=((), ("tensor",)), y_out=((), ("tensor",))), (2, 64)),
}
recipes, cases, extras = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
x = jax.random.normal(jax.random.key(0), (8, 64, 128), jnp.float32)
key = jax.random.key(5)
out = {}
def recipe_of(spec):  # "name" or "name:knob=value,knob=value"
  name, _, knobs = spec.partition(":")
  values = dict(kv.split("=") for kv in knobs.split(",") if kv)
  return get_recipe(name, **{k: {"true": True, "false": False}.get(v, v) for k, v in values.items()})


for name in recipes:
  recipe = recipe_of(name)
  for case in cases:
    shape, axes, out_dims = CASES[case]
    w = jax.random.normal(jax.random.key(1), (128, *out_dims), jnp.float32) * 0.05
    dy = jax.random.normal(jax.random.key(2), (8, 64, *out_dims), jnp.float32)

    def run(x, w, dy, part):
      f = lambda x, w: qdense(x, w, recipe, key=key, backend=backends.Choice.EMULATE, partition=part)
      y, vjp = jax.vjp(f, x, w)
      return (y, *vjp(dy))

    want = jax.jit(lambda x, w, dy: run(x, w, dy, None))(x, w, dy)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), AXES)
    with jax.set_mesh(mesh):
      put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
      args = put(x, axes.x_spec), put(w, axes.w_spec), put(dy, axes.y_spec)
      got = jax.jit(lambda x, w, dy: run(x, w, dy, axes))(*args)
    want, got = [np.asarray(a) for a in want], [np.asarray(b) for b in got]
    rel = [float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in zip(want, got)]
    exact = [bool(np.array_equal(a, b)) for a, b in zip(want, got)]
    out[f"{name or 'bf16'}/{case}"] = dict(rel=rel, exact=exact)

# A shard quantized where it lies (amax over the mesh, draws of its elements) has the whole operand's bits.
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(1, 4, 1, 2), AXES)
row_scales = jnp.exp(jax.random.normal(jax.random.key(8), (64, 1)))
a = jax.random.normal(jax.random.key(7), (64, 128), jnp.float32) * row_scales
for name in recipes:
  recipe = recipe_of(name)
  for role in ("x", "w", "dy", "x_t", "dy_t"):
    backend = backends.EMULATED
    whole = backend.quantize(a, recipe, role, key, kernels=Kernels.XLA)

    def local(a_l, _role=role):
      rows = partition.global_indices(mesh, (a_l.shape[0],), (("fsdp",),))
      cols = partition.global_indices(mesh, (a_l.shape[1],), (("tensor",),))
      extra = {}
      if recipe.stochastic_rounding(_role):
        extra["draws"] = partition.draws(key, a.shape, rows, cols)
      q = backend.quantize(a_l, recipe, _role, key, kernels=Kernels.XLA, amax_axes=("fsdp", "tensor"), **extra)
      return q.values

    with jax.set_mesh(mesh):
      got = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("fsdp", "tensor"), out_specs=P("fsdp", "tensor"),
                                  check_vma=False))(a)
    out[f"shard/{name}/{role}"] = bool(np.array_equal(np.asarray(whole.values), np.asarray(got)))

if "xla_interpret" in extras:  # the xla backend's narrow Pallas operands (interpret mode) on each shard
  from MaxText.quantization.backends import xla as xla_backend
  bits = lambda v: np.asarray(jnp.asarray(v).astype(jnp.float32)).view(np.uint32)
  for name in recipes:
    recipe = recipe_of(name)
    for role, transpose in (("x", False), ("w", True), ("x_t", True), ("dy", False), ("dy_t", True)):
      whole = xla_backend.BACKEND.quantize(a, recipe, role, key, kernels=Kernels.XLA, transpose=transpose)
      out_spec = P("tensor", "fsdp") if transpose else P("fsdp", "tensor")

      def local(a_l, _role=role, _transpose=transpose):
        rows = partition.global_indices(mesh, (a_l.shape[0],), (("fsdp",),))
        cols = partition.global_indices(mesh, (a_l.shape[1],), (("tensor",),))
        extra = {}
        if recipe.stochastic_rounding(_role):  # the operand's draws, transposed or not (the XLA path takes these)
          shape, r, c = (a.shape[::-1], cols, rows) if _transpose else (a.shape, rows, cols)
          extra["draws"] = partition.draws(key, shape, r, c)
        q = xla_backend.BACKEND.quantize(a_l, recipe, _role, key, kernels=Kernels.INTERPRET, transpose=_transpose,
                                         amax_axes=("fsdp", "tensor"), **extra)
        return q.values.astype(jnp.float32), q.scales.astype(jnp.float32), jnp.full((1, 1), q.global_scale)

      with jax.set_mesh(mesh):
        got = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("fsdp", "tensor"), check_vma=False,
                                    out_specs=(out_spec, out_spec, P("fsdp", "tensor"))))(a)
      names = str(jax.make_jaxpr(jax.shard_map(local, mesh=mesh, in_specs=P("fsdp", "tensor"), check_vma=False,
                                               out_specs=(out_spec, out_spec, P("fsdp", "tensor"))))(a))
      out[f"xla_interpret/{name}/{role}"] = dict(
        kernel="_narrow" in names,
        values=bool(np.array_equal(bits(whole.values), bits(got[0]))),
        scales=bool(np.array_equal(bits(whole.scales), bits(got[1]))),
        amax=bool(np.all(bits(got[2]) == bits(whole.global_scale))),
      )

if "interpret" in extras:  # the Pallas kernels (interpret mode) on each shard: the XLA quantizers' bits
  shape, axes, out_dims = CASES["fsdp4_tensor2"]
  w = jax.random.normal(jax.random.key(1), (128, *out_dims), jnp.float32) * 0.05
  dy = jax.random.normal(jax.random.key(2), (8, 64, *out_dims), jnp.float32)
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), AXES)
  runs = {}
  for kernels in (Kernels.XLA, Kernels.INTERPRET):
    f = lambda x, w, _k=kernels: qdense(x, w, get_recipe("te_nvfp4"), key=key, backend=backends.Choice.EMULATE,
                                        kernels=_k, partition=axes)
    with jax.set_mesh(mesh):
      y, vjp = jax.vjp(jax.jit(f), x, w)
      runs[kernels] = [np.asarray(a) for a in (y, *vjp(dy))]
  out["interpret"] = [bool(np.array_equal(a, b)) for a, b in zip(runs[Kernels.XLA], runs[Kernels.INTERPRET])]

if "export_xla" in extras:  # the xla backend lowered for CUDA: block-scaled dots, FP4 + E4M3 gathered
  from MaxText.quantization.backends import xla as xla_backend
  real = xla_backend.unavailable_reason
  xla_backend.unavailable_reason = lambda recipe, platform=None: real(recipe, "gpu")
  shape, axes, out_dims = CASES["fsdp4_tensor2"]
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), AXES)
  args = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, spec)) for s, d, spec in
          (((8, 64, 128), jnp.bfloat16, axes.x_spec), ((128, *out_dims), jnp.float32, axes.w_spec))]
  loss = lambda x, w: jnp.sum(qdense(x, w, get_recipe("te_nvfp4"), key=key, backend=backends.Choice.XLA,
                                     partition=axes).astype(jnp.float32) ** 2)
  with jax.set_mesh(mesh):
    exported = jax.export.export(
      jax.jit(jax.grad(loss, argnums=(0, 1))), platforms=["cuda"],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__op$block_scaled_dot")])(*args)
  text = exported.mlir_module()
  gathered = re.findall(r'"stablehlo\.all_gather".*: \(tensor<[\dx]*x(\w+)>\)', text)
  from tests.quantization.backends.test_xla import _block_scaled_dots
  dot_dtypes = sorted(set(re.findall(r'block_scaled_dot.*-> tensor<[\dx]*x(\w+)>', text)))
  out["export_xla"] = dict(gathered=gathered, block_scaled_dots=len(_block_scaled_dots(text)),
                           reduce_scatters=text.count('"stablehlo.reduce_scatter"'), dot_dtypes=dot_dtypes)
print("RESULT" + json.dumps(out))
"""


def _run(recipes, cases, extras=()):
  return run_on_cpu_devices(SCRIPT, json.dumps(recipes), json.dumps(cases), json.dumps(list(extras)))


@pytest.mark.slow
def test_partitioned_gemm_equals_one_device():
  """te_nvfp4 (RHT, SR, 16x16 weight tiles) on every kind of split; the quantized operands bit for bit. Where a
  contraction is split (dgrad and wgrad over tokens or tensor shards, a row GEMM's forward) the f32 partial sums are
  added in another order than one device's dot: equal to f32 rounding."""
  out = _run(
    ["te_nvfp4"],
    ["fsdp8", "data2_fsdp4", "fsdp4_tensor2", "fsdp2_context2_tensor2", "row_fsdp4_tensor2", "fused_fsdp4_tensor2"],
    ["interpret", "export_xla"],
  )
  # The Pallas kernels quantize each shard (the SR gradients with the XLA quantizers): the same outputs, bit for bit.
  assert out.pop("interpret") == [True, True, True]
  # The xla backend: fprop, dgrad and wgrad block-scaled; the weight all-gathered as E2M1 values and E4M3 scales (what
  # XLA reads, 4.5 bits per weight against BF16's 16); one reduce-scatter, the wgrad.
  exported = out.pop("export_xla")
  assert exported["block_scaled_dots"] == 3 and exported["reduce_scatters"] == 1
  # Each dot emits the compute dtype (bf16), as one device's: the forward splits no sum, the dgrad and wgrad are rounded
  # to bf16 before they are reduced.
  assert exported["dot_dtypes"] == ["bf16"], exported
  assert sorted(exported["gathered"]) == ["f4E2M1FN", "f8E4M3FN"], exported
  for label, value in out.items():
    if label.startswith("shard/"):
      assert value, label
      continue
    assert max(value["rel"]) < 1e-6, (label, value)
    y_exact, dx_exact, _ = value["exact"]
    assert y_exact or label.endswith("row_fsdp4_tensor2"), label  # a column GEMM's forward splits no sum
    assert dx_exact or "tensor2" in label, label  # the dgrad sums over tensor shards only


@pytest.mark.slow
def test_the_xla_backends_pallas_operands_per_shard_are_the_whole_operands():
  """The xla backend's narrow kernels (interpret mode) on each shard of a 4 x 2 mesh, rows of very different
  magnitudes: the plain amax (XLA's reduction in the producer, no RHT) and the RHT amax pass's each the largest over
  the mesh, so E2M1 values, E4M3 scales and the per-tensor amax are the whole operand's bits; the SR roles, given their
  draws in the whole operand, take the XLA path, the same bits."""
  out = _run(["te_nvfp4", "te_nvfp4_no_rht"], [], ["xla_interpret"])
  checked = {label: value for label, value in out.items() if label.startswith("xla_interpret/")}
  assert len(checked) == 10
  for label, value in checked.items():
    sr = label.endswith("/dy") or label.endswith("/dy_t")
    assert value == dict(kernel=not sr, values=True, scales=True, amax=True), (label, value)


@pytest.mark.slow
@pytest.mark.parametrize(
  "name",
  [
    "te_nvfp4_no_rht",
    "te_fp8_currentscaling",
    "te_mxfp8",
    "mxfp4",
    "te_nvfp4:disable_2d_quantization=true,disable_rht=true",
    "te_nvfp4:backward_override=dequantized",
    "te_nvfp4:backward_override=high_precision",
  ],
)
def test_partitioned_gemm_equals_one_device_for_every_recipe(name):
  out = _run([name], ["fsdp2_context2_tensor2", "row_fsdp4_tensor2", "fused_fsdp4_tensor2"])
  for label, value in out.items():
    if label.startswith("shard/"):
      assert value, label
    else:
      assert max(value["rel"]) < 1e-6, (label, value)
