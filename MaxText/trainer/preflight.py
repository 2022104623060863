"""Before anything is allocated: the devices a run is planned for, its printed summary and precision plan, the
memory estimate against the device, and the run directory."""

import datetime
import os

import jax
import numpy as np

from MaxText import precision, storage
from MaxText.aot import targets
from MaxText.config import RunShape, hardware
from MaxText.config.models import definition as model_definition
from MaxText.model import accounting
from MaxText.model.decoder import abstract_model
from MaxText.quantization import cpu_gemm
from MaxText.runtime import sharding
from MaxText.errors import UserError


def device_memory_gib(cfg, devices):
  """Memory per device for the preflight: hardware_memory_gib, gpu_type, the accelerator's limit, or host RAM."""
  if cfg.hardware_memory_gib > 0:
    return cfg.hardware_memory_gib, "hardware_memory_gib"
  if cfg.gpu_type:
    gpu = targets.GPUS[cfg.gpu_type]
    return gpu.usable_bytes() / accounting.GIB, (
      f"a {cfg.gpu_type.upper()} ({targets.memory_fraction():.0%} of its {gpu.device_memory_size / accounting.GIB:.1f}"
      " GiB, XLA_PYTHON_CLIENT_MEM_FRACTION)"
    )
  local = [d for d in devices if d.process_index == jax.process_index()]
  stats = local[0].memory_stats() if hasattr(local[0], "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return stats["bytes_limit"] / accounting.GIB, local[0].device_kind
  with open("/proc/meminfo", encoding="ascii") as f:
    info = dict(line.split(":", 1) for line in f)
  available_kib = int(info["MemAvailable"].split()[0])
  return available_kib / 2**20 / len(local), local[0].platform  # virtual CPU devices share the host


def local_hardware(cfg, devices):
  """The config.hardware.Hardware `auto` values are chosen for: this machine's devices, or, in a dry run on another
  machine, the GPUs the run is planned for (gpu_type or hardware=gpu*); memory as the preflight counts it
  (hardware_memory_gib, gpu_type, the accelerator's limit, or host RAM)."""
  gib, what = device_memory_gib(cfg, devices)
  capability = getattr(devices[0], "compute_capability", None)
  platform = devices[0].platform
  if platform != "gpu" and cfg.dry_run and (cfg.gpu_type or cfg.hardware.startswith("gpu")):
    platform, gpu = "gpu", targets.GPUS.get(cfg.gpu_type)
    capability = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}" if gpu else None
  return hardware.Hardware(platform, float(capability) if capability else None, gib * accounting.GIB, what)


def resolve_auto(cfg, hw, num_devices, num_processes):
  """(cfg with its auto values made concrete for `hw` (config.hardware), what they became): remat_policy=auto
  against the analytic memory estimate on the run's mesh."""

  def memory_of(concrete):
    mesh_sizes, _, _ = sharding.mesh_shape(concrete, num_devices, num_processes)
    micro = RunShape.of(concrete, num_devices).micro_batch_size
    return accounting.memory_per_device(concrete, mesh_sizes, micro).total_gib * accounting.GIB

  return hardware.resolve(cfg, hw, num_devices, memory_of)


def planned_devices(cfg, local_count):
  """(devices, processes) the run is planned for: num_devices, else an explicit ici x dcn product, else local."""
  ici = [getattr(cfg, f"ici_{a}_parallelism") for a in sharding.MESH_AXES]
  dcn = [getattr(cfg, f"dcn_{a}_parallelism") for a in sharding.MESH_AXES]
  processes = int(np.prod(dcn)) if -1 not in dcn else 1
  if cfg.num_devices > 0:
    if -1 in dcn and -1 not in ici and cfg.num_devices % int(np.prod(ici)) == 0:
      processes = cfg.num_devices // int(np.prod(ici))  # the nodes a job of num_devices has, ici devices each
    return cfg.num_devices, processes
  if -1 not in ici + dcn:
    return int(np.prod(ici) * np.prod(dcn)), processes
  return local_count, processes


