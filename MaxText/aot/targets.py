"""The GPU targets train_compile compiles for: one table of NVIDIA GPUs (what XLA's compiler is told about each, its
peak rates and links, and where every number comes from), the `compile_topology` names (`h100-8`, `gb300-72`,
MaxText's `a3`), and the stream_executor GpuTargetConfigProto text a compile-only client is made from.

Sources. The device description (SMs, clocks, HBM size and bandwidth, L2, compute capability) and the tensor-core
rates per element type are XLA's published target specs, `xla/backends/gpu/target_config/specs/<name>.txtpb` in
openxla/xla (h100_sxm, h200, b200, gb200, b300, gb300; measured on each GPU by XLA's authors), copied here field by
field: a rate is `2 x ops_per_clock x units_per_core x core_count x clock` of the spec's `matrix_unit_description`
(FMA = 2 FLOPs). What XLA's specs don't hold comes from NVIDIA's datasheets, as cited per field: NVLink bandwidth per
GPU (NVLink 4 on Hopper: 900 GB/s both directions, so 450 GB/s each way; NVLink 5 on Blackwell: 1.8 TB/s, 900 GB/s),
the scale-out NIC per GPU (ConnectX-7, 400 Gb/s, on HGX H100/H200/B200 and GB200 NVL72 trays; ConnectX-8, 800 Gb/s,
on GB300 NVL72), GPUs per host (8 on an HGX board, 4 on a Grace-Blackwell tray) and the largest NVLink domain
(8 on HGX, 72 on NVL72). The CUDA and cuDNN versions are those of the CUDA 13 wheels jax 0.10.2 and 0.11.2 install
(cuDNN 9.28.1): the cuDNN version sits inside `gpu_device_info`, where XLA reads it (without it XLA assumes no cuDNN
and compiles a block-scaled dot to a naive loop).

What the estimate needs beyond XLA's specs, each from a public source (SOURCES): Blackwell Ultra's (B300, GB300) dense
NVFP4 rate, 15 PFLOP/s per GPU against Blackwell's 10 (1.5x: 6144 FP4 FMAs per tensor-core unit per clock where XLA's
spec copies Blackwell's 4096), and its doubled special-function (exponential) throughput for attention's softmax, 32
per SM per clock against 16 on Hopper and Blackwell (NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025; the CUDA C++
Programming Guide's throughput table for 16; FlashAttention-4, arXiv 2603.05451: H100 to B200 left the SFU count
per SM unchanged).
"""

import dataclasses
import os
import re

from MaxText.errors import UserError

GB = 1e9
DEFAULT_MEM_FRACTION = 0.75  # jax's XLA_PYTHON_CLIENT_MEM_FRACTION default: the share of HBM its allocator takes
CUDNN_VERSION = (9, 28, 1)
CUDA_VERSION = (13, 0, 0)
XLA_SPECS = "openxla/xla xla/backends/gpu/target_config/specs/"
SOURCES = {
  "device": "XLA's target specs, " + "openxla/xla xla/backends/gpu/target_config/specs/<gpu>.txtpb",
  "fp4_blackwell_ultra": "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra: The Chip Powering the AI Factory Era' "
  "(2025): 15 PFLOP/s dense NVFP4 per GPU vs 10 on Blackwell",
  "exp_per_clock": "CUDA C++ Programming Guide, arithmetic instruction throughput (16 exp2 per SM per clock, compute "
  "capability 9.0 / 10.0); 'Inside NVIDIA Blackwell Ultra' (2x SFU throughput for attention: 32)",
  "nvlink": "NVIDIA H100 / GB200 NVL72 / GB300 NVL72 datasheets: NVLink 4 900 GB/s, NVLink 5 1.8 TB/s per GPU "
  "(both directions)",
  "nic": "GB200 NVL72: ConnectX-7 400 Gb/s per GPU; GB300 NVL72: ConnectX-8 SuperNIC 800 Gb/s per GPU; HGX H100 / "
  "H200 / B200: ConnectX-7 400 Gb/s per GPU (NVIDIA datasheets)",
}


