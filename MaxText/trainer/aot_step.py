"""The trainer's own train step compiled ahead of time, nothing run and nothing allocated: for a GPU target that is not
here (compile_topology's compile-only devices) or for this machine's devices. What the compiled program holds: XLA's
memory analysis, every kernel (GEMMs by kind, attention, collectives, elementwise), and a roofline estimate of its
time. train_compile's engine, and the compiled figure dry_run and the preflight check memory with.

The step is the one the run would execute (StepFunctions' variant for a step without telemetry): the run's mesh and
shardings, its donation, remat policy and precision plan, with the backends and kernels the target would pick
(quantization/target.py), compiled with the XLA flags the project's GPU jobs set (runtime/xla_flags.py) unless
$XLA_FLAGS sets them.
"""

import contextlib
import dataclasses
import pathlib
import time
import typing

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from MaxText import precision
from MaxText.aot import devices as aot_devices, dump, hlo, roofline, targets
from MaxText.config import RunShape, hardware
from MaxText.data.batch import Batch
from MaxText.model import accounting
from MaxText.quantization import backends, partition, target as quant_target
from MaxText.quantization.backends import te as te_backend
from MaxText.runtime import sharding, xla_flags
from MaxText.trainer import optimizer, preflight, run_setup
from MaxText.trainer.hooks.profiler import compiled_memory
from MaxText.trainer.train_step import StepFunctions

GIB = 2**30
memory_fraction = targets.memory_fraction  # the share of a GPU's memory jax's allocator takes


@dataclasses.dataclass
class CompiledStep:
  """A compiled train step and what it holds, per device."""

  target: str  # 'h100-8', or the local devices' kind
  gpu: typing.Optional[targets.Gpu]  # None: a device the target table doesn't know (no estimate)
  num_devices: int
  mesh: dict  # {axis: size}
  memory: dict  # argument/output/alias/temp/peak bytes (XLA's memory analysis), device_bytes, available_bytes
  kernels: list  # hlo.Kernel of the optimized program
  hlo_text: str
  module: hlo.Module  # the optimized program, parsed (its schedule: the estimate's order)
  seconds: float  # lowering + compiling
  backends: dict  # {recipe: the backend (and quantizer kernels) that ran it}
  flops_per_device: float  # MaxText's training FLOPs per device per step
  tokens_per_device: float

  @property
  def fits(self):
    """Whether the step fits the memory the device leaves it (True where that is unknown: 0)."""
    available = self.memory["available_bytes"]
    return available <= 0 or self.memory["peak_bytes"] <= available

  def summary(self):
    return hlo.summary(self.kernels)

  def estimate(self, calibration=roofline.DEFAULT):
    """The roofline estimate on the target GPU (None where the GPU is not in the target table)."""
    if self.gpu is None:
      return None
    return roofline.estimate(
      self.kernels, self.gpu, calibration, self.flops_per_device, self.tokens_per_device, module=self.module
    )


def _steady_step(cfg):
  """A step index the run executes with the plan's usual program: the first after 0 without quantization telemetry."""
  period = cfg.quantization_stats_period
  step = 1
  while period > 1 and step % period == 0:
    step += 1
  return step


def abstract_inputs(cfg, mesh, run_shape):
  """(graphdef, optimizer, the state's shardings (params, rest, opt_state), the step's abstract arguments) on `mesh`:
  the train state exactly as the run builds it (run_setup.abstract_train_state: every leaf in its sharding) and the
  batch, step and seed key, as jax.ShapeDtypeStruct."""
  tx = optimizer.make_optimizer(cfg)
  graphdef, state = run_setup.abstract_train_state(cfg, mesh, tx)
  replicated = NamedSharding(mesh, P())
  batch_sharding = sharding.batch_sharding(mesh)
  rows, length = run_shape.global_batch_size, cfg.max_target_length
  dtype = lambda field: jnp.float32 if field == "weights" else jnp.int32
  batch = {f: jax.ShapeDtypeStruct((rows, length), dtype(f), sharding=batch_sharding) for f in Batch._fields}
  key_type = jax.eval_shape(lambda: jax.random.key(0))
  args = (
    state.params,
    state.rest,
    state.opt_state,
    batch,
    jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    jax.ShapeDtypeStruct(key_type.shape, key_type.dtype, sharding=replicated),
  )
  return graphdef, tx, run_setup.state_shardings(state), args