def sharding_plan(cfg, plan, num_devices, num_processes):
  """{axis: size} of the mesh, after checking that the parameters (built abstractly) and quantization blocks fit it."""
  mesh_sizes, _, _ = sharding.mesh_shape(cfg, num_devices, num_processes)
  sharding.param_specs(abstract_model(cfg)[1], mesh_sizes)
  sharding.check_quantization_blocks(cfg, mesh_sizes, precision.block_sizes(plan))
  return mesh_sizes


def model_line(cfg):
  """'llama3-8b', 'llama3-8b with base_num_decoder_layers=4 (override_model_config)' or 'default (...)'."""
  model = model_definition(cfg.model_name)
  if model is None:
    return (
      f"default (the config's: width {cfg.base_emb_dim}, {cfg.base_num_decoder_layers} layers, "
      f"{cfg.base_num_query_heads}/{cfg.base_num_kv_heads} heads of {cfg.head_dim}, MLP {cfg.base_mlp_dim}, "
      f"vocab {cfg.vocab_size})"
    )
  changed = [f"{k}={getattr(cfg, k)}" for k, v in model.items() if getattr(cfg, k) != v]
  return f"{cfg.model_name} with {', '.join(changed)} (override_model_config)" if changed else cfg.model_name


def summary(cfg, run_shape, mesh_sizes):
  """(the printed summary, the memory estimate)."""
  flops = accounting.training_flops_per_device(cfg)
  mem = accounting.memory_per_device(cfg, mesh_sizes, run_shape.micro_batch_size)
  mesh_text = " x ".join(f"{a} {n}" for a, n in mesh_sizes.items())
  optimizer_state = "none: sgd" if cfg.opt_type == "sgd" else f"{cfg.opt_type} mu+nu f32"
  lines = [
    f"model: {model_line(cfg)}",
    f"parameters: {accounting.param_count(cfg)}",
    f"TFLOPs per device per step: {flops.tflops:.2f}",
    f"mesh: {mesh_text} ({run_shape.num_devices} device(s))",
    f"memory per device: {mem.total_gib:.2f} GiB",
    f"  parameters {mem.params / accounting.GIB:.2f} GiB ({cfg.weight_dtype}), gradients "
    f"{mem.grads / accounting.GIB:.2f} GiB (f32), optimizer state {mem.optimizer / accounting.GIB:.2f} GiB "
    f"({optimizer_state}), activations ~{mem.activations / accounting.GIB:.2f} GiB "
    f"(remat_policy={cfg.remat_policy}, micro-batch {run_shape.micro_batch_size}, estimate)"
    + (f", gathered weights {mem.gathered / accounting.GIB:.2f} GiB (fsdp)" if mem.gathered else "")
    + (f", amax histories {mem.amax_history / accounting.GIB:.2f} GiB" if mem.amax_history else ""),
    f"global batch: {run_shape.global_batch_size} sequences x {cfg.max_target_length} tokens "
    f"({run_shape.tokens_per_step} tokens/step)",
  ]
  return "\n".join(lines), mem


def memory_check(cfg, mem, devices, compiled=None):
  """(fits, needed GiB, available GiB, of what) for the memory per device against the device's (or gpu_type's):
  the compiled step's figure where there is one (`compiled`: {peak_bytes, available_bytes, target}, a step compiled
  for a named compile_topology or the local GPUs), else the analytic estimate."""
  if compiled is not None:
    have = compiled["available_bytes"] / accounting.GIB
    need = compiled["peak_bytes"] / accounting.GIB
    return need <= have, need, have, compiled["target"]
  have, what = device_memory_gib(cfg, devices)
  return mem.total_gib <= have, mem.total_gib, have, what


def compiled_memory_lines(mem, compiled):
  """The compiled step's memory per device, and the analytic estimate beside it where they differ by more than 10%."""
  if compiled is None:
    return []
  need = compiled["peak_bytes"] / accounting.GIB
  lines = [
    f"compiled memory per device: {need:.2f} GiB (XLA's memory analysis of the step compiled for {compiled['target']})"
  ]
  if abs(need - mem.total_gib) > 0.1 * max(need, mem.total_gib):
    lines.append(
      f"  the analytic estimate above ({mem.total_gib:.2f} GiB) differs from it by {mem.total_gib / need - 1:+.0%}: "
      "the compiled figure is the one checked"
    )
  return lines