def memory_fraction():
  """The share of a GPU's memory jax's allocator takes: $XLA_PYTHON_CLIENT_MEM_FRACTION, else jax's 0.75."""
  try:
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION))
  except ValueError:
    return DEFAULT_MEM_FRACTION


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One GPU model: XLA's device description of it, its tensor-core rates, links and packaging."""

  name: str  # compile_topology's prefix: h100, h200, b200, gb200, b300, gb300
  description: str  # device_description_str (what jax's device_kind reports)
  compute_capability: tuple  # (major, minor)
  accelerated: bool  # the 'a' features (sm_90a, sm_100a, sm_103a): wgmma, tcgen05, block-scaled MMA
  core_count: int
  clock_ghz: float
  memory_bandwidth: float  # bytes/s
  l2_cache_size: int
  device_memory_size: int  # bytes
  matrix_clock_ghz: float
  matrix_ops_per_clock: dict  # {dtype: FMAs per tensor-core unit per clock}, 4 units per SM
  nvlink_bytes_per_s: float  # per GPU, each direction
  network_bytes_per_s: float  # per GPU, each direction (the scale-out NIC)
  gpus_per_host: int
  max_nvlink_domain: int
  source: str  # the XLA spec file
  exp_per_clock: int = 16  # exp2 (SFU) results per SM per clock: attention's softmax (SOURCES)

  def peak_flops(self, dtype):
    """Dense tensor-core FLOP/s for operands of `dtype` (bf16, fp8, fp4, tf32)."""
    return 2.0 * self.matrix_ops_per_clock[dtype] * 4 * self.core_count * self.matrix_clock_ghz * 1e9

  def usable_bytes(self):
    """The memory jax's allocator takes of this GPU: its HBM x memory_fraction()."""
    return self.device_memory_size * memory_fraction()

  @property
  def sm(self):
    return self.compute_capability[0] * 10 + self.compute_capability[1]

  def target_config(self):
    """The stream_executor GpuTargetConfigProto text of this GPU, trimmed to the fields jaxlib 0.10 / 0.11 read."""
    major, minor = self.compute_capability
    cudnn = ".".join(map(str, CUDNN_VERSION))
    cuda = ".".join(map(str, CUDA_VERSION))
    capability = f"    major: {major}\n" + (f"    minor: {minor}\n" if minor else "")
    capability += "    feature_extension: ACCELERATED_FEATURES\n" if self.accelerated else ""
    return (
      f"# {self.description}: {XLA_SPECS}{self.source} (MaxText/aot/targets.py)\n"
      "gpu_device_info {\n"
      "  threads_per_block_limit: 1024\n  threads_per_warp: 32\n  shared_memory_per_block: 49152\n"
      "  shared_memory_per_core: 233472\n  threads_per_core_limit: 2048\n"
      f"  core_count: {self.core_count}\n  fpus_per_core: 128\n"
      "  block_dim_limit_x: 2147483647\n  block_dim_limit_y: 65535\n  block_dim_limit_z: 65535\n"
      f"  memory_bandwidth: {int(self.memory_bandwidth)}\n  l2_cache_size: {self.l2_cache_size}\n"
      f"  clock_rate_ghz: {self.clock_ghz}\n  device_memory_size: {self.device_memory_size}\n"
      "  shared_memory_per_block_optin: 232448\n"
      f"  cuda_compute_capability {{\n{capability}  }}\n"
      "  registers_per_core_limit: 65536\n  registers_per_block_limit: 65536\n"
      f'  runtime_version: "{cuda}"\n  compile_time_toolkit_version: "{cuda}"\n  dnn_version: "{cudnn}"\n'
      "}\n"
      f"runtime_version {{ major: {CUDA_VERSION[0]} minor: {CUDA_VERSION[1]} }}\n"
      'platform_name: "CUDA"\n'
      f"dnn_version_info {{ major: {CUDNN_VERSION[0]} minor: {CUDNN_VERSION[1]} patch: {CUDNN_VERSION[2]} }}\n"
      f'device_description_str: "{self.description}"\n'
    )


_HOPPER_RATES = {"bf16": 512, "fp8": 1024, "tf32": 256}  # XLA's matrix_unit_description keys 16, 20, 11
_BLACKWELL_RATES = {"bf16": 1024, "fp8": 2048, "fp4": 4096, "tf32": 512}  # keys 16, 20, 32, 11
_BLACKWELL_ULTRA_RATES = {**_BLACKWELL_RATES, "fp4": 6144}  # 1.5x Blackwell's dense NVFP4 (SOURCES)
NVLINK4, NVLINK5 = 450 * GB, 900 * GB  # per GPU, each direction (NVIDIA: 900 GB/s and 1.8 TB/s bidirectional)
CX7, CX8 = 400e9 / 8, 800e9 / 8  # ConnectX-7 400 Gb/s, ConnectX-8 800 Gb/s per GPU