def _backends_used(plan, partitioned):
  """{recipe name: 'backend' or 'backend (kernels)'} of the quantized GEMMs, as resolved for the target;
  `partitioned`: the mesh splits something (more than one device)."""
  out = {}
  for _, _, gemms in plan.layer_ranges:
    for prec in gemms.values():
      if not prec.recipe.quantized:
        continue
      backend = backends.resolve(prec.recipe, prec.backend)
      text = backend.name
      if backend in (backends.EMULATED, backends.XLA):  # a stateless recipe's GEMMs are partitioned: per shard
        per_shard = partitioned and not prec.recipe.stateful
        kernels = partition.per_shard_kernels(prec.kernels) if per_shard else prec.kernels
        text += f" ({backend.quantizers(kernels, prec.recipe)} quantizers)"
      out[prec.recipe.name] = text
  return out


def compile_step(
  cfg, devices, gpu=None, *, target_name=None, compile_only=True, devices_per_domain=None, xla_options=None
):
  """The CompiledStep of `cfg`'s train step over `devices` (compile-only devices of a GPU target when
  `compile_only`, else this machine's), with `gpu` (aot.targets.Gpu) for the memory limit and the estimate.
  `devices_per_domain`: GPUs per NVLink domain (default: per process). `xla_options`: per-compilation XLA options
  (default: the project's GPU flags for compile-only devices, none for local devices, which compile as the run will,
  with $XLA_FLAGS)."""
  start = time.perf_counter()
  devices = list(devices)
  hw = gpu_hardware(gpu, target_name) if compile_only else preflight.local_hardware(cfg, devices)
  processes = len({d.process_index for d in devices})  # as sharding.make_mesh splits them
  cfg, _ = preflight.resolve_auto(cfg, hw, len(devices), processes)  # the auto values, as the run would make them
  mesh = sharding.make_mesh(cfg, devices)
  run_shape = RunShape.of(cfg, len(devices))
  plan = precision.plan_from_config(cfg)
  sm = gpu.sm if gpu is not None else None
  named = contextlib.ExitStack()
  if compile_only:
    named.enter_context(quant_target.compiling_for(sm, len(devices)))
    if plan.quantized and sm is not None:
      named.enter_context(te_backend.compiling_for_sm(sm))  # TE asks the driver, which isn't the target's
  # Outside the mesh's context: optax's tree_map_params initializes the optimizer eagerly (a jnp.zeros), which no
  # compile-only device can hold; on the default (host) device it holds nothing that matters.
  graphdef, tx, state_shardings, args = abstract_inputs(cfg, mesh, run_shape)
  with named, sharding.use_mesh(mesh):  # Transformer Engine's GEMMs partitioned by its rules, traced and compiled
    steps = StepFunctions(cfg, graphdef, tx, plan, state_shardings, seed_key=None)
    _, step_fn = steps.for_step(_steady_step(cfg))
    with jax.default_device(devices[0]):  # Pallas' Triton lowering asks the default device for its GPU
      lowered = step_fn.lower(*args)
    used = _backends_used(plan, any(size > 1 for size in mesh.shape.values()))
    if xla_options is None:
      xla_options = xla_flags.compiler_options(len(devices)) if compile_only else {}
    if compile_only:  # a GPU target: its kernels' code read from the compiler's dump
      compiled, code = dump.compile_reading_code(lowered, xla_options)
    else:
      compiled, code = lowered.compile(compiler_options=xla_options or None), {}
  text = compiled.as_text()
  domain = devices_per_domain or len(devices) // len({d.process_index for d in devices})
  module = hlo.parse(text)
  return CompiledStep(
    target=target_name or devices[0].device_kind,
    gpu=gpu,
    num_devices=len(devices),
    mesh=dict(mesh.shape),
    memory=_step_memory(compiled, gpu, devices, compile_only),
    kernels=_kernels_with_code(module, code, len(devices), domain),
    hlo_text=text,
    module=module,
    seconds=time.perf_counter() - start,
    backends=used,
    flops_per_device=accounting.training_flops_per_device(cfg).total,
    tokens_per_device=run_shape.tokens_per_step / len(devices),
  )


