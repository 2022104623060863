"""The device mesh from MaxText's ici_*/dcn_* keys, logical axis rules, and parameter / activation shardings.

Mesh axes: data (replicas), fsdp (parameters and batch sharded), context (sequence), tensor (heads,
MLP width, vocabulary). dcn_* split the processes (nodes, outermost), ici_* the devices within each.
"""

import contextlib
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from MaxText.errors import UserError
from MaxText.quantization.backends import te as te_backend

MESH_AXES = ("data", "fsdp", "context", "tensor")

# Logical axis -> mesh axes (MaxText's names). Parameters shard their embed dim over fsdp (and
# context, as MaxText does), heads / MLP / vocab over tensor; activations their batch over data+fsdp.
LOGICAL_RULES = {
  "vocab": ("tensor",),
  "embed": ("fsdp", "context"),
  "mlp": ("tensor",),
  "num_activations": (),  # fused_mlp's [embed, 2, mlp] kernel: gate and up of the same mlp columns stay together
  "heads": ("tensor",),
  "kv_heads": ("tensor",),
  "layers": (),
  "norm": (),
  "activation_batch": ("data", "fsdp"),
  "activation_length": ("context",),
  "activation_embed": (),
  "activation_mlp": ("tensor",),
  "activation_heads": ("tensor",),
  "activation_vocab": ("tensor",),
}

# Parameter path (nnx state keys, joined by "/") -> logical axes of each dimension.
PARAM_AXES = {
  "embed/embedding": ("vocab", "embed"),
  "lm_head": ("embed", "vocab"),
  "final_norm/scale": ("norm",),
  "layers/pre_attention_norm/scale": ("layers", "norm"),
  "layers/pre_mlp_norm/scale": ("layers", "norm"),
  "layers/attention/query/kernel": ("layers", "embed", "heads"),
  "layers/attention/key/kernel": ("layers", "embed", "kv_heads"),
  "layers/attention/value/kernel": ("layers", "embed", "kv_heads"),
  "layers/attention/out/kernel": ("layers", "heads", "embed"),
  "layers/mlp/gate/kernel": ("layers", "embed", "mlp"),
  "layers/mlp/up/kernel": ("layers", "embed", "mlp"),
  "layers/mlp/gate_up/kernel": ("layers", "embed", "num_activations", "mlp"),
  "layers/mlp/down/kernel": ("layers", "mlp", "embed"),
}
BATCH_AXES = ("activation_batch", "activation_length")


class ShardingError(UserError, ValueError):
  """A mesh that doesn't fit the devices or the model: a user error."""


def _resolve(values, total, kind):
  """Fill one -1 so the product is `total`."""
  values = list(values)
  unknown = [i for i, v in enumerate(values) if v == -1]
  known = math.prod(v for v in values if v != -1)
  if len(unknown) > 1:
    raise ShardingError(f"only one {kind}_* parallelism may be -1, got {dict(zip(MESH_AXES, values))}")
  if any(v == 0 or v < -1 for v in values):
    raise ShardingError(f"{kind}_* parallelism must be positive or -1, got {dict(zip(MESH_AXES, values))}")
  if unknown:
    if total % known:
      named = ", ".join(f"{kind}_{a}_parallelism={v}" for a, v in zip(MESH_AXES, values) if v != 1)
      what, advice = (
        ("processes (one per host)", "hosts (nodes; for train_compile, compile_topology_num_slices)")
        if kind == "dcn"
        else ("devices in each dcn_* group (each host)", "devices per host")
      )
      raise ShardingError(
        f"{named} needs a multiple of {known} {what}, and there are {total}: change the {kind}_* keys, or use a "
        f"multiple of {known} {advice}"
      )
    values[unknown[0]] = total // known
  return values