GPUS = {
  g.name: g
  for g in (
    Gpu(
      "h100", "NVIDIA H100 80GB HBM3", (9, 0), True, 132, 1.98, 3352320000000, 52428800, 84942979072,
      1.8295201, _HOPPER_RATES, NVLINK4, CX7, 8, 8, "h100_sxm.txtpb",
    ),
    Gpu(
      "h200", "NVIDIA H200 141GB HBM3e", (9, 0), True, 132, 1.98, 4800000000000, 52428800, 151397597184,
      1.8295201, _HOPPER_RATES, NVLINK4, CX7, 8, 8, "h200.txtpb",
    ),
    Gpu(
      "b200", "NVIDIA B200", (10, 0), True, 148, 1.965, 7672320000000, 132644864, 191514411008,
      1.8353101, _BLACKWELL_RATES, NVLINK5, CX7, 8, 8, "b200.txtpb",
    ),
    Gpu(
      "gb200", "NVIDIA GB200", (10, 0), True, 152, 2.062, 7928064000000, 135528448, 197897748480,
      1.9259081, _BLACKWELL_RATES, NVLINK5, CX7, 4, 72, "gb200.txtpb",
    ),
    Gpu(
      "b300", "NVIDIA B300", (10, 3), True, 158, 1.965, 7936000000000, 135528448, 297021865984,
      1.8353101, _BLACKWELL_ULTRA_RATES, NVLINK5, CX8, 8, 8,
      "b300.txtpb (its 'a' features added, as gb300's; FP4 and exp rates: Blackwell Ultra's)", 32,
    ),
    Gpu(
      "gb300", "NVIDIA GB300", (10, 3), True, 152, 2.07, 7928064000000, 135528448, 297021079552,
      1.93338, _BLACKWELL_ULTRA_RATES, NVLINK5, CX8, 4, 72, "gb300.txtpb (FP4 and exp rates: Blackwell Ultra's)", 32,
    ),
  )
}  # fmt: skip
ALIASES = {"a3": "h100-8"}  # MaxText's compile_topology name for 8 H100s (one A3 host)


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile target: `gpus_per_slice` GPUs of one model in each of `slices` NVLink domains (hosts, for HGX)."""

  gpu: Gpu
  gpus_per_slice: int
  slices: int = 1

  @property
  def name(self):
    return f"{self.gpu.name}-{self.gpus_per_slice}" + (f" x {self.slices} slices" if self.slices > 1 else "")

  @property
  def num_devices(self):
    return self.gpus_per_slice * self.slices

  @property
  def gpus_per_host(self):
    return min(self.gpus_per_slice, self.gpu.gpus_per_host)

  @property
  def hosts(self):
    """Processes of a job on this target: one per host."""
    return self.slices * (self.gpus_per_slice // self.gpus_per_host)

  @property
  def topology(self):
    """get_topology_desc's topology: slices x hosts per slice x GPUs per host (one process per host)."""
    return f"{self.slices}x{self.gpus_per_slice // self.gpus_per_host}x{self.gpus_per_host}"


def parse(name, num_slices=1) -> Target:
  """The Target of compile_topology=`name` (gpu-N, or a3) and compile_topology_num_slices; a UserError otherwise."""
  if num_slices < 1:
    raise UserError(f"compile_topology_num_slices={num_slices}: give the number of slices (NVLink domains), >= 1")
  spelled = ALIASES.get(name, name)
  match = re.fullmatch(r"([a-z0-9]+)-(\d+)", spelled or "")
  known = ", ".join(f"{g}-N" for g in GPUS) + ", " + ", ".join(f"{a} (= {n})" for a, n in ALIASES.items())
  if match is None or match.group(1) not in GPUS:
    raise UserError(
      f"compile_topology={name!r} is not a GPU target this knows; use one of {known} (N GPUs in one NVLink domain, "
      "compile_topology_num_slices=S for S of them)"
    )
  gpu, n = GPUS[match.group(1)], int(match.group(2))
  if not 1 <= n <= gpu.max_nvlink_domain:
    raise UserError(
      f"compile_topology={name}: one {gpu.name.upper()} NVLink domain holds 1 to {gpu.max_nvlink_domain} GPUs; for "
      f"more, use compile_topology={gpu.name}-{gpu.max_nvlink_domain if n > gpu.max_nvlink_domain else 1} "
      "compile_topology_num_slices=S"
    )
  if n > gpu.gpus_per_host and n % gpu.gpus_per_host:
    raise UserError(
      f"compile_topology={name}: {gpu.name.upper()} hosts hold {gpu.gpus_per_host} GPUs each, so a domain of more "
      f"than {gpu.gpus_per_host} is a multiple of {gpu.gpus_per_host}"
    )
  return Target(gpu, n, num_slices)


def of_device_kind(device_kind):
  """The Gpu whose description names jax's `device_kind` ('NVIDIA H100 80GB HBM3' -> h100), or None."""
  kind = device_kind.upper()
  for gpu in sorted(GPUS.values(), key=lambda g: -len(g.name)):
    if re.search(rf"\b{gpu.name.upper()}\b", kind):
      return gpu
  return None


def table():
  """Markdown: one row per GPU, the figures the roofline and the memory check use, and their sources."""
  rows = [
    "| target | SM | SMs | HBM (GiB) | HBM TB/s | bf16 TFLOP/s | fp8 | fp4 | exp2/SM/clock | NVLink GB/s/dir | "
    "NIC GB/s | GPUs/host | NVLink domain | XLA spec |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
  ]
  for g in GPUS.values():
    fp4 = f"{g.peak_flops('fp4') / 1e12:.0f}" if "fp4" in g.matrix_ops_per_clock else "-"
    rows.append(
      f"| {g.name}-N | {g.sm}{'a' if g.accelerated else ''} | {g.core_count} | {g.device_memory_size / 2**30:.1f} | "
      f"{g.memory_bandwidth / 1e12:.2f} | {g.peak_flops('bf16') / 1e12:.0f} | {g.peak_flops('fp8') / 1e12:.0f} | "
      f"{fp4} | {g.exp_per_clock} | {g.nvlink_bytes_per_s / GB:.0f} | {g.network_bytes_per_s / GB:.0f} | "
      f"{g.gpus_per_host} | "
      f"{g.max_nvlink_domain} | {g.source} |"
    )
  return "\n".join(rows)