def _step_memory(compiled, gpu, devices, compile_only):
  """XLA's memory analysis of the compiled step with what the device has and leaves it (its bytes, and the share
  jax's allocator takes: a target's at the memory fraction, this machine's as its allocator reports)."""
  memory = compiled_memory(compiled) or {}
  if compile_only:
    device_bytes = gpu.device_memory_size if gpu is not None else 0
    memory["device_bytes"], memory["available_bytes"] = device_bytes, int(device_bytes * memory_fraction())
  else:  # this machine's devices: what jax's allocator has (its limit, the memory fraction applied)
    memory["device_bytes"] = memory["available_bytes"] = _local_bytes_limit(devices)
  return memory


def _kernels_with_code(module, code, num_devices, devices_per_domain):
  """The module's kernels (hlo.kernels), each with its code from the compiler's dump where there is some."""
  kernel_list = hlo.kernels(module, num_devices, devices_per_domain)
  for kernel in kernel_list:
    kernel.code = code.get(kernel.name)
  return kernel_list


def gpu_hardware(gpu, what=None):
  """The config.hardware.Hardware of a GPU target (None: an unknown GPU), with the memory jax's allocator takes."""
  if gpu is None:
    return hardware.Hardware("gpu", what=what or "an unknown GPU")
  major, minor = gpu.compute_capability
  return hardware.Hardware("gpu", major + minor / 10, gpu.usable_bytes(), what or gpu.name)


def _local_bytes_limit(devices):
  """The allocator's limit on this process's first device (another process's devices report nothing here)."""
  local = next((d for d in devices if d.process_index == jax.process_index()), devices[0])
  stats = local.memory_stats() if hasattr(local, "memory_stats") else None
  return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else 0


def compile_for_target(cfg, target):
  """compile_step for an aot.targets.Target on its compile-only devices (needs jax's CUDA plugin)."""
  devices = aot_devices.for_target(target)
  return compile_step(
    cfg, devices, target.gpu, target_name=target.name, compile_only=True, devices_per_domain=target.gpus_per_slice
  )


def from_saved(cfg, hlo_path, dump_dir):
  """The CompiledStep of a step compiled before for cfg.compile_topology, from its optimized HLO (compile_hlo) and
  the compiler's dump (XLA_FLAGS=--xla_dump_to): its kernels and schedule costed by the model as it is now, without
  compiling (memory: not in these files, so empty)."""
  target = named_target(cfg)
  module = hlo.parse(pathlib.Path(hlo_path).read_text(encoding="utf-8"))
  kernel_list = _kernels_with_code(module, dump.read(dump_dir), target.num_devices, target.gpus_per_slice)
  run_shape = RunShape.of(cfg, target.num_devices)
  return CompiledStep(
    target=target.name,
    gpu=target.gpu,
    num_devices=target.num_devices,
    mesh={},
    memory={},
    kernels=kernel_list,
    hlo_text="",
    module=module,
    seconds=0.0,
    backends={},
    flops_per_device=accounting.training_flops_per_device(cfg).total,
    tokens_per_device=run_shape.tokens_per_step / target.num_devices,
  )


def gib(nbytes):
  return nbytes / GIB


# -- the report --------------------------------------------------------------------------------------------------