def mesh_shape(cfg, num_devices, num_processes=1):
  """{axis: size} from the ici_*/dcn_* keys; dcn -1 fills to the processes, ici -1 to the devices per dcn group."""
  dcn = _resolve([getattr(cfg, f"dcn_{a}_parallelism") for a in MESH_AXES], num_processes, "dcn")
  dcn_total = math.prod(dcn)
  if num_devices % dcn_total:
    raise ShardingError(f"dcn_* product {dcn_total} doesn't divide the {num_devices} devices")
  ici = _resolve([getattr(cfg, f"ici_{a}_parallelism") for a in MESH_AXES], num_devices // dcn_total, "ici")
  shape = {a: d * i for a, d, i in zip(MESH_AXES, dcn, ici)}
  if math.prod(shape.values()) != num_devices:
    keys = ", ".join(
      f"{k}_{a}_parallelism={v}" for k, vals in (("ici", ici), ("dcn", dcn)) for a, v in zip(MESH_AXES, vals) if v != 1
    )
    raise ShardingError(
      f"the mesh ({keys or 'all 1'}) has {math.prod(shape.values())} devices but there are "
      f"{num_devices}; make the ici_* x dcn_* product match, or set one of them to -1"
    )
  return shape, dict(zip(MESH_AXES, dcn)), dict(zip(MESH_AXES, ici))


def make_mesh(cfg, devices=None):
  """The Mesh over `devices` (default all): processes split along the dcn axes, outermost."""
  devices = list(devices if devices is not None else jax.devices())
  num_processes = len({d.process_index for d in devices})
  shape, dcn, ici = mesh_shape(cfg, len(devices), num_processes)
  ordered = np.array(sorted(devices, key=lambda d: (d.process_index, d.id)), dtype=object)
  # [dcn axes..., ici axes...] then interleave each dcn axis with its ici axis.
  grid = ordered.reshape([dcn[a] for a in MESH_AXES] + [ici[a] for a in MESH_AXES])
  n = len(MESH_AXES)
  grid = grid.transpose([k for i in range(n) for k in (i, n + i)]).reshape([shape[a] for a in MESH_AXES])
  return Mesh(grid, MESH_AXES)


def logical_to_spec(logical_axes, shape, mesh_sizes, *, strict=True, what="array"):
  """PartitionSpec for an array with these logical axes; a dim is split over its rule's mesh axes of size > 1.

  strict: a dim that those axes don't divide is an error (parameters); otherwise it stays unsplit
  (activations).
  """
  dims = mesh_axes(logical_axes, shape, mesh_sizes, strict=strict, what=what)
  return P(*(None if not axes else axes[0] if len(axes) == 1 else axes for axes in dims))


def mesh_axes(logical_axes, shape, mesh_sizes, *, strict=True, what="array"):
  """logical_to_spec as a tuple of mesh-axis tuples, one per dim (() for an unsplit dim)."""
  spec, used = [], set()
  for dim, name in zip(shape, logical_axes):
    axes = tuple(a for a in LOGICAL_RULES[name] if mesh_sizes.get(a, 1) > 1 and a not in used)
    size = math.prod(mesh_sizes[a] for a in axes)
    if axes and dim % size:
      if strict:
        raise ShardingError(
          f"{what}: dimension {name} of size {dim} can't be split over mesh axes {axes} "
          f"({size} ways); change the parallelism keys or the model size"
        )
      axes = ()
    used.update(axes)
    spec.append(axes)
  return tuple(spec)


def param_path(path):
  """ "layers/mlp/gate/kernel" from a pytree path (attribute steps such as a Variable's .value dropped)."""
  return "/".join(str(k.key) if hasattr(k, "key") else str(k.idx) for k in path if not hasattr(k, "name"))


def param_specs(params, mesh_sizes):
  """PartitionSpecs for an nnx Param state (same tree), from PARAM_AXES and LOGICAL_RULES."""

  def spec(path, leaf):
    name = param_path(path)
    if name not in PARAM_AXES:
      raise ShardingError(f"parameter {name} has no logical axes in MaxText/runtime/sharding.py PARAM_AXES")
    return logical_to_spec(PARAM_AXES[name], leaf.shape, mesh_sizes, what=f"parameter {name}")

  return jax.tree_util.tree_map_with_path(spec, params)


def param_shardings(params, mesh):
  return jax.tree.map(
    lambda s: NamedSharding(mesh, s), param_specs(params, dict(mesh.shape)), is_leaf=lambda x: isinstance(x, P)
  )


def batch_sharding(mesh):
  """[B, L] inputs: batch over data+fsdp, length over context."""
  return NamedSharding(mesh, logical_to_spec(BATCH_AXES, (0, 0), dict(mesh.shape), strict=False))


@contextlib.contextmanager
def use_mesh(mesh):
  """Inside: `mesh` is the current mesh (jax.set_mesh), and Transformer Engine's GEMMs are partitioned by TE's rules
  with its data, fsdp, tensor and context axes (TE's MeshResource, what upstream MaxText sets for a run). Trace,
  compile and run a program that may hold TE GEMMs inside it."""
  with jax.set_mesh(mesh), te_backend.mesh_resource(data="data", fsdp="fsdp", tensor="tensor", context="context"):
    yield


def constrain(x, logical_axes):
  """with_sharding_constraint by logical axes under the current mesh (jax.set_mesh); a no-op without one."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, dict(mesh.shape), strict=False))


def check_quantization_blocks(cfg, mesh_sizes, block_sizes):
  """Every quantized GEMM's scaling blocks must lie within one shard: a clear error otherwise.

  `block_sizes`: {gemm: block elements along each contraction axis (16 NVFP4, 32 MX, 1 none)}.
  Weight blocks run along both kernel dims (2D tiles / both GEMM directions); the wgrad operands
  block along tokens, which are split by batch (data x fsdp) and, within a sequence, by context.
  """
  gemm_params = {
    "q": "layers/attention/query/kernel",
    "k": "layers/attention/key/kernel",
    "v": "layers/attention/value/kernel",
    "o": "layers/attention/out/kernel",
    "gate": "layers/mlp/gate/kernel",
    "up": "layers/mlp/up/kernel",
    "down": "layers/mlp/down/kernel",
  }
  if cfg.fused_mlp:
    gemm_params.update(gate="layers/mlp/gate_up/kernel", up="layers/mlp/gate_up/kernel")
  dims = {
    "embed": cfg.base_emb_dim,
    "mlp": cfg.base_mlp_dim,
    "heads": cfg.base_num_query_heads * cfg.head_dim,
    "kv_heads": cfg.base_num_kv_heads * cfg.head_dim,
  }
  for gemm, block in block_sizes.items():
    if block <= 1:
      continue
    for logical in (a for a in PARAM_AXES[gemm_params[gemm]][1:] if a in dims):
      shards = math.prod(mesh_sizes.get(a, 1) for a in LOGICAL_RULES[logical])
      if dims[logical] % shards == 0 and (dims[logical] // shards) % block:
        raise ShardingError(
          f"{gemm} GEMM: a shard holds {dims[logical] // shards} of its {logical} dimension "
          f"({dims[logical]} over {shards}), not a multiple of the {block}-element quantization "
          "blocks; use fewer shards on that axis or keep that GEMM in bf16"
        )
    micro_tokens = cfg.per_device_batch_size * cfg.max_target_length / cfg.gradient_accumulation_steps
    if micro_tokens == int(micro_tokens) and int(micro_tokens) % block:
      raise ShardingError(
        f"{gemm} GEMM: its wgrad operands are quantized in {block}-token blocks, but a micro-batch "
        f"holds {micro_tokens:g} tokens per device (per_device_batch_size x max_target_length / "
        f"gradient_accumulation_steps); make that a multiple of {block} or keep that GEMM in bf16"
      )
    context = mesh_sizes.get("context", 1)
    tokens_per_shard = cfg.max_target_length // context
    if context > 1 and tokens_per_shard % block:
      raise ShardingError(
        f"{gemm} GEMM: context parallelism {context} leaves {tokens_per_shard} tokens of each "
        f"sequence per shard, not a multiple of the {block}-element wgrad blocks; change "
        "max_target_length or ici/dcn_context_parallelism"
      )
