"""The GPU target table: compile_topology names, their topologies and processes, the peaks computed from XLA's specs
(checked against NVIDIA's published dense figures), and the target config text a compile-only client reads."""

import re

import pytest

from MaxText.aot import targets
from MaxText.errors import UserError


@pytest.mark.parametrize(
  "name, slices, devices, topology",
  [
    ("h100-1", 1, 1, "1x1x1"),
    ("h100-8", 1, 8, "1x1x8"),
    ("a3", 4, 32, "4x1x8"),  # MaxText's name; slices = hosts
    ("b200-8", 2, 16, "2x1x8"),
    ("gb200-4", 1, 4, "1x1x4"),
    ("gb300-8", 1, 8, "1x2x4"),  # two Grace-Blackwell trays of 4 in one NVLink domain
    ("gb300-72", 2, 144, "2x18x4"),
    ("h200-2", 1, 2, "1x1x2"),
  ],
)
def test_names(name, slices, devices, topology):
  target = targets.parse(name, slices)
  assert target.num_devices == devices
  assert target.topology == topology
  hosts = [int(x) for x in topology.split("x")]
  assert hosts[0] * hosts[1] * hosts[2] == devices


@pytest.mark.parametrize(
  "name, slices, message",
  [
    ("v5p-8", 1, "compile_topology='v5p-8' is not a GPU target this knows; use one of h100-N, "),
    ("h100", 1, "is not a GPU target"),
    ("h100-16", 1, "compile_topology=h100-16: one H100 NVLink domain holds 1 to 8 GPUs; for more, use "
     "compile_topology=h100-8 compile_topology_num_slices=S"),
    ("gb300-6", 1, "GB300 hosts hold 4 GPUs each, so a domain of more than 4 is a multiple of 4"),
    ("h100-8", 0, "compile_topology_num_slices=0"),
  ],
)  # fmt: skip
def test_mistakes_are_one_line(name, slices, message):
  with pytest.raises(UserError, match=re.escape(message)) as error:
    targets.parse(name, slices)
  assert "\n" not in str(error.value)


def test_peaks_match_nvidia_dense_figures():
  """2 x ops/clock x 4 units x SMs x clock from XLA's specs, against NVIDIA's data sheets (dense, no sparsity):
  H100 SXM 989 TFLOP/s bf16, 1979 fp8; B200 2.25 PFLOP/s bf16 (HGX B200 18 PF fp16 / 8), 9 PF fp4 (72 / 8)."""
  h100, b200 = targets.GPUS["h100"], targets.GPUS["b200"]
  assert h100.peak_flops("bf16") / 1e12 == pytest.approx(989, rel=0.01)
  assert h100.peak_flops("fp8") / 1e12 == pytest.approx(1979, rel=0.01)
  assert "fp4" not in h100.matrix_ops_per_clock
  assert b200.peak_flops("bf16") / 1e12 == pytest.approx(2250, rel=0.02)
  assert b200.peak_flops("fp4") / 1e12 == pytest.approx(9000, rel=0.02)
  for gpu in targets.GPUS.values():
    assert gpu.peak_flops("fp8") == 2 * gpu.peak_flops("bf16")
    assert gpu.device_memory_size > 79 * 2**30


def _block(text, name):
  """The text of the top-level `name { ... }` block of a protobuf text message."""
  start = text.index(name + " {")
  depth = 0
  for i in range(start, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if text[i] == "}" and depth == 0:
      return text[start:i]
  raise AssertionError(f"unbalanced {name}")


@pytest.mark.parametrize("gpu", sorted(targets.GPUS))
def test_target_config(gpu):
  spec = targets.GPUS[gpu]
  text = spec.target_config()
  info = _block(text, "gpu_device_info")
  # XLA reads cuDNN's version inside gpu_device_info (without it: no cuDNN, a block-scaled dot becomes a naive loop).
  assert 'dnn_version: "9.28.1"' in info
  assert f"core_count: {spec.core_count}\n" in info
  assert f"device_memory_size: {spec.device_memory_size}\n" in info
  capability = _block(info, "cuda_compute_capability")
  assert f"major: {spec.compute_capability[0]}" in capability
  assert ("feature_extension: ACCELERATED_FEATURES" in capability) == spec.accelerated
  assert f'device_description_str: "{spec.description}"' in text
  assert text.count("{") == text.count("}")


def test_device_kinds():
  assert targets.of_device_kind("NVIDIA H100 80GB HBM3") is targets.GPUS["h100"]
  assert targets.of_device_kind("NVIDIA GB200") is targets.GPUS["gb200"]
  assert targets.of_device_kind("NVIDIA B200") is targets.GPUS["b200"]
  assert targets.of_device_kind("NVIDIA A100-SXM4-80GB") is None
  assert targets.of_device_kind("cpu") is None


def test_table_lists_every_gpu_with_its_source():
  table = targets.table()
  for gpu in targets.GPUS.values():
    assert f"| {gpu.name}-N |" in table and gpu.source in table


def test_blackwell_ultra_has_its_published_fp4_and_exponential_rates():
  """15 PFLOP/s dense NVFP4 against Blackwell's 10, and twice the exponential throughput per SM (the SOURCES)."""
  gb200, gb300 = targets.GPUS["gb200"], targets.GPUS["gb300"]
  assert gb300.matrix_ops_per_clock["fp4"] == 1.5 * gb200.matrix_ops_per_clock["fp4"]
  assert gb300.peak_flops("fp8") == pytest.approx(gb200.peak_flops("fp8"), rel=0.01)  # FP8 unchanged
  assert (gb200.exp_per_clock, gb300.exp_per_clock, targets.GPUS["h100"].exp_per_clock) == (16, 32, 16)
  assert "Blackwell Ultra" in targets.SOURCES["fp4_blackwell_ultra"]