def report(step: CompiledStep, cfg, calibration=roofline.DEFAULT):
  """The JSON report of a compiled step (train_compile's compile_report): target, memory, GEMMs by kind (and by
  model site), collectives' bytes per step, kernels launched per step, and the roofline estimate (labelled as a
  compiled estimate), with the dry run's analytic memory estimate beside XLA's figure."""
  found = step.summary()
  analytic = accounting.memory_per_device(cfg, step.mesh, RunShape.of(cfg, step.num_devices).micro_batch_size)
  estimate = step.estimate(calibration)
  if estimate is not None:
    estimate["what"] = (
      f"a compiled estimate for {step.target} (roofline of the optimized HLO, calibrated on {calibration.source}), "
      "not a measurement"
    )
    estimate["calibration"] = dataclasses.asdict(calibration)
    estimate["constants"] = roofline.constants(calibration)
  return {
    "target": step.target,
    "gpu": step.gpu.description if step.gpu is not None else None,
    "num_devices": step.num_devices,
    "mesh": step.mesh,
    "memory": {k: int(v) for k, v in step.memory.items()},
    "fits": step.fits,
    "memory_fraction": memory_fraction(),
    "analytic_memory_bytes": int(analytic.total_gib * GIB),
    "gemms": found["gemms"],
    "gemm_flops": found["gemm_flops"],
    "gemm_sites": found["gemm_sites"],
    "collectives": found["collectives"],
    "kernels": found["kernels"],
    "backends": step.backends,
    "estimate": estimate,
    "quantizer_kernels": roofline.quantizer_kernels(step.kernels, step.gpu, calibration) if step.gpu else {},
    "flops_per_device": step.flops_per_device,
    "compile_seconds": round(step.seconds, 2),
    "jax": jax.__version__,
  }


def differs(a, b, threshold=0.10):
  """Whether two figures differ by more than `threshold` of the larger."""
  return abs(a - b) > threshold * max(abs(a), abs(b), 1e-30)


def format_report(rep):
  """The short table train_compile prints."""
  mem = rep["memory"]
  lines = [
    f"target: {rep['target']} ({rep['num_devices']} x {rep['gpu'] or 'unknown GPU'}), mesh "
    + " x ".join(f"{a} {n}" for a, n in rep["mesh"].items())
    + f"; compiled in {rep['compile_seconds']:.1f} s (jax {rep['jax']})",
    f"memory per device: {gib(mem['peak_bytes']):.2f} GiB (XLA's memory analysis: arguments "
    f"{gib(mem['argument_bytes']):.2f} + outputs {gib(mem['output_bytes']):.2f} - donated "
    f"{gib(mem['alias_bytes']):.2f} + temporaries {gib(mem['temp_bytes']):.2f}); "
    f"{'fits' if rep['fits'] else 'does NOT fit'} in {gib(mem['available_bytes']):.1f} GiB",
  ]
  analytic = rep["analytic_memory_bytes"]
  if differs(analytic, mem["peak_bytes"]):
    lines.append(
      f"  the analytic estimate (dry_run) says {gib(analytic):.2f} GiB: {analytic / mem['peak_bytes'] - 1:+.0%}"
    )
  gemms = ", ".join(f"{k} {v:g}" for k, v in sorted(rep["gemms"].items())) or "none"
  lines.append(
    f"GEMMs per step: {gemms}"
    + ("  (naive_loop: a dot XLA could not hand to a library)" if "naive_loop" in rep["gemms"] else "")
  )
  sites = "; ".join(
    f"{site} " + ", ".join(f"{k} {v:g}" for k, v in sorted(kinds.items())) for site, kinds in rep["gemm_sites"].items()
  )
  lines.append(f"  by site: {sites}")
  if rep["backends"]:
    lines.append("  quantized GEMMs: " + ", ".join(f"{r} on {b}" for r, b in rep["backends"].items()))
  coll = ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in sorted(rep["collectives"].items())) or "none"
  lines.append(f"collectives per step (data per device): {coll}")
  if rep["estimate"] is not None:
    lines += format_estimate(rep["estimate"], rep["target"])
  lines += format_quantizer_kernels(rep.get("quantizer_kernels") or {}, rep["target"])
  return "\n".join(lines)