def print_plan(cfg, plan, run_shape, mesh_sizes, devices, compiled=None, auto=None):
  """Prints the summary, what `auto` values became (config.hardware), and the precision plan (and, for a dry run,
  the memory check, with the compiled step's figure where there is one); returns the estimate."""
  text, mem = summary(cfg, run_shape, mesh_sizes)
  print(text)
  if auto:
    print(hardware.describe(auto))
  print("precision plan:\n" + precision.format_plan(plan, cfg, accounting.gemm_flops(cfg)))
  if devices and devices[0].platform == "cpu":
    print(f"CPU GEMM operands: {cpu_gemm.describe()}")
  if 0 <= cfg.high_precision_from_step < cfg.steps:
    print(f"from step {cfg.high_precision_from_step}: every GEMM in bf16")
  elif cfg.high_precision_from_step >= cfg.steps:
    print(
      f"high_precision_from_step={cfg.high_precision_from_step} is past the last step (steps={cfg.steps}): "
      "every step runs the plan above"
    )
  if cfg.dry_run:
    for line in compiled_memory_lines(mem, compiled):
      print(line)
    fits, need, have, what = memory_check(cfg, mem, devices, compiled)
    print(f"memory check: {need:.1f} GiB per device {'fits' if fits else 'does NOT fit'} in {have:.1f} GiB ({what})")
  return mem


def check_memory(cfg, mem, devices, compiled=None):
  """A run whose memory per device (compiled where known, else estimated) exceeds the device's is refused."""
  for line in compiled_memory_lines(mem, compiled):
    print(line)
  fits, need, have, what = memory_check(cfg, mem, devices, compiled)
  if not fits:
    kind = "compiled (XLA's memory analysis)" if compiled is not None else "estimated"
    raise UserError(
      f"{kind} memory per device {need:.1f} GiB exceeds the {have:.1f} GiB available on {what} "
      f"({len(devices)} device(s)); use more devices, a smaller model, or lower per_device_batch_size / "
      "max_target_length, or remat_policy=full (or set hardware_memory_gib)"
    )


def run_dir(cfg):
  """base_output_directory/run_name; without a run_name a new timestamped directory (never an existing one)."""
  if cfg.run_name:
    return os.path.join(cfg.base_output_directory, cfg.run_name)
  stamp = os.path.join(cfg.base_output_directory, datetime.datetime.now().strftime("run_%Y%m%d_%H%M%S"))
  path, n = stamp, 1
  while storage.exists(path):
    path, n = f"{stamp}_{n}", n + 1
  return path


def check_storage(cfg):
  """Every URL the run writes or reads can be served here (its scheme's package installed, a library that writes
  it): one line before anything is written."""
  if storage.is_remote(cfg.base_output_directory):
    storage.filesystem(cfg.base_output_directory, "base_output_directory")
  if cfg.enable_checkpointing:
    storage.check_checkpoint_path(cfg.base_output_directory, "base_output_directory")
  for key in ("load_parameters_path", "load_full_state_path"):
    if getattr(cfg, key):
      storage.check_checkpoint_path(getattr(cfg, key), key)
  if cfg.enable_tensorboard:
    storage.check_tensorboard_path(cfg.base_output_directory, "base_output_directory")
  if cfg.dataset_type in ("grain", "tfds"):
    for key in ("grain_train_files", "grain_eval_files", "dataset_path"):
      storage.check_local_shards(getattr(cfg, key), key)
  if cfg.profiler and storage.is_remote(cfg.base_output_directory):
    raise UserError(
      f"profiler={cfg.profiler} writes its trace and summary into the run directory, which must be local here "
      f"(base_output_directory={cfg.base_output_directory}); profile with a local base_output_directory"
    )


def check_writable(out_dir):
  """The run directory exists (created) and takes files: a clear error now, not after compiling."""
  try:
    storage.makedirs(out_dir)
    probe = os.path.join(out_dir, ".write_test")
    storage.write_text(probe, "")
    storage.remove(probe)
  except OSError as e:
    raise UserError(
      f"can't write the run directory {out_dir} ({e.strerror or e}); set base_output_directory to a writable directory"
    ) from None