def format_estimate(est, target):
  """train_compile's lines on the step-time estimate: the scheduled total with its range, the categories, the
  collectives' exposed and hidden time, MFU, tokens/s and model TFLOP/s per device (point and range)."""
  ms, low, high = est["ms_per_step"], est["range_ms"]["low"], est["range_ms"]["high"]
  tflops, (tflops_low, tflops_high) = est["model_tflops_per_s_per_device"], est["model_tflops_range"]
  how = "as scheduled" if est.get("scheduled") else "categories added"
  lines = [
    f"estimate for {target} (compiled, not a measurement; constants fitted on one H100, targets' published rates): "
    f"{ms['total']:.1f} ms/step {how} (range {low:.1f} - {high:.1f})",
    f"  kernels: gemm {ms['gemm']:.1f} + elementwise {ms['elementwise']:.1f} + attention {ms['attention']:.1f} ms; "
    f"collectives {ms['collectives']:.1f} ms, of which exposed {ms['collectives_exposed']:.1f} and hidden "
    f"{ms['collectives_hidden']:.1f} behind compute",
  ]
  if tflops:
    lines.append(
      f"  MFU {est['mfu']:.1%}, {est['tokens_per_s_per_device']:,.0f} tokens/s/device, {tflops:,.0f} model TFLOP/s "
      f"per device (range {tflops_low:,.0f} - {tflops_high:,.0f})"
    )
  return lines


def format_quantizer_kernels(rows, target):
  """train_compile's lines on the quantizer kernels: per element of the tensor each reads, its thread-instructions
  (from the compiled PTX) and bytes, and whether its instructions or its bytes bound it on the target."""
  if not rows:
    return []
  lines = [f"quantizer kernels on {target} (estimate: thread-instructions from the compiled PTX, per element read):"]
  for name, row in rows.items():
    head = f"  {name}: {row['runs_per_step']:g} runs/step, {row['bytes_per_element']:.2f} B/element"
    if row["instructions_per_element"] is None:
      lines.append(f"{head}; bytes {row['bytes_ms']:.1f} ms/step ({row['bound']})")
      continue
    lines.append(
      f"{head}, {row['instructions_per_element']:.1f} instructions/element ({row['bound_by']} pipe); "
      f"instructions {row['instructions_ms']:.1f} ms/step vs bytes {row['bytes_ms']:.1f}: {row['bound']}-bound "
      f"(byte-bound at <= {row['byte_bound_at_instructions_per_element']:.1f} instructions/element)"
    )
  return lines


def refusal(rep):
  """The one line that refuses a step over the target's memory."""
  mem = rep["memory"]
  over = mem["peak_bytes"] - mem["available_bytes"]
  return (
    f"the train step needs {gib(mem['peak_bytes']):.1f} GiB per device on {rep['target']} (XLA's memory analysis of "
    f"the compiled step), {gib(over):.1f} GiB more than the {gib(mem['available_bytes']):.1f} GiB it leaves "
    f"({rep['memory_fraction']:.0%} of {gib(mem['device_bytes']):.1f} GiB, XLA_PYTHON_CLIENT_MEM_FRACTION); use more "
    "GPUs (compile_topology, compile_topology_num_slices), remat_policy=full, or a smaller per_device_batch_size / "
    "max_target_length"
  )


# -- dry_run and the preflight -----------------------------------------------------------------------------------


def named_target(cfg):
  """The aot.targets.Target of cfg.compile_topology, or None without one."""
  return targets.parse(cfg.compile_topology, cfg.compile_topology_num_slices) if cfg.compile_topology else None


def preflight_memory(cfg, target, devices, num_devices):
  """{peak_bytes, available_bytes, target} of the step compiled where the target is known (compile_topology's, or
  this machine's GPUs when the run is planned on exactly them), for dry_run and the preflight; None otherwise (the
  analytic estimate is then the only figure)."""
  if target is not None:
    step = compile_for_target(cfg, target)
  elif devices[0].platform == "gpu" and num_devices == len(devices):
    gpu = targets.of_device_kind(devices[0].device_kind)
    step = compile_step(cfg, devices, gpu, target_name=f"{len(devices)} x {devices[0].device_kind}", compile_only=False)
  else:
    return None
  if step.memory["available_bytes"] <= 0:  # the device says nothing of its memory: the analytic check decides
    return None
  return {
    "peak_bytes": step.memory["peak_bytes"],
    "available_bytes": step.memory["available_bytes"],
    "target": step.target,
  }
